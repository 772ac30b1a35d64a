//! The gang restart: a preempted or failed worker restarts the whole gang as the next
//! attempt, counted against its budget; past the budget the job fails.

use std::sync::Arc;

use crate::model::cached_pod::CachedPod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::super::outcome::{Flow, next_try};
use super::super::round::Round;
use super::super::view::View;
use super::super::{attempt_start, in_place, supervised};
use crate::model::condition;
use crate::model::crd::{LastRestart, MAX_MESSAGE_CHARS, Phase, RestartReason};
use crate::model::events::JobEvent;
use crate::model::liveness::SinceFailure;
use crate::model::lost_peer::{self, Judging, SilentPeer, Verdict};
use crate::model::nodes;
use crate::model::placement;
use crate::model::preemption::{NodeView, WorkerState};
use crate::model::reason;

pub(super) fn attempt_limit_message(detail: &str) -> String {
    format!(
        "attempt {} is the last one status.attempt can number; last: {detail}",
        u32::MAX
    )
}

/// Why the gang restarts, and the detail users read.
pub(super) struct Cause {
    pub reason: RestartReason,
    pub detail: String,
}

/// The budget a restart reason is counted against, once counted.
struct Budget {
    spent: u32,
    limit: u32,
    name: &'static str,
    counted: &'static str,
    exceeded: &'static str,
    event: &'static str,
}

/// Counts one more restart for `reason` in the next status.
fn count(round: &mut Round, view: &View<'_>, reason: RestartReason) -> Budget {
    let policy = &view.job.spec.restart_policy;
    let st = &mut round.st;
    let (counter, limit, name, counted, exceeded, event) = match reason {
        RestartReason::Preemption => (
            &mut st.preemptions,
            policy.max_preemptions,
            "maxPreemptions",
            "preemptions",
            reason::PREEMPTION_BUDGET_EXCEEDED,
            reason::PREEMPTED,
        ),
        RestartReason::Failure => (
            &mut st.failures,
            policy.max_failures,
            "maxFailures",
            "failures",
            reason::FAILURE_BUDGET_EXCEEDED,
            reason::WORKER_FAILED,
        ),
        RestartReason::Hang => (
            &mut st.hangs,
            policy.max_hangs,
            "maxHangs",
            "hangs",
            reason::HANG_BUDGET_EXCEEDED,
            reason::HANG,
        ),
        // A resume is not a gang restart of a running job (see the resume phase).
        RestartReason::Resume => (&mut st.preemptions, u32::MAX, "", "", "", reason::RESUMED),
        RestartReason::Shrink => (&mut st.preemptions, u32::MAX, "", "", "", reason::SHRINKING),
        RestartReason::Grow => (&mut st.preemptions, u32::MAX, "", "", "", reason::GROWING),
        RestartReason::Requeue => {
            st.requeues = st.requeues.saturating_add(1);
            (&mut st.requeues, u32::MAX, "", "", "", reason::REQUEUED)
        }
    };
    if reason.counted() {
        *counter = counter.saturating_add(1);
    }
    Budget {
        spent: *counter,
        limit,
        name,
        counted,
        exceeded,
        event,
    }
}

/// A preempted rank makes the others fail too (the collective breaks): preemption wins.
/// Failures alone: was a peer's node lost under the ranks that still seem to run? Then it is
/// a preemption too, or the round holds until that is known.
fn cause(view: &View<'_>, round: &mut Round) -> Option<Cause> {
    let problems: Vec<(u32, &WorkerState)> = view
        .census
        .states
        .iter()
        .filter(|(_, s)| matches!(s, WorkerState::Preempted(_) | WorkerState::Failed(_)))
        .map(|(r, s)| (*r, s))
        .collect();
    let (&(first_rank, first_state), more) = problems.split_first()?;
    let preempted = problems
        .iter()
        .any(|(_, s)| matches!(s, WorkerState::Preempted(_)));
    let lost_peer = if preempted {
        None
    } else {
        match judge_lost_peer(view) {
            Verdict::Preemption(detail) => Some(detail),
            Verdict::Hold(at) => {
                round.requeue(Some(at));
                round.verdict_held = true;
                return None;
            }
            Verdict::Failure => None,
        }
    };
    let reason_of = |s: &WorkerState| s.reason().unwrap_or_default().to_owned();
    let detail = match &lost_peer {
        Some(lost) => format!(
            "{lost}; worker {first_rank} failed with it: {}",
            reason_of(first_state)
        ),
        None => problems
            .iter()
            .find(|(_, s)| !preempted || matches!(s, WorkerState::Preempted(_)))
            .map(|(r, s)| format!("worker {r}: {}", reason_of(s)))
            .unwrap_or_default(),
    };
    let detail = match more.len() {
        0 => detail,
        more => format!("{detail} (and {more} more)"),
    };
    let reason = if preempted || lost_peer.is_some() {
        RestartReason::Preemption
    } else {
        RestartReason::Failure
    };
    Some(Cause { reason, detail })
}

