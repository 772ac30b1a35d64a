//! `spec.elastic`: a gang whose workers cannot all be placed trains with the ones that are,
//! and grows back once there is room for the others.
//!
//! - **Shrink.** Some workers of the attempt wait for a node the scheduler (or the placement)
//!   says it cannot give them, for `replacementWaitSeconds` since the attempt began, while at
//!   least `minWorkers` are placed: the gang restarts (reason `Shrink`, no budget) with as
//!   many workers as are placed, ranks `0..n`; pods of ranks below `n` restart in place where
//!   the job allows it.
//! - **Grow.** A shrunk gang that runs, where the free GPUs of the nodes that fit
//!   ([`super::super::Observed::gpus_in_use`]) hold one or more of its missing workers: it
//!   asks its trainers for a checkpoint and, once one is saved, restarts (reason `Grow`, no
//!   budget) with as many more as fit. Trainers that do not report progress grow at once,
//!   from their last checkpoint.
//!
//! A gang restart for any other reason (a preemption, a failure, a hang) asks for every
//! worker again: capacity may have come back, and a worker that cannot be placed costs only
//! the wait before the next shrink.

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::super::cost_fallback;
use super::super::outcome::{Flow, MAX_BACKOFF};
use super::super::round::Round;
use super::super::view::View;
use super::restart;
use crate::model::crd::{Phase, RestartReason};
use crate::model::events::JobEvent;
use crate::model::nodes;
use crate::model::placement;
use crate::model::preemption::WorkerState;
use crate::model::reason;
use trainyard_api::ranks::RankSet;

/// How often a shrunk gang looks for room again (and a grow's checkpoint is looked for).
pub(crate) const GROW_RECHECK: SignedDuration = SignedDuration::from_secs(15);
/// How often a checkpoint asked for before growing is looked for (a report of it wakes the
/// job at once).
const CHECKPOINT_RECHECK: SignedDuration = SignedDuration::from_secs(2);

/// The ranks of the attempt that wait for a node nobody can give them: unscheduled, and the
/// scheduler says so, or no node fits at all.
pub(super) fn waiting(view: &View<'_>, round: &Round) -> RankSet {
    let none_fits = round
        .placement
        .as_ref()
        .is_some_and(|p| p.unschedulable.is_some());
    view.census
        .current
        .iter()
        .filter(|(_, p)| p.node_name().is_none() && p.metadata.deletion_timestamp.is_none())
        .filter(|(r, _)| none_fits || view.census.states.get(r).is_some_and(|s| s.unschedulable()))
        .map(|(r, _)| *r)
        .collect()
}

/// The ranks of the attempt that hold a node: scheduled pods of this attempt that are not
/// going, and pods kept for it in place.
pub(super) fn placed(view: &View<'_>) -> RankSet {
    let census = &view.census;
    let scheduled = census
        .current
        .iter()
        .filter(|(_, p)| p.node_name().is_some() && p.metadata.deletion_timestamp.is_none())
        .filter(|(r, _)| {
            !matches!(
                census.states.get(r),
                Some(WorkerState::Preempted(_) | WorkerState::Failed(_))
            )
        })
        .map(|(r, _)| *r);
    scheduled.chain(census.kept.keys().copied()).collect()
}

/// When the attempt began waiting for its workers: its restart's decision, else the job's
/// start, else now.
pub(super) fn attempt_began(view: &View<'_>, round: &Round) -> Timestamp {
    let st = &round.st;
    match st.last_restart.as_ref() {
        Some(last) if st.attempt > 0 => Some(last.time.0),
        _ => st.start_time.as_ref().map(|t| t.0),
    }
    .unwrap_or(view.now)
}

