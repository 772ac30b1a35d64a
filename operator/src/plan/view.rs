//! What one decision reads: the job, the cluster and the status it started from, built once
//! and never changed by the phases; and the census of the attempt the round works on.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::model::cached_pod::CachedPod;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;

use super::observed::{Observed, is_finished};
use super::supervised;
use crate::build::pods::{is_standby, label_u32};
use crate::config::OperatorConfig;
use crate::model::crd::{LABEL_ATTEMPT, LABEL_RANK, Phase, TrainingJobStatus};
use crate::model::liveness::{self, Reports, Silence};
use crate::model::lost_peer;
use crate::model::preemption::{self, ClassifierConfig, WorkerState, min_time};
use crate::model::validate::ValidJob;
use trainyard_api::ranks::RankSet;

/// The inputs of one decision.
pub(crate) struct View<'a> {
    pub job: &'a ValidJob,
    pub observed: &'a Observed,
    /// The status the round started from.
    pub current: &'a TrainingJobStatus,
    pub config: &'a OperatorConfig,
    pub classifier: ClassifierConfig,
    pub now: Timestamp,
    pub generation: Option<i64>,
    /// Workers of the attempt the round started in: the spec's, or fewer after an elastic job
    /// shrank ([`attempt_workers`]).
    pub workers: u32,
    /// The attempt this round works on and its workers.
    pub census: Census<'a>,
}

impl<'a> View<'a> {
    pub fn new(
        job: &'a ValidJob,
        observed: &'a Observed,
        current: &'a TrainingJobStatus,
        config: &'a OperatorConfig,
    ) -> Self {
        let mut view = Self {
            job,
            observed,
            current,
            config,
            classifier: ClassifierConfig::from_config(config),
            now: observed.now,
            generation: job.generation,
            workers: attempt_workers(job, current),
            census: Census::default(),
        };
        // A resume in this round starts the next attempt, with no worker recorded yet.
        let (attempt, recorded) = if resumes_as_new_attempt(job, current) {
            (current.attempt.saturating_add(1), RecordedRanks::default())
        } else {
            (current.attempt, RecordedRanks::of(current))
        };
        view.census = Census::take(&view, attempt, &recorded);
        view
    }
}

/// The workers of the attempt `status` records: `spec.workers`, unless the job is elastic and
/// its gang shrank (`status.worldSize`, never more than the spec asks for).
pub fn attempt_workers(job: &ValidJob, status: &TrainingJobStatus) -> u32 {
    let full = job.spec.workers;
    match (&job.spec.elastic, status.world_size) {
        (Some(_), Some(size)) => size.clamp(1, full),
        _ => full,
    }
}

/// Whether this round resumes a suspended job that ran before, as a new attempt (see the
/// resume phase).
pub(crate) fn resumes_as_new_attempt(job: &ValidJob, current: &TrainingJobStatus) -> bool {
    current.phase == Some(Phase::Suspended) && !job.spec.suspend && current.start_time.is_some()
}

/// The pod of `rank` in the attempt of `st`, placed by `placement`: what the create phase
/// creates, and whose environment a kept pod's supervisor starts the attempt with.
pub(super) fn worker_pod(
    view: &View<'_>,
    st: &TrainingJobStatus,
    rank: u32,
    placement: &crate::model::placement::Placement,
) -> Pod {
    let start = crate::build::pods::AttemptStart::of(
        st.attempt,
        st.last_restart.as_ref().map(|l| l.reason),
        view.observed.claim.as_ref().is_some_and(|c| c.inherited),
    );
    let seat = crate::build::pods::Seat {
        rank,
        attempt: st.attempt,
        workers: attempt_workers(view.job, st),
    };
    crate::build::pods::desired_pod(
        view.job,
        seat,
        start,
        st.resume_point.as_ref().map(|r| r.file.as_str()),
        placement,
        view.config.progress_channel.as_ref(),
    )
}

/// The nodes lost to the attempt whose trainers report ([`liveness::lost_nodes`]): judged for
/// the pods of that attempt still running, whichever attempt the round works on, so that a
/// pod of an attempt just ended is removed without its kubelet only where the rule says so.
/// Lease renewals that stop wake no job by themselves: the controller's silence triggers do.
fn judge_heartbeats(view: &View<'_>) -> BTreeMap<String, String> {
    let observed = view.observed;
    let Some(progress) = observed.progress.as_ref() else {
        return BTreeMap::new();
    };
    let ranks: Vec<(u32, &str)> = observed
        .pods
        .iter()
        .filter(|p| label_u32(p.as_ref(), LABEL_ATTEMPT) == Some(progress.attempt))
        .filter(|p| !is_finished(p))
        .filter_map(|p| Some((label_u32(p.as_ref(), LABEL_RANK)?, p.node_name()?)))
        .collect();
    let reported: Vec<(u32, Timestamp)> =
        reported(observed, progress.attempt).into_iter().collect();
    let reports = Reports {
        ranks: &reported,
        cadence: progress.report_cadence,
        channel_trouble_at: progress.channel_refused_at,
    };
    liveness::lost_nodes(&observed.liveness, &ranks, Some(reports), view.now)
}

