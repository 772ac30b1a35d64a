//! In-place gang restarts (`spec.restartPolicy.inPlace`): a worker whose pod and node are
//! healthy keeps its pod, and so its GPUs, across a gang restart; the supervisor in its
//! container stops the old attempt's processes and starts the next attempt's
//! ([`crate::progress::supervisors`]). Only the other ranks' pods are created again.
//!
//! The rounds of one in-place restart, each derived again from status and observation:
//! 1. **Decided** ([`keep`]): the restart keeps every current pod that is running, not being
//!    deleted, on a Ready node that is neither silent, lost nor under a termination notice,
//!    and whose supervisor polled lately for this attempt. `status.lastRestart.inPlaceRanks`
//!    lists their ranks; every other pod is deleted as in any restart. A pod of a kept rank is
//!    one with an older attempt's label: the operator creates pods only for the current
//!    attempt, so no other incarnation of the name can carry one.
//! 2. **Stopping** ([`settle`], in the drain phase): the directive tells the kept supervisors
//!    to stop. A kept pod is ready once its supervisor says nothing of the old attempt runs.
//!    One that does not say so within its grace period and [`STOP_MARGIN`], whose supervisor
//!    stops polling, or whose pod or node fails meanwhile, is replaced like any other pod:
//!    its rank leaves `inPlaceRanks` and Event `InPlaceFallback` says why. A supervisor stops
//!    polling only once this operator has heard it: a new leader, whose board starts empty,
//!    times the stop from when it began serving the channel, and waits for supervisors it
//!    has not heard yet until that deadline.
//! 3. **Starting** ([`start`], in the create phase, once every pod of the old attempt that is
//!    not kept is gone and the backoff is over): each kept pod gets the attempt's label, the
//!    missing ranks are created, and the directive tells the kept supervisors to start the
//!    attempt with the environment a new pod of their rank would have.
//!
//! So the old attempt's processes are gone everywhere (stopped in the kept pods, the other
//! pods deleted) before any process of the new attempt starts, as with recreated pods.

use std::collections::BTreeMap;
use std::sync::Arc;

use jiff::SignedDuration;

use super::observed::{is_finished, pod_name};
use super::outcome::{Action, Supervise};
use super::round::Round;
use super::supervised::{fresh, kept_for, stopped_before, supervisor};
use super::view::View;
use crate::build::pods::{self, label_u32};
use crate::model::cached_pod::CachedPod;
use crate::model::crd::{LABEL_ATTEMPT, TrainingJobStatus};
use crate::model::events::JobEvent;
use crate::model::nodes;
use crate::model::preemption::{NodeView, WorkerState};
use crate::model::reason;
use crate::model::supervision::Directive;
use trainyard_api::ranks::RankSet;

/// How long kept pods have to stop the old attempt beyond the job's grace period.
pub const STOP_MARGIN: SignedDuration = SignedDuration::from_secs(10);

/// Whether in-place restarts apply to the job: asked for, and the operator serves the channel
/// its supervisors poll.
pub(crate) fn enabled(view: &View<'_>) -> bool {
    view.job.spec.restart_policy.in_place() && view.config.progress_channel.is_some()
}

/// Why a kept or keepable pod fails, whatever its supervisor says: it is being deleted, its
/// containers stopped, it has no node, or its node is gone, `lost` (by the caller's rule) or
/// under a termination notice. The node, when it is there and none of that holds.
fn pod_or_node_fails<'a>(
    view: &View<'a>,
    pod: &'a CachedPod,
    lost: impl Fn(&str) -> Option<String>,
) -> Result<&'a k8s_openapi::api::core::v1::Node, String> {
    if pod.metadata.deletion_timestamp.is_some() {
        return Err("its pod is being deleted".to_owned());
    }
    if is_finished(pod) {
        return Err("its containers have stopped".to_owned());
    }
    let node = match view.observed.node_view(pod) {
        NodeView::Present(node) => node,
        NodeView::Unscheduled => return Err("its pod was never scheduled".to_owned()),
        NodeView::Missing(n) => return Err(format!("its node {n} is gone")),
    };
    let name = nodes::name(node);
    if let Some(why) = lost(name) {
        return Err(why);
    }
    match nodes::termination_taint(node, &view.classifier.termination_taints) {
        Some(taint) => Err(format!(
            "its node {name} has the termination notice {taint}"
        )),
        None => Ok(node),
    }
}

