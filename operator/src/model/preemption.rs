//! The preemption/failure classifier: a pure function of one worker pod and its node.
//!
//! Preemption must never count as a failure (it is answered by a free restart from the
//! checkpoint), and a real failure must never hide as a preemption (it spends the failure
//! budget and backs off). Every rule below is one row of the table in the tests.

use std::ops::ControlFlow;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Node;

use crate::model::cached_pod::{CachedContainerStatus, CachedPod, CachedPodStatus};

use crate::model::nodes::{self, Readiness};
use crate::model::trainer::trainer_container;

/// `status.reason` values with which the kubelet or control plane ends a pod it took away:
/// 1.20-era (Evicted, NodeLost, Shutdown, Terminated) and newer (NodeShutdown, Preempting).
pub const PREEMPTION_REASONS: &[&str] = &[
    "Evicted",
    "Shutdown",
    "NodeShutdown",
    "Terminated",
    "NodeLost",
    "Preempting",
];

/// `status.reason` values with which a kubelet rejects a pod at admission, before any of its
/// containers ran: the node could not take it (its devices still held for pods it had not yet
/// cleaned up after a restart or a partition, resources the scheduler thought free). The
/// trainer never ran, so the job did nothing wrong: like a preemption, it is not counted as a
/// failure. `OutOf<resource>` reasons are matched by prefix.
pub const ADMISSION_REASONS: &[&str] = &[
    "UnexpectedAdmissionError",
    "TopologyAffinityError",
    "NodeAffinity",
];

/// Terminated states (exit code, reason) with which a trainer's container is reported when it
/// was lost with its node's container runtime, not ended by the trainer: containerd's CRI
/// plugin gives a container whose task is gone when it starts again (the node crashed or
/// rebooted, the runtime and its shims were killed) exit code 255 and reason `Unknown`;
/// kubelets from 1.22 report a container they cannot locate any more as
/// `ContainerStatusUnknown` (exit code 137). Like a preemption, it is not counted as a failure.
pub const LOST_CONTAINER_EXITS: &[(i32, &str)] =
    &[(255, "Unknown"), (137, "ContainerStatusUnknown")];

/// How long the scheduler must have called a pod unschedulable before the job says so.
const UNSCHEDULABLE_SETTLE: SignedDuration = SignedDuration::from_secs(10);

/// Waiting reasons that mean "making progress", not "stuck".
const PROGRESS_WAITING_REASONS: &[&str] = &["ContainerCreating", "PodInitializing"];

/// Timeouts the classifier applies.
#[derive(Clone, Debug)]
pub struct ClassifierConfig {
    /// Taint keys announcing a node's termination.
    pub termination_taints: Vec<String>,
    /// Taint keys warning of a termination to come (a rebalance recommendation).
    pub early_warning_taints: Vec<String>,
    /// A node NotReady for longer than this has lost its workers.
    pub node_not_ready_timeout: SignedDuration,
    /// A container waiting for longer than this has failed.
    pub container_waiting_timeout: SignedDuration,
    /// How long a failure is held while a peer's node may be lost ([`crate::model::lost_peer`]).
    pub lost_peer_window: SignedDuration,
}

impl ClassifierConfig {
    /// Takes the classifier's part of the operator config.
    pub fn from_config(config: &crate::config::OperatorConfig) -> Self {
        Self {
            termination_taints: config.termination_taints.clone(),
            early_warning_taints: config.early_warning_taints.clone(),
            node_not_ready_timeout: seconds(config.node_not_ready_timeout_seconds),
            container_waiting_timeout: seconds(config.container_waiting_timeout_seconds),
            lost_peer_window: seconds(config.lost_peer_window_seconds),
        }
    }
}

fn seconds(s: u64) -> SignedDuration {
    SignedDuration::from_secs(i64::try_from(s).unwrap_or(i64::MAX))
}

