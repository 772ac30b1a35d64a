//! The collector one decision fills: the next status, the actions, the Events, when to look
//! again and whether a restart was decided. It finishes into the [`Plan`].

use std::sync::Arc;

use crate::model::cached_pod::CachedPod;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::observed::{is_finished, pod_name};
use super::outcome::{Action, Supervise};
use super::view::View;
use crate::model::condition::{self, condition_is_true, set_condition};
use crate::model::crd::{
    MAX_REASON_CHARS, MAX_WORKER_ENTRIES, Phase, RestartReason, TrainingJobStatus, WorkerStatus,
    WorkerSummary,
};
use crate::model::events::JobEvent;
use crate::model::nodes;
use crate::model::placement::Placement;
use crate::model::preemption::{WorkerPhase, WorkerState, min_time};
use crate::model::reason;
use crate::model::validate::InvalidSpec;
use trainyard_api::ranks::RankSet;

/// What the phases of one round have decided so far.
pub(crate) struct Round {
    /// The next status.
    pub st: TrainingJobStatus,
    pub actions: Vec<Action>,
    pub events: Vec<JobEvent>,
    pub requeue_at: Option<Timestamp>,
    /// A gang restart decided in this round.
    pub restart: Option<RestartReason>,
    /// A resume decided in this round: the controller persists it first, whatever else is.
    pub resumed: Option<RestartReason>,
    pub creates_attempt: Option<u32>,
    /// The `CreatingWorkers` Event of the attempt's first pods: published only when one of
    /// them is created in this round, so that a round that repeats creates the caches do not
    /// show yet (held back) does not announce the attempt a second time.
    pub announcement: Option<JobEvent>,
    /// [`Plan::checkpoint_request`].
    pub checkpoint_request: Option<u32>,
    /// [`Plan::checkpoint_withdrawal`].
    pub checkpoint_withdrawal: Option<u32>,
    /// [`Plan::steps_lost`].
    pub steps_lost: Option<u64>,
    /// The spec cannot run in this cluster as written (condition InvalidSpec).
    pub invalid: Option<InvalidSpec>,
    /// Where this round's pods go, once a phase has placed them.
    pub placement: Option<Placement>,
    /// The kept pods start the attempt in place in this round ([`super::in_place::start`]).
    pub start_in_place: bool,
    /// A failure's verdict is held in this round ([`crate::model::lost_peer`]): nothing is decided
    /// about the attempt yet, so a running job stays `Running`.
    pub verdict_held: bool,
    /// What the in-place restart supervisors are told ([`super::finish::supervise`]).
    pub supervise: Option<Supervise>,
    /// Standbys this round lets go of as standbys (the switch, a give-up, a withdrawn
    /// notice): the ledger charges the GPUs they held for the notice
    /// ([`super::goodput::fold`]).
    pub released_standbys: Vec<Arc<CachedPod>>,
}

impl Round {
    pub fn new(view: &View<'_>) -> Self {
        let mut st = view.current.clone();
        st.observed_generation = view.generation;
        st.phase = Some(st.phase.unwrap_or(Phase::Pending));
        st.checkpoint_claim = Some(view.job.claim_name.clone());
        Self {
            st,
            actions: Vec::new(),
            events: Vec::new(),
            requeue_at: None,
            restart: None,
            resumed: None,
            creates_attempt: None,
            announcement: None,
            checkpoint_request: None,
            checkpoint_withdrawal: None,
            steps_lost: None,
            invalid: view.job.rejected_edit.clone(),
            placement: None,
            start_in_place: false,
            verdict_held: false,
            supervise: None,
            released_standbys: Vec::new(),
        }
    }

    /// Looks again at `at` at the latest.
    pub fn requeue(&mut self, at: Option<Timestamp>) {
        self.requeue_at = min_time(self.requeue_at, at);
    }

    /// Sets a condition of the next status.
    pub fn condition(
        &mut self,
        view: &View<'_>,
        type_: &str,
        status: bool,
        reason: &str,
        message: &str,
    ) {
        set_condition(
            &mut self.st.conditions,
            type_,
            status,
            reason,
            message,
            view.now,
            view.generation,
        );
    }

