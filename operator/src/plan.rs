//! The decision step: from a validated job, what the cluster looks like and the current
//! status, compute the next status, the actions that move the cluster towards it, and the
//! Events that describe the transition.
//!
//! Everything that must not happen twice (counting a preemption, bumping the attempt) is a
//! status transition, and every action is idempotent and derived again from status plus
//! observation on the next round. The controller persists a status that deletes or restarts
//! before acting on it, and sends creates together with the status write (the write order is
//! stated once, in `controller/executor.rs`). So a crash between any two steps repeats
//! actions, never decisions:
//! - pods have deterministic names (`<job>-worker-<rank>`), so a repeated create cannot duplicate;
//! - the next attempt's pods are created only after every older pod is gone;
//! - only pods recorded in `status.workers` can "disappear", so a pod the cache has not seen
//!   yet is never mistaken for a preempted one.

use std::collections::BTreeMap;
use std::sync::Arc;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ContainerStatus, Node, PersistentVolumeClaim, Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::config::OperatorConfig;
use crate::crd::{
    JobCondition, LABEL_ATTEMPT, LABEL_RANK, LastRestart, Phase, RestartReason, TrainingJobStatus,
    WorkerStatus,
};
use crate::lost_peer::{self, SilentPeer, Verdict};
use crate::ownership::Foreign;
use crate::placement::{self, Placement};
use crate::preemption::{self, ClassifierConfig, NodeView, WorkerState, min_time};
use crate::validate::{InvalidSpec, ValidJob};
use crate::{nodes, pods, pvc, service};

/// Condition types.
pub mod condition {
    /// Every worker runs.
    pub const RUNNING: &str = "Running";
    /// A gang restart is under way.
    pub const RESTARTING: &str = "Restarting";
    /// Every trainer exited 0.
    pub const SUCCEEDED: &str = "Succeeded";
    /// The job failed for good.
    pub const FAILED: &str = "Failed";
    /// No node can take the workers.
    pub const UNSCHEDULABLE: &str = "Unschedulable";
    /// The spec cannot run as written.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// The API server rejected a write the job needs (see [`crate::rejection`]).
    pub const WRITE_REJECTED: &str = "WriteRejected";
    /// An object holding one of the job's names is not the job's (see [`crate::ownership`]).
    pub const NAME_CONFLICT: &str = "NameConflict";
}

/// Cap of the exponential failure backoff.
pub const MAX_BACKOFF: SignedDuration = SignedDuration::from_secs(600);
/// How often a job that waits on the cluster (missing claim, no GPU node) is looked at again.
pub const CLUSTER_WAIT_RECHECK: SignedDuration = SignedDuration::from_secs(60);

/// What the cluster looks like to one reconcile.
#[derive(Clone, Debug)]
pub struct Observed {
    /// The job's pods (any attempt) owned by it.
    pub pods: Vec<Arc<Pod>>,
    /// Objects that hold one of the job's names (a pod's, the Service's, the created PVC's)
    /// but are not the job's ([`crate::ownership::foreign`]).
    pub foreign: Vec<Foreign>,
    /// Every node.
    pub nodes: Vec<Arc<Node>>,
    /// The kubelets' Leases in `kube-node-lease` (empty when the operator may not read them).
    pub node_leases: Vec<Arc<Lease>>,
    /// Whether the checkpoint PVC exists: the job's own, or the `existingClaim` it mounts.
    pub claim_exists: bool,
    /// Whether the job's own rendezvous Service exists.
    pub service_exists: bool,
    /// The time of this reconcile.
    pub now: Timestamp,
}

impl Observed {
    fn node(&self, name: &str) -> Option<&Node> {
        self.nodes
            .iter()
            .find(|n| n.metadata.name.as_deref() == Some(name))
            .map(|n| n.as_ref())
    }

    fn node_view<'a>(&'a self, pod: &'a Pod) -> NodeView<'a> {
        match pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
            None => NodeView::Unscheduled,
            Some(n) => match self.node(n) {
                Some(node) => NodeView::Present(node),
                None => NodeView::Missing(n),
            },
        }
    }

    fn node_refs(&self) -> Vec<&Node> {
        self.nodes.iter().map(|n| n.as_ref()).collect()
    }
}

/// Something the controller must do (in the write order of `controller/executor.rs`).
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Create the rendezvous Service (AlreadyExists means it is there: never adopted).
    CreateService(Box<Service>),
    /// Create the checkpoint PVC (AlreadyExists means it is there: never adopted).
    CreatePvc(Box<PersistentVolumeClaim>),
    /// Create a worker pod (AlreadyExists means a previous round did it).
    CreatePod(Box<Pod>),
    /// Delete a pod with its grace period, so the trainer gets SIGTERM and can checkpoint.
    DeletePod {
        /// Pod name.
        name: String,
        /// Precondition: only this incarnation.
        uid: Option<String>,
    },
    /// Delete a pod with grace period 0: its containers have all stopped, or it is stuck
    /// terminating on a lost node.
    ForceDeletePod {
        /// Pod name.
        name: String,
        /// Precondition: only this incarnation.
        uid: Option<String>,
    },
}

impl Action {
    /// Whether the action deletes a pod.
    pub fn deletes(&self) -> bool {
        matches!(self, Self::DeletePod { .. } | Self::ForceDeletePod { .. })
    }
}

