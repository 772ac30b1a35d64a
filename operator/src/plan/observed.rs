//! What the cluster looks like to one decision: the input `decide` reads, and the pod facts
//! every part of it shares.

use std::sync::Arc;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::{Node, NodeAffinity, Pod, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::model::cached_pod::CachedPod;
use crate::model::crd::LABEL_JOB_UID;
use crate::model::liveness::Liveness;
use crate::model::ownership::{Foreign, Kind};
use crate::model::preemption::NodeView;
use crate::model::validate::ValidJob;

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
    pub last_writes: Option<crate::model::rejection::WriteOutcome>,
    /// Writes this operator sent to the job's objects that the caches do not show yet
    /// ([`crate::state::expectations`]): the round holds back any action on those objects.
    pub unseen_writes: Vec<UnseenWrite>,
    /// Where the job's Kueue Workload stands, for a job that names a LocalQueue
    /// ([`crate::model::kueue`]); `None` for every other job.
    pub queue: Option<crate::model::kueue::Queued>,
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
    pub ranks: Vec<ObservedRank>,
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
pub struct ObservedRank {
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

    pub(super) fn node(&self, name: &str) -> Option<&Node> {
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

/// The pod's name.
pub(crate) fn pod_name(pod: &CachedPod) -> String {
    pod.metadata.name.clone().unwrap_or_default()
}

/// Whether a pod's containers have all stopped (it no longer holds its GPUs): its phase is
/// final, or every container has terminated and the kubelet has not said so in the phase yet.
/// A pod whose trainer exited while a sidecar (or a native sidecar init container) still runs
/// is not finished.
pub(crate) fn is_finished(pod: &CachedPod) -> bool {
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
