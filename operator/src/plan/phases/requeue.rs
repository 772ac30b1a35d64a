//! `spec.scheduling.placementTimeoutSeconds`: a gang that holds some nodes while it waits for
//! others lets go of all of them.
//!
//! The kube-scheduler places pods one by one and knows no gang. Two jobs that share a cluster
//! can each get part of their workers placed and wait for ever for the rest, every placed
//! worker holding its GPUs and its trainer blocked at rendezvous. When some workers of the
//! attempt hold a node (scheduled, or kept to restart in place) while others wait for one the
//! scheduler (or the placement) says it cannot give, for `placementTimeoutSeconds` since the
//! attempt's pods could first be created, the gang restarts with reason `Requeue`: every pod
//! is deleted, in-place restarts included (none has trained in this attempt), and the next
//! attempt's pods are created after [`crate::plan::outcome::requeue_backoff`], whose jitter
//! lets one of two such jobs go first. No budget is spent (`status.requeues` counts them), and
//! the ledger counts the wait as `pending`.
//!
//! An elastic job with at least `minWorkers` placed shrinks instead (the phase before).

use jiff::SignedDuration;

use super::super::outcome::{Flow, next_try};
use super::super::round::Round;
use super::super::view::View;
use super::elastic::{attempt_began, placed, waiting};
use super::restart::{self, Cause};
use crate::model::crd::{Phase, RestartReason};
use crate::model::preemption::WorkerState;

/// Releases a half-placed gang that waited `placementTimeoutSeconds` (see the module's doc).
pub(in crate::plan) fn requeue(view: &View<'_>, round: &mut Round) -> Flow {
    if round.st.phase.is_some_and(Phase::is_terminal) {
        return Flow::Continue;
    }
    let waiting = waiting(view, round);
    let placed = placed(view);
    if waiting.is_empty() || placed.is_empty() {
        return Flow::Continue;
    }
    let size = u32::try_from(placed.len()).unwrap_or(u32::MAX);
    if let Some(elastic) = view.job.spec.elastic.as_ref()
        && size >= elastic.min_workers
    {
        return Flow::Continue;
    }
    let timeout = view.job.spec.scheduling.placement_timeout_seconds;
    let began = attempt_began(view, round);
    let began = next_try(view.job, view.current).map_or(began, |t| t.max(began));
    let due = began
        .saturating_add(SignedDuration::from_secs(i64::from(timeout)))
        .unwrap_or(began);
    if view.now < due {
        round.requeue(Some(due));
        return Flow::Continue;
    }
    let why = waiting
        .iter()
        .find_map(|r| view.census.states.get(&r).and_then(WorkerState::reason))
        .map(|r| format!(" ({r})"))
        .unwrap_or_default();
    let detail = format!(
        "worker(s) {waiting} could not be placed for {timeout}s{why} while worker(s) {placed} \
         held their nodes (scheduling.placementTimeoutSeconds): releasing every pod so that \
         other jobs can use their GPUs, and trying again"
    );
    let cause = Cause {
        reason: RestartReason::Requeue,
        detail,
    };
    restart::restart_for(view, round, cause)
}
