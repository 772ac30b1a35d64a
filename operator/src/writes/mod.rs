//! The write path: everything that carries a decided round out against the API server, behind
//! one entry, [`Writes::carry_out`].
//!
//! The controller observes and decides ([`crate::plan::decide`]) and hands the decision here as
//! a [`DecidedRound`], which is carried out as decided, in the reconcile that decided it:
//!
//! - `state::status_cache` and `state::status_write`: whether the decided status is written now, later (the
//!   per-worker detail waits for its batch) or not at all;
//! - `routine`: a round that writes status alone takes a routine slot first, or parks its job
//!   and sends nothing (the job is decided afresh once it is woken); every other round is
//!   carried out at once. kube-runtime bounds the reconciles in flight, and so the writes;
//! - `executor`: the write order of one round (status before deletes, expectations, the
//!   rejection shown on the job);
//! - `publisher`: the Events, sent by a task of their own.

use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use jiff::Timestamp;
use kube::core::error_boundary::InvalidObject;
use kube::runtime::controller::Action;
use kube::runtime::events::Reporter;
use kube::{Client, Resource};
use tokio::task::JoinHandle;

use crate::error::Error;
use crate::metrics::Metrics;
use crate::model::crd::{TrainingJob, TrainingJobStatus};
use crate::model::events::JobEvent;
use crate::plan::Plan;
use crate::state::JobRef;
use crate::state::expectations::Expectations;
use crate::state::job_memory::Sweep;
use crate::state::write_memory::WriteMemory;

mod executor;
mod publisher;
mod routine;

use crate::state::status_cache::Known;
use executor::Executor;
pub use executor::{FIELD_MANAGER, apply_status};
pub(crate) use publisher::EVENT_DRAIN;
use routine::RoutineSlots;
pub(crate) use routine::routine_share;

/// One decided round of one job: what [`Writes::carry_out`] takes.
pub(crate) struct DecidedRound {
    /// The decision.
    pub(crate) plan: Plan,
    /// The status the round was decided on (written last, and current).
    pub(crate) known: Known,
    /// When it was decided.
    pub(crate) now: Timestamp,
}

/// What became of a round.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Carried {
    /// A status-only round found every routine slot taken: nothing was sent, and the job is
    /// sent on the wake stream of [`Writes::start`] when a slot is free.
    Parked,
    /// Carried out. Look at the job again within this (deferred status detail due), whatever
    /// the plan asks.
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

/// The write path of one leader term: the routine slots, the executor and the Events
/// publisher.
pub(crate) struct Writes {
    executor: Executor,
    routine: Arc<RoutineSlots>,
    memory: Arc<WriteMemory>,
}

/// Everything [`Writes::start`] needs from the controller.
pub(crate) struct Shared {
    pub(crate) client: Client,
    /// Name of this replica in Events (`reportingInstance`).
    pub(crate) instance: String,
    /// The reconciles in flight: half of them may write status alone ([`routine`]).
    pub(crate) reconciles: u16,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) expectations: Arc<Expectations>,
    /// The write path's per-job state.
    pub(crate) memory: Arc<WriteMemory>,
    /// Every part's per-job state, swept against the jobs that exist after status writes.
    pub(crate) sweep: Sweep,
    /// The progress store, through which trainers are asked for checkpoints.
    pub(crate) trainers: Arc<crate::progress::ProgressStore>,
}

impl Writes {
    /// Starts the write path: the routine slots, the Events publisher task (which ends once the last
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
        let (routine, parked_wakes) =
            RoutineSlots::new(routine_share(shared.reconciles), shared.metrics.clone());
        let (events_tx, events_rx) = tokio::sync::mpsc::channel(publisher::EVENT_QUEUE);
        let publisher = tokio::spawn(publisher::publish_events(
            shared.client.clone(),
            reporter,
            shared.memory.clone(),
            events_rx,
        ));
        let executor = Executor::new(
            shared.client,
            shared.expectations,
            events_tx,
            shared.metrics,
            shared.memory.clone(),
            shared.sweep,
            shared.trainers,
        );
        let writes = Self {
            executor,
            routine,
            memory: shared.memory,
        };
        (writes, parked_wakes, publisher)
    }

    /// The object of `uid` parses again: a later malformed generation is reported anew.
    pub(crate) fn parses_again(&self, uid: &str) {
        self.memory.forget_malformed(uid);
    }

    /// Carries out `round` of `job` as decided: schedules its status ([`status_cache`]) and
    /// sends its writes in the executor's order. A round that writes status alone takes a
    /// routine slot first, or parks its job and sends nothing ([`routine`]).
    pub(crate) async fn carry_out(
        &self,
        job: &TrainingJob,
        round: DecidedRound,
    ) -> Result<Carried, Error> {
        let DecidedRound { plan, known, now } = round;
        let uid = job.metadata.uid.as_deref().unwrap_or_default();
        let write = self.memory.status.schedule(uid, &known, &plan.status);
        drop(known);
        let routine = write.now() && !plan.is_urgent();
        tracing::debug!(
            job = %job_ref(job),
            decided_by = ?plan.decided_by,
            urgent = plan.is_urgent(),
            status = ?write,
            "round decided"
        );
        let slot = match routine {
            true => match self.routine.take_or_park(&job_ref(job)) {
                Some(slot) => Some(slot),
                None => {
                    tracing::debug!(job = %job_ref(job), "round parked");
                    return Ok(Carried::Parked);
                }
            },
            false => None,
        };
        // Boxed: a round in the executor holds a pointer, not its state.
        let changed = Box::pin(self.executor.carry_out(job, plan, write.now(), now)).await?;
        drop(slot);
        self.wake_if_changed(job, changed);
        Ok(Carried::Done(write.later()))
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
        let changed = if *status == known.written {
            false
        } else {
            self.executor.write_status(job, status).await?
        };
        self.executor.publish(&job.object_ref(&()), events).await;
        // The change may be the fix.
        self.wake_if_changed(job, changed);
        Ok(())
    }

    /// Wakes `job` when it `changed` while its status was written: that change's watch event
    /// woke nothing ([`crate::state::status_cache::WriteInFlight::end`]).
    fn wake_if_changed(&self, job: &TrainingJob, changed: bool) {
        if changed {
            self.routine.wake(job_ref(job));
        }
    }

    /// Shows on an object that does not parse as a TrainingJob why, once per generation.
    pub(crate) async fn report_malformed(&self, invalid: &InvalidObject) -> Result<Action, Error> {
        self.executor.report_malformed(invalid).await
    }
}
