//! One reconcile of one job: read ([`super::observe`]), decide ([`plan::decide`]), schedule the
//! status write ([`super::status_cache`]), carry the round out ([`super::executor`]) and say
//! when to look again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use kube::core::error_boundary::DeserializeGuard;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

use super::Context;
use super::executor::slots_to_enter;
use super::gate::{Permit, Urgency};
use super::job_memory::error_key;
use super::status_cache::Known;
use super::status_write::StatusWrite;
use super::watchdog::{self, Watched};
use crate::crd::{TrainingJob, TrainingJobStatus};
use crate::error::Error;
use crate::plan;
use crate::validate::{InvalidSpec, ValidJob, validate};

/// How often a quiet job is looked at again, to heal drift (a deleted Service, ...).
const RESYNC: Duration = Duration::from_secs(300);
/// A reconcile running this long is reported with the stage it waits in.
const RECONCILE_WARN: Duration = Duration::from_secs(60);
/// A reconcile running this long is abandoned and retried ([`watchdog`]): longer than a round
/// waits for a write slot in a burst, far shorter than a hung round would cost.
const RECONCILE_LIMIT: Duration = Duration::from_secs(180);

pub(super) async fn reconcile(
    obj: Arc<DeserializeGuard<TrainingJob>>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    ctx.metrics.reconciles.inc();
    let started = Instant::now();
    let what = error_key(&obj.namespace().unwrap_or_default(), &obj.name_any());
    let result = match watchdog::watch(
        &what,
        RECONCILE_WARN,
        RECONCILE_LIMIT,
        reconcile_inner(&obj, &ctx),
    )
    .await
    {
        Watched::Done(result) => result,
        Watched::Abandoned(stage) => {
            tracing::error!(job = %what, stage, "a reconcile ran past its limit: abandoned, retried");
            Err(Error::ReconcileTimedOut {
                stage,
                limit: RECONCILE_LIMIT,
            })
        }
    };
    ctx.metrics
        .reconcile_duration
        .observe(started.elapsed().as_secs_f64());
    if result.is_ok() {
        ctx.memory.clear_errors(&error_key(
            &obj.namespace().unwrap_or_default(),
            &obj.name_any(),
        ));
    }
    ctx.export_state_sizes();
    result
}