/// Restarts the gang after a preemption or failure, or fails the job past its budget.
pub(super) fn gang_restart(view: &View<'_>, round: &mut Round) -> Flow {
    match cause(view, round) {
        Some(cause) => restart_for(view, round, cause),
        None => Flow::Continue,
    }
}

/// Counts a gang restart for `cause` against its budget and restarts the gang as the next
/// attempt, or fails the job past the budget.
pub(super) fn restart_for(view: &View<'_>, round: &mut Round, cause: Cause) -> Flow {
    let Cause { reason, detail } = cause;
    let Budget {
        spent,
        limit,
        name,
        counted,
        exceeded,
        event,
    } = count(round, view, reason);
    let next_attempt = match round.st.attempt.checked_add(1) {
        _ if spent > limit => Err((
            exceeded,
            format!("{spent} {counted} exceed {name}={limit}; last: {detail}"),
        )),
        None => Err((
            reason::ATTEMPT_LIMIT_REACHED,
            attempt_limit_message(&detail),
        )),
        Some(next) => Ok(next),
    };
    match next_attempt {
        Ok(next) => restart(view, round, next, reason, &detail, view.job.spec.workers),
        Err((why, message)) => {
            round.events.push(JobEvent::warning(event, detail.clone()));
            round.fail(view, why, &message);
            round.record_workers(view);
            round.remove_running_pods(view);
        }
    }
    Flow::Stop
}

/// Restarts an elastic gang with `size` workers for `reason` (`Shrink` or `Grow`), counted
/// against no budget; fails the job when the attempt number is spent.
pub(super) fn resize(
    view: &View<'_>,
    round: &mut Round,
    reason: RestartReason,
    size: u32,
    detail: &str,
) -> Flow {
    match round.st.attempt.checked_add(1) {
        Some(next) => restart(view, round, next, reason, detail, size),
        None => {
            round.fail(
                view,
                reason::ATTEMPT_LIMIT_REACHED,
                &attempt_limit_message(detail),
            );
            round.record_workers(view);
            round.remove_running_pods(view);
        }
    }
    Flow::Stop
}

/// Moves to attempt `next` with `size` workers and stops every pod, which is now from an
/// older attempt. One Event says why and what follows, and starts the attempt (see
/// `attempt_start`).
fn restart(
    view: &View<'_>,
    round: &mut Round,
    next: u32,
    reason: RestartReason,
    detail: &str,
    size: u32,
) {
    let now = view.now;
    // A requeue lets go of every pod: the point is to give their nodes back.
    let (kept, replaced) = match reason {
        RestartReason::Requeue => Default::default(),
        _ => in_place::keep(view, size),
    };
    // Replacements created ahead of a notice are the next attempt's pods of their ranks.
    let joining = match reason {
        RestartReason::Requeue => Vec::new(),
        _ => super::standby::joining(view, next, size, &kept),
    };
    let switch = super::standby::Switch::of(&joining, now);
    super::standby::release(round, joining.iter().copied());
    let detail = &switch.detail(detail);
    let st = &mut round.st;
    st.attempt = next;
    if view.job.spec.elastic.is_some() {
        st.world_size = Some(size);
    }
    st.phase = Some(Phase::Restarting);
    st.clear_workers();
    st.last_restart = Some(LastRestart {
        in_place_ranks: kept.to_string(),
        replaced_ahead_ranks: switch.ranks.to_string(),
        ahead_millis: switch.ahead_millis(),
        ..LastRestart::new(
            Time(now),
            reason,
            crate::model::condition::cut_to_chars(detail, MAX_MESSAGE_CHARS),
        )
    });
    let message = format!("attempt {next} after {}: {detail}", reason.as_str());
    round.condition(view, condition::RESTARTING, true, reason.as_str(), &message);
    round.condition(view, condition::RUNNING, false, reason.as_str(), &message);
    if view.job.spec.elastic.is_some() {
        shrunk_condition(view, round, size, detail);
    }
    let wait = match next_try(view.job, &round.st) {
        Some(at) => format!(", after a {}s backoff", at.duration_since(now).as_secs()),
        None => String::new(),
    };
    round.events.push(attempt_start::restart_event(
        reason, detail, next, &wait, now,
    ));
    let preemptions = round.st.preemptions;
    let (mode, fell_back) = placement::spot_mode(view.job, preemptions);
    let (_, fell_back_before) = placement::spot_mode(view.job, preemptions.saturating_sub(1));
    if reason == RestartReason::Preemption && fell_back && !fell_back_before {
        round.events.push(JobEvent::normal(
            reason::SPOT_FALLBACK,
            format!(
                "after {preemptions} preemptions later attempts run on on-demand nodes ({mode:?})"
            ),
        ));
    }
    // Every pod is now from an older attempt: stop them all (but those kept to restart in
    // place, whose supervisors stop their trainers), then wait for them to go.
    let kept_uids: Vec<&str> = kept
        .iter()
        .filter_map(|r| view.census.current.get(&r)?.metadata.uid.as_deref())
        .collect();
    let is_kept = |p: &&Arc<CachedPod>| {
        p.metadata
            .uid
            .as_deref()
            .is_some_and(|u| kept_uids.contains(&u))
            || joining.iter().any(|j| Arc::ptr_eq(j, p))
    };
    round.remove_pods(view, view.observed.pods.iter().filter(|p| !is_kept(p)));
    if let Some(event) = in_place::restart_event(view, next, &kept, &replaced) {
        round.events.push(event);
    }
    round.restart = Some(reason);
}