/// Severity of an Event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// Normal.
    Normal,
    /// Warning.
    Warning,
}

/// A Kubernetes Event to publish on the TrainingJob.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobEvent {
    /// Normal or Warning.
    pub kind: EventKind,
    /// CamelCase reason.
    pub reason: String,
    /// Human-readable note.
    pub note: String,
}

impl JobEvent {
    fn normal(reason: &str, note: impl Into<String>) -> Self {
        Self {
            kind: EventKind::Normal,
            reason: reason.to_owned(),
            note: note.into(),
        }
    }
    fn warning(reason: &str, note: impl Into<String>) -> Self {
        Self {
            kind: EventKind::Warning,
            reason: reason.to_owned(),
            note: note.into(),
        }
    }
}

/// The outcome of one decision.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The status to write (before the actions when they delete or restart; see the write
    /// order in `controller/executor.rs`).
    pub status: TrainingJobStatus,
    /// What to do.
    pub actions: Vec<Action>,
    /// Events describing transitions.
    pub events: Vec<JobEvent>,
    /// Look again at this time even if nothing changes.
    pub requeue_at: Option<Timestamp>,
    /// A gang restart was decided in this round.
    pub restart: Option<RestartReason>,
    /// The first pods of this attempt are created in this round.
    pub creates_attempt: Option<u32>,
}

/// Sets a condition, moving lastTransitionTime only when the status flips.
pub fn set_condition(
    conditions: &mut Vec<JobCondition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    now: Timestamp,
    generation: Option<i64>,
) {
    let status_str = if status { "True" } else { "False" };
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            if c.status != status_str {
                c.status = status_str.to_owned();
                c.last_transition_time = Some(Time(now));
            }
            c.reason = reason.to_owned();
            c.message = message.to_owned();
            c.observed_generation = generation;
        }
        None => conditions.push(JobCondition {
            type_: type_.to_owned(),
            status: status_str.to_owned(),
            reason: reason.to_owned(),
            message: message.to_owned(),
            last_transition_time: Some(Time(now)),
            observed_generation: generation,
        }),
    }
}

/// Whether a condition is currently True.
pub fn condition_is_true(conditions: &[JobCondition], type_: &str) -> bool {
    conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == "True")
}

/// Delay before the restart after the `failures`-th failure: base × 2^(failures-1), capped at 10 minutes.
pub fn failure_backoff(base_seconds: u32, failures: u32) -> SignedDuration {
    if base_seconds == 0 || failures == 0 {
        return SignedDuration::ZERO;
    }
    let exp = failures.saturating_sub(1).min(20);
    let secs = u64::from(base_seconds).saturating_mul(1u64 << exp);
    SignedDuration::from_secs(i64::try_from(secs).unwrap_or(i64::MAX)).min(MAX_BACKOFF)
}

/// The status for a job whose spec cannot run: condition InvalidSpec, nothing else changes.
pub fn invalid_status(
    current: &TrainingJobStatus,
    err: &InvalidSpec,
    generation: Option<i64>,
    now: Timestamp,
) -> (TrainingJobStatus, Vec<JobEvent>) {
    let mut st = current.clone();
    let events = mark_invalid(&mut st, &current.conditions, err, generation, now);
    (st, events)
}

fn mark_invalid(
    st: &mut TrainingJobStatus,
    before: &[JobCondition],
    err: &InvalidSpec,
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<JobEvent> {
    let message = err.to_string();
    let already = before
        .iter()
        .any(|c| c.type_ == condition::INVALID_SPEC && c.status == "True" && c.message == message);
    set_condition(
        &mut st.conditions,
        condition::INVALID_SPEC,
        true,
        "InvalidSpec",
        &message,
        now,
        generation,
    );
    st.observed_generation = generation;
    st.phase.get_or_insert(Phase::Pending);
    if already {
        Vec::new()
    } else {
        vec![JobEvent::warning("InvalidSpec", message)]
    }
}

/// The condition `NameConflict`: True, with a Warning Event when its message changes, while
/// objects of the job's names are someone else's; False once they are gone.
fn report_name_conflicts(
    st: &mut TrainingJobStatus,
    before: &[JobCondition],
    foreign: &[Foreign],
    now: Timestamp,
    generation: Option<i64>,
) -> Vec<JobEvent> {
    if foreign.is_empty() {
        if condition_is_true(&st.conditions, condition::NAME_CONFLICT) {
            set_condition(
                &mut st.conditions,
                condition::NAME_CONFLICT,
                false,
                "NamesFree",
                "",
                now,
                generation,
            );
        }
        return Vec::new();
    }
    let objects: Vec<String> = foreign.iter().map(Foreign::to_string).collect();
    let message = format!(
        "names this TrainingJob needs are held by objects that are not its own: {}; trainyard \
         does not change, use or delete them, and creates no workers while they are there \
         (delete or rename them, or rename the job; spec.checkpoint.existingClaim mounts a PVC \
         of your own)",
        objects.join(", ")
    );
    let already = before
        .iter()
        .any(|c| c.type_ == condition::NAME_CONFLICT && c.status == "True" && c.message == message);
    set_condition(
        &mut st.conditions,
        condition::NAME_CONFLICT,
        true,
        "NameTaken",
        &message,
        now,
        generation,
    );
    if already {
        Vec::new()
    } else {
        vec![JobEvent::warning("NameConflict", message)]
    }
}

/// A numeric label of a pod (`trainyard.dev/rank`, `trainyard.dev/attempt`).
pub(crate) fn label_u32(pod: &Pod, key: &str) -> Option<u32> {
    pod.metadata.labels.as_ref()?.get(key)?.parse().ok()
}

fn pod_name(pod: &Pod) -> String {
    pod.metadata.name.clone().unwrap_or_default()
}

/// Whether a pod's containers have all stopped (it no longer holds its GPUs): its phase is
/// final, or every container has terminated and the kubelet has not said so in the phase yet.
/// A pod whose trainer exited while a sidecar (or a native sidecar init container) still runs
/// is not finished.
fn is_finished(pod: &Pod) -> bool {
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return true;
    }
    let terminated = |c: &ContainerStatus| c.state.as_ref().is_some_and(|s| s.terminated.is_some());
    let statuses = status.container_statuses.as_deref().unwrap_or_default();
    let containers = pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default();
    !containers.is_empty()
        && containers
            .iter()
            .all(|c| statuses.iter().any(|s| s.name == c.name && terminated(s)))
        && status
            .init_container_statuses
            .iter()
            .flatten()
            .chain(status.ephemeral_container_statuses.iter().flatten())
            .all(terminated)
}

