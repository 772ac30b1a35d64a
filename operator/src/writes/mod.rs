//! The write path: everything that carries a decided round out against the API server, behind
//! one entry, [`Writes::carry_out`].
//!
//! The controller observes and decides ([`crate::plan::decide`]) and hands the decision here as
//! a [`Round`]. From there, in this order:
//!
//! - `status_cache` and `status_write`: whether the decided status is written now, later (the
//!   per-worker detail waits for its batch) or not at all;
//! - `gate`, bounded by `limit`: the write slots. A round that writes takes the slots of its
//!   first phase: at once when they are free; a status-only round that finds them taken parks
//!   its job, which the gate wakes (and the controller decides afresh) when a slot is free; any
//!   other round waits behind the rounds of its urgency, restarts and creates before status.
//!   What is carried out is always a decision made while the round holds its slots: one that
//!   had to wait is decided again when its turn comes ([`Writes::carry_out`] says why);
//! - `executor`: the write order of one round (status before deletes, expectations, the
//!   rejection shown on the job);
//! - `publisher`: the Events, sent by a task of their own under slots of their own.

use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use jiff::Timestamp;
use kube::core::error_boundary::{DeserializeGuard, InvalidObject};
use kube::runtime::controller::Action;
use kube::runtime::events::Reporter;
use kube::runtime::reflector::ObjectRef;
use kube::{Client, Resource};
use tokio::task::JoinHandle;

use crate::crd::{TrainingJob, TrainingJobStatus};
use crate::error::Error;
use crate::events::JobEvent;
use crate::expectations::Expectations;
use crate::job_memory::Sweep;
use crate::metrics::Metrics;
use crate::plan::Plan;
use crate::watchdog;
use memory::WriteMemory;

mod executor;
mod gate;
pub mod limit;
pub(crate) mod memory;
mod publisher;
pub(crate) mod status_cache;
pub mod status_write;

pub use executor::apply_status;
use executor::{Executor, slots_to_enter};
use gate::{Urgency, WriteGate};
pub(crate) use publisher::EVENT_DRAIN;
use status_cache::Known;
use status_write::StatusWrite;

/// The one field manager for everything the operator writes.
pub const FIELD_MANAGER: &str = "trainyard-operator";

/// A job to reconcile.
pub(crate) type JobRef = ObjectRef<DeserializeGuard<TrainingJob>>;

/// One decided round of one job: what [`Writes::carry_out`] takes.
pub(crate) struct Round {
    /// The decision.
    pub(crate) plan: Plan,
    /// The status the round was decided on (written last, and current).
    pub(crate) known: Known,
    /// When it was decided.
    pub(crate) now: Timestamp,
}

/// A round once its status write is scheduled.
struct Decided {
    plan: Plan,
    now: Timestamp,
}

/// What became of a round.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Carried {
    /// A status-only round found every slot taken: nothing was sent, and the job is sent on
    /// the wake stream of [`Writes::start`] when a slot is free.
    Parked,
    /// Carried out. Look at the job again within this (deferred status detail due, or a
    /// held-back write's expectation lapsing), whatever the plan asks.
    Done(Option<Duration>),
}

/// The queue's reference to `job`.
fn job_ref(job: &TrainingJob) -> JobRef {
    let name = job.metadata.name.as_deref().unwrap_or_default();
    match job.metadata.namespace.as_deref() {
        Some(ns) => JobRef::new(name).within(ns),
        None => JobRef::new(name),
    }
}

/// The write path of one leader term: the gate, the executor and the Events publisher.
pub(crate) struct Writes {
    executor: Executor,
    gate: Arc<WriteGate>,
    memory: Arc<WriteMemory>,
}

/// Everything [`Writes::start`] needs from the controller.
pub(crate) struct Shared {
    pub(crate) client: Client,
    /// Name of this replica in Events (`reportingInstance`).
    pub(crate) instance: String,
    /// The bound on write requests in flight.
    pub(crate) limit: limit::LimitConfig,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) expectations: Arc<Expectations>,
    /// The write path's per-job state.
    pub(crate) memory: Arc<WriteMemory>,
    /// Every part's per-job state, swept against the jobs that exist after status writes.
    pub(crate) sweep: Sweep,
}