/// What became of one worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WorkerState {
    /// Not running yet; `reason` says what it waits for, when known.
    Pending {
        /// Why it is not running, when known.
        reason: Option<PendingReason>,
    },
    /// Running; `reason` surfaces a waiting container, if any.
    Running {
        /// A non-running container's waiting reason, when there is one.
        reason: Option<String>,
    },
    /// The trainer exited 0.
    Succeeded,
    /// Taken away by the platform: restart for free.
    Preempted(String),
    /// Ended badly on its own: restart against the failure budget.
    Failed(String),
}

/// Why a worker is not running yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PendingReason {
    /// The scheduler's settled verdict that no node fits; the text, as shown in
    /// `status.workers[].reason`, is `Unschedulable: ` and the scheduler's message.
    Unschedulable(String),
    /// A container waits (ImagePullBackOff, ContainerCreating, ...): its waiting reason.
    Waiting(String),
}

impl PendingReason {
    /// The text shown in `status.workers[].reason`.
    pub fn text(&self) -> &str {
        match self {
            PendingReason::Unschedulable(t) | PendingReason::Waiting(t) => t,
        }
    }
}

/// A worker's phase, as `status.workers[].phase` spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerPhase {
    /// Not running yet.
    Pending,
    /// Running.
    Running,
    /// The trainer exited 0.
    Succeeded,
    /// Taken away by the platform.
    Preempted,
    /// Ended badly on its own.
    Failed,
}

impl WorkerPhase {
    const ALL: [WorkerPhase; 5] = [
        WorkerPhase::Pending,
        WorkerPhase::Running,
        WorkerPhase::Succeeded,
        WorkerPhase::Preempted,
        WorkerPhase::Failed,
    ];

    /// The string in `status.workers[].phase`.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerPhase::Pending => "Pending",
            WorkerPhase::Running => "Running",
            WorkerPhase::Succeeded => "Succeeded",
            WorkerPhase::Preempted => "Preempted",
            WorkerPhase::Failed => "Failed",
        }
    }

    /// Reads `status.workers[].phase` (status is input too: an unknown string is `None`).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == s)
    }
}

impl WorkerState {
    /// The phase shown in `status.workers[].phase`.
    pub fn phase(&self) -> WorkerPhase {
        match self {
            WorkerState::Pending { .. } => WorkerPhase::Pending,
            WorkerState::Running { .. } => WorkerPhase::Running,
            WorkerState::Succeeded => WorkerPhase::Succeeded,
            WorkerState::Preempted(_) => WorkerPhase::Preempted,
            WorkerState::Failed(_) => WorkerPhase::Failed,
        }
    }

    /// Whether the scheduler says no node fits this worker.
    pub fn unschedulable(&self) -> bool {
        matches!(
            self,
            WorkerState::Pending {
                reason: Some(PendingReason::Unschedulable(_))
            }
        )
    }

    /// The reason or detail shown in `status.workers[].reason`.
    pub fn reason(&self) -> Option<&str> {
        match self {
            WorkerState::Pending { reason } => reason.as_ref().map(PendingReason::text),
            WorkerState::Running { reason } => reason.as_deref(),
            WorkerState::Succeeded => None,
            WorkerState::Preempted(d) | WorkerState::Failed(d) => Some(d),
        }
    }
}

/// The verdict plus the moment a timer could change it (a NotReady or waiting timeout).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Classification {
    /// The verdict now.
    pub state: WorkerState,
    /// Classify again at this time, even if nothing else changes.
    pub recheck_at: Option<Timestamp>,
}

