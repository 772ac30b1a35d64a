//! What the trainers report through the progress channel (`crate::progress`): recorded in
//! `status.progress`; reports that stop coming are a fault of the channel (the condition
//! `ProgressChannel`), never a hang; a gang whose step stops advancing while its reports keep
//! coming is restarted (reason `Hang`); a termination notice on a running worker's node asks
//! the trainers for a checkpoint and, once it is saved, restarts the gang from it before the
//! node goes. A job whose trainers never report is decided exactly as without the channel.

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::super::observed::ObservedProgress;
use super::super::outcome::Flow;
use super::super::round::Round;
use super::super::view::View;
use super::restart::{self, Cause};
use crate::model::condition;
use crate::model::crd::{ProgressStatus, RestartReason, ResumePoint};
use crate::model::events::JobEvent;
use crate::model::nodes;
use crate::model::preemption::{NodeView, WorkerState};
use crate::model::reason;

/// How stale `status.progress` may get while the trainers report and nothing else happens.
const PROGRESS_REFRESH: SignedDuration = SignedDuration::from_secs(60);
/// How often a checkpoint asked for on a termination notice is looked for (a report of it
/// wakes the job at once; one saved before the request does not).
const NOTICE_RECHECK: SignedDuration = SignedDuration::from_secs(2);
/// No report from any rank for this long, while every worker runs, is a fault of the channel
/// (trainers report every few seconds: docs/env-contract.md). As long as
/// [`PROGRESS_REFRESH`], so that noticing it costs no extra round.
const REPORTS_STOPPED_AFTER: SignedDuration = PROGRESS_REFRESH;
/// How often a hang that is due is looked at again while the report that would show it is
/// awaited (reports do not wake the job; trainers report every few seconds).
const HANG_RECHECK: SignedDuration = SignedDuration::from_secs(5);

/// The reports of the attempt this round works on.
pub(super) fn current<'v>(view: &'v View<'_>, round: &Round) -> Option<&'v ObservedProgress> {
    view.observed
        .progress
        .as_ref()
        .filter(|p| p.attempt == round.st.attempt && !p.ranks.is_empty())
}

/// Records the current attempt's reports in `status.progress`, and the steps the restart
/// before it lost. Never stops the round.
pub(in crate::plan) fn record_progress(view: &View<'_>, round: &mut Round) -> Flow {
    // The newest step-addressed checkpoint reported moves the resume point, whichever attempt
    // reported it: trainers save once more on their way out (SIGTERM) and report it after the
    // restart was decided, and that save still counts until the next attempt's pods are
    // created with it. Only pods that exist can report, so no trainer whose pod is gone moves
    // it.
    if let Some(p) = view.observed.progress.as_ref()
        && let (Some((step, _)), Some(file)) = (p.checkpoint, p.checkpoint_file.as_deref())
    {
        advance_resume_point(&mut round.st.resume_point, p.attempt, step, file);
    }
    let Some(p) = current(view, round) else {
        return Flow::Continue;
    };
    let mut st = round
        .st
        .progress
        .clone()
        .filter(|s| s.attempt == p.attempt)
        .unwrap_or(ProgressStatus {
            attempt: p.attempt,
            ..ProgressStatus::default()
        });
    st.step = p.step();
    // Within one attempt the checkpoint only moves forward: a leader that just took over
    // starts with an empty store, and the first report it takes may name an older
    // checkpoint than the status holds.
    if let Some((step, at)) = p.checkpoint
        && st.checkpoint_step.is_none_or(|recorded| step > recorded)
    {
        st.checkpoint_step = Some(step);
        st.checkpoint_file.clone_from(&p.checkpoint_file);
        st.checkpoint_time = Some(Time(at));
    } else if p.checkpoint.map(|(step, _)| step) == st.checkpoint_step
        && st.checkpoint_file.is_none()
    {
        st.checkpoint_file.clone_from(&p.checkpoint_file);
    }
    if st.resumed_from.is_none()
        && let Some(resumed) = p.resumed_from
    {
        st.resumed_from = Some(resumed);
        if let Some(before) = p.previous_attempt_step {
            let lost = before.saturating_sub(resumed);
            st.steps_lost = Some(lost);
            let after_preemption = round.st.restarted_for(RestartReason::Preemption);
            if after_preemption {
                round.steps_lost = Some(lost);
            }
        }
    }
    round.st.progress = Some(st);
    round.requeue(view.now.saturating_add(PROGRESS_REFRESH).ok());
    report_channel(view, round, p);
    Flow::Continue
}

