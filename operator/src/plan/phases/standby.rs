//! Make before break on a termination notice: the noticed workers' replacements are created
//! at once, beside the pods they replace, as the next attempt's pods **in waiting**
//! (standbys: scheduled, image pulled, the supervisor started with its spare interpreter
//! warm, running nothing). Once every standby waits, warm (its supervisor no longer says it
//! is `warming`), or [`STANDBY_WAIT`] after they were created (a standby that waits but still
//! warms then joins as it is), the notice goes on as without them: a checkpoint at the next step boundary, then
//! the gang restart, in which the noticed pods are deleted, the healthy ones are kept in place
//! and the standbys, already labelled with the new attempt, are its pods for their ranks:
//! their supervisors start it as soon as nothing of the old attempt runs.
//!
//! - **No room**: a standby not waiting by the deadline (unschedulable, slow to start) is
//!   deleted with a Warning Event, and its rank restarts as without one.
//! - **Notice withdrawn** before the switch: the standbys are deleted (Normal Event) and the
//!   job trains on undisturbed.
//! - Only for jobs that restart in place (the standby's supervisor is the one that starts
//!   it), with trainers that report progress (the checkpoint on the notice), that place
//!   their own pods (not queued in Kueue, whose quota they would exceed, nor under a gang
//!   scheduler).
//!
//! A standby's name is the one of its rank's two names ([`worker_pod_names`]) its noticed
//! pod does not use; its hostname is its rank's, so the rendezvous address does not change.

use std::collections::BTreeMap;
use std::sync::Arc;

use jiff::{SignedDuration, Timestamp};

use super::super::in_place;
use super::super::outcome::{Action, Flow};
use super::super::round::Round;
use super::super::supervised::{fresh, stopped_before, supervisor};
use super::super::view::{View, attempt_workers};
use super::progress::{noticed_ranks, requested_time, warned_ranks};
use crate::build::pods::{self, AttemptStart, Seat};
use crate::model::cached_pod::CachedPod;
use crate::model::crd::{LABEL_ATTEMPT, LABEL_RANK, MAX_LEDGER, RestartReason};
use crate::model::events::JobEvent;
use crate::model::ledger::millis_between;
use crate::model::nodes;
use crate::model::preemption::NodeView;
use crate::model::reason;
use crate::model::validate::worker_pod_names;
use trainyard_api::ranks::RankSet;

/// How long standbys are waited for before the notice's checkpoint is asked for all the
/// same: the notice must leave time for the checkpoint and a clean stop (30 s on GCP and
/// Azure, 2 minutes on AWS).
pub const STANDBY_WAIT: SignedDuration = SignedDuration::from_secs(15);
/// How often standbys that do not wait yet are looked at (their pods' changes and their
/// supervisors' first polls wake the job first).
const STANDBY_RECHECK: SignedDuration = SignedDuration::from_secs(2);

/// Whether the job places its own pods: a job admitted by Kueue holds only the quota it was
/// admitted with, and a gang scheduler places whole groups, so neither gets standbys.
fn own_capacity(view: &View<'_>) -> bool {
    view.job.queue.is_none()
        && crate::build::podgroup::desired_pod_group(view.job, view.config).is_none()
}

/// Whether the standby `pod` waits: it runs, and its supervisor polls, with nothing running.
fn waits(view: &View<'_>, pod: &CachedPod, next: u32) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod.node_name().is_some()
        && supervisor(view.observed, pod).is_some_and(|s| fresh(s, view.now))
        && stopped_before(view.observed, pod, next)
}

/// Whether the waiting standby `pod` is still warming what its start needs (its supervisor
/// says so: the spare interpreter importing torch).
fn warming(view: &View<'_>, pod: &CachedPod) -> bool {
    supervisor(view.observed, pod).is_some_and(|s| s.warming)
}

/// What the standbys are created for: a termination notice (the checkpoint is asked for once
/// they wait) or an early warning (the switch waits for the trainers' next checkpoint).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ahead {
    Notice,
    Warning,
}