/// Deletes pods gracefully; removes at once those whose containers have all stopped (the
/// kubelet may keep such a pod's object for tens of seconds while it tears down volumes or
/// retries a failed kill, and the pod's name would block the next attempt while its GPUs are
/// already free: the kubelet does not count a pod in a final phase as holding devices), and
/// force-deletes those stuck terminating on a lost node.
fn remove_pods<'a>(
    pods_: impl Iterator<Item = &'a Arc<Pod>>,
    observed: &Observed,
    classifier: &ClassifierConfig,
    actions: &mut Vec<Action>,
    events: &mut Vec<JobEvent>,
    requeue_at: &mut Option<Timestamp>,
) {
    let now = observed.now;
    for pod in pods_ {
        let name = pod_name(pod);
        let uid = pod.metadata.uid.clone();
        if is_finished(pod) {
            actions.push(Action::ForceDeletePod { name, uid });
            continue;
        }
        if pod.metadata.deletion_timestamp.is_none() {
            actions.push(Action::DeletePod { name, uid });
            continue;
        }
        let node_name = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        let force_at = match node_name.map(|n| (n, observed.node(n))) {
            // Nothing will ever confirm the deletion: no kubelet, or no node.
            None | Some((_, None)) => Some(now),
            Some((_, Some(node))) => match nodes::readiness(node) {
                nodes::Readiness::Ready => None,
                nodes::Readiness::NotReady { since } => {
                    let since = since.unwrap_or(now);
                    // No kubelet is there to deliver SIGTERM, so the grace period buys nothing.
                    Some(
                        since
                            .saturating_add(classifier.node_not_ready_timeout)
                            .unwrap_or(since),
                    )
                }
            },
        };
        match force_at {
            Some(at) if now >= at => {
                events.push(JobEvent::warning(
                    "ForceDeleted",
                    format!(
                        "pod {name} was stuck terminating on lost node {}",
                        node_name.unwrap_or("(none)")
                    ),
                ));
                actions.push(Action::ForceDeletePod { name, uid });
            }
            Some(at) => *requeue_at = min_time(*requeue_at, Some(at)),
            None => {}
        }
    }
}

/// The [`lost_peer`] rule for a round whose problems are failures only.
fn judge_lost_peer(
    current_pods: &BTreeMap<u32, &Arc<Pod>>,
    states: &BTreeMap<u32, WorkerState>,
    observed: &Observed,
    classifier: &ClassifierConfig,
) -> Verdict {
    let now = observed.now;
    let failed: Vec<&Arc<Pod>> = states
        .iter()
        .filter(|(_, s)| matches!(s, WorkerState::Failed(_)))
        .filter_map(|(r, _)| current_pods.get(r).copied())
        .collect();
    let failed_at = failed
        .iter()
        .map(|p| lost_peer::failed_at(p, now))
        .min()
        .unwrap_or(now);
    let node_of = |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.clone());
    let failed_nodes: Vec<String> = failed.iter().filter_map(|p| node_of(p)).collect();
    let peers: Vec<SilentPeer<'_>> = states
        .iter()
        .filter(|(_, s)| matches!(s, WorkerState::Running { .. } | WorkerState::Pending { .. }))
        .filter_map(|(r, _)| current_pods.get(r).map(|p| (*r, p)))
        .map(|(rank, pod)| {
            let node = observed.node_view(pod);
            let heartbeat = match node {
                NodeView::Present(n) => {
                    lost_peer::heartbeat(observed.node_leases.iter().map(|l| &**l), nodes::name(n))
                }
                _ => None,
            };
            SilentPeer {
                rank,
                node,
                heartbeat,
                beside_failure: node_of(pod).is_some_and(|n| failed_nodes.contains(&n)),
            }
        })
        .collect();
    lost_peer::judge(
        failed_at,
        &peers,
        &classifier.termination_taints,
        classifier.lost_peer_window,
        now,
    )
}