    /// Deletes pods gracefully; removes at once those whose containers have all stopped (the
    /// kubelet may keep such a pod's object for tens of seconds while it tears down volumes
    /// or retries a failed kill, and the pod's name would block the next attempt while its
    /// GPUs are already free: the kubelet does not count a pod in a final phase as holding
    /// devices), and force-deletes those stuck terminating on a lost node.
    pub fn remove_pods<'p>(
        &mut self,
        view: &View<'_>,
        pods_: impl Iterator<Item = &'p Arc<CachedPod>>,
    ) {
        for pod in pods_ {
            let name = pod_name(pod);
            let uid = pod.metadata.uid.clone();
            if is_finished(pod) {
                self.actions.push(Action::ForceDeletePod { name, uid });
                continue;
            }
            if pod.metadata.deletion_timestamp.is_none() {
                self.actions.push(Action::DeletePod { name, uid });
                // The deletion's own echo wakes no round (the pod watch meets it as our
                // write): when it may have to be forced is asked for now.
                self.requeue(force_delete_at(view, pod.node_name()));
                continue;
            }
            let node_name = pod.node_name();
            match force_delete_at(view, node_name) {
                Some(at) if view.now >= at => {
                    self.events.push(JobEvent::warning(
                        reason::FORCE_DELETED,
                        format!(
                            "pod {name} was stuck terminating on lost node {}",
                            node_name.unwrap_or("(none)")
                        ),
                    ));
                    self.actions.push(Action::ForceDeletePod { name, uid });
                }
                Some(at) => self.requeue(Some(at)),
                None => {}
            }
        }
    }

    /// Removes every pod of the job whose containers still run.
    pub fn remove_running_pods(&mut self, view: &View<'_>) {
        self.remove_pods(view, view.observed.pods.iter().filter(|p| !is_finished(p)));
    }

    /// The job failed for good.
    pub fn fail(&mut self, view: &View<'_>, reason: &str, message: &str) {
        self.st.phase = Some(Phase::Failed);
        self.st.completion_time = Some(Time(view.now));
        self.condition(view, condition::FAILED, true, reason, message);
        self.condition(view, condition::RUNNING, false, reason, message);
        if condition_is_true(&self.st.conditions, condition::RESTARTING) {
            self.condition(view, condition::RESTARTING, false, reason, message);
        }
        self.events.push(JobEvent::warning(
            reason::FAILED,
            format!("{reason}: {message}"),
        ));
    }

    /// status.workers: the current attempt's workers the operator has seen.
    pub fn record_workers(&mut self, view: &View<'_>) {
        self.record_workers_except(view, &[]);
    }

    /// [`Round::record_workers`] without the ranks `unrecorded`: pods deleted on purpose,
    /// whose going must not be taken for a lost worker.
    pub fn record_workers_except(&mut self, view: &View<'_>, unrecorded: &[u32]) {
        let census = &view.census;
        let mut workers: Vec<WorkerStatus> = census
            .current
            .iter()
            .filter(|(rank, _)| !unrecorded.contains(rank))
            .map(|(&rank, pod)| WorkerStatus {
                rank,
                pod: pod_name(pod),
                node: pod.spec.node_name.clone(),
                phase: census
                    .states
                    .get(&rank)
                    .map_or(WorkerPhase::Pending, WorkerState::phase)
                    .as_str()
                    .to_owned(),
                reason: census
                    .states
                    .get(&rank)
                    .and_then(|s| s.reason())
                    .map(str::to_owned),
            })
            .collect();
        // A worker recorded as succeeded whose pod is gone stays recorded until a restart
        // clears the list, so that it is not taken for a preemption after a crash; a rank the
        // spec does not have (status is input too) is dropped.
        let succeeded = self.st.succeeded_ranks();
        for rank in succeeded.iter().filter(|r| *r < view.workers) {
            if !census.current.contains_key(&rank) {
                workers.push(WorkerStatus {
                    rank,
                    pod: view.job.pod_name(rank),
                    node: None,
                    phase: WorkerPhase::Succeeded.as_str().to_owned(),
                    reason: None,
                });
            }
        }
        workers.sort_by_key(|w| w.rank);
        workers.dedup_by_key(|w| w.rank);
        let (listed, summary) = compact_workers(self.st.attempt, workers);
        self.st.workers = listed;
        self.st.worker_summary = summary;
    }
}

