//! The decision step: from a validated job, what the cluster looks like and the current
//! status, compute the next status, the actions that move the cluster towards it, and the
//! Events that describe the transition.
//!
//! [`decide`] builds one read-only `View` of the job (`view.rs`), then runs the phases of
//! `phases::PHASES` in order, each adding to a `Round` (`round.rs`) and saying whether the
//! round goes on; the phase that stops it is recorded in [`Plan::decided_by`].
//!
//! Everything that must not happen twice (counting a preemption, bumping the attempt) is a
//! status transition, and every action is idempotent and derived again from status plus
//! observation on the next round. The controller persists a status that deletes or restarts
//! before acting on it, and sends creates together with the status write (the write order is
//! stated once, in `writes/executor.rs`). So a crash between any two steps repeats
//! actions, never decisions:
//! - pods have deterministic names (`<job>-worker-<rank>`), so a repeated create cannot duplicate;
//! - the next attempt's pods are created only after every older pod is gone;
//! - only pods recorded in `status.workers` can "disappear", so a pod the cache has not seen
//!   yet is never mistaken for a preempted one.

use std::sync::Arc;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::{
    Node, NodeAffinity, PersistentVolumeClaim, Pod, Service, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::model::cached_pod::CachedPod;

use crate::config::OperatorConfig;
use crate::model::crd::{JobCondition, LABEL_JOB_UID, Phase, RestartReason, TrainingJobStatus};
use crate::model::liveness::Liveness;
use crate::model::ownership::Foreign;
use crate::model::ownership::Kind;
use crate::model::preemption::NodeView;
use crate::model::validate::{InvalidSpec, ValidJob};

use crate::model::condition::{self, condition_is_true, set_condition};
use crate::model::events::JobEvent;
use crate::model::reason;

mod attempt_start;
mod cost_fallback;
mod goodput;
pub mod in_place;
mod phases;
mod reads;
mod round;
mod view;

use attempt_start::tell_attempt_start;
pub use phases::PhaseName;
pub use phases::elastic::nodes_to_weigh;
pub use reads::sibling_to_read;
use round::Round;
use view::View;
pub use view::attempt_workers;

/// Cap of the exponential failure backoff.
pub const MAX_BACKOFF: SignedDuration = SignedDuration::from_secs(600);
/// How often a job that waits on the cluster (missing claim, no GPU node) is looked at again.
pub const CLUSTER_WAIT_RECHECK: SignedDuration = SignedDuration::from_secs(60);

/// What the cluster looks like to one reconcile.
#[derive(Clone, Debug)]
pub struct Observed {
    /// The job's pods (any attempt) owned by it, as the cache holds them.
    pub pods: Vec<Arc<CachedPod>>,
    /// Where the first pod of a half-created attempt was placed, read whole from the API
    /// server because the cache does not hold placement. The controller supplies it before
    /// deciding when some rank of the current attempt is missing and was not just created
    /// ([`sibling_to_read`]); the missing ranks are then created beside that pod.
    pub sibling_placement: Option<SiblingPlacement>,
    /// GPUs requested by the unfinished pods bound to each node an elastic job that runs shrunk
    /// could grow onto, read whole from the API server when [`nodes_to_weigh`] names nodes
    /// (the caches hold neither other jobs' pods nor requests); None otherwise.
    pub gpus_in_use: Option<std::collections::BTreeMap<String, u64>>,
    /// Objects that hold one of the job's names (a pod's, the Service's, the created PVC's)
    /// but are not the job's ([`crate::model::ownership::foreign`]).
    pub foreign: Vec<Foreign>,
    /// Every node.
    pub nodes: Vec<Arc<Node>>,
    /// What the kubelets' Lease renewals say of the nodes (empty when the operator may not
    /// read Leases): the silent nodes, and the heartbeats of the nodes of the job's pods.
    pub liveness: Liveness,
    /// The checkpoint PVC, when it exists: the job's own, or the `existingClaim` it mounts.
    pub claim: Option<ObservedClaim>,
    /// Whether the job's own rendezvous Service exists.
    pub service_exists: bool,
    /// What the trainers have reported through the progress channel, if they report.
    pub progress: Option<ObservedProgress>,
    /// The attempt whose starting Event this replica has told (published or queued), if any:
    /// a round of a later attempt tells it ([`tell_attempt_start`]), so that a leader killed
    /// between writing a restart and publishing its Event leaves no attempt untold.
    pub told_attempt: Option<u32>,
    /// What this replica's last round that wrote to the job's objects came to, while it is
    /// news: writes the API server rejected for good, or an accepted write while the job shows
    /// a rejection. The round shows it (`WriteRejected`, [`crate::model::rejection::after_writes`]).
    pub last_writes: Option<crate::model::rejection::Writes>,
    /// Writes this operator sent to the job's objects that the caches do not show yet
    /// ([`crate::state::expectations`]): the round holds back any action on those objects.
    pub unseen_writes: Vec<UnseenWrite>,
    /// What the supervisors of the job's workers last said (`spec.restartPolicy.inPlace`).
    pub supervisors: Vec<crate::model::supervision::SupervisorSeen>,
    /// When this operator began serving the supervisors' channel (it became the leader):
    /// what it knows of them starts then ([`SupervisorBoard::listening_since`]).
    ///
    /// [`SupervisorBoard::listening_since`]: crate::progress::supervisors::SupervisorBoard::listening_since
    pub supervisors_since: Option<Timestamp>,
    /// The time of this reconcile.
    pub now: Timestamp,
}

/// A write the operator sent that the caches do not show yet. Until they do (or the wait
/// lapses, in case its watch event was lost), a round decides no action on that object: it
/// would decide from a cache that trails the write, and send it again.
#[derive(Clone, Debug, PartialEq)]
pub struct UnseenWrite {
    /// The object's kind.
    pub kind: Kind,
    /// The object's name.
    pub name: String,
    /// How long it is waited for at most.
    pub lapses_in: SignedDuration,
}

/// The checkpoint claim as one reconcile sees it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ObservedClaim {
    /// The claim was there before this job: one an earlier job of the same name kept
    /// (`retainOnDelete`), or the `existingClaim` the job mounts. It may hold checkpoints the
    /// job's first attempt must continue from, not overwrite.
    pub inherited: bool,
    /// Its owner references: the job's exactly when the job does not retain it.
    pub owners: Vec<OwnerReference>,
    /// Its resourceVersion, the precondition of an owner change.
    pub resource_version: Option<String>,
}