/// The node a pod is bound to, as the cache sees it.
#[derive(Clone, Copy, Debug)]
pub enum NodeView<'a> {
    /// The pod has no `spec.nodeName` yet.
    Unscheduled,
    /// The pod is bound to a node that no longer exists.
    Missing(&'a str),
    /// The pod's node.
    Present(&'a Node),
}

/// Classifies one worker pod.
pub fn classify(
    pod: &CachedPod,
    node: NodeView<'_>,
    config: &ClassifierConfig,
    now: Timestamp,
) -> Classification {
    let decided = |state| Classification {
        state,
        recheck_at: None,
    };
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    let on_node = match node {
        NodeView::Unscheduled => String::new(),
        NodeView::Missing(n) => format!(" on node {n}"),
        NodeView::Present(n) => format!(" on node {}", nodes::name(n)),
    };
    // 1. The control plane announced the disruption; any reason counts.
    if let Some(state) = disruption_target(status, &on_node) {
        return decided(state);
    }

    let trainer_exit = trainer_status(pod).and_then(terminated_exit);
    // 2. Success is the trainer's exit code 0 (sidecars may keep the pod running).
    if phase == "Succeeded" || trainer_exit.as_ref().is_some_and(|(code, _)| *code == 0) {
        return decided(WorkerState::Succeeded);
    }

    // 3. The pod was ended by the kubelet or control plane with a preemption reason, rejected
    // at admission before its trainer ran, or its trainer was lost with its node's runtime.
    if let Some(state) = preempting_pod_reason(status, &on_node)
        .or_else(|| admission_rejection(pod, phase, status, &on_node))
        .or_else(|| lost_container(trainer_exit.as_ref(), &on_node))
    {
        return decided(state);
    }

    let ended = phase == "Failed" || trainer_exit.is_some();
    let mut recheck_at = match node_rules(node, ended, config, now) {
        ControlFlow::Break(state) => return decided(state),
        ControlFlow::Continue(recheck) => recheck,
    };

    // 7. Someone else is deleting the pod (drain, taint manager, kubectl): it will disappear.
    if pod.metadata.deletion_timestamp.is_some() && !ended {
        return decided(WorkerState::Preempted(format!(
            "pod deleted by someone other than trainyard{on_node}"
        )));
    }

    // 8. Ended badly on its own.
    if let Some(state) = own_failure(trainer_exit, phase, status, &on_node) {
        return decided(state);
    }

    // 9. A container stuck waiting (ImagePullBackOff, CreateContainerConfigError, ...).
    let waiting_reason = match waiting_rule(pod, config, now, &on_node) {
        ControlFlow::Break(state) => return decided(state),
        ControlFlow::Continue((reason, recheck)) => {
            recheck_at = min_time(recheck_at, recheck);
            reason
        }
    };

    // 10. Running, or 11. still pending (surface the scheduler's verdict).
    let state = if phase == "Running" {
        WorkerState::Running {
            reason: waiting_reason,
        }
    } else {
        let (unschedulable, recheck) = scheduler_verdict(status, now);
        recheck_at = min_time(recheck_at, recheck);
        WorkerState::Pending {
            reason: waiting_reason
                .map(PendingReason::Waiting)
                .or(unschedulable.map(PendingReason::Unschedulable)),
        }
    };
    Classification { state, recheck_at }
}

/// The trainer container's status, once the kubelet reports it.
pub(crate) fn trainer_status(pod: &CachedPod) -> Option<&CachedContainerStatus> {
    let name = trainer_container(pod)?;
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == name)
}

/// Rule 1: the control plane announced the disruption; any reason counts.
fn disruption_target(status: Option<&CachedPodStatus>, on_node: &str) -> Option<WorkerState> {
    let c = status
        .and_then(|s| s.conditions.as_ref())?
        .iter()
        .find(|c| c.type_ == "DisruptionTarget" && c.status == "True")?;
    let reason = c.reason.as_deref().unwrap_or("Unknown");
    Some(WorkerState::Preempted(format!(
        "DisruptionTarget/{reason}{on_node}"
    )))
}

/// Rule 3: the pod was ended by the kubelet or control plane with a preemption reason.
fn preempting_pod_reason(status: Option<&CachedPodStatus>, on_node: &str) -> Option<WorkerState> {
    let reason = status
        .and_then(|s| s.reason.as_deref())
        .filter(|r| PREEMPTION_REASONS.contains(r))?;
    Some(WorkerState::Preempted(format!(
        "{reason}{on_node}{}",
        status_message(status)
    )))
}