impl Writes {
    /// Starts the write path: the gate, the Events publisher task (which ends once the last
    /// `Writes` is dropped and it has sent what was queued) and the executor. Also returns the
    /// stream of parked jobs to wake.
    pub(crate) fn start(
        shared: Shared,
    ) -> (
        Self,
        impl Stream<Item = JobRef> + Send + 'static,
        JoinHandle<()>,
    ) {
        let reporter = Reporter {
            controller: FIELD_MANAGER.to_owned(),
            instance: Some(shared.instance),
        };
        let (gate, parked_wakes) = WriteGate::new(shared.limit, shared.metrics.clone());
        let (events_tx, events_rx) = tokio::sync::mpsc::channel(publisher::EVENT_QUEUE);
        let publisher = tokio::spawn(publisher::publish_events(
            shared.client.clone(),
            reporter,
            gate.clone(),
            shared.memory.clone(),
            events_rx,
        ));
        let executor = Executor::new(
            shared.client,
            gate.clone(),
            shared.expectations,
            events_tx,
            shared.metrics,
            shared.memory.clone(),
            shared.sweep,
        );
        let writes = Self {
            executor,
            gate,
            memory: shared.memory,
        };
        (writes, parked_wakes, publisher)
    }

    /// The writes the caches do not show yet.
    pub(crate) fn expectations(&self) -> &Expectations {
        self.executor.expectations()
    }

    /// What a round of `job` decides on: its status as written last (the cache, or our newer
    /// write), with the worker detail not written yet ([`status_cache`]).
    pub(crate) fn current(&self, job: &TrainingJob) -> Known {
        self.memory.status.current(job)
    }

    /// The object of `uid` parses again: a later malformed generation is reported anew.
    pub(crate) fn parses_again(&self, uid: &str) {
        self.memory.forget_malformed(uid);
    }

    /// Carries out `round` of `job`: schedules its status ([`status_cache`]), takes its write
    /// slots (or parks the job, see the module) and sends its writes in the executor's order.
    ///
    /// A round that has to wait for its slots is not carried out as decided: the executor
    /// checks each action against the caches' expectations when it sends it, so the decision
    /// must be as fresh as that check (a create decided before the watch showed the last one,
    /// and sent after, would be sent twice). Its decision is dropped while it waits, and the
    /// round is decided by `decide_again` once it holds its slots; that decision is the one
    /// carried out.
    pub(crate) async fn carry_out(
        &self,
        job: &TrainingJob,
        round: Round,
        decide_again: impl AsyncFnOnce() -> Result<Round, Error>,
    ) -> Result<Carried, Error> {
        let (round, write) = self.schedule(job, round);
        let (permit, round, write) = if write.now() || !round.plan.actions.is_empty() {
            let urgency = Urgency::of(&round.plan);
            let wanted = slots_to_enter(&round.plan, write.now());
            if urgency == Urgency::Routine {
                // A status-only round does not hold a reconcile while it waits.
                match self.gate.enter_or_park(&job_ref(job), wanted) {
                    Some(permit) => (Some(permit), round, write),
                    None => return Ok(Carried::Parked),
                }
            } else if let Some(permit) = self.gate.try_enter(urgency, wanted) {
                (Some(permit), round, write)
            } else {
                // Nothing of the first decision is kept while waiting: the memory of waiting
                // rounds.
                drop(round);
                watchdog::stage(watchdog::WAITING_FOR_A_SLOT);
                let permit = self.gate.enter(urgency, wanted).await;
                let (round, write) = self.schedule(job, decide_again().await?);
                (Some(permit), round, write)
            }
        } else {
            (None, round, write)
        };
        // Boxed: a round waiting inside the executor holds a pointer, not its state. The
        // executor gives the permit back when the round is done (it may widen it between the
        // round's status write and its deletes).
        let held_for =
            Box::pin(
                self.executor
                    .carry_out(job, round.plan, write.now(), round.now, permit),
            )
            .await?;
        Ok(Carried::Done(
            [write.later(), held_for].into_iter().flatten().min(),
        ))
    }

    /// Whether the round's status is written now, later or not at all ([`status_cache`]); the
    /// statuses it was decided on are not kept beyond this.
    fn schedule(&self, job: &TrainingJob, round: Round) -> (Decided, StatusWrite) {
        let Round { plan, known, now } = round;
        let uid = job.metadata.uid.as_deref().unwrap_or_default();
        let write = self.memory.status.schedule(uid, &known, &plan.status);
        (Decided { plan, now }, write)
    }

    /// Shows an invalid spec on `job`: writes `status` unless it is the one written last, then
    /// queues `events`.
    pub(crate) async fn show_invalid(
        &self,
        job: &TrainingJob,
        known: &Known,
        status: &TrainingJobStatus,
        events: Vec<JobEvent>,
    ) -> Result<(), Error> {
        if *status != known.written {
            self.executor.write_status(job, status).await?;
        }
        self.executor.publish(&job.object_ref(&()), events).await;
        Ok(())
    }

    /// Shows on an object that does not parse as a TrainingJob why, once per generation.
    pub(crate) async fn report_malformed(&self, invalid: &InvalidObject) -> Result<Action, Error> {
        self.executor.report_malformed(invalid).await
    }
}