/// When each rank of `attempt` last reported progress.
fn reported(observed: &Observed, attempt: u32) -> BTreeMap<u32, Timestamp> {
    observed
        .progress
        .iter()
        .filter(|p| p.attempt == attempt)
        .flat_map(|p| p.ranks.iter().map(|r| (r.rank, r.reported_at)))
        .collect()
}

/// The pods of the attempt a round works on, by rank, and how each worker stands. Built by
/// the classify phase: a resume earlier in the round moves the attempt.
#[derive(Default)]
pub(crate) struct Census<'a> {
    /// Pods of the current attempt, by rank.
    pub current: BTreeMap<u32, &'a Arc<CachedPod>>,
    /// Everything else: an older attempt, or a rank the spec no longer has. It must be gone
    /// before new pods start.
    pub old: Vec<&'a Arc<CachedPod>>,
    /// Pods of an older attempt kept for this one (`status.lastRestart.inPlace`), by rank,
    /// until they carry this attempt's label: their supervisors stop the old attempt and start
    /// this one ([`super::in_place`]).
    pub kept: BTreeMap<u32, &'a Arc<CachedPod>>,
    /// Standbys: replacements created ahead of a termination notice for the next attempt
    /// (labelled with it), by rank, while this attempt runs ([`super::standby`]).
    pub ahead: BTreeMap<u32, &'a Arc<CachedPod>>,
    /// Each current rank's state, including recorded workers whose pods are gone.
    pub states: BTreeMap<u32, WorkerState>,
    /// When a state may change without a watch event.
    pub recheck_at: Option<Timestamp>,
    /// Nodes whose kubelet went silent ([`liveness::Heartbeats::silent`]): no new pod goes
    /// there.
    pub silent: BTreeMap<String, Silence>,
    /// Nodes lost to the reporting attempt ([`liveness::lost_nodes`]), with the detail: their
    /// running workers are preempted, and a pod deleted there is removed at once.
    pub lost: BTreeMap<String, String>,
    /// When each rank of this attempt last reported progress (the operator's clock).
    pub reported: BTreeMap<u32, Timestamp>,
}

impl Census<'_> {
    /// When `node`, if it is down (its kubelet silent, or the Node NotReady, unreachable or
    /// under a termination taint: [`lost_peer::node_down`]), last showed it was alive
    /// ([`liveness::last_alive`]): its kubelet's last renewal, or a later report of a rank of
    /// this attempt whose pod runs there. Whichever rule caught the node first, its work
    /// stopped then. None when it is up, or no renewal of it was seen.
    pub fn last_alive(&self, view: &View<'_>, node: &str) -> Option<Timestamp> {
        let observed = view.observed;
        let down = self.silent.contains_key(node)
            || observed.node(node).is_some_and(|n| {
                lost_peer::node_down(n, &view.classifier.termination_taints).is_some()
            });
        let renewed = observed.liveness.last_renewal(node).filter(|_| down)?;
        let on_node = |rank: &u32| {
            self.current
                .get(rank)
                .is_some_and(|pod| pod.node_name() == Some(node))
        };
        let reported = self
            .reported
            .iter()
            .filter(|(rank, _)| on_node(rank))
            .map(|(_, at)| *at);
        Some(liveness::last_alive(renewed, reported))
    }
}

/// The observed pods by their place in attempt `attempt` ([`Census`]).
#[derive(Default)]
struct Split<'a> {
    current: BTreeMap<u32, &'a Arc<CachedPod>>,
    old: Vec<&'a Arc<CachedPod>>,
    kept: BTreeMap<u32, &'a Arc<CachedPod>>,
    ahead: BTreeMap<u32, &'a Arc<CachedPod>>,
}

impl<'a> Split<'a> {
    fn of(view: &View<'a>, attempt: u32, kept_for: &RankSet) -> Self {
        let mut split = Self::default();
        for pod in &view.observed.pods {
            match (
                label_u32(pod.as_ref(), LABEL_ATTEMPT),
                label_u32(pod.as_ref(), LABEL_RANK),
            ) {
                (Some(a), Some(r)) if a == attempt && r < view.workers => {
                    split.current.insert(r, pod);
                }
                (Some(a), Some(r)) if a < attempt && r < view.workers && kept_for.contains(r) => {
                    split.kept.insert(r, pod);
                }
                (Some(a), Some(r))
                    if a == attempt.saturating_add(1)
                        && r < view.workers
                        && is_standby(pod.as_ref()) =>
                {
                    split.ahead.insert(r, pod);
                }
                _ => split.old.push(pod),
            }
        }
        split
    }
}