/// Why `pod` (of attempt `attempt`) cannot keep its pod through a restart, if it cannot.
fn unkeepable(view: &View<'_>, pod: &CachedPod, attempt: u32) -> Option<String> {
    let census = &view.census;
    let silent = |name: &str| {
        (census.silent.contains_key(name) || census.lost.contains_key(name))
            .then(|| format!("its node {name} is silent"))
    };
    let node = match pod_or_node_fails(view, pod, silent) {
        Ok(node) => node,
        Err(why) => return Some(why),
    };
    if !matches!(nodes::readiness(node), nodes::Readiness::Ready) {
        return Some(format!("its node {} is not Ready", nodes::name(node)));
    }
    match supervisor(view.observed, pod) {
        Some(s) if s.attempt == attempt && fresh(s, view.now) => None,
        Some(s) if s.attempt == attempt => Some(format!(
            "its supervisor last polled {}s ago",
            view.now.duration_since(s.seen_at).as_secs()
        )),
        _ => Some("no supervisor polled for this attempt".to_owned()),
    }
}

/// Why `pod` (rank `rank`) moves to its standby rather than keeping its pod: its node carries
/// an early warning of a termination and a standby of the rank waits (not being deleted).
/// Without a standby, a warned worker keeps its pod: the node is not going yet.
fn warned_with_a_standby(view: &View<'_>, rank: u32, pod: &CachedPod) -> Option<String> {
    let standby = view.census.ahead.get(&rank)?;
    if standby.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let NodeView::Present(node) = view.observed.node_view(pod) else {
        return None;
    };
    let warning = nodes::termination_taint(node, &view.classifier.early_warning_taints)?;
    Some(format!(
        "its node {} has the early warning {warning}; its replacement waits",
        nodes::name(node)
    ))
}

/// The current attempt's workers that keep their pods through the restart decided now to an
/// attempt of `size` workers, and the detail of the others: why each is replaced (a rank at
/// or past `size` has no place in the next attempt).
pub(crate) fn keep(view: &View<'_>, size: u32) -> (RankSet, Vec<String>) {
    if !enabled(view) {
        return (RankSet::default(), Vec::new());
    }
    let attempt = view.current.attempt;
    let mut kept = RankSet::default();
    let mut replaced = Vec::new();
    for rank in 0..view.workers {
        let why = match view.census.current.get(&rank) {
            None => "its pod is gone".to_owned(),
            Some(_) if rank >= size => format!("the gang shrinks to {size} worker(s)"),
            Some(pod) => match view.census.states.get(&rank) {
                Some(WorkerState::Preempted(_)) => "it was preempted".to_owned(),
                _ if let Some(why) = warned_with_a_standby(view, rank, pod) => why,
                _ => match unkeepable(view, pod, attempt) {
                    None => {
                        kept.insert(rank);
                        continue;
                    }
                    Some(why) => why,
                },
            },
        };
        replaced.push(format!("worker {rank}: {why}"));
    }
    (kept, replaced)
}

/// The Event of a restart of a job that restarts in place: `RestartingInPlace` when it keeps
/// pods; `InPlaceFallback` (a warning) when it keeps none although some pod was still there
/// (an image without the supervisor in a job that set `inPlace: true`, a supervisor gone
/// quiet): the restart recreates every pod, as without `inPlace`, and says why. A job that
/// left `inPlace` unset and never had a supervisor gets no such warning.
pub(crate) fn restart_event(
    view: &View<'_>,
    next: u32,
    kept: &RankSet,
    replaced: &[String],
) -> Option<JobEvent> {
    if !enabled(view) {
        return None;
    }
    if kept.is_empty() {
        // A job that left `inPlace` unset and whose image runs no supervisor restarts as it
        // always did: nothing to warn of.
        let asked = view.job.spec.restart_policy.in_place == Some(true);
        let supervised = view
            .census
            .current
            .values()
            .any(|p| supervisor(view.observed, p).is_some());
        if !asked && !supervised {
            return None;
        }
        return (!view.census.current.is_empty()).then(|| {
            JobEvent::warning(
                reason::IN_PLACE_FALLBACK,
                format!(
                    "attempt {next}: no worker restarts in place, every pod is created again: {}",
                    replaced.join("; ")
                ),
            )
        });
    }
    let replaced = match replaced.len() {
        0 => "no pod is created again".to_owned(),
        _ => format!("pods created again: {}", replaced.join("; ")),
    };
    Some(JobEvent::normal(
        reason::RESTARTING_IN_PLACE,
        format!(
            "attempt {next}: worker(s) {kept} keep their pods and restart in place; {replaced}"
        ),
    ))
}