/// Before the checkpoint of a termination notice is asked for: creates the noticed ranks'
/// standbys and waits for them (see the module's doc). `Some(flow)` while they are waited
/// for; `None` when the notice goes on (every standby waits, the deadline passed, or make
/// before break does not apply).
pub(super) fn before_checkpoint(view: &View<'_>, round: &mut Round) -> Option<Flow> {
    standbys_for(view, round, &noticed_ranks(view), Ahead::Notice)
}

/// Whether make before break applies to the job now: it restarts in place (the standby's
/// supervisor starts it), reports progress, places its own pods, and no checkpoint is asked
/// for yet.
fn applies(view: &View<'_>, round: &Round) -> bool {
    view.config.progress_channel.is_some()
        && in_place::enabled(view)
        && view.job.spec.restart_policy.replace_ahead_on_notice()
        && requested_time(round).is_none()
        && own_capacity(view)
}

/// An early warning on running workers' nodes (a rebalance recommendation, the operator
/// config's `earlyWarningTaints`) and no termination notice: their standbys are created and
/// waited for as for a notice, and once they wait the gang switches to them at the trainers'
/// next checkpoint (the first reported after the standbys were created) instead of asking for
/// one: the node is not going yet. No room for a standby: it stays pending (holding nothing)
/// and the worker trains on where it is until there is. A warning that goes away deletes the
/// standbys; one that becomes a notice is the notice's
/// ([`super::progress::termination_notice`]), with the standbys it has (those not waiting by
/// then are given up at once, the notice's deadline being past).
pub(in crate::plan) fn early_warning(view: &View<'_>, round: &mut Round) -> Flow {
    let Some(p) = super::progress::current(view, round) else {
        return Flow::Continue;
    };
    if super::progress::notice(view).is_some() || !applies(view, round) {
        return Flow::Continue;
    }
    let warned = warned_ranks(view);
    if warned.is_empty() {
        return Flow::Continue;
    }
    if let Some(flow) = standbys_for(view, round, &warned, Ahead::Warning) {
        return flow;
    }
    // Every standby waits, warm.
    let Some(created) = warned
        .iter()
        .filter_map(|(rank, ..)| view.census.ahead.get(rank))
        .filter_map(|p| p.standby_created_at())
        .max()
    else {
        // None could be created (both of a rank's names taken): train on.
        return Flow::Continue;
    };
    let Some((step, _)) = p.checkpoint.filter(|(_, at)| *at >= created) else {
        // The trainers' next checkpoint report wakes the job.
        return Flow::Continue;
    };
    let moved: Vec<String> = warned
        .iter()
        .map(|(rank, node, taint)| format!("worker {rank}: early warning {taint} on node {node}"))
        .collect();
    super::restart::restart_for(
        view,
        round,
        super::restart::Cause {
            reason: RestartReason::Preemption,
            detail: format!(
                "{}; moved at the trainers' checkpoint at step {step}",
                moved.join(", ")
            ),
        },
    )
}