impl ObservedClaim {
    /// The claim `meta` describes, as the job `job` sees it. A claim the operator creates
    /// carries the uid of the job that created it ([`crate::build::pvc::desired_pvc`]): any other
    /// (another uid, or none) was there before this job, and so is every `existingClaim`.
    pub fn of(meta: &ObjectMeta, job: &ValidJob) -> Self {
        let created_by_job = meta
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_JOB_UID))
            .is_some_and(|uid| *uid == job.uid);
        Self {
            inherited: !job.creates_claim || !created_by_job,
            owners: meta.owner_references.clone().unwrap_or_default(),
            resource_version: meta.resource_version.clone(),
        }
    }
}

/// What the trainers of one attempt have reported of their progress (the controller's
/// progress store, `crate::progress`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ObservedProgress {
    /// The attempt the reports belong to.
    pub attempt: u32,
    /// Each reporting rank: its step, when that step last advanced and when it last reported.
    pub ranks: Vec<RankProgress>,
    /// The latest checkpoint step reported, and when it first was.
    pub checkpoint: Option<(u64, Timestamp)>,
    /// The file holding that checkpoint, when its report named one.
    pub checkpoint_file: Option<String>,
    /// The step the attempt resumed from.
    pub resumed_from: Option<u64>,
    /// The highest step reported in the attempt before this one.
    pub previous_attempt_step: Option<u64>,
    /// The step at which a checkpoint was requested, while the request is outstanding.
    pub checkpoint_requested: Option<u64>,
    /// The checkpoint step that answered this attempt's checkpoint request, once one did.
    pub checkpoint_saved_on_request: Option<u64>,
    /// When the endpoint last refused a report for a reason of its own (a token the API
    /// server could not review, too many reports at once), from any job: reports that stop
    /// coming until then say nothing of the ranks that sent them.
    pub channel_refused_at: Option<Timestamp>,
    /// The longest gap between two reports of one rank in this attempt, once a rank reported
    /// twice: a rank is quiet only relative to it ([`crate::model::liveness::quiet_after`]).
    pub report_cadence: Option<SignedDuration>,
}