/// Shrinks the gang to its placed workers once the others have waited for
/// `replacementWaitSeconds` (see the module's doc).
pub(in crate::plan) fn shrink(view: &View<'_>, round: &mut Round) -> Flow {
    let Some(elastic) = view.job.spec.elastic.as_ref() else {
        return Flow::Continue;
    };
    let waiting = waiting(view, round);
    if waiting.is_empty() || round.st.phase.is_some_and(Phase::is_terminal) {
        return Flow::Continue;
    }
    let placed = placed(view);
    let size = u32::try_from(placed.len()).unwrap_or(u32::MAX);
    if size < elastic.min_workers || size >= view.workers {
        return Flow::Continue;
    }
    let wait = SignedDuration::from_secs(i64::from(elastic.replacement_wait_seconds));
    let began = attempt_began(view, round);
    let due = began.saturating_add(wait).unwrap_or(began);
    if view.now < due {
        round.requeue(Some(due));
        return Flow::Continue;
    }
    let why = waiting
        .iter()
        .find_map(|r| view.census.states.get(&r).and_then(WorkerState::reason))
        .map(|r| format!(" ({r})"))
        .unwrap_or_default();
    // The attempt that cannot be placed was a grow: the room it saw was not there (GPUs of
    // pods the operator cannot see, another resource short). The next grow waits longer.
    let grew = round.st.restarted_for(RestartReason::Grow);
    let failed = grew.then(|| round.st.failed_grows.unwrap_or(0).saturating_add(1));
    let failed_grow = failed
        .map(|n| {
            format!(
                "; the grow did not fit ({n} in a row): the next grow waits {}s",
                grow_backoff(elastic.replacement_wait_seconds, n).as_secs()
            )
        })
        .unwrap_or_default();
    let detail = format!(
        "worker(s) {waiting} could not be placed for {}s{why}; {size} of {} worker(s) are \
         placed (minWorkers {}): training continues with {size}{failed_grow}",
        elastic.replacement_wait_seconds, view.job.spec.workers, elastic.min_workers
    );
    if failed.is_some() {
        round.st.failed_grows = failed;
    }
    restart::resize(view, round, RestartReason::Shrink, size, &detail)
}

/// How long a shrunk gang waits before it grows again after `failed` grows in a row that did
/// not fit: the replacement wait (at least [`GROW_RECHECK`]) doubled for each, at most
/// [`crate::plan::MAX_BACKOFF`].
fn grow_backoff(wait_seconds: u32, failed: u32) -> SignedDuration {
    let base = SignedDuration::from_secs(i64::from(wait_seconds)).max(GROW_RECHECK);
    let factor = 1i32.checked_shl(failed.min(16)).unwrap_or(i32::MAX);
    base.checked_mul(factor)
        .unwrap_or(MAX_BACKOFF)
        .min(MAX_BACKOFF)
}

/// GPUs free on each node that fits the job, from what the controller read
/// ([`super::super::Observed::gpus_in_use`]).
fn free_gpus(view: &View<'_>) -> BTreeMap<String, u64> {
    let Some(in_use) = view.observed.gpus_in_use.as_ref() else {
        return BTreeMap::new();
    };
    let resource = &view.job.spec.gpu.resource_name;
    view.observed
        .nodes
        .iter()
        .filter_map(|n| {
            let used = in_use.get(nodes::name(n))?;
            let free = nodes::allocatable(n, resource).saturating_sub(*used);
            Some((nodes::name(n).to_owned(), free))
        })
        .collect()
}

/// Whether grows are held back after grows that did not fit (`status.failedGrows`): until
/// [`grow_backoff`] after the shrink that followed the last one.
fn held_back(view: &View<'_>, round: &mut Round) -> bool {
    let (Some(failed), Some(last)) = (
        view.current.failed_grows,
        view.current.last_restart.as_ref(),
    ) else {
        return false;
    };
    let wait = view
        .job
        .spec
        .elastic
        .as_ref()
        .map_or(0, |e| e.replacement_wait_seconds);
    let due = last
        .time
        .0
        .saturating_add(grow_backoff(wait, failed))
        .unwrap_or(last.time.0);
    if view.now < due {
        round.requeue(Some(due));
        return true;
    }
    false
}