/// `status.workers` within bounds: every worker of a gang of up to [`MAX_WORKER_ENTRIES`]; of
/// a larger one, the workers that are not running first (failed, preempted, pending,
/// succeeded), then by rank; each reason cut to [`MAX_REASON_CHARS`] characters. The summary
/// counts every worker of `attempt` and records every rank seen, which is what later rounds
/// decide on ([`TrainingJobStatus::recorded_ranks`]); none when there is no worker.
fn compact_workers(
    attempt: u32,
    mut workers: Vec<WorkerStatus>,
) -> (Vec<WorkerStatus>, Option<WorkerSummary>) {
    if workers.is_empty() {
        return (workers, None);
    }
    let mut summary = WorkerSummary {
        attempt,
        ..WorkerSummary::default()
    };
    let mut seen = RankSet::default();
    let mut succeeded = RankSet::default();
    for w in &mut workers {
        seen.insert(w.rank);
        let count = match WorkerPhase::parse(&w.phase) {
            Some(WorkerPhase::Running) => &mut summary.running,
            Some(WorkerPhase::Succeeded) => {
                succeeded.insert(w.rank);
                &mut summary.succeeded
            }
            Some(WorkerPhase::Preempted) => &mut summary.preempted,
            Some(WorkerPhase::Failed) => &mut summary.failed,
            Some(WorkerPhase::Pending) | None => &mut summary.pending,
        };
        *count = count.saturating_add(1);
        if let Some(reason) = &mut w.reason {
            *reason = crate::model::condition::cut_to_chars(reason, MAX_REASON_CHARS);
        }
    }
    summary.seen_ranks = seen.to_string();
    summary.succeeded_ranks = succeeded.to_string();
    if workers.len() > MAX_WORKER_ENTRIES {
        let interest = |w: &WorkerStatus| match WorkerPhase::parse(&w.phase) {
            Some(WorkerPhase::Failed) => 0,
            Some(WorkerPhase::Preempted) => 1,
            Some(WorkerPhase::Pending) | None => 2,
            Some(WorkerPhase::Succeeded) => 3,
            Some(WorkerPhase::Running) => 4,
        };
        workers.sort_by_key(|w| (interest(w), w.rank));
        workers.truncate(MAX_WORKER_ENTRIES);
        workers.sort_by_key(|w| w.rank);
    }
    (workers, Some(summary))
}

/// When a pod already terminating is force-deleted: never on a Ready node whose kubelet
/// renews; at once when no node or kubelet will ever confirm the deletion; after the not-ready
/// timeout otherwise.
fn force_delete_at(view: &View<'_>, node_name: Option<&str>) -> Option<Timestamp> {
    let now = view.now;
    let lost =
        |n: &str| view.census.lost.contains_key(n) || view.observed.liveness.gone_for_good(n);
    if node_name.is_some_and(lost) {
        // Lost by the liveness rule (silent, and its ranks quiet or two renewals missed): its
        // kubelet will confirm nothing, and the checkpoint is fenced against the trainers it
        // may still run (docs/env-contract.md). A node merely late stays graceful.
        return Some(now);
    }
    match node_name.map(|n| view.observed.node(n)) {
        None | Some(None) => Some(now),
        Some(Some(node)) => match nodes::readiness(node) {
            nodes::Readiness::Ready => None,
            nodes::Readiness::NotReady { since } => {
                let since = since.unwrap_or(now);
                // No kubelet is there to deliver SIGTERM, so the grace period buys nothing.
                Some(
                    since
                        .saturating_add(view.classifier.node_not_ready_timeout)
                        .unwrap_or(since),
                )
            }
        },
    }
}