/// Moves the resume point to the step-addressed checkpoint `file` of `step`, saved by
/// attempt `attempt`, when it is newer: of a later attempt, or of the same attempt and a
/// later step. A later attempt resumed from the newest point, so its checkpoints are the
/// newest even at a lower step (an attempt that found nothing to load starts again from 0,
/// and must not be sent back to a file it could not read). Reports come only from the
/// workers of the current attempt (pod-bound tokens), so a stale writer cannot move it.
fn advance_resume_point(point: &mut Option<ResumePoint>, attempt: u32, step: u64, file: &str) {
    let newer = point
        .as_ref()
        .is_none_or(|p| (attempt, step) > (p.attempt, p.step));
    if newer && trainyard_api::env::is_checkpoint_file_name(file) {
        *point = Some(ResumePoint {
            attempt,
            step,
            file: file.to_owned(),
        });
    }
}

/// The condition `ProgressChannel`: True while the attempt's reports arrive; False (reason
/// `ReportsStopped`, one Warning Event) once none has come for [`REPORTS_STOPPED_AFTER`]
/// while every worker runs: the operator cannot receive or check them (the token reviewer
/// unavailable, the progress Service routing to a pod that is gone, a NetworkPolicy). Silence
/// restarts nothing ([`hang`]); the condition is True again with the next report.
fn report_channel(view: &View<'_>, round: &mut Round, p: &ObservedProgress) {
    let Some(last) = p.reported_at() else {
        return;
    };
    let silent_at = last.saturating_add(REPORTS_STOPPED_AFTER).unwrap_or(last);
    if view.now < silent_at {
        round.requeue(Some(silent_at));
        round.condition(
            view,
            condition::PROGRESS_CHANNEL,
            true,
            reason::REPORTS_ARRIVING,
            "the trainers' progress reports arrive",
        );
        return;
    }
    if !all_running(view) {
        return;
    }
    let message = format!(
        "no progress report has arrived since {last} while every worker runs: the trainers \
         cannot reach the operator, or it cannot check their tokens; no hang is judged until \
         reports arrive again"
    );
    let stands = round.st.conditions.iter().any(|c| {
        c.type_ == condition::PROGRESS_CHANNEL && c.status == "False" && c.message == message
    });
    round.condition(
        view,
        condition::PROGRESS_CHANNEL,
        false,
        reason::REPORTS_STOPPED,
        &message,
    );
    if !stands {
        round
            .events
            .push(JobEvent::warning(reason::PROGRESS_REPORTS_STOPPED, message));
    }
}

/// Whether every worker of the attempt runs.
pub(super) fn all_running(view: &View<'_>) -> bool {
    view.census.missing(view.workers).is_empty()
        && (0..view.workers).all(|r| {
            matches!(
                view.census.states.get(&r),
                Some(WorkerState::Running { .. })
            )
        })
}

/// When the trainers of the attempt last showed they work: their step's last advance, a newer
/// checkpoint, or the operator's request for one (a save takes time, and no step advances
/// meanwhile). None while a checkpoint asked for on a termination notice that still stands is
/// awaited: that save is no hang, however long it takes, and the node's end bounds it.
fn last_sign_of_work(view: &View<'_>, round: &Round, p: &ObservedProgress) -> Option<Timestamp> {
    let requested = requested_time(round);
    if requested.is_some() && p.checkpoint_saved_on_request.is_none() && noticed(view).is_some() {
        return None;
    }
    [p.advanced_at(), p.checkpoint.map(|(_, at)| at), requested]
        .into_iter()
        .flatten()
        .max()
}