pub(super) fn error_policy(
    obj: Arc<DeserializeGuard<TrainingJob>>,
    err: &Error,
    ctx: Arc<Context>,
) -> Action {
    ctx.metrics.count_error(err);
    let key = error_key(&obj.namespace().unwrap_or_default(), &obj.name_any());
    if err.waits_for_change() {
        tracing::info!(job = %key, error = %err, "waiting for the TrainingJob to change");
        return Action::await_change();
    }
    let n = ctx.memory.count_error(&key);
    ctx.export_state_sizes();
    let delay = Duration::from_secs((1u64 << n.min(9)).min(300));
    tracing::warn!(job = %key, error = %err, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

impl Context {
    /// Sets the `trainyard_operator_state_entries` gauges.
    fn export_state_sizes(&self) {
        self.metrics
            .set_state_sizes(&self.memory.sizes(self.executor.expectations()));
    }
}

async fn reconcile_inner(
    obj: &Arc<DeserializeGuard<TrainingJob>>,
    ctx: &Context,
) -> Result<Action, Error> {
    watchdog::stage("caches");
    ctx.caches.ready().await?;
    let job = match &obj.0 {
        Ok(job) => job,
        Err(invalid) => return ctx.executor.report_malformed(invalid).await,
    };
    if job.metadata.deletion_timestamp.is_some() {
        // Owner references let the garbage collector remove pods, Service and (unless retained) the PVC.
        return Ok(Action::await_change());
    }
    let uid = job.metadata.uid.clone().unwrap_or_default();
    // It may have been malformed before, and reported.
    ctx.memory.forget_malformed(&uid);
    let known = ctx.memory.status.current(job);
    // The status is the ledger's record: the metrics show what it holds.
    ctx.metrics.record_ledger(
        &job.namespace().unwrap_or_default(),
        &job.name_any(),
        &uid,
        known.current.ledger.as_ref(),
    );
    let valid = match validate(job) {
        Ok(v) => {
            ctx.memory.remember_valid(&uid, obj);
            v
        }
        Err(e) => match run_on_last_valid(ctx, &uid, e, job.metadata.generation) {
            Ok(v) => v,
            Err(e) => return Err(reject_invalid(ctx, job, &known, e, Timestamp::now()).await),
        },
    };
    let Round {
        plan: decided,
        write,
        now,
        permit,
        parked,
    } = decide_with_slot(ctx, obj, job, &valid, known).await?;
    let requeue_at = decided.requeue_at;
    if parked {
        // The gate wakes the job when a slot is free; the plan's own time stands as well.
        return Ok(Action::requeue(requeue_after(requeue_at, None, None)));
    }
    let follow_up = super::progress::FollowUp::of(&decided);
    // Boxed: a reconcile waiting at the gate then holds a pointer, not the executor's state.
    // The executor gives the permit back when the round is done (it may widen it between the
    // round's status write and its deletes).
    let held_for =
        Box::pin(
            ctx.executor
                .carry_out(job, decided, write == StatusWrite::Now, now, permit),
        )
        .await?;
    ctx.follow_progress(follow_up);
    let write_later = match write {
        StatusWrite::Later(after) => Some(after),
        StatusWrite::Now | StatusWrite::Unchanged => None,
    };
    Ok(Action::requeue(requeue_after(
        requeue_at,
        write_later,
        held_for,
    )))
}

/// A job edited into a spec that does not validate runs on as last validly specified (its
/// pods keep being managed, and `InvalidSpec` asks for a fix); one this operator never saw
/// valid waits for a valid spec. Gives the error back when there is no valid spec to run on.
fn run_on_last_valid(
    ctx: &Context,
    uid: &str,
    edit: InvalidSpec,
    generation: Option<i64>,
) -> Result<ValidJob, InvalidSpec> {
    let last = ctx.memory.last_valid(uid);
    match last.as_deref().map(|guard| guard.0.as_ref().map(validate)) {
        Some(Ok(Ok(valid))) => Ok(valid.with_rejected_edit(edit, generation)),
        _ => Err(edit),
    }
}

/// Shows an invalid spec on the job (the `InvalidSpec` condition and its Event); the error
/// to fail the reconcile with.
async fn reject_invalid(
    ctx: &Context,
    job: &TrainingJob,
    known: &Known,
    invalid: InvalidSpec,
    now: Timestamp,
) -> Error {
    let (status, events) =
        plan::invalid_status(&known.current, &invalid, job.metadata.generation, now);
    if status != known.written
        && let Err(e) = ctx.executor.write_status(job, &status).await
    {
        return e;
    }
    ctx.executor.publish(&job.object_ref(&()), events).await;
    Error::InvalidSpec(invalid)
}

/// One decided round, and the write slot it holds when it writes.
struct Round {
    plan: plan::Plan,
    write: StatusWrite,
    now: Timestamp,
    permit: Option<Permit>,
    /// A status-only round that found the gate full: nothing is carried out, the job is
    /// reconciled again when a slot is free.
    parked: bool,
}

impl Round {
    /// Whether carrying the round out sends anything to the API server (Events aside: they
    /// go to the publisher's queue).
    fn writes(&self) -> bool {
        self.write == StatusWrite::Now || !self.plan.actions.is_empty()
    }
}

/// Decides the round and, when it writes, takes the write slots of its first phase
/// ([`slots_to_enter`], [`super::gate`]): at once when they are free; else after waiting behind
/// the rounds ahead of it, and then decided again on what the caches show by then (the wait may
/// be long, and the first decision stale). Once its first phase is under way a round is not
/// decided again: the executor widens its permit itself.
async fn decide_with_slot(
    ctx: &Context,
    obj: &DeserializeGuard<TrainingJob>,
    job: &TrainingJob,
    valid: &ValidJob,
    known: Known,
) -> Result<Round, Error> {
    let round = decide(ctx, job, valid, &known).await?;
    if !round.writes() {
        return Ok(round);
    }
    let urgency = Urgency::of(&round.plan);
    let wanted = slots_to_enter(&round.plan, round.write == StatusWrite::Now);
    if urgency == Urgency::Routine {
        // A status-only round does not hold a reconcile while it waits: parked, its job is
        // reconciled again (and decided afresh) when a slot is free.
        let permit = ctx.gate.enter_or_park(&ObjectRef::from_obj(obj), wanted);
        return Ok(match permit {
            Some(permit) => Round {
                permit: Some(permit),
                ..round
            },
            None => Round {
                parked: true,
                ..round
            },
        });
    }
    if let Some(permit) = ctx.gate.try_enter(urgency, wanted) {
        return Ok(Round {
            permit: Some(permit),
            ..round
        });
    }
    // Nothing of the first decision is kept while waiting: the memory of waiting reconciles.
    drop((round, known));
    watchdog::stage(watchdog::WAITING_FOR_A_SLOT);
    let permit = ctx.gate.enter(urgency, wanted).await;
    let known = ctx.memory.status.current(job);
    let round = decide(ctx, job, valid, &known).await?;
    Ok(Round {
        permit: Some(permit),
        ..round
    })
}

/// Observes and decides now, tells the trainers what the round decided for them (a
/// checkpoint request, before the round waits for any write slot), and schedules the decided
/// status ([`super::status_cache`]).
async fn decide(
    ctx: &Context,
    job: &TrainingJob,
    valid: &ValidJob,
    known: &Known,
) -> Result<Round, Error> {
    let now = Timestamp::now();
    let plan = observe_and_decide(ctx, valid, &known.current, now).await?;
    ctx.tell_trainers(valid, &plan);
    let uid = job.metadata.uid.as_deref().unwrap_or_default();
    let write = ctx.memory.status.schedule(uid, known, &plan.status);
    Ok(Round {
        plan,
        write,
        now,
        permit: None,
        parked: false,
    })
}

/// Observes the job in the caches (with the placement of a half-created attempt's first pod
/// when a missing rank must copy it: see `sibling_to_read`), then decides once.
async fn observe_and_decide(
    ctx: &Context,
    valid: &ValidJob,
    current: &TrainingJobStatus,
    now: Timestamp,
) -> Result<plan::Plan, Error> {
    watchdog::stage("observe and decide");
    let mut observed = ctx.caches.observe(valid, current, now);
    observed.progress = ctx.observe_progress(valid);
    ctx.caches
        .read_sibling_placement(valid, current, &mut observed)
        .await?;
    Ok(plan::decide(valid, &observed, current, &ctx.config))
}

/// When to look at the job again: at the time the plan asked for (at least half a second from
/// now), when deferred status detail is due, or when a held-back write's expectation lapses,
/// whichever comes first, and within [`RESYNC`].
fn requeue_after(
    requeue_at: Option<Timestamp>,
    write_later: Option<Duration>,
    held_for: Option<Duration>,
) -> Duration {
    let after = requeue_at
        .map(|at| {
            let wait = at.duration_since(Timestamp::now()).as_secs_f64().max(0.5);
            Duration::from_secs_f64(wait).min(RESYNC)
        })
        .unwrap_or(RESYNC);
    [write_later, held_for]
        .into_iter()
        .flatten()
        .fold(after, Duration::min)
}