/// How kept pods stand in a drain round: the ones to replace leave `inPlace` and are removed;
/// true when every kept pod has stopped the old attempt.
pub(crate) fn settle(view: &View<'_>, round: &mut Round) -> bool {
    let census = &view.census;
    if census.kept.is_empty() {
        return true;
    }
    let attempt = round.st.attempt;
    let decided_at = round
        .st
        .last_restart
        .as_ref()
        .map_or(view.now, |l| l.time.0);
    // A new leader hears the supervisors only from when it began serving their channel: the
    // stop is timed from then, as if decided then.
    let timed_from = view
        .observed
        .supervisors_since
        .map_or(decided_at, |since| since.max(decided_at));
    let grace = SignedDuration::from_secs(view.job.spec.termination_grace_period_seconds);
    let deadline = timed_from
        .saturating_add(grace)
        .and_then(|t| t.saturating_add(STOP_MARGIN))
        .unwrap_or(timed_from);
    let mut all_stopped = true;
    let mut fallen: Vec<(u32, &Arc<CachedPod>, String)> = Vec::new();
    for (&rank, &pod) in &census.kept {
        let seen = supervisor(view.observed, pod);
        let stopped = stopped_before(view.observed, pod, attempt);
        let old_attempt = label_u32(pod.as_ref(), LABEL_ATTEMPT).unwrap_or(0);
        let why = match unkeepable_while_stopping(view, pod) {
            Some(why) => Some(why),
            None if stopped => None,
            // Heard by this operator, then quiet: gone. Never heard (a new leader's board
            // starts empty, and the supervisors find it only once the channel points to it)
            // is not quiet: the deadline bounds the wait.
            None if seen.is_some_and(|s| !fresh(s, view.now)) => {
                Some("its supervisor stopped polling".to_owned())
            }
            None if view.now >= deadline => Some(format!(
                "its supervisor did not stop attempt {old_attempt} within {}s{}",
                view.now.duration_since(timed_from).as_secs(),
                match seen {
                    None => " (it never polled this operator)",
                    Some(_) => "",
                }
            )),
            None => {
                all_stopped = false;
                round.requeue(Some(deadline));
                continue;
            }
        };
        if let Some(why) = why {
            fallen.push((rank, pod, why));
        }
    }
    // One Event for the round, however many ranks fall back (the first reasons named).
    let mut whys = Vec::new();
    let ranks: RankSet = fallen.iter().map(|(rank, _, _)| *rank).collect();
    for (rank, pod, why) in fallen {
        all_stopped = false;
        if let Some(last) = round.st.last_restart.as_mut() {
            let left: RankSet = RankSet::parse(&last.in_place_ranks)
                .iter()
                .filter(|&r| r != rank)
                .collect();
            last.in_place_ranks = left.to_string();
        }
        if whys.len() < MAX_REASONS_NAMED {
            whys.push(format!("worker {rank}: {why}"));
        }
        round.remove_pods(view, std::iter::once(pod));
    }
    if !ranks.is_empty() {
        round.events.push(fallback_event(&ranks, &whys));
    }
    all_stopped
}

/// The one Event of a round's fallen `ranks`, with the first reasons `whys`.
fn fallback_event(ranks: &RankSet, whys: &[String]) -> JobEvent {
    let more = match ranks.len().saturating_sub(whys.len()) {
        0 => String::new(),
        more => format!("; and {more} more"),
    };
    JobEvent::warning(
        reason::IN_PLACE_FALLBACK,
        format!(
            "worker(s) {ranks} replaced instead of restarting in place: {}{more}",
            whys.join("; ")
        ),
    )
}

/// The most fallen ranks whose reasons one fallback Event names.
const MAX_REASONS_NAMED: usize = 8;

