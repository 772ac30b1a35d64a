//! What a decision comes to: the [`Plan`] with its actions, the phase that decided it, and how
//! a phase hands on to the next.

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::model::crd::{RestartReason, TrainingJobStatus};
use crate::model::events::JobEvent;
use crate::model::ownership::Kind;
use crate::model::supervision::Directive;

/// Cap of the exponential failure backoff.
pub const MAX_BACKOFF: SignedDuration = SignedDuration::from_secs(600);
/// How often a job that waits on the cluster (missing claim, no GPU node) is looked at again.
pub const CLUSTER_WAIT_RECHECK: SignedDuration = SignedDuration::from_secs(60);

/// The name of a phase: which one decided a round ([`Plan::decided_by`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PhaseName {
    /// `checkpoint.retainOnDelete`, also when edited: the claim's owner reference.
    ClaimOwner,
    /// A Succeeded or Failed job: stop what still runs.
    Terminal,
    /// `spec.suspend`: no pods.
    Suspend,
    /// `spec.suspend` went back to false.
    Resume,
    /// `activeDeadlineSeconds`.
    Deadline,
    /// A job that names a Kueue LocalQueue: no pods until its Workload is admitted.
    Admission,
    /// Classify the current attempt's workers.
    Classify,
    /// Record what the trainers reported through the progress channel.
    Progress,
    /// A preemption or failure: restart the whole gang, or fail past the budget.
    GangRestart,
    /// The trainers' progress stopped advancing for `progressTimeoutSeconds`.
    Hang,
    /// `spec.elastic`: a shrunk gang with room for more workers grows, after a checkpoint.
    Grow,
    /// A termination notice on a running worker's node: checkpoint, then restart from it.
    TerminationNotice,
    /// An early warning (a rebalance recommendation) on a running worker's node: a
    /// replacement waits elsewhere, and the gang switches to it at the next checkpoint.
    EarlyWarning,
    /// Every trainer exited 0.
    Success,
    /// Pods of an older attempt must be gone before new ones start.
    DrainOldAttempt,
    /// Objects of the job's names that are not its own.
    ForeignObjects,
    /// The claim the job mounts must exist.
    ClusterPrerequisites,
    /// The wait after a failure or a requeue.
    Backoff,
    /// Unscheduled pods that avoid a node whose termination notice was withdrawn.
    WithdrawnNotice,
    /// Create the missing workers (and the Service and PVC).
    Create,
    /// Whether the workers can be placed.
    Unschedulable,
    /// `spec.elastic`: workers that cannot be placed for a while: the gang shrinks.
    Shrink,
    /// Workers that cannot be placed for `placementTimeoutSeconds` beside placed ones: the
    /// gang lets go of every pod and tries again later.
    Requeue,
    /// Whether every worker runs.
    Running,
}

/// Whether the round goes on to the next phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Flow {
    /// The next phase decides further.
    Continue,
    /// This phase ended the round.
    Stop,
}

/// What the executor tells the job's supervisors after a round.
#[derive(Clone, Debug, PartialEq)]
pub struct Supervise {
    /// The job's directive.
    pub directive: Directive,
    /// The uids of the job's pods: supervisors of other pods are forgotten.
    pub pods: Vec<String>,
}

/// Something the controller must do (in the write order of `writes/executor.rs`).
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Create the rendezvous Service (AlreadyExists means it is there: never adopted).
    CreateService(Box<Service>),
    /// Create the checkpoint PVC (AlreadyExists means it is there: never adopted).
    CreatePvc(Box<PersistentVolumeClaim>),
    /// Create the gang scheduler's PodGroup with an attempt's first pods (AlreadyExists means
    /// it is there).
    CreatePodGroup(Box<crate::model::podgroup::PodGroup>),
    /// Create the job's Kueue Workload (AlreadyExists means it is there).
    CreateWorkload(Box<crate::model::kueue::Workload>),
    /// Write the status of the job's Kueue Workload, by a merge patch under the
    /// resourceVersion it was read at (a conflict writes nothing; the next round decides
    /// again): its whole `conditions` list, and with `release`, no `admission` (the quota
    /// given back after an eviction, so that Kueue queues it again).
    WriteWorkloadStatus {
        /// The Workload.
        name: String,
        /// Precondition: the Workload as observed.
        resource_version: Option<String>,
        /// Every condition it is to have.
        conditions: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
        /// Clear `status.admission`.
        release: bool,
    },
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
        /// The pod's seal for that attempt ([`crate::model::seal`]).
        seal: Option<String>,
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
            Kind::PodGroup => "podgroup",
            Kind::Workload => "workload",
        };
        fn uid(uid: &Option<String>) -> &str {
            uid.as_deref().unwrap_or("any")
        }
        match self {
            Self::CreateService(_)
            | Self::CreatePvc(_)
            | Self::CreatePodGroup(_)
            | Self::CreateWorkload(_)
            | Self::CreatePod(_) => {
                write!(f, "create {kind} {name}")
            }
            Self::WriteWorkloadStatus { release, .. } => write!(
                f,
                "write the status of {kind} {name}{}",
                if *release { " (quota given back)" } else { "" }
            ),
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
            Self::CreatePodGroup(group) => (Kind::PodGroup, name(group.metadata())),
            Self::CreateWorkload(w) => (Kind::Workload, name(&w.metadata)),
            Self::WriteWorkloadStatus { name, .. } => (Kind::Workload, name),
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
    pub supervise: Option<Supervise>,
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

/// The least base of the requeue backoff: two jobs released together retry at least this far
/// apart on average, whatever `restartPolicy.backoffSeconds` says.
pub const MIN_REQUEUE_BACKOFF_SECONDS: u32 = 10;

/// Delay before the next try after the `requeues`-th requeue of the job whose uid is `uid`:
/// the failure backoff of `base_seconds` (at least [`MIN_REQUEUE_BACKOFF_SECONDS`]) for that
/// count, stretched by a jitter of 0 to 100 % that the uid and the count decide. Two jobs
/// released at the same time so retry at different times, and the one that goes first can be
/// placed whole before the other holds anything; each replica computes the same delay.
pub fn requeue_backoff(base_seconds: u32, requeues: u32, uid: &str) -> SignedDuration {
    use std::hash::{Hash, Hasher};
    let backoff = failure_backoff(base_seconds.max(MIN_REQUEUE_BACKOFF_SECONDS), requeues);
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (uid, requeues).hash(&mut hasher);
    let permille = i32::try_from(hasher.finish() % 1000).unwrap_or(0);
    let jitter = backoff.checked_mul(permille).unwrap_or(MAX_BACKOFF) / 1000;
    backoff.saturating_add(jitter)
}

/// When the pods of the attempt that `status` restarted into may be created: the failure
/// backoff after a failure, the requeue backoff (with its jitter) after a requeue, counted from
/// the restart's decision; `None` for a restart that waits for nothing.
pub fn next_try(
    job: &crate::model::validate::ValidJob,
    status: &crate::model::crd::TrainingJobStatus,
) -> Option<jiff::Timestamp> {
    let last = status.last_restart.as_ref()?;
    let base = job.spec.restart_policy.backoff_seconds;
    let backoff = match last.reason {
        RestartReason::Failure => failure_backoff(base, status.failures),
        RestartReason::Requeue => requeue_backoff(base, status.requeues, &job.uid),
        _ => return None,
    };
    Some(last.time.0.saturating_add(backoff).unwrap_or(last.time.0))
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