/// Creates the standbys of the ranks `under` a notice or warning and waits for them (see the
/// module's doc): `Some(flow)` while they are waited for, `None` once they all wait, the
/// deadline passed, or make before break does not apply.
fn standbys_for(
    view: &View<'_>,
    round: &mut Round,
    under: &[(u32, &str, &str)],
    why: Ahead,
) -> Option<Flow> {
    let channel = view.config.progress_channel.as_ref()?;
    if !applies(view, round) || under.is_empty() {
        return None;
    }
    let next = round.st.attempt.saturating_add(1);
    // Standbys being deleted (given up, or a withdrawn notice's) are none.
    let ahead: BTreeMap<u32, &Arc<CachedPod>> = view
        .census
        .ahead
        .iter()
        .filter(|(_, p)| p.metadata.deletion_timestamp.is_none())
        .map(|(&r, &p)| (r, p))
        .collect();
    let missing: Vec<(u32, &str, &str)> = under
        .iter()
        .copied()
        .filter(|(rank, ..)| !ahead.contains_key(rank))
        .collect();
    // A rank whose two names are both taken (its last standby still going) has none: it
    // restarts as without one.
    if create(view, round, channel, &missing, next, why) > 0 {
        round.requeue(view.now.saturating_add(STANDBY_RECHECK).ok());
        return Some(Flow::Continue);
    }
    if ahead.is_empty() {
        return None;
    }
    let since = ahead
        .values()
        .filter_map(|p| p.standby_created_at())
        .min()
        .unwrap_or(view.now);
    let deadline = since.saturating_add(STANDBY_WAIT).unwrap_or(since);
    let late: Vec<u32> = ahead
        .iter()
        .filter(|(_, p)| !waits(view, p, next))
        .map(|(&r, _)| r)
        .collect();
    let cold: RankSet = ahead
        .iter()
        .filter(|(_, p)| warming(view, p))
        .map(|(&r, _)| r)
        .collect();
    // A warning's node is not going yet: no deadline. A standby that cannot be placed stays
    // pending, holding nothing, until there is room; one that waits warms first. Their pods'
    // changes and their supervisors' polls wake the job.
    if why == Ahead::Warning {
        return (!late.is_empty() || !cold.is_empty()).then_some(Flow::Continue);
    }
    // Every standby waits, warm; or at the deadline, those that wait join cold.
    if late.is_empty() && (cold.is_empty() || view.now >= deadline) {
        let waited = view.now.duration_since(since).as_secs_f64();
        let ranks: RankSet = ahead.keys().copied().collect();
        let warm = if cold.is_empty() {
            String::new()
        } else {
            format!(" (worker(s) {cold} still warming)")
        };
        // A warning's standbys then wait for the trainers' checkpoint over many rounds: its
        // StandbyCreated Event and the switch's restart Event tell it.
        if why == Ahead::Notice {
            round.events.push(JobEvent::normal(
                reason::STANDBY_READY,
                format!(
                    "the replacement(s) of worker(s) {ranks} wait on their nodes after \
                     {waited:.1}s{warm}: asking for the checkpoint before the switch"
                ),
            ));
        }
        return None;
    }
    if view.now < deadline {
        round.requeue(Some(
            deadline.min(view.now.saturating_add(STANDBY_RECHECK).unwrap_or(deadline)),
        ));
        return Some(Flow::Continue);
    }
    give_up(view, round, &ahead, &late, since);
    None
}

/// Creates the standbys of `missing` (rank, node, notice) for attempt `next`; how many.
fn create(
    view: &View<'_>,
    round: &mut Round,
    channel: &crate::config::ProgressChannel,
    missing: &[(u32, &str, &str)],
    next: u32,
    why: Ahead,
) -> usize {
    if missing.is_empty() {
        return 0;
    }
    let node_refs = view.observed.node_refs();
    let history = super::super::cost_fallback::history(&round.st);
    let placement = super::place(view, &node_refs, history);
    let start = AttemptStart::of(
        next,
        Some(RestartReason::Preemption),
        view.observed.claim.as_ref().is_some_and(|c| c.inherited),
    );
    let workers = attempt_workers(view.job, &round.st);
    let mut told = Vec::new();
    for &(rank, node, taint) in missing {
        let used: Vec<&str> = view
            .observed
            .pods
            .iter()
            .filter_map(|p| p.metadata.name.as_deref())
            .collect();
        let Some(name) = worker_pod_names(&view.job.name, rank)
            .into_iter()
            .find(|n| !used.contains(&n.as_str()))
        else {
            continue;
        };
        let seat = Seat {
            rank,
            attempt: next,
            workers,
        };
        let pod = pods::standby_pod(view.job, seat, start, &placement, channel, &name, view.now);
        round.actions.push(Action::CreatePod(Box::new(pod)));
        let what = match why {
            Ahead::Notice => "notice",
            Ahead::Warning => "early warning",
        };
        told.push(format!(
            "worker {rank} ({name}, for {what} {taint} on node {node})"
        ));
    }
    let created = told.len();
    if created > 0 {
        round.events.push(JobEvent::normal(
            reason::STANDBY_CREATED,
            match why {
                Ahead::Notice => format!(
                    "termination notice: created the replacement(s) of attempt {next} ahead, \
                     beside the pods they replace, to wait up to {}s before the switch: {}",
                    STANDBY_WAIT.as_secs(),
                    told.join("; ")
                ),
                // No deadline: one with no room waits pending until there is.
                Ahead::Warning => format!(
                    "early warning: created the replacement(s) of attempt {next} ahead, beside \
                     the pods they replace; once they wait, the gang switches to them at the \
                     trainers' next checkpoint: {}",
                    told.join("; ")
                ),
            },
        ));
    }
    created
}