/// Rule 3, second half: the kubelet rejected the pod at admission; no container ever ran.
fn admission_rejection(
    pod: &CachedPod,
    phase: &str,
    status: Option<&CachedPodStatus>,
    on_node: &str,
) -> Option<WorkerState> {
    let reason = status.and_then(|s| s.reason.as_deref())?;
    let rejected = ADMISSION_REASONS.contains(&reason) || reason.starts_with("OutOf");
    if phase != "Failed" || !rejected || trainer_status(pod).is_some() {
        return None;
    }
    Some(WorkerState::Preempted(format!(
        "rejected at admission by the kubelet{on_node}: {reason}{}",
        status_message(status)
    )))
}

/// Rule 3, last: the trainer's container was lost with its node's container runtime
/// ([`LOST_CONTAINER_EXITS`]).
fn lost_container(trainer_exit: Option<&(i32, String)>, on_node: &str) -> Option<WorkerState> {
    let (code, reason) = trainer_exit?;
    LOST_CONTAINER_EXITS
        .contains(&(*code, reason.as_str()))
        .then(|| {
            WorkerState::Preempted(format!(
                "the trainer's container was lost with its node's container runtime (exit code {code}, {reason}){on_node}"
            ))
        })
}

/// Rule 8: the trainer exited non-zero, or the pod failed, on its own.
fn own_failure(
    trainer_exit: Option<(i32, String)>,
    phase: &str,
    status: Option<&CachedPodStatus>,
    on_node: &str,
) -> Option<WorkerState> {
    if let Some((code, reason)) = trainer_exit {
        return Some(WorkerState::Failed(format!(
            "trainer exited with code {code} ({reason}){on_node}"
        )));
    }
    if phase != "Failed" {
        return None;
    }
    let reason = status.and_then(|s| s.reason.as_deref()).unwrap_or("Failed");
    Some(WorkerState::Failed(format!(
        "{reason}{on_node}{}",
        status_message(status)
    )))
}

/// The pod's status message as ": message", or nothing.
fn status_message(status: Option<&CachedPodStatus>) -> String {
    status
        .and_then(|s| s.message.as_deref())
        .map(|m| format!(": {m}"))
        .unwrap_or_default()
}

/// Rules 4 to 6: the node. A decided state breaks; otherwise when the node's NotReady
/// timeout runs out.
fn node_rules(
    node: NodeView<'_>,
    ended: bool,
    config: &ClassifierConfig,
    now: Timestamp,
) -> ControlFlow<WorkerState, Option<Timestamp>> {
    let mut recheck_at = None;
    match node {
        // 4. The node object is gone: so is the machine.
        NodeView::Missing(n) => {
            return ControlFlow::Break(WorkerState::Preempted(format!("node {n} is gone")));
        }
        NodeView::Present(n) => {
            // 5. NotReady past the timeout: the node and its workers are lost.
            if let Readiness::NotReady { since: Some(since) } = nodes::readiness(n) {
                let deadline = since
                    .saturating_add(config.node_not_ready_timeout)
                    .unwrap_or(since);
                if now >= deadline {
                    return ControlFlow::Break(WorkerState::Preempted(format!(
                        "node {} NotReady for {}s",
                        nodes::name(n),
                        now.duration_since(since).as_secs()
                    )));
                }
                recheck_at = Some(deadline);
            }
            // 6. Ending on a node that is being taken away is part of the preemption.
            if ended && let Some(taint) = nodes::termination_taint(n, &config.termination_taints) {
                return ControlFlow::Break(WorkerState::Preempted(format!(
                    "ended on node {} with taint {taint}",
                    nodes::name(n)
                )));
            }
        }
        NodeView::Unscheduled => {}
    }
    ControlFlow::Continue(recheck_at)
}