/// When the standing checkpoint request of the attempt was made, if one stands.
pub(super) fn requested_time(round: &Round) -> Option<Timestamp> {
    round
        .st
        .progress
        .as_ref()
        .and_then(|s| s.checkpoint_requested_time.as_ref())
        .map(|t| t.0)
}

/// `restartPolicy.progressTimeoutSeconds`: a gang whose reports show its step not advancing
/// for that long while every worker runs is hung (a peer stuck in a collective, a deadlock):
/// restart it, counted against `maxHangs`. The reports themselves must show it: one must
/// have arrived at least the timeout after the last sign of work ([`last_sign_of_work`]).
/// Reports that stop coming show nothing (an operator restart, a channel fault:
/// [`report_channel`]).
pub(in crate::plan) fn hang(view: &View<'_>, round: &mut Round) -> Flow {
    let Some(timeout) = view.job.spec.restart_policy.progress_timeout_seconds else {
        return Flow::Continue;
    };
    let Some(p) = current(view, round) else {
        return Flow::Continue;
    };
    if !all_running(view) {
        return Flow::Continue;
    }
    let (Some(worked), Some(reported)) = (last_sign_of_work(view, round, p), p.reported_at())
    else {
        return Flow::Continue;
    };
    let limit = SignedDuration::from_secs(i64::from(timeout));
    let due = worked.saturating_add(limit).unwrap_or(worked);
    if view.now < due {
        round.requeue(Some(due));
        return Flow::Continue;
    }
    if reported < due {
        // The next report shows it, unless reports have stopped.
        if view.now
            < reported
                .saturating_add(REPORTS_STOPPED_AFTER)
                .unwrap_or(reported)
        {
            round.requeue(view.now.saturating_add(HANG_RECHECK).ok());
        }
        return Flow::Continue;
    }
    let first = p
        .ranks
        .iter()
        .map(|r| r.advanced_at)
        .min()
        .unwrap_or(worked);
    let stopped_first: Vec<String> = p
        .ranks
        .iter()
        .filter(|r| r.advanced_at == first)
        .map(|r| format!("{} (step {})", r.rank, r.step))
        .collect();
    let detail = format!(
        "no progress for {timeout}s at step {}; ranks that stopped advancing first, at {first}: {}",
        p.step(),
        stopped_first.join(", ")
    );
    restart::restart_for(
        view,
        round,
        Cause {
            reason: RestartReason::Hang,
            detail,
        },
    )
}

/// The first running worker whose node carries a termination taint, with the taint.
/// Why the gang checkpoints and stops before it is made to: as an Event tells it, and as
/// `lastRestart.detail` starts.
pub(super) struct Notice {
    pub told: String,
    pub detail: String,
}

/// A running gang told to stop soon: Kueue evicted its Workload ([`crate::model::kueue`]), or a
/// running worker's node carries a termination notice.
pub(super) fn notice(view: &View<'_>) -> Option<Notice> {
    if let Some(crate::model::kueue::Queued::Workload(w)) = view.observed.queue.as_ref()
        && let Some(why) = w.evicted.as_deref()
        && view
            .census
            .states
            .values()
            .any(|s| matches!(s, WorkerState::Running { .. }))
    {
        let what = format!("Kueue evicted Workload {} ({why})", w.name);
        return Some(Notice {
            told: what.clone(),
            detail: what,
        });
    }
    noticed(view).map(|(rank, node, taint)| Notice {
        told: format!("termination notice {taint} on node {node} (worker {rank})"),
        detail: format!("worker {rank}: termination notice {taint} on node {node}"),
    })
}

pub(super) fn noticed<'v>(view: &'v View<'_>) -> Option<(u32, &'v str, &'v str)> {
    noticed_ranks(view).into_iter().next()
}

/// The running ranks of the attempt on nodes under a termination notice, with the node and
/// the notice.
pub(super) fn noticed_ranks<'v>(view: &'v View<'_>) -> Vec<(u32, &'v str, &'v str)> {
    ranks_under(view, &view.classifier.termination_taints)
}