/// The standbys of `late` ranks did not wait by the deadline: deleted, and their ranks
/// restart as without one.
fn give_up(
    view: &View<'_>,
    round: &mut Round,
    ahead: &BTreeMap<u32, &Arc<CachedPod>>,
    late: &[u32],
    since: Timestamp,
) {
    let why = |rank: u32| -> String {
        let Some(pod) = ahead.get(&rank) else {
            return String::new();
        };
        if pod.node_name().is_none() {
            return "not scheduled (no room)".to_owned();
        }
        match supervisor(view.observed, pod) {
            None => "its supervisor never polled".to_owned(),
            Some(_) => "its supervisor does not wait".to_owned(),
        }
    };
    let whys: Vec<String> = late
        .iter()
        .map(|&r| format!("worker {r}: {}", why(r)))
        .collect();
    round.events.push(JobEvent::warning(
        reason::STANDBY_GIVEN_UP,
        format!(
            "the replacement(s) did not wait within {}s of {since}: deleted, and the notice's \
             restart creates them after the old pods are gone: {}",
            STANDBY_WAIT.as_secs(),
            whys.join("; ")
        ),
    ));
    release(round, late.iter().filter_map(|r| ahead.get(r).copied()));
    let pods = late.iter().filter_map(|r| ahead.get(r).copied());
    round.remove_pods(view, pods);
}

/// Records `pods` as let go of as standbys in this round, for the ledger to charge what they
/// held; a pod already being deleted was counted in the round that deleted it.
pub(super) fn release<'p>(round: &mut Round, pods: impl IntoIterator<Item = &'p Arc<CachedPod>>) {
    round.released_standbys.extend(
        pods.into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .cloned(),
    );
}

/// Standbys whose notice is gone before the switch (the provider withdrew it, or the noticed
/// worker's pod went another way): deleted, and nothing else changes.
pub(super) fn withdrawn(view: &View<'_>, round: &mut Round) {
    let ahead = &view.census.ahead;
    if ahead.is_empty() || requested_time(round).is_some() {
        return;
    }
    // A rank whose pod still runs on its node, that node without a notice or an early
    // warning now. A pod that went another way (its node lost, its trainer failed) is the
    // restart's to judge: the standby joins that restart's attempt.
    let unnoticed = |rank: &u32| {
        let Some(pod) = view.census.current.get(rank) else {
            return false;
        };
        let NodeView::Present(node) = view.observed.node_view(pod) else {
            return false;
        };
        let c = &view.classifier;
        nodes::termination_taint(node, &c.termination_taints).is_none()
            && nodes::termination_taint(node, &c.early_warning_taints).is_none()
    };
    let gone: Vec<u32> = ahead.keys().copied().filter(unnoticed).collect();
    if gone.is_empty() {
        return;
    }
    let ranks: RankSet = gone.iter().copied().collect();
    round.events.push(JobEvent::normal(
        reason::STANDBY_WITHDRAWN,
        format!(
            "the termination notice or early warning on worker(s) {ranks} is withdrawn: their \
             replacement(s) created ahead are deleted, and training goes on"
        ),
    ));
    release(round, gone.iter().filter_map(|r| ahead.get(r).copied()));
    round.remove_pods(view, gone.iter().filter_map(|r| ahead.get(r).copied()));
}