/// Rule 9: a container stuck waiting past the timeout fails the worker; otherwise the
/// reason a container waits, and when its timeout runs out.
fn waiting_rule(
    pod: &CachedPod,
    config: &ClassifierConfig,
    now: Timestamp,
    on_node: &str,
) -> ControlFlow<WorkerState, (Option<String>, Option<Timestamp>)> {
    let status = pod.status.as_ref();
    let mut recheck_at = None;
    let started = status
        .and_then(|s| s.start_time.as_ref())
        .or(pod.metadata.creation_timestamp.as_ref())
        .map(|t| t.0);
    let mut waiting_reason = None;
    let all_statuses = status.into_iter().flat_map(|s| {
        s.init_container_statuses
            .iter()
            .flatten()
            .chain(s.container_statuses.iter().flatten())
    });
    for cs in all_statuses {
        let Some(waiting) = cs.state.as_ref().and_then(|s| s.waiting.as_ref()) else {
            continue;
        };
        let Some(reason) = waiting.reason.as_deref() else {
            continue;
        };
        if PROGRESS_WAITING_REASONS.contains(&reason) {
            waiting_reason.get_or_insert_with(|| reason.to_owned());
            continue;
        }
        if let Some(started) = started {
            let deadline = started
                .saturating_add(config.container_waiting_timeout)
                .unwrap_or(started);
            if now >= deadline {
                let message = waiting
                    .message
                    .as_deref()
                    .map(|m| format!(": {m}"))
                    .unwrap_or_default();
                return ControlFlow::Break(WorkerState::Failed(format!(
                    "container {} waiting ({reason}) for more than {}s{on_node}{message}",
                    cs.name,
                    config.container_waiting_timeout.as_secs()
                )));
            }
            recheck_at = min_time(recheck_at, Some(deadline));
        }
        waiting_reason = Some(reason.to_owned());
    }
    ControlFlow::Continue((waiting_reason, recheck_at))
}

/// Rule 11's verdict: the scheduler's settled Unschedulable, and when a fresh one settles.
fn scheduler_verdict(
    status: Option<&CachedPodStatus>,
    now: Timestamp,
) -> (Option<String>, Option<Timestamp>) {
    let mut recheck_at = None;
    let verdict = status.and_then(|s| s.conditions.as_ref()).and_then(|cs| {
        cs.iter().find(|c| {
            c.type_ == "PodScheduled"
                && c.status == "False"
                && c.reason.as_deref() == Some("Unschedulable")
        })
    });
    // A fresh pod is often briefly unschedulable (its PVC is still binding); only a
    // verdict that has stood for a while is worth a condition and an Event.
    let unschedulable = verdict.and_then(|c| {
        let since = c.last_transition_time.as_ref().map(|t| t.0);
        let settled = since
            .and_then(|t| t.saturating_add(UNSCHEDULABLE_SETTLE).ok())
            .filter(|at| now < *at);
        match settled {
            Some(at) => {
                recheck_at = min_time(recheck_at, Some(at));
                None
            }
            None => Some(format!(
                "Unschedulable: {}",
                c.message.as_deref().unwrap_or("no node fits")
            )),
        }
    });
    (unschedulable, recheck_at)
}

/// The exit code and reason of a terminated container.
fn terminated_exit(cs: &CachedContainerStatus) -> Option<(i32, String)> {
    let t = cs.state.as_ref()?.terminated.as_ref()?;
    Some((
        t.exit_code,
        t.reason.clone().unwrap_or_else(|| "Error".to_owned()),
    ))
}