/// Decides the next status and actions.
pub fn decide(
    job: &ValidJob,
    observed: &Observed,
    current: &TrainingJobStatus,
    config: &OperatorConfig,
) -> Plan {
    let mut marked_invalid = false;
    let mut plan = decide_inner(job, observed, current, config, &mut marked_invalid);
    if !marked_invalid && condition_is_true(&plan.status.conditions, condition::INVALID_SPEC) {
        set_condition(
            &mut plan.status.conditions,
            condition::INVALID_SPEC,
            false,
            "Valid",
            "",
            observed.now,
            job.generation,
        );
    }
    plan
}

fn decide_inner(
    job: &ValidJob,
    observed: &Observed,
    current: &TrainingJobStatus,
    config: &OperatorConfig,
    marked_invalid: &mut bool,
) -> Plan {
    let now = observed.now;
    let gen_ = job.generation;
    let classifier = ClassifierConfig::from_config(config);
    let mut st = current.clone();
    st.observed_generation = gen_;
    let mut actions = Vec::new();
    let mut events = Vec::new();
    let mut requeue_at = None;
    let mut creates_attempt = None;
    let workers = job.spec.workers;
    let phase = st.phase.unwrap_or(Phase::Pending);
    st.phase = Some(phase);
    st.checkpoint_claim = Some(job.claim_name.clone());

    let finish = |st: TrainingJobStatus,
                  actions: Vec<Action>,
                  events: Vec<JobEvent>,
                  requeue_at: Option<Timestamp>,
                  restart: Option<RestartReason>,
                  creates_attempt: Option<u32>| Plan {
        status: st,
        actions,
        events,
        requeue_at,
        restart,
        creates_attempt,
    };

    // Final phases: stop what still runs (after a failure, or a sidecar beside a trainer that
    // succeeded) so that it gives its GPUs back; leave completed pods for their logs.
    if phase.is_terminal() {
        let running = observed.pods.iter().filter(|p| !is_finished(p));
        remove_pods(
            running,
            observed,
            &classifier,
            &mut actions,
            &mut events,
            &mut requeue_at,
        );
        return finish(st, actions, events, requeue_at, None, None);
    }

    // Suspend: no pods, and no deadline running (see the resume below).
    if job.spec.suspend {
        if phase != Phase::Suspended {
            events.push(JobEvent::normal(
                "Suspended",
                "spec.suspend is true: deleting the workers",
            ));
        }
        st.phase = Some(Phase::Suspended);
        st.workers.clear();
        set_condition(
            &mut st.conditions,
            condition::RUNNING,
            false,
            "Suspended",
            "spec.suspend is true",
            now,
            gen_,
        );
        let all = observed.pods.iter();
        remove_pods(
            all,
            observed,
            &classifier,
            &mut actions,
            &mut events,
            &mut requeue_at,
        );
        return finish(st, actions, events, requeue_at, None, None);
    }
    let mut resumed = None;
    if phase == Phase::Suspended {
        match resume(&mut st, now, &mut events) {
            Ok(r) => resumed = r,
            Err(message) => {
                fail(
                    &mut st,
                    ATTEMPT_LIMIT_REACHED,
                    &message,
                    now,
                    gen_,
                    &mut events,
                );
                return finish(st, actions, events, requeue_at, None, None);
            }
        }
    }
    // A resume is decided in this round whatever else is: the controller persists it first.
    let finish = |st, actions, events, requeue_at, restart: Option<RestartReason>, creates| {
        finish(
            st,
            actions,
            events,
            requeue_at,
            restart.or(resumed),
            creates,
        )
    };

    // Deadline.
    if let (Some(limit), Some(start)) = (job.spec.active_deadline_seconds, st.start_time.as_ref()) {
        let deadline = start
            .0
            .saturating_add(SignedDuration::from_secs(limit))
            .unwrap_or(start.0);
        if now >= deadline {
            let message = format!("activeDeadlineSeconds ({limit}s) passed");
            fail(
                &mut st,
                "DeadlineExceeded",
                &message,
                now,
                gen_,
                &mut events,
            );
            let running = observed.pods.iter().filter(|p| !is_finished(p));
            remove_pods(
                running,
                observed,
                &classifier,
                &mut actions,
                &mut events,
                &mut requeue_at,
            );
            return finish(st, actions, events, requeue_at, None, None);
        }
        requeue_at = min_time(requeue_at, Some(deadline));
    }

    // Pods of the current attempt, by rank; everything else is from an older attempt (or a
    // rank the spec no longer has) and must be gone before new pods start.
    let mut current_pods: BTreeMap<u32, &Arc<Pod>> = BTreeMap::new();
    let mut old_pods: Vec<&Arc<Pod>> = Vec::new();
    for pod in &observed.pods {
        match (label_u32(pod, LABEL_ATTEMPT), label_u32(pod, LABEL_RANK)) {
            (Some(a), Some(r)) if a == st.attempt && r < workers => {
                current_pods.insert(r, pod);
            }
            _ => old_pods.push(pod),
        }
    }

    // Classify the current attempt's workers.
    let mut states: BTreeMap<u32, WorkerState> = BTreeMap::new();
    for (&rank, pod) in &current_pods {
        let c = preemption::classify(pod, observed.node_view(pod), &classifier, now);
        requeue_at = min_time(requeue_at, c.recheck_at);
        states.insert(rank, c.state);
    }
    for w in &st.workers {
        if w.rank < workers && !states.contains_key(&w.rank) {
            let state = if w.phase == "Succeeded" {
                WorkerState::Succeeded
            } else {
                WorkerState::Preempted(format!(
                    "pod {} disappeared without trainyard deleting it",
                    w.pod
                ))
            };
            states.insert(w.rank, state);
        }
    }

    let mut problems: Vec<(u32, &WorkerState)> = states
        .iter()
        .filter(|(_, s)| matches!(s, WorkerState::Preempted(_) | WorkerState::Failed(_)))
        .map(|(r, s)| (*r, s))
        .collect();
    // A preempted rank makes the others fail too (the collective breaks): preemption wins.
    let preempted = problems
        .iter()
        .any(|(_, s)| matches!(s, WorkerState::Preempted(_)));
    // Failures alone: was a peer's node lost under the ranks that still seem to run?
    let lost_peer = if problems.is_empty() || preempted {
        None
    } else {
        match judge_lost_peer(&current_pods, &states, observed, &classifier) {
            Verdict::Preemption(detail) => Some(detail),
            Verdict::Hold(at) => {
                requeue_at = min_time(requeue_at, Some(at));
                problems.clear();
                None
            }
            Verdict::Failure => None,
        }
    };
    if !problems.is_empty() {
        let preempted = preempted || lost_peer.is_some();
        let reason = if preempted {
            RestartReason::Preemption
        } else {
            RestartReason::Failure
        };
        let mut first = problems
            .iter()
            .filter(|(_, s)| !preempted || matches!(s, WorkerState::Preempted(_)));
        let detail = match (&lost_peer, problems.first()) {
            (Some(lost), Some((r, s))) => format!(
                "{lost}; worker {r} failed with it: {}",
                s.reason().unwrap_or_default()
            ),
            _ => first
                .next()
                .map(|(r, s)| format!("worker {r}: {}", s.reason().unwrap_or_default()))
                .unwrap_or_default(),
        };
        let more = problems.len() - 1;
        let detail = if more > 0 {
            format!("{detail} (and {more} more)")
        } else {
            detail
        };

        let (spent, budget, budget_name, counted, exceeded) = if preempted {
            st.preemptions = st.preemptions.saturating_add(1);
            (
                st.preemptions,
                job.spec.restart_policy.max_preemptions,
                "maxPreemptions",
                "preemptions",
                "PreemptionBudgetExceeded",
            )
        } else {
            st.failures = st.failures.saturating_add(1);
            (
                st.failures,
                job.spec.restart_policy.max_failures,
                "maxFailures",
                "failures",
                "FailureBudgetExceeded",
            )
        };
        events.push(JobEvent::warning(
            if preempted {
                "Preempted"
            } else {
                "WorkerFailed"
            },
            detail.clone(),
        ));
        let alive_pods = observed.pods.iter().filter(|p| !is_finished(p));
        let next_attempt = match st.attempt.checked_add(1) {
            _ if spent > budget => Err((
                exceeded,
                format!("{spent} {counted} exceed {budget_name}={budget}; last: {detail}"),
            )),
            None => Err((ATTEMPT_LIMIT_REACHED, attempt_limit_message(&detail))),
            Some(next) => Ok(next),
        };
        let next_attempt = match next_attempt {
            Ok(next) => next,
            Err((why, message)) => {
                fail(&mut st, why, &message, now, gen_, &mut events);
                record_workers(&mut st, workers, &current_pods, &states);
                remove_pods(
                    alive_pods,
                    observed,
                    &classifier,
                    &mut actions,
                    &mut events,
                    &mut requeue_at,
                );
                return finish(st, actions, events, requeue_at, None, None);
            }
        };
        st.attempt = next_attempt;
        st.phase = Some(Phase::Restarting);
        st.workers.clear();
        st.last_restart = Some(LastRestart {
            time: Time(now),
            reason,
            detail: detail.clone(),
        });
        let message = format!("attempt {} after {}: {detail}", st.attempt, reason.as_str());
        set_condition(
            &mut st.conditions,
            condition::RESTARTING,
            true,
            reason.as_str(),
            &message,
            now,
            gen_,
        );
        set_condition(
            &mut st.conditions,
            condition::RUNNING,
            false,
            reason.as_str(),
            &message,
            now,
            gen_,
        );
        let wait = if reason == RestartReason::Failure {
            let b = failure_backoff(job.spec.restart_policy.backoff_seconds, st.failures);
            format!(", after a {}s backoff", b.as_secs())
        } else {
            String::new()
        };
        events.push(JobEvent::normal(
            "Restarting",
            format!(
                "gang restart as attempt {} with RESUME_FROM set{wait}",
                st.attempt
            ),
        ));
        let (mode, fell_back) = placement::spot_mode(job, st.preemptions);
        let (_, fell_back_before) = placement::spot_mode(job, st.preemptions.saturating_sub(1));
        if reason == RestartReason::Preemption && fell_back && !fell_back_before {
            events.push(JobEvent::normal(
                "SpotFallback",
                format!(
                    "after {} preemptions later attempts run on on-demand nodes ({mode:?})",
                    st.preemptions
                ),
            ));
        }
        // Every pod is now from an older attempt: stop them all, then wait for them to go.
        remove_pods(
            observed.pods.iter(),
            observed,
            &classifier,
            &mut actions,
            &mut events,
            &mut requeue_at,
        );
        return finish(st, actions, events, requeue_at, Some(reason), None);
    }

    if workers > 0 && (0..workers).all(|r| states.get(&r) == Some(&WorkerState::Succeeded)) {
        st.phase = Some(Phase::Succeeded);
        st.completion_time = Some(Time(now));
        record_workers(&mut st, workers, &current_pods, &states);
        set_condition(
            &mut st.conditions,
            condition::SUCCEEDED,
            true,
            "AllWorkersSucceeded",
            "every trainer exited 0",
            now,
            gen_,
        );
        set_condition(
            &mut st.conditions,
            condition::RUNNING,
            false,
            "Succeeded",
            "every trainer exited 0",
            now,
            gen_,
        );
        set_condition(
            &mut st.conditions,
            condition::RESTARTING,
            false,
            "Succeeded",
            "",
            now,
            gen_,
        );
        events.push(JobEvent::normal(
            "Succeeded",
            format!("every trainer exited 0 (attempt {})", st.attempt),
        ));
        let running = observed.pods.iter().filter(|p| !is_finished(p));
        remove_pods(
            running,
            observed,
            &classifier,
            &mut actions,
            &mut events,
            &mut requeue_at,
        );
        return finish(st, actions, events, requeue_at, None, None);
    }

    // Older pods first: nothing new may meet an old rank at rendezvous.
    if !old_pods.is_empty() {
        remove_pods(
            old_pods.iter().copied(),
            observed,
            &classifier,
            &mut actions,
            &mut events,
            &mut requeue_at,
        );
        record_workers(&mut st, workers, &current_pods, &states);
        // Watch events normally wake us; this is only the safety net.
        requeue_at = min_time(
            requeue_at,
            Some(
                now.saturating_add(SignedDuration::from_secs(10))
                    .unwrap_or(now),
            ),
        );
        return finish(st, actions, events, requeue_at, None, None);
    }
    events.extend(report_name_conflicts(
        &mut st,
        &current.conditions,
        &observed.foreign,
        now,
        gen_,
    ));

    let missing: Vec<u32> = (0..workers)
        .filter(|r| !current_pods.contains_key(r))
        .collect();
    let any_unscheduled = current_pods
        .values()
        .any(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none());
    let node_refs = observed.node_refs();
    let mut placement_now: Option<Placement> = None;

    if !missing.is_empty() {
        // New pods would use the objects of the job's names: not while one is someone else's.
        if !observed.foreign.is_empty() {
            record_workers(&mut st, workers, &current_pods, &states);
            requeue_at = min_time(requeue_at, now.saturating_add(CLUSTER_WAIT_RECHECK).ok());
            return finish(st, actions, events, requeue_at, None, None);
        }
        // The one check that depends on the cluster, not the spec alone: a claim the user
        // names must exist. Nodes never make a spec invalid: a GPU pool scaled to zero (or to
        // smaller nodes) grows only once pods are Pending, so those get created and the
        // placement below says, in the Unschedulable condition, what no node offers yet.
        let cluster_invalid = (!job.creates_claim && !observed.claim_exists).then(|| InvalidSpec {
            field: "spec.checkpoint.existingClaim".to_owned(),
            message: format!(
                "PersistentVolumeClaim {:?} does not exist in namespace {}",
                job.claim_name, job.namespace
            ),
        });
        if let Some(err) = cluster_invalid {
            *marked_invalid = true;
            events.extend(mark_invalid(&mut st, &current.conditions, &err, gen_, now));
            record_workers(&mut st, workers, &current_pods, &states);
            requeue_at = min_time(requeue_at, now.saturating_add(CLUSTER_WAIT_RECHECK).ok());
            return finish(st, actions, events, requeue_at, None, None);
        }

        // Failure backoff runs from the moment the restart was decided.
        if let Some(last) = st.last_restart.as_ref()
            && last.reason == RestartReason::Failure
            && current_pods.is_empty()
        {
            let ready_at = last
                .time
                .0
                .saturating_add(failure_backoff(
                    job.spec.restart_policy.backoff_seconds,
                    st.failures,
                ))
                .unwrap_or(last.time.0);
            if now < ready_at {
                record_workers(&mut st, workers, &current_pods, &states);
                requeue_at = min_time(requeue_at, Some(ready_at));
                return finish(st, actions, events, requeue_at, None, None);
            }
        }

        let placement = match current_pods.values().next() {
            // Later ranks of a half-created attempt follow the first ones, never a new choice.
            Some(sibling) => placement_of(sibling, job, config, &node_refs, st.preemptions),
            None => placement::place(job, config, &node_refs, st.preemptions),
        };
        if current_pods.is_empty() {
            st.selected_gpu = placement.selected.clone();
            creates_attempt = Some(st.attempt);
            let restart_reason = st
                .last_restart
                .as_ref()
                .map(|l| l.reason)
                .filter(|_| st.attempt > 0);
            let what = match &placement.selected {
                Some(s) if !s.product.is_empty() => {
                    format!(" on {}{}", s.product, if s.spot { " (spot)" } else { "" })
                }
                _ => String::new(),
            };
            // Retrying creates the API server rejected is not news: WriteRejected says so.
            if !condition_is_true(&current.conditions, condition::WRITE_REJECTED) {
                events.push(JobEvent::normal(
                    "CreatingWorkers",
                    format!(
                        "creating {} worker(s) for attempt {}{what}{}",
                        missing.len(),
                        st.attempt,
                        restart_reason
                            .map(|r| format!(" after {}", r.as_str()))
                            .unwrap_or_default()
                    ),
                ));
            }
        }
        if !observed.service_exists {
            actions.push(Action::CreateService(Box::new(service::desired_service(
                job,
            ))));
        }
        if !observed.claim_exists
            && let Some(claim) = pvc::desired_pvc(job)
        {
            actions.push(Action::CreatePvc(Box::new(claim)));
        }
        let restart_reason = st
            .last_restart
            .as_ref()
            .map(|l| l.reason)
            .filter(|_| st.attempt > 0);
        for &rank in &missing {
            let mut pod = pods::desired_pod(job, rank, st.attempt, restart_reason, &placement);
            if let (Some(spec), Some(sibling)) = (pod.spec.as_mut(), current_pods.values().next()) {
                let sib = sibling.spec.as_ref();
                spec.affinity = sib.and_then(|s| s.affinity.clone());
                spec.tolerations = sib.and_then(|s| s.tolerations.clone());
            }
            actions.push(Action::CreatePod(Box::new(pod)));
        }
        if st.start_time.is_none() {
            st.start_time = Some(Time(now));
            if let Some(limit) = job.spec.active_deadline_seconds {
                requeue_at = min_time(
                    requeue_at,
                    now.saturating_add(SignedDuration::from_secs(limit)).ok(),
                );
            }
        }
        placement_now = Some(placement);
    } else if any_unscheduled {
        placement_now = Some(placement::place(job, config, &node_refs, st.preemptions));
    }

    // Unschedulable: our own view of the cluster first (it names what the cluster has), then
    // the scheduler's verdict on the pods.
    let scheduler_says = states.values().find_map(|s| match s {
        WorkerState::Pending { reason: Some(r) } if r.starts_with("Unschedulable") => {
            Some(r.clone())
        }
        _ => None,
    });
    match (
        placement_now.as_ref().and_then(|p| p.unschedulable.clone()),
        scheduler_says,
    ) {
        (Some(m), _) => {
            if !condition_is_true(&st.conditions, condition::UNSCHEDULABLE) {
                events.push(JobEvent::warning("Unschedulable", m.clone()));
            }
            set_condition(
                &mut st.conditions,
                condition::UNSCHEDULABLE,
                true,
                "NoMatchingNode",
                &m,
                now,
                gen_,
            );
            requeue_at = min_time(requeue_at, now.saturating_add(CLUSTER_WAIT_RECHECK).ok());
        }
        (None, Some(m)) => {
            if !condition_is_true(&st.conditions, condition::UNSCHEDULABLE) {
                events.push(JobEvent::warning("Unschedulable", m.clone()));
            }
            set_condition(
                &mut st.conditions,
                condition::UNSCHEDULABLE,
                true,
                "SchedulerUnschedulable",
                &m,
                now,
                gen_,
            );
        }
        (None, None) => {
            if st
                .conditions
                .iter()
                .any(|c| c.type_ == condition::UNSCHEDULABLE)
            {
                set_condition(
                    &mut st.conditions,
                    condition::UNSCHEDULABLE,
                    false,
                    "Schedulable",
                    "",
                    now,
                    gen_,
                );
            }
        }
    }

    record_workers(&mut st, workers, &current_pods, &states);
    let all_running = missing.is_empty()
        && (0..workers).all(|r| {
            matches!(
                states.get(&r),
                Some(WorkerState::Running { .. } | WorkerState::Succeeded)
            )
        });
    if all_running {
        if st.phase != Some(Phase::Running) {
            events.push(JobEvent::normal(
                "Running",
                format!(
                    "all {workers} worker(s) of attempt {} are running",
                    st.attempt
                ),
            ));
        }
        st.phase = Some(Phase::Running);
        let message = format!(
            "attempt {}: {workers}/{workers} workers running",
            st.attempt
        );
        set_condition(
            &mut st.conditions,
            condition::RUNNING,
            true,
            "AllWorkersRunning",
            &message,
            now,
            gen_,
        );
        if condition_is_true(&st.conditions, condition::RESTARTING) {
            set_condition(
                &mut st.conditions,
                condition::RESTARTING,
                false,
                "Restarted",
                &message,
                now,
                gen_,
            );
        }
    } else if st.phase != Some(Phase::Restarting) {
        st.phase = Some(Phase::Pending);
    }
    finish(st, actions, events, requeue_at, None, creates_attempt)
}