/// One rank's reported progress.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RankProgress {
    /// The rank.
    pub rank: u32,
    /// Its latest reported step.
    pub step: u64,
    /// When its step last advanced (or first appeared).
    pub advanced_at: Timestamp,
    /// When it last reported, whether its step advanced or not: reports that stop coming are
    /// a fault of the channel, not a hang.
    pub reported_at: Timestamp,
}

impl ObservedProgress {
    /// The highest step any rank reported.
    pub fn step(&self) -> u64 {
        self.ranks.iter().map(|r| r.step).max().unwrap_or(0)
    }

    /// When the job's progress last advanced: the latest advance of any rank.
    pub fn advanced_at(&self) -> Option<Timestamp> {
        self.ranks.iter().map(|r| r.advanced_at).max()
    }

    /// When the latest report of any rank arrived.
    pub fn reported_at(&self) -> Option<Timestamp> {
        self.ranks.iter().map(|r| r.reported_at).max()
    }
}

impl Observed {
    /// Whether a write to the object `kind`/`name` is on its way into the caches.
    pub fn is_unseen(&self, kind: Kind, name: &str) -> bool {
        self.unseen_writes
            .iter()
            .any(|w| w.kind == kind && w.name == name)
    }

    fn node(&self, name: &str) -> Option<&Node> {
        self.nodes
            .iter()
            .find(|n| n.metadata.name.as_deref() == Some(name))
            .map(|n| n.as_ref())
    }

    pub(crate) fn node_view<'a>(&'a self, pod: &'a CachedPod) -> NodeView<'a> {
        match pod.node_name() {
            None => NodeView::Unscheduled,
            Some(n) => match self.node(n) {
                Some(node) => NodeView::Present(node),
                None => NodeView::Missing(n),
            },
        }
    }

    /// Every node, borrowed.
    pub fn node_refs(&self) -> Vec<&Node> {
        self.nodes.iter().map(|n| n.as_ref()).collect()
    }
}

/// The placement of a pod already created for the current attempt.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SiblingPlacement {
    /// Its node affinity.
    pub node_affinity: Option<NodeAffinity>,
    /// Its tolerations.
    pub tolerations: Vec<Toleration>,
}

impl SiblingPlacement {
    /// The placement of a whole pod.
    pub fn of(pod: &Pod) -> Self {
        let spec = pod.spec.as_ref();
        Self {
            node_affinity: spec
                .and_then(|s| s.affinity.as_ref())
                .and_then(|a| a.node_affinity.clone()),
            tolerations: spec.and_then(|s| s.tolerations.clone()).unwrap_or_default(),
        }
    }
}

/// Something the controller must do (in the write order of `writes/executor.rs`).
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Create the rendezvous Service (AlreadyExists means it is there: never adopted).
    CreateService(Box<Service>),
    /// Create the checkpoint PVC (AlreadyExists means it is there: never adopted).
    CreatePvc(Box<PersistentVolumeClaim>),
    /// Set the checkpoint claim's owner references (`retainOnDelete` edited), by a merge patch
    /// that fails when the claim changed since it was observed.
    SetClaimOwners {
        /// Claim name.
        name: String,
        /// Every owner reference the claim is to have.
        owners: Vec<OwnerReference>,
        /// Precondition: the claim as observed.
        resource_version: Option<String>,
    },
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
    /// Move a pod kept for an in-place restart to the attempt it now runs (its attempt label).
    RelabelPod {
        /// Pod name.
        name: String,
        /// Precondition: only this incarnation.
        uid: Option<String>,
        /// The attempt.
        attempt: u32,
    },
}