/// The condition `Shrunk` after a restart to `size` workers of an elastic job.
pub(super) fn shrunk_condition(view: &View<'_>, round: &mut Round, size: u32, detail: &str) {
    let full = view.job.spec.workers;
    if size < full {
        let message = format!(
            "attempt {} runs {size} of {full} workers: {detail}",
            round.st.attempt
        );
        round.condition(
            view,
            condition::SHRUNK,
            true,
            reason::CAPACITY_GONE,
            &message,
        );
    } else if round
        .st
        .conditions
        .iter()
        .any(|c| c.type_ == condition::SHRUNK)
    {
        let message = format!("attempt {} asks for all {full} workers", round.st.attempt);
        round.condition(view, condition::SHRUNK, false, reason::FULL_SIZE, &message);
    }
}

/// The [`lost_peer`] rule for a round whose problems are failures only.
fn judge_lost_peer(view: &View<'_>) -> Verdict {
    let (observed, now) = (view.observed, view.now);
    let liveness = &observed.liveness;
    let (current_pods, states) = (&view.census.current, &view.census.states);
    let failed: Vec<&Arc<CachedPod>> = states
        .iter()
        .filter(|(_, s)| matches!(s, WorkerState::Failed(_)))
        .filter_map(|(r, _)| current_pods.get(r).copied())
        .collect();
    // On the operator's clock: when the supervisor of a pod kept running reported the
    // trainer's exit, or else the failed trainer's end as its node stamped it, shifted by that
    // node's clock offset seen through its Lease.
    let attempt = view.current.attempt;
    let failed_at = failed
        .iter()
        .map(|p| {
            supervised::exit_heard_at(observed, p, attempt).unwrap_or_else(|| {
                liveness.on_operator_clock(p.node_name(), lost_peer::failed_at(p, now))
            })
        })
        .min()
        .unwrap_or(now)
        .min(now);
    // The ranks of this attempt whose trainers reported after the failure and the margin.
    let after = failed_at
        .saturating_add(liveness.margin)
        .unwrap_or(failed_at);
    let heard_after = |rank: u32| {
        view.census
            .reported
            .get(&rank)
            .is_some_and(|&at| at > after)
    };
    let node_of = |p: &CachedPod| p.spec.node_name.clone();
    let failed_nodes: Vec<String> = failed.iter().filter_map(|p| node_of(p)).collect();
    let peers: Vec<SilentPeer<'_>> = states
        .iter()
        .filter(|(_, s)| matches!(s, WorkerState::Running { .. } | WorkerState::Pending { .. }))
        .filter_map(|(r, _)| current_pods.get(r).map(|p| (*r, p)))
        .map(|(rank, pod)| {
            let node = observed.node_view(pod);
            let lease = match node {
                NodeView::Present(n) => liveness.since_failure(nodes::name(n), failed_at),
                _ => SinceFailure::NoLease,
            };
            SilentPeer {
                rank,
                node,
                lease,
                beside_failure: node_of(pod).is_some_and(|n| failed_nodes.contains(&n)),
                heard_after: heard_after(rank),
                reports: view.census.reported.contains_key(&rank),
            }
        })
        .collect();
    let c = &view.classifier;
    let judging = Judging {
        failed_at,
        termination_taints: &c.termination_taints,
        window: c.lost_peer_window,
        now,
    };
    lost_peer::judge(&peers, &judging)
}