/// The earlier of two optional times.
pub fn min_time(a: Option<Timestamp>, b: Option<Timestamp>) -> Option<Timestamp> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{node, pod_json, ts};
    use serde_json::json;
    use trainyard_api::spot::KARPENTER_DISRUPTED;

    fn config() -> ClassifierConfig {
        ClassifierConfig::from_config(&crate::config::OperatorConfig::default())
    }

    struct Row {
        name: &'static str,
        status: serde_json::Value,
        deleting: bool,
        node: Option<Node>,
        node_missing: bool,
        expect: &'static str,
        detail_contains: &'static str,
    }

    fn row(
        name: &'static str,
        status: serde_json::Value,
        expect: &'static str,
        detail: &'static str,
    ) -> Row {
        Row {
            name,
            status,
            deleting: false,
            node: Some(node("n-1").build()),
            node_missing: false,
            expect,
            detail_contains: detail,
        }
    }

    fn running() -> serde_json::Value {
        json!({"phase": "Running", "startTime": "2026-01-01T00:00:00Z",
               "containerStatuses": [{"name": "trainer", "ready": true, "restartCount": 0, "image": "x", "imageID": "",
                                      "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]})
    }

    fn terminated(phase: &str, code: i32, reason: &str) -> serde_json::Value {
        json!({"phase": phase, "startTime": "2026-01-01T00:00:00Z",
               "containerStatuses": [{"name": "trainer", "ready": false, "restartCount": 0, "image": "x", "imageID": "",
                                      "state": {"terminated": {"exitCode": code, "reason": reason}}}]})
    }

    fn disruption(reason: &str) -> serde_json::Value {
        let mut s = running();
        s["conditions"] = json!([{"type": "DisruptionTarget", "status": "True", "reason": reason,
                                  "message": "going away"}]);
        s
    }

    fn failed_with_reason(reason: &str) -> serde_json::Value {
        json!({"phase": "Failed", "reason": reason, "message": "The node was low on resource"})
    }

    fn waiting(reason: &str) -> serde_json::Value {
        json!({"phase": "Pending", "startTime": "2026-01-01T00:00:00Z",
               "containerStatuses": [{"name": "trainer", "ready": false, "restartCount": 0, "image": "x", "imageID": "",
                                      "state": {"waiting": {"reason": reason, "message": "back-off pulling image"}}}]})
    }

    /// "now" in the table: 10 minutes after the pods started.
    fn now() -> Timestamp {
        ts("2026-01-01T00:10:00Z")
    }

    #[expect(clippy::too_many_lines, reason = "a table of cases, a few lines each")]
    fn table() -> Vec<Row> {
        let mut rows = vec![
            row("running pod on ready node runs", running(), "Running", ""),
            row(
                "pending unscheduled pod is pending",
                json!({"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes are available"}]}),
                "Pending",
                "0/3 nodes are available",
            ),
            row(
                "trainer exit 0 succeeds",
                terminated("Succeeded", 0, "Completed"),
                "Succeeded",
                "",
            ),
            row(
                "trainer exit 0 with sidecar still running succeeds",
                {
                    let mut s = terminated("Running", 0, "Completed");
                    s["containerStatuses"]
                        .as_array_mut()
                        .expect("array")
                        .push(json!({"name": "sidecar", "ready": true,
                    "restartCount": 0, "image": "x", "imageID": "", "state": {"running": {}}}));
                    s
                },
                "Succeeded",
                "",
            ),
            row(
                "non-zero exit fails",
                terminated("Failed", 1, "Error"),
                "Failed",
                "code 1",
            ),
            row(
                "OOMKilled fails",
                terminated("Failed", 137, "OOMKilled"),
                "Failed",
                "OOMKilled",
            ),
            row(
                "failed pod without container status fails",
                json!({"phase": "Failed", "reason": "CreateContainerError"}),
                "Failed",
                "CreateContainerError",
            ),
            // Found by the chaos run (seed 3): after node 2's kubelet came back, a pod of the
            // next attempt bound there was rejected because its GPUs were still held.
            row(
                "a pod the kubelet rejected at admission is preempted, not failed",
                json!({"phase": "Failed", "reason": "UnexpectedAdmissionError",
                       "message": "Pod Allocate failed due to requested number of devices unavailable for nvidia.com/gpu"}),
                "Preempted",
                "rejected at admission by the kubelet on node n-1: UnexpectedAdmissionError",
            ),
            row(
                "OutOf<resource> at admission is preempted",
                json!({"phase": "Failed", "reason": "OutOfnvidia.com/gpu"}),
                "Preempted",
                "OutOfnvidia.com/gpu",
            ),
            row(
                "an admission reason on a pod whose trainer ran is its own failure",
                {
                    let mut s = terminated("Failed", 1, "Error");
                    s["reason"] = json!("UnexpectedAdmissionError");
                    s
                },
                "Failed",
                "code 1",
            ),
            row(
                "image pull backoff past timeout fails",
                waiting("ImagePullBackOff"),
                "Failed",
                "ImagePullBackOff",
            ),
            row(
                "config error past timeout fails",
                waiting("CreateContainerConfigError"),
                "Failed",
                "CreateContainerConfigError",
            ),
            row(
                "container creating is progress, not failure",
                waiting("ContainerCreating"),
                "Pending",
                "ContainerCreating",
            ),
        ];
        for reason in [
            "TerminationByKubelet",
            "PreemptionByScheduler",
            "PreemptionByKubeScheduler",
            "DeletionByTaintManager",
            "EvictionByEvictionAPI",
            "DeletionByPodGC",
            "SomeFutureReason",
        ] {
            rows.push(row(
                "DisruptionTarget with any reason is preemption",
                disruption(reason),
                "Preempted",
                reason,
            ));
        }
        rows.push(row("DisruptionTarget wins over a non-zero exit", {
            let mut s = terminated("Failed", 143, "Error");
            s["conditions"] = json!([{"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet"}]);
            s
        }, "Preempted", "DisruptionTarget/TerminationByKubelet on node n-1"));
        rows.push(row("DisruptionTarget wins over exit 0 after SIGTERM", {
            let mut s = terminated("Succeeded", 0, "Completed");
            s["conditions"] = json!([{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}]);
            s
        }, "Preempted", "EvictionByEvictionAPI"));
        rows.push(row(
            "DisruptionTarget=False is ignored",
            {
                let mut s = running();
                s["conditions"] =
                    json!([{"type": "DisruptionTarget", "status": "False", "reason": "X"}]);
                s
            },
            "Running",
            "",
        ));
        for reason in PREEMPTION_REASONS {
            rows.push(row(
                "failed with a 1.20-era preemption status.reason is preemption",
                failed_with_reason(reason),
                "Preempted",
                reason,
            ));
        }
        for (code, reason) in LOST_CONTAINER_EXITS {
            rows.push(row(
                "a trainer lost with its node's container runtime is preempted",
                terminated("Failed", *code, reason),
                "Preempted",
                "lost with its node's container runtime",
            ));
        }
        rows.push(row(
            "a trainer that exits 255 itself has failed",
            terminated("Failed", 255, "Error"),
            "Failed",
            "trainer exited with code 255 (Error)",
        ));
        rows.push(row(
            "NodeLost with phase Unknown is preemption",
            json!({"phase": "Unknown", "reason": "NodeLost"}),
            "Preempted",
            "NodeLost",
        ));
        rows.push(Row {
            node: None,
            node_missing: true,
            ..row(
                "pod on a deleted node is preempted",
                running(),
                "Preempted",
                "node n-1 is gone",
            )
        });
        rows.push(Row {
            node: Some(node("n-1").not_ready_since("2026-01-01T00:08:00Z").build()),
            ..row(
                "node NotReady past the timeout preempts",
                running(),
                "Preempted",
                "NotReady for 120s",
            )
        });
        rows.push(Row {
            node: Some(node("n-1").not_ready_since("2026-01-01T00:09:30Z").build()),
            ..row(
                "node NotReady within the timeout keeps running",
                running(),
                "Running",
                "",
            )
        });
        for taint in config().termination_taints {
            let taint: &'static str = Box::leak(taint.into_boxed_str());
            rows.push(Row {
                node: Some(node("n-1").taint(taint).build()),
                ..row(
                    "pod ending on a node with a termination taint is preempted",
                    terminated("Failed", 143, "Error"),
                    "Preempted",
                    taint,
                )
            });
        }
        rows.push(Row {
            node: Some(node("n-1").taint(KARPENTER_DISRUPTED).build()),
            ..row(
                "running pod on a tainted node keeps running until it ends",
                running(),
                "Running",
                "",
            )
        });
        rows.push(Row {
            node: Some(node("n-1").taint("some.other/taint").build()),
            ..row(
                "ending on a node with an unrelated taint is a failure",
                terminated("Failed", 1, "Error"),
                "Failed",
                "code 1",
            )
        });
        rows.push(Row {
            deleting: true,
            ..row(
                "running pod deleted by someone else is preempted",
                running(),
                "Preempted",
                "someone other",
            )
        });
        rows.push(Row {
            deleting: true,
            ..row(
                "exit 0 while being deleted still succeeds",
                terminated("Succeeded", 0, "Completed"),
                "Succeeded",
                "",
            )
        });
        rows
    }

    #[test]
    fn classifier_table_covers_every_rule() {
        let cfg = config();
        for r in table() {
            let mut p = pod_json("job-worker-0", &r.status);
            if r.deleting {
                p.metadata.deletion_timestamp =
                    Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()));
            }
            let view = match (&r.node, r.node_missing) {
                (_, true) => NodeView::Missing("n-1"),
                (Some(n), false) => NodeView::Present(n),
                (None, false) => NodeView::Unscheduled,
            };
            let got = classify(&p, view, &cfg, now());
            assert_eq!(
                got.state.phase().as_str(),
                r.expect,
                "{}: got {:?}",
                r.name,
                got.state
            );
            if !r.detail_contains.is_empty() {
                let reason = got.state.reason().unwrap_or_default();
                assert!(
                    reason.contains(r.detail_contains),
                    "{}: {reason:?} lacks {:?}",
                    r.name,
                    r.detail_contains
                );
            }
        }
    }

    #[test]
    fn not_ready_node_asks_for_a_recheck_when_the_timeout_ends() {
        let n = node("n-1").not_ready_since("2026-01-01T00:09:30Z").build();
        let got = classify(
            &pod_json("p", &running()),
            NodeView::Present(&n),
            &config(),
            now(),
        );
        assert_eq!(got.recheck_at, Some(ts("2026-01-01T00:10:30Z")));
    }

    #[test]
    fn waiting_container_asks_for_a_recheck_when_the_timeout_ends() {
        let early = ts("2026-01-01T00:01:00Z");
        let got = classify(
            &pod_json("p", &waiting("ImagePullBackOff")),
            NodeView::Present(&node("n-1").build()),
            &config(),
            early,
        );
        assert_eq!(
            got.state,
            WorkerState::Pending {
                reason: Some(PendingReason::Waiting("ImagePullBackOff".into()))
            }
        );
        assert_eq!(got.recheck_at, Some(ts("2026-01-01T00:05:00Z")));
    }

    #[test]
    fn worker_phases_read_back_as_status_spells_them() {
        for phase in WorkerPhase::ALL {
            assert_eq!(WorkerPhase::parse(phase.as_str()), Some(phase));
        }
        assert_eq!(WorkerPhase::parse("succeeded"), None);
    }

    #[test]
    fn a_fresh_unschedulable_verdict_is_not_reported_until_it_settles() {
        let status = json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
            "reason": "Unschedulable", "message": "pod has unbound immediate PersistentVolumeClaims",
            "lastTransitionTime": "2026-01-01T00:09:55Z"}]});
        let p = pod_json("p", &status);
        let got = classify(&p, NodeView::Unscheduled, &config(), now());
        assert_eq!(got.state, WorkerState::Pending { reason: None });
        assert_eq!(got.recheck_at, Some(ts("2026-01-01T00:10:05Z")));
        let later = classify(
            &p,
            NodeView::Unscheduled,
            &config(),
            ts("2026-01-01T00:10:05Z"),
        );
        assert!(
            later.state.reason().is_some_and(|r| r.contains("unbound")),
            "{:?}",
            later.state
        );
        assert!(
            later.state.unschedulable(),
            "a settled verdict is a typed decision"
        );
    }

    #[test]
    fn detail_names_reason_and_node_like_the_issue_example() {
        let n = node("n-3").build();
        let got = classify(
            &pod_json("p", &disruption("TerminationByKubelet")),
            NodeView::Present(&n),
            &config(),
            now(),
        );
        assert_eq!(
            got.state,
            WorkerState::Preempted("DisruptionTarget/TerminationByKubelet on node n-3".into())
        );
    }

    #[test]
    fn trainer_is_the_container_named_trainer_else_the_first() {
        let mut p = pod_json("p", &running());
        assert_eq!(trainer_container(&p), Some("trainer"));
        p.spec.containers[0].name = "main".into();
        assert_eq!(trainer_container(&p), Some("main"));
    }
}