/// One line per write, as the operator logs it: `create pod tj-worker-1`,
/// `relabel pod tj-worker-0 (uid …) to attempt 2`.
impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (kind, name) = self.target();
        let kind = match kind {
            Kind::Pod => "pod",
            Kind::Service => "service",
            Kind::Claim => "claim",
        };
        fn uid(uid: &Option<String>) -> &str {
            uid.as_deref().unwrap_or("any")
        }
        match self {
            Self::CreateService(_) | Self::CreatePvc(_) | Self::CreatePod(_) => {
                write!(f, "create {kind} {name}")
            }
            Self::SetClaimOwners { owners, .. } => {
                write!(f, "set the {} owner(s) of {kind} {name}", owners.len())
            }
            Self::DeletePod { uid: u, .. } => write!(f, "delete {kind} {name} (uid {})", uid(u)),
            Self::ForceDeletePod { uid: u, .. } => {
                write!(f, "force-delete {kind} {name} (uid {})", uid(u))
            }
            Self::RelabelPod {
                uid: u, attempt, ..
            } => write!(
                f,
                "relabel {kind} {name} (uid {}) to attempt {attempt}",
                uid(u)
            ),
        }
    }
}

impl Action {
    /// The object the action writes.
    pub fn target(&self) -> (Kind, &str) {
        fn name(meta: &ObjectMeta) -> &str {
            meta.name.as_deref().unwrap_or_default()
        }
        match self {
            Self::CreateService(svc) => (Kind::Service, name(&svc.metadata)),
            Self::CreatePvc(claim) => (Kind::Claim, name(&claim.metadata)),
            Self::CreatePod(pod) => (Kind::Pod, name(&pod.metadata)),
            Self::SetClaimOwners { name, .. } => (Kind::Claim, name),
            Self::DeletePod { name, .. }
            | Self::ForceDeletePod { name, .. }
            | Self::RelabelPod { name, .. } => (Kind::Pod, name),
        }
    }

    /// Whether the action deletes a pod.
    pub fn deletes(&self) -> bool {
        matches!(self, Self::DeletePod { .. } | Self::ForceDeletePod { .. })
    }
}

/// The outcome of one decision.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The status to write (before the actions when they delete or restart; see the write
    /// order in `writes/executor.rs`).
    pub status: TrainingJobStatus,
    /// What to do.
    pub actions: Vec<Action>,
    /// Events describing transitions.
    pub events: Vec<JobEvent>,
    /// Look again at this time even if nothing changes.
    pub requeue_at: Option<Timestamp>,
    /// A gang restart was decided in this round.
    pub restart: Option<RestartReason>,
    /// The first pods of this attempt are created in this round (a sample of the
    /// preemption-recovery histogram when the attempt follows a preemption).
    pub creates_attempt: Option<u32>,
    /// Ask the trainers of this attempt for a checkpoint (answered through the progress
    /// channel). It costs no request to the API server: the executor makes it first.
    pub checkpoint_request: Option<u32>,
    /// Forget the answered checkpoint request of this attempt: the termination notice it was
    /// made for is gone, so that a later notice asks for a new checkpoint.
    pub checkpoint_withdrawal: Option<u32>,
    /// Steps the last restart after a preemption lost, measured in this round (for the
    /// `trainyard_operator_steps_lost_per_preemption` histogram).
    pub steps_lost: Option<u64>,
    /// What the job's in-place restart supervisors are told, when the job restarts in place.
    pub supervise: Option<in_place::Supervise>,
    /// The phase that ended the round.
    pub decided_by: PhaseName,
}