/// When to write a decided status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusWrite {
    /// Nothing changed.
    Unchanged,
    /// Write it now.
    Now,
    /// Only per-worker detail changed: keep it in memory and write it after this long, together
    /// with whatever else changes meanwhile.
    Later(std::time::Duration),
}

/// Decides when `desired` is written over `written` (what the API server holds).
///
/// Everything but `status.workers` is a decision or a transition users and tools wait on
/// (phase, attempt, counters, conditions, selected GPU): written at once. `status.workers` is
/// per-worker detail that moves with every pod event (a pod seen, bound to a node, started):
/// one write per worker per step would be most of the operator's API traffic (measured 4.3–4.8
/// status writes per job while creating, and as many again while going Running), so such detail
/// waits up to `batch`, counted from the first unwritten change (`pending_for`), and goes out in
/// one write. The controller decides on the unwritten detail meanwhile, so a worker it has seen
/// and that disappears is still a preemption.
pub fn status_write(
    written: &TrainingJobStatus,
    desired: &TrainingJobStatus,
    pending_for: Option<std::time::Duration>,
    batch: std::time::Duration,
) -> StatusWrite {
    if desired == written {
        return StatusWrite::Unchanged;
    }
    let decisions_equal = TrainingJobStatus {
        workers: Vec::new(),
        ..desired.clone()
    } == TrainingJobStatus {
        workers: Vec::new(),
        ..written.clone()
    };
    if !decisions_equal {
        return StatusWrite::Now;
    }
    match pending_for {
        Some(waited) if waited >= batch => StatusWrite::Now,
        Some(waited) => StatusWrite::Later(batch - waited),
        None => StatusWrite::Later(batch),
    }
}