/// Grows a shrunk gang that runs, once the nodes that fit have room for missing workers:
/// after a checkpoint when its trainers report progress (see the module's doc).
pub(in crate::plan) fn grow(view: &View<'_>, round: &mut Round) -> Flow {
    // Kueue reserved quota for the admitted workers only.
    let full = super::admission::admitted_workers(view)
        .map_or(view.job.spec.workers, |n| n.min(view.job.spec.workers));
    if view.job.spec.elastic.is_none()
        || view.workers >= full
        || view.current.phase != Some(Phase::Running)
        || !super::progress::all_running(view)
        || super::progress::notice(view).is_some()
    {
        return Flow::Continue;
    }
    if held_back(view, round) {
        return Flow::Continue;
    }
    let per_worker = u64::from(view.job.spec.gpus_per_worker.max(1));
    let free = free_gpus(view);
    let fit: u64 = free.values().map(|f| f / per_worker).sum();
    let more = u32::try_from(fit)
        .unwrap_or(u32::MAX)
        .min(full - view.workers);
    if more == 0 {
        round.requeue(view.now.saturating_add(GROW_RECHECK).ok());
        return Flow::Continue;
    }
    let size = view.workers + more;
    let room: Vec<String> = free
        .iter()
        .filter(|(_, f)| **f >= per_worker)
        .map(|(n, f)| format!("{n} ({f} free)"))
        .collect();
    let room = room.join(", ");
    let attempt = round.st.attempt;
    let Some(p) = super::progress::current(view, round) else {
        let detail = format!(
            "room for {more} more worker(s) on {room}; the trainers report no progress, so \
             the gang grows to {size} of {full} from its last checkpoint"
        );
        return restart::resize(view, round, RestartReason::Grow, size, &detail);
    };
    let requested = super::progress::requested_time(round).is_some();
    match p.checkpoint_saved_on_request {
        Some(step) if requested => {
            let detail = format!(
                "room for {more} more worker(s) on {room}; the trainers saved a checkpoint at \
                 step {step} on request: the gang grows to {size} of {full}"
            );
            restart::resize(view, round, RestartReason::Grow, size, &detail)
        }
        _ => {
            if !requested {
                if let Some(st) = round.st.progress.as_mut() {
                    st.checkpoint_requested_time = Some(Time(view.now));
                }
                round.events.push(JobEvent::normal(
                    reason::CHECKPOINT_REQUESTED,
                    format!(
                        "room for {more} more worker(s) on {room}: asked the trainers for a \
                         checkpoint at step {} before growing to {size} of {full} workers",
                        p.step()
                    ),
                ));
            }
            // Asked again every round, as for a termination notice: the request lives in
            // the operator's memory.
            round.checkpoint_request = Some(attempt);
            round.requeue(view.now.saturating_add(CHECKPOINT_RECHECK).ok());
            Flow::Continue
        }
    }
}

/// The nodes whose GPUs in use the controller reads before a round of `status` (into
/// [`super::super::Observed::gpus_in_use`]): the nodes that fit an elastic job whose gang runs
/// shrunk, as the placement of its next attempt would see them (its spot mode, no node with a
/// termination notice, none whose kubelet went silent). Empty for every other job.
pub fn nodes_to_weigh(
    job: &crate::model::validate::ValidJob,
    status: &crate::model::crd::TrainingJobStatus,
    all: &[&Node],
    silent: &[String],
    config: &crate::config::OperatorConfig,
) -> Vec<String> {
    if job.spec.elastic.is_none()
        || status.phase != Some(Phase::Running)
        || super::super::view::attempt_workers(job, status) >= job.spec.workers
    {
        return Vec::new();
    }
    placement::fitting_nodes(job, config, all, cost_fallback::history(status), silent)
}