/// The ranks of an attempt the status records: seen, and of those, succeeded.
#[derive(Default)]
struct RecordedRanks {
    seen: RankSet,
    succeeded: RankSet,
}

impl RecordedRanks {
    fn of(status: &TrainingJobStatus) -> Self {
        Self {
            seen: status.recorded_ranks(),
            succeeded: status.succeeded_ranks(),
        }
    }
}

impl<'a> Census<'a> {
    /// Splits the pods by attempt `attempt` and classifies its workers; `recorded` is what
    /// the status recorded of them.
    fn take(view: &View<'a>, attempt: u32, recorded: &RecordedRanks) -> Self {
        let observed = view.observed;
        let kept_for = supervised::kept_for(view.current, attempt);
        let Split {
            current,
            old,
            kept,
            ahead,
        } = Split::of(view, attempt, &kept_for);
        let mut states: BTreeMap<u32, WorkerState> = BTreeMap::new();
        let mut recheck_at = None;
        for (&rank, pod) in &current {
            let c = preemption::classify(pod, observed.node_view(pod), &view.classifier, view.now);
            recheck_at = min_time(recheck_at, c.recheck_at);
            // A supervisor holds its container while it waits for the operator: its report of
            // the trainer's exit is the end a container without one would show.
            let state = match (c.state, supervised::exit_reported(observed, pod, attempt)) {
                (WorkerState::Running { .. } | WorkerState::Pending { .. }, Some(code)) => {
                    WorkerState::Failed(format!(
                        "the trainer exited with code {code} (reported by its supervisor)"
                    ))
                }
                // A kept pod, or a standby, runs this attempt once its supervisor says it
                // started it.
                (WorkerState::Running { .. }, None)
                    if (kept_for.contains(rank) || is_standby(pod.as_ref()))
                        && !supervised::started(observed, pod, attempt) =>
                {
                    WorkerState::Pending { reason: None }
                }
                (state, _) => state,
            };
            states.insert(rank, state);
        }
        let silent = observed.liveness.silent.clone();
        let lost = judge_heartbeats(view);
        // With a failed rank, the lost-peer rule judges the silent node (and names the
        // failure it caused).
        let failed = states.values().any(|s| matches!(s, WorkerState::Failed(_)));
        for (rank, pod) in current.iter().filter(|_| !failed) {
            let detail = pod.node_name().and_then(|n| lost.get(n));
            if let (Some(detail), Some(state)) = (detail, states.get_mut(rank))
                && matches!(
                    state,
                    WorkerState::Running { .. } | WorkerState::Pending { .. }
                )
            {
                *state = WorkerState::Preempted(detail.clone());
            }
        }
        for rank in recorded.seen.iter() {
            if rank < view.workers && !states.contains_key(&rank) {
                let state = if recorded.succeeded.contains(rank) {
                    WorkerState::Succeeded
                } else {
                    WorkerState::Preempted(format!(
                        "pod {} disappeared without trainyard deleting it",
                        view.job.pod_name(rank)
                    ))
                };
                states.insert(rank, state);
            }
        }
        Self {
            current,
            old,
            kept,
            ahead,
            states,
            recheck_at,
            silent,
            lost,
            reported: reported(observed, attempt),
        }
    }

    /// Ranks the spec asks for that have no pod of this attempt, nor one kept for it.
    pub fn missing(&self, workers: u32) -> Vec<u32> {
        (0..workers)
            .filter(|r| !self.current.contains_key(r) && !self.kept.contains_key(r))
            .collect()
    }

    /// Whether nothing of an older attempt runs any more, so that this one may start: no pod of
    /// one is left, or every pod left is being deleted and its supervisor said, after the
    /// attempt's processes were gone, that nothing of it runs there (its teardown then costs
    /// the next attempt nothing: make before break). Only while every rank has its pod (none
    /// waits to be created under a name a pod being deleted may still hold), and never for
    /// rank 0's, whose hostname the next attempt's master takes: the old pod's address stays
    /// behind the name until the pod is gone.
    pub fn old_attempt_over(&self, view: &View<'_>, attempt: u32) -> bool {
        self.old.is_empty()
            || (self.missing(view.workers).is_empty()
                && self.old.iter().all(|pod| {
                    pod.metadata.deletion_timestamp.is_some()
                        && label_u32(pod.as_ref(), LABEL_RANK).is_some_and(|rank| rank != 0)
                        && supervised::stopped_before(view.observed, pod, attempt)
                }))
    }

    /// Whether a pod of this attempt waits for a node.
    pub fn any_unscheduled(&self) -> bool {
        self.current.values().any(|p| p.node_name().is_none())
    }
}