/// The placement a half-created attempt already uses (its first pod's).
fn placement_of(
    sibling: &Pod,
    job: &ValidJob,
    config: &OperatorConfig,
    nodes_: &[&Node],
    preemptions: u32,
) -> Placement {
    let mut p = placement::place(job, config, nodes_, preemptions);
    let spec = sibling.spec.as_ref();
    p.node_affinity = spec
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.clone());
    p.tolerations = spec.and_then(|s| s.tolerations.clone()).unwrap_or_default();
    p
}

/// `spec.suspend` went back to false. A job whose workers were created before (it has a
/// `startTime`) continues as a new attempt with restart reason `Resume`: its pods get
/// `RESUME_FROM` like every attempt after the first, so progress made before the suspend is
/// kept, and pods still terminating from the suspend are older pods that must be gone before
/// the new ones start. Like a Kubernetes Job, `startTime` (and with it
/// `activeDeadlineSeconds`) restarts at the resume. A job that never ran starts as it would have.
/// `Err` says why it cannot: the attempt number is spent.
fn resume(
    st: &mut TrainingJobStatus,
    now: Timestamp,
    events: &mut Vec<JobEvent>,
) -> Result<Option<RestartReason>, String> {
    st.phase = Some(Phase::Pending);
    if st.start_time.is_none() {
        events.push(JobEvent::normal(
            "Resumed",
            "spec.suspend is false: creating the workers",
        ));
        return Ok(None);
    }
    st.attempt = st
        .attempt
        .checked_add(1)
        .ok_or_else(|| attempt_limit_message("spec.suspend set to false"))?;
    st.workers.clear();
    st.start_time = Some(Time(now));
    st.last_restart = Some(LastRestart {
        time: Time(now),
        reason: RestartReason::Resume,
        detail: "spec.suspend set to false".to_owned(),
    });
    events.push(JobEvent::normal(
        "Resumed",
        format!(
            "spec.suspend is false: recreating the workers as attempt {} with RESUME_FROM set",
            st.attempt
        ),
    ));
    Ok(Some(RestartReason::Resume))
}