/// The running ranks of the attempt on nodes under an early warning (a rebalance
/// recommendation), with the node and the warning. Its caller acts only while no notice
/// stands ([`notice`]).
pub(super) fn warned_ranks<'v>(view: &'v View<'_>) -> Vec<(u32, &'v str, &'v str)> {
    ranks_under(view, &view.classifier.early_warning_taints)
}

/// The running ranks of the attempt on nodes carrying one of `taints`, with the node and the
/// taint.
fn ranks_under<'v>(view: &'v View<'_>, taints: &'v [String]) -> Vec<(u32, &'v str, &'v str)> {
    view.census
        .current
        .iter()
        .filter_map(|(&rank, pod)| {
            if !matches!(
                view.census.states.get(&rank),
                Some(WorkerState::Running { .. })
            ) {
                return None;
            }
            let NodeView::Present(node) = view.observed.node_view(pod) else {
                return None;
            };
            let taint = nodes::termination_taint(node, taints)?;
            Some((rank, nodes::name(node), taint))
        })
        .collect()
}

/// A termination notice (a taint of the provider table) on a running worker's node, for
/// trainers that report progress: ask them for a checkpoint now (`CheckpointRequested`), and
/// once a checkpoint at or past the step of the request is reported, restart the gang from it as a
/// preemption, before the node goes. Until then the job runs on: a trainer that does not
/// checkpoint on request loses what it would have lost without the notice. A notice that goes
/// away ends its request ([`notice_gone`]), so that a later one asks for a checkpoint anew.
pub(in crate::plan) fn termination_notice(view: &View<'_>, round: &mut Round) -> Flow {
    let Some(p) = current(view, round) else {
        return Flow::Continue;
    };
    super::standby::withdrawn(view, round);
    let Some(Notice { told, detail }) = notice(view) else {
        notice_gone(round, p);
        return Flow::Continue;
    };
    if let Some(flow) = super::standby::before_checkpoint(view, round) {
        return flow;
    }
    let attempt = round.st.attempt;
    if requested_time(round).is_none() {
        let step = p.step();
        if let Some(st) = round.st.progress.as_mut() {
            st.checkpoint_requested_time = Some(Time(view.now));
        }
        round.checkpoint_request = Some(attempt);
        round.events.push(JobEvent::normal(
            reason::CHECKPOINT_REQUESTED,
            format!("{told}: asked the trainers for a checkpoint at step {step}"),
        ));
        round.requeue(view.now.saturating_add(NOTICE_RECHECK).ok());
        return Flow::Continue;
    }
    let Some(step) = p.checkpoint_saved_on_request else {
        // Asked again every round: the request lives in memory, which a restart of the
        // operator loses, and asking again while it stands changes nothing.
        round.checkpoint_request = Some(attempt);
        round.requeue(view.now.saturating_add(NOTICE_RECHECK).ok());
        return Flow::Continue;
    };
    let detail = format!("{detail}; the trainers saved a checkpoint at step {step} on request");
    restart::restart_for(
        view,
        round,
        Cause {
            reason: RestartReason::Preemption,
            detail,
        },
    )
}

/// No notice stands (the provider abandoned the disruption), nor a grow's request: a request
/// the trainers have answered is withdrawn and `checkpointRequestedTime` cleared, so that a later notice asks
/// for a checkpoint at the step reached by then instead of restarting from this one. A
/// request not answered yet stands (the trainers may be saving) until its checkpoint comes.
fn notice_gone(round: &mut Round, p: &ObservedProgress) {
    // A request stands while the trainers have not answered it, or while a grow asks for it
    // (`elastic::grow`).
    if p.checkpoint_requested.is_some() || round.checkpoint_request.is_some() {
        return;
    }
    if p.checkpoint_saved_on_request.is_some() {
        round.checkpoint_withdrawal = Some(round.st.attempt);
    }
    if let Some(st) = round.st.progress.as_mut() {
        st.checkpoint_requested_time = None;
    }
}
