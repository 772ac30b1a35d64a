//! One reconcile of one job: read ([`crate::observe`]), decide ([`plan::decide`]), hand the
//! round to the write path ([`crate::writes`]) and say when to look again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use kube::ResourceExt;
use kube::core::error_boundary::DeserializeGuard;
use kube::runtime::controller::Action;

use super::context::Context;
use crate::error::Error;
use crate::model::crd::TrainingJob;
use crate::model::validate::{InvalidSpec, ValidJob, validate};
use crate::plan;
use crate::state::status_cache::Known;
use crate::watchdog::{self, Watched};
use crate::writes::{Carried, DecidedRound};

/// How often a quiet job is looked at again, to heal drift (a deleted Service, ...).
const RESYNC: Duration = Duration::from_secs(300);
/// A reconcile running this long is reported with the stage it waits in.
const RECONCILE_WARN: Duration = Duration::from_secs(60);
/// A reconcile running this long is abandoned and retried ([`watchdog`]): far longer than the
/// few requests of a round take, far shorter than a hung round would cost.
const RECONCILE_LIMIT: Duration = Duration::from_secs(180);

pub(super) async fn reconcile(
    obj: Arc<DeserializeGuard<TrainingJob>>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    ctx.metrics.reconciles.inc();
    let started = Instant::now();
    let what = job_path(&obj);
    tracing::debug!(job = %what, "reconcile");
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
        ctx.memory.clear_errors(&obj.uid().unwrap_or_default());
    }
    ctx.export_state_sizes();
    result
}

/// `namespace/name`, as logs name the job.
fn job_path(obj: &DeserializeGuard<TrainingJob>) -> String {
    format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any())
}

/// How soon a round whose write met a newer version of the job is decided again: long
/// enough for the watch to bring that version, short next to any restart's timing.
const CONFLICT_RETRY: Duration = Duration::from_millis(250);

pub(super) fn error_policy(
    obj: Arc<DeserializeGuard<TrainingJob>>,
    err: &Error,
    ctx: Arc<Context>,
) -> Action {
    ctx.metrics.count_error(err);
    let key = job_path(&obj);
    if err.waits_for_change() {
        tracing::info!(job = %key, error = %err, "waiting for the TrainingJob to change");
        return Action::await_change();
    }
    if err.is_conflict() {
        // The job changed since the round read it (a status write conditioned on its
        // resourceVersion was refused): no fault to back off from, decide again on the newer
        // job at once, as the watch shows it.
        tracing::info!(job = %key, error = %err, "the TrainingJob changed: deciding again");
        return Action::requeue(CONFLICT_RETRY);
    }
    let n = ctx.memory.count_error(&obj.uid().unwrap_or_default());
    ctx.export_state_sizes();
    let delay = Duration::from_secs((1u64 << n.min(9)).min(300));
    tracing::warn!(job = %key, error = %err, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

impl Context {
    /// Sets the `trainyard_operator_state_entries` gauges.
    fn export_state_sizes(&self) {
        self.metrics.set_state_sizes(&self.forgetting.sizes());
    }
}

async fn reconcile_inner(
    obj: &Arc<DeserializeGuard<TrainingJob>>,
    ctx: &Context,
) -> Result<Action, Error> {
    watchdog::stage("caches");
    ctx.sources.ready().await?;
    let job = match &obj.0 {
        Ok(job) => job,
        Err(invalid) => return ctx.writes.report_malformed(invalid).await,
    };
    if job.metadata.deletion_timestamp.is_some() {
        // Owner references let the garbage collector remove pods, Service and (unless retained) the PVC.
        return Ok(Action::await_change());
    }
    let uid = job.metadata.uid.clone().unwrap_or_default();
    // It may have been malformed before, and reported.
    ctx.writes.parses_again(&uid);
    let known = ctx.sources.known(job);
    let checked = validate(job).and_then(|v| {
        crate::model::validate::check_policy(&v.spec, &ctx.config.template_policy).map(|()| v)
    });
    let valid = match checked {
        Ok(v) => {
            ctx.memory.remember_valid(&uid, obj);
            v
        }
        Err(e) => match run_on_last_valid(ctx, &uid, e, job.metadata.generation) {
            Ok(v) => v,
            Err(e) => return Err(reject_invalid(ctx, job, &known, e, Timestamp::now()).await),
        },
    };
    let round = decide(ctx, &valid, known).await?;
    let requeue_at = round.plan.requeue_at;
    let look_again = match ctx.writes.carry_out(job, round).await? {
        // Woken when a routine slot is free; the plan's own time stands as well.
        Carried::Parked => None,
        Carried::Done(within) => within,
    };
    Ok(Action::requeue(requeue_after(requeue_at, look_again)))
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
    match ctx.writes.show_invalid(job, known, &status, events).await {
        Ok(()) => Error::InvalidSpec(invalid),
        Err(e) => e,
    }
}

/// Observes the job ([`crate::observe::Sources::observe`]) and decides the round.
async fn decide(ctx: &Context, valid: &ValidJob, known: Known) -> Result<DecidedRound, Error> {
    watchdog::stage("observe and decide");
    let now = Timestamp::now();
    let observed = ctx
        .sources
        .observe(valid, &known.current, &ctx.config, now)
        .await?;
    let plan = plan::decide(valid, &observed, &known.current, &ctx.config);
    Ok(DecidedRound { plan, known, now })
}

/// When to look at the job again: at the time the plan asked for (at least half a second from
/// now; a held-back write's expectation lapsing is one of those times) or when deferred status
/// detail is due (`look_again`), whichever comes first, and within [`RESYNC`].
fn requeue_after(requeue_at: Option<Timestamp>, look_again: Option<Duration>) -> Duration {
    let after = requeue_at
        .map(|at| {
            let wait = at.duration_since(Timestamp::now()).as_secs_f64().max(0.5);
            Duration::from_secs_f64(wait).min(RESYNC)
        })
        .unwrap_or(RESYNC);
    look_again.map_or(after, |within| within.min(after))
}