/// Failed condition reason when `status.attempt` cannot count one more attempt.
const ATTEMPT_LIMIT_REACHED: &str = "AttemptLimitReached";

fn attempt_limit_message(detail: &str) -> String {
    format!(
        "attempt {} is the last one status.attempt can number; last: {detail}",
        u32::MAX
    )
}

fn fail(
    st: &mut TrainingJobStatus,
    reason: &str,
    message: &str,
    now: Timestamp,
    gen_: Option<i64>,
    events: &mut Vec<JobEvent>,
) {
    st.phase = Some(Phase::Failed);
    st.completion_time = Some(Time(now));
    set_condition(
        &mut st.conditions,
        condition::FAILED,
        true,
        reason,
        message,
        now,
        gen_,
    );
    set_condition(
        &mut st.conditions,
        condition::RUNNING,
        false,
        reason,
        message,
        now,
        gen_,
    );
    if condition_is_true(&st.conditions, condition::RESTARTING) {
        set_condition(
            &mut st.conditions,
            condition::RESTARTING,
            false,
            reason,
            message,
            now,
            gen_,
        );
    }
    events.push(JobEvent::warning("Failed", format!("{reason}: {message}")));
}

/// status.workers: the current attempt's workers the operator has seen.
fn record_workers(
    st: &mut TrainingJobStatus,
    workers_wanted: u32,
    current: &BTreeMap<u32, &Arc<Pod>>,
    states: &BTreeMap<u32, WorkerState>,
) {
    let mut workers: Vec<WorkerStatus> = current
        .iter()
        .map(|(&rank, pod)| WorkerStatus {
            rank,
            pod: pod_name(pod),
            node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            phase: states
                .get(&rank)
                .map_or("Pending", WorkerState::phase)
                .to_owned(),
            reason: states
                .get(&rank)
                .and_then(|s| s.reason())
                .map(str::to_owned),
        })
        .collect();
    // A recorded worker whose pod is gone stays recorded until a restart clears the list,
    // so that its disappearance is noticed again after a crash; a rank the spec does not have
    // (status is input too) is dropped.
    for w in &st.workers {
        if w.phase == "Succeeded" && w.rank < workers_wanted && !current.contains_key(&w.rank) {
            workers.push(w.clone());
        }
    }
    workers.sort_by_key(|w| w.rank);
    workers.dedup_by_key(|w| w.rank);
    st.workers = workers;
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