impl Plan {
    /// Whether GPUs or a node with seconds left wait on the round: it restarts the gang, acts
    /// on the cluster, or asks for a checkpoint on a notice. Any other round writes status
    /// alone (routine, `crate::writes`).
    pub fn is_urgent(&self) -> bool {
        self.restart.is_some() || !self.actions.is_empty() || self.checkpoint_request.is_some()
    }
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
    let events = write_invalid_spec(&mut st, &current.conditions, Some(err), generation, now);
    (st, events)
}

/// The report on an object that does not parse as a TrainingJob (so no status can be
/// decided for it): the `InvalidSpec` condition with reason `MalformedObject`, and its
/// Warning Event. The controller sends the condition alone, as a merge patch.
pub fn malformed_report(
    parse_error: &str,
    generation: Option<i64>,
    now: Timestamp,
) -> (JobCondition, JobEvent) {
    let message = format!("the object does not parse as a TrainingJob: {parse_error}");
    let mut conditions = Vec::new();
    set_condition(
        &mut conditions,
        condition::INVALID_SPEC,
        true,
        reason::MALFORMED_OBJECT,
        &message,
        now,
        generation,
    );
    let condition = conditions.remove(0);
    (condition, JobEvent::warning(reason::INVALID_SPEC, message))
}

/// The one writer of the condition `InvalidSpec`: True with the error (and a Warning Event
/// when its message changes), or False once a job that was invalid is valid again.
fn write_invalid_spec(
    st: &mut TrainingJobStatus,
    before: &[JobCondition],
    err: Option<&InvalidSpec>,
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<JobEvent> {
    let Some(err) = err else {
        if condition_is_true(&st.conditions, condition::INVALID_SPEC) {
            set_condition(
                &mut st.conditions,
                condition::INVALID_SPEC,
                false,
                reason::VALID,
                "",
                now,
                generation,
            );
        }
        return Vec::new();
    };
    let message = err.to_string();
    let already = before
        .iter()
        .any(|c| c.type_ == condition::INVALID_SPEC && c.status == "True" && c.message == message);
    set_condition(
        &mut st.conditions,
        condition::INVALID_SPEC,
        true,
        reason::INVALID_SPEC,
        &message,
        now,
        generation,
    );
    st.observed_generation = generation;
    st.phase.get_or_insert(Phase::Pending);
    if already {
        Vec::new()
    } else {
        vec![JobEvent::warning(reason::INVALID_SPEC, message)]
    }
}

/// Decides the next status and actions: runs the phases (`phases::PHASES`) in order over one view of the
/// job until one of them ends the round.
pub fn decide(
    job: &ValidJob,
    observed: &Observed,
    current: &TrainingJobStatus,
    config: &OperatorConfig,
) -> Plan {
    let view = View::new(job, observed, current, config);
    let mut round = Round::new(&view);
    for &(name, phase) in phases::PHASES {
        if phase(&view, &mut round) == Flow::Stop {
            return round.finish(&view, name);
        }
    }
    unreachable!("the last phase always ends the round")
}

/// Whether the round goes on to the next phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Flow {
    /// The next phase decides further.
    Continue,
    /// This phase ended the round.
    Stop,
}

/// The pod of `rank` in the attempt of `st`, placed by `placement`: what the create phase
/// creates, and whose environment a kept pod's supervisor starts the attempt with.
fn worker_pod(
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
        workers: view::attempt_workers(view.job, st),
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

fn pod_name(pod: &CachedPod) -> String {
    pod.metadata.name.clone().unwrap_or_default()
}

/// Whether a pod's containers have all stopped (it no longer holds its GPUs): its phase is
/// final, or every container has terminated and the kubelet has not said so in the phase yet.
/// A pod whose trainer exited while a sidecar (or a native sidecar init container) still runs
/// is not finished.
fn is_finished(pod: &CachedPod) -> bool {
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return true;
    }
    let terminated = |c: &crate::model::cached_pod::CachedContainerStatus| {
        c.state.as_ref().is_some_and(|s| s.terminated.is_some())
    };
    let statuses = status.container_statuses.as_deref().unwrap_or_default();
    let containers = &pod.spec.containers;
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

#[cfg(test)]
mod tests;