/// Why a kept pod stopping its old attempt can no longer restart in place: the pod or its
/// node failed meanwhile (a node merely silent may still confirm the stop). Its supervisor's
/// own answer is judged by [`settle`].
fn unkeepable_while_stopping(view: &View<'_>, pod: &CachedPod) -> Option<String> {
    let lost = |name: &str| {
        (view.census.lost.contains_key(name) || view.observed.liveness.gone_for_good(name))
            .then(|| format!("its node {name} is lost"))
    };
    pod_or_node_fails(view, pod, lost).err()
}

/// The start of the attempt in the kept pods (the create phase: the old attempt is gone): each
/// gets the attempt's label, and its supervisor may start.
pub(crate) fn start(view: &View<'_>, round: &mut Round) {
    let attempt = round.st.attempt;
    let channel = view.config.progress_channel.as_ref();
    for (&rank, pod) in &view.census.kept {
        let name = pod_name(pod);
        // Sealed anew for the attempt it now runs: the old seal names the old one.
        let seal = channel.map(|c| c.seal.seal(&view.job.sealed_worker(&name, rank, attempt)));
        round.actions.push(Action::RelabelPod {
            name,
            uid: pod.metadata.uid.clone(),
            attempt,
            seal,
        });
    }
    round.start_in_place = !view.census.kept.is_empty();
}

/// What the job's supervisors are told after this round, when the job restarts in place.
pub(crate) fn supervise(view: &View<'_>, round: &Round) -> Option<Supervise> {
    if !enabled(view) {
        return None;
    }
    let st = &round.st;
    let pods = view
        .observed
        .pods
        .iter()
        .filter_map(|p| p.metadata.uid.clone())
        .collect();
    let exit = st.phase.is_some_and(|p| p.is_terminal());
    // Nothing of the attempt starts while a pod of an older one is there, unless it is kept
    // and its supervisor said the old attempt stopped: the leader relabels the kept pods one
    // write each, so a pod may carry the attempt's label while another kept one has not
    // stopped yet (or falls back and is deleted).
    let old_attempt_gone = view.census.old_attempt_over(view, st.attempt)
        && view
            .census
            .kept
            .values()
            .all(|p| stopped_before(view.observed, p, st.attempt));
    let mut start = BTreeMap::new();
    let kept = kept_for(st, st.attempt);
    // The census is of the round's attempt: in the round that decides a restart, none of its
    // pods is the next attempt's yet.
    let census_is_of_attempt = view.current.attempt == st.attempt;
    for (&rank, pod) in view.census.kept.iter().chain(&view.census.current) {
        let standby = pods::is_standby(pod.as_ref()) && census_is_of_attempt;
        if !kept.contains(rank) && !standby {
            continue;
        }
        let (Some(uid), Some(labelled)) = (
            pod.metadata.uid.clone(),
            label_u32(pod.as_ref(), LABEL_ATTEMPT),
        ) else {
            continue;
        };
        if old_attempt_gone
            && (labelled == st.attempt || (labelled < st.attempt && round.start_in_place))
        {
            start.insert(uid, start_env(view, st, rank));
        }
    }
    Some(Supervise {
        directive: Directive {
            attempt: st.attempt,
            start,
            exit,
            hold_seconds: hold_seconds(view, st),
        },
        pods,
    })
}

/// What a kept supervisor waits after its trainer stopped or exited: the longest wait the
/// operator may take before it starts the next attempt there (the backoff of a next failure,
/// a replaced pod's grace period, the lost-peer hold), with a margin for its own rounds.
fn hold_seconds(view: &View<'_>, st: &TrainingJobStatus) -> u32 {
    const MARGIN: i64 = 30;
    let policy = &view.job.spec.restart_policy;
    let backoff = crate::plan::outcome::failure_backoff(policy.backoff_seconds, st.failures + 1);
    let waits = [
        backoff.as_secs(),
        view.job.spec.termination_grace_period_seconds,
        view.classifier.lost_peer_window.as_secs(),
    ];
    let longest = waits.into_iter().max().unwrap_or(0).saturating_add(MARGIN);
    u32::try_from(longest).unwrap_or(u32::MAX)
}

/// The trainer's environment a new pod of `rank` would get in the status' attempt.
fn start_env(view: &View<'_>, st: &TrainingJobStatus, rank: u32) -> Vec<(String, String)> {
    let pod = super::view::worker_pod(
        view,
        st,
        rank,
        &crate::model::placement::Placement::default(),
    );
    pods::literal_trainer_env(&pod, view.job.trainer_index)
}