/// Standbys of the current attempt whose supervisor does not start it: quiet past the pod's
/// grace period and [`in_place::STOP_MARGIN`] after the restart was decided, while nothing of
/// the old attempt runs. They are deleted (Warning Event) and their ranks created again as
/// any missing rank; true when some were.
pub(super) fn stalled(view: &View<'_>, round: &mut Round) -> bool {
    if view.current.attempt != round.st.attempt
        || !view.census.old_attempt_over(view, round.st.attempt)
    {
        return false;
    }
    let Some(decided) = round.st.last_restart.as_ref().map(|l| l.time.0) else {
        return false;
    };
    let grace = SignedDuration::from_secs(view.job.spec.termination_grace_period_seconds);
    let due = decided
        .saturating_add(grace)
        .and_then(|t| t.saturating_add(in_place::STOP_MARGIN))
        .unwrap_or(decided);
    let attempt = round.st.attempt;
    let quiet: Vec<(u32, &Arc<CachedPod>)> = view
        .census
        .current
        .iter()
        .filter(|(_, p)| pods::is_standby(p.as_ref()) && p.metadata.deletion_timestamp.is_none())
        .filter(|(_, p)| !super::super::supervised::started(view.observed, p, attempt))
        .filter(|(_, p)| !supervisor(view.observed, p).is_some_and(|s| fresh(s, view.now)))
        .map(|(&r, &p)| (r, p))
        .collect();
    if quiet.is_empty() {
        return false;
    }
    if view.now < due {
        round.requeue(Some(due));
        return false;
    }
    let ranks: RankSet = quiet.iter().map(|(r, _)| *r).collect();
    round.events.push(JobEvent::warning(
        reason::IN_PLACE_FALLBACK,
        format!(
            "worker(s) {ranks}: the replacement created ahead of the notice did not start \
             attempt {attempt} (its supervisor is quiet): created again"
        ),
    ));
    round.remove_pods(view, quiet.iter().map(|(_, p)| *p));
    let ranks: Vec<u32> = quiet.iter().map(|(r, _)| *r).collect();
    round.record_workers_except(view, &ranks);
    true
}

/// The standbys that join the restart decided now to attempt `next` of `size` workers, in
/// which `kept` restart in place: the next attempt's pods of their ranks.
pub(super) fn joining<'v>(
    view: &'v View<'_>,
    next: u32,
    size: u32,
    kept: &RankSet,
) -> Vec<&'v Arc<CachedPod>> {
    view.census
        .ahead
        .iter()
        .filter(|(rank, p)| {
            **rank < size
                && !kept.contains(**rank)
                && pods::label_u32(p.as_ref(), LABEL_ATTEMPT) == Some(next)
                && p.metadata.deletion_timestamp.is_none()
        })
        .map(|(_, p)| *p)
        .collect()
}

/// The ranks a restart decided now switches to standbys ([`joining`]), and how long ahead the
/// first of them was created.
pub(super) struct Switch {
    pub ranks: RankSet,
    /// When the first of the standbys was created, and the decision's time.
    created: Option<Timestamp>,
    now: Timestamp,
}

impl Switch {
    pub fn of(joining: &[&Arc<CachedPod>], now: Timestamp) -> Self {
        let ranks = joining
            .iter()
            .filter_map(|p| pods::label_u32(p.as_ref(), LABEL_RANK))
            .collect();
        let created = joining.iter().filter_map(|p| p.standby_created_at()).min();
        Self {
            ranks,
            created,
            now,
        }
    }

    /// `status.lastRestart.aheadMillis`.
    pub fn ahead_millis(&self) -> Option<u64> {
        Some(millis_between(self.created?, self.now).min(MAX_LEDGER))
    }

    /// The restart's `detail`, with the ranks that switch and how long ahead their standbys
    /// were created.
    pub fn detail(&self, detail: &str) -> String {
        if self.ranks.is_empty() {
            return detail.to_owned();
        }
        let ahead = self
            .created
            .map_or(0.0, |t| self.now.duration_since(t).as_secs_f64());
        let ranks = &self.ranks;
        format!(
            "{detail}; worker(s) {ranks} switch to their replacement(s) created {ahead:.1}s ahead"
        )
    }
}
