//! The `TrainingJob` custom resource (`trainyard.dev/v1alpha1`).
//!
//! The Rust types are the source of truth: `trainyard-operator crd` prints the CRD generated
//! from them, and the schema carries the validation (minimums, enums, patterns, defaults) that
//! lets the API server reject nonsense before the operator sees it. The schema sticks to plain
//! OpenAPI v3 so that Kubernetes 1.20 accepts it (no CEL rules).

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::env::MAX_CHECKPOINT_FILE_BYTES;
use crate::ranks::RankSet;

/// API group of every trainyard resource.
pub const GROUP: &str = "trainyard.dev";
/// Label carrying the owning job's name on pods, Services and PVCs.
pub const LABEL_JOB: &str = "trainyard.dev/job";
/// Label carrying the worker rank on pods.
pub const LABEL_RANK: &str = "trainyard.dev/rank";
/// Label carrying the 0-based attempt on pods.
pub const LABEL_ATTEMPT: &str = "trainyard.dev/attempt";
/// Label `"true"` on a replacement created ahead of a termination notice, labelled with the
/// attempt it waits for: it joins that attempt when the notice's restart starts it.
pub const LABEL_STANDBY: &str = "trainyard.dev/standby";
/// Annotation on a standby ([`LABEL_STANDBY`]): when the operator created it, on the
/// operator's own clock, the one every judgment of the standby's waits is made on (its
/// `creationTimestamp` is the API server's, which may differ from the operator's by any
/// amount).
pub const ANNOTATION_STANDBY_CREATED_AT: &str = "trainyard.dev/standby-created-at";
/// Label carrying the owning job's uid on pods: with [`LABEL_ATTEMPT`], it selects one
/// attempt of one incarnation of a job (a job deleted and created again under the same name
/// has another uid), e.g. `kubectl get pods -l trainyard.dev/job-uid=<uid>,trainyard.dev/attempt=2`.
pub const LABEL_JOB_UID: &str = "trainyard.dev/job-uid";
/// The extended resource name GPUs are requested under unless `spec.gpu.resourceName` says otherwise.
pub const DEFAULT_GPU_RESOURCE: &str = "nvidia.com/gpu";

// Upper bounds of the spec's numbers, in the schema and checked again by `validate` (which
// must not rely on the API server). Every number the operator reads is bounded, so none can
// drive a loop, an overflow or a timestamp past year 9999.

/// Most workers (`spec.workers`): defined with the rank sets it bounds.
pub use crate::ranks::MAX_WORKERS;
/// Most entries of `status.workers`: a gang this small is listed whole; of a larger one, the
/// workers that are not running come first, and `status.workerSummary` counts them all, so a
/// status stays a few KiB at 10,000 workers.
pub const MAX_WORKER_ENTRIES: usize = 32;
/// Most gang sizes `status.ledger.elastic.byWorkers` lists; a stretch of another size past
/// them is counted under the listed size nearest to it.
pub const MAX_LEDGER_SIZES: usize = 64;
/// Longest `status.workers[].reason`: a kubelet's or scheduler's message is cut there.
pub const MAX_REASON_CHARS: usize = 256;
/// Longest condition message and `lastRestart.detail`: they quote kubelets, the scheduler
/// and pod messages, whose length trainyard does not choose.
pub const MAX_MESSAGE_CHARS: usize = 1024;
/// Longest rank set of `status.workerSummary`, above the longest any set of ranks below
/// [`MAX_WORKERS`] can be written as (pairs with a rank left out between them,
/// "0-1,3-4,…", about 33,000 characters); a whole gang is "0-9999".
pub const MAX_RANK_SET_CHARS: usize = 40_000;
/// Most GPUs per worker (`spec.gpusPerWorker`): the largest nodes have 8 or 16 GPUs, and 8
/// GPUs split into 7 MIG slices each expose 56 devices; it is also `NPROC_PER_NODE`.
pub const MAX_GPUS_PER_WORKER: u32 = 64;
/// Largest `spec.gpu.minMemoryGiB`: today's largest GPUs hold 288 GB.
pub const MAX_MIN_MEMORY_GIB: u32 = 1024;
/// Largest restart budget or count (`maxPreemptions`, `maxFailures`,
/// `fallbackToOnDemandAfter`): keeps the status counters far below `u32::MAX`.
pub const MAX_RESTARTS: u32 = 10_000;
/// Largest `spec.restartPolicy.backoffSeconds`: the backoff is capped at 10 minutes anyway.
pub const MAX_BACKOFF_SECONDS: u32 = 600;
/// Longest `spec.terminationGracePeriodSeconds` (one day): time to write a checkpoint.
pub const MAX_GRACE_SECONDS: i64 = 86_400;
/// Longest `spec.activeDeadlineSeconds` (365 days).
pub const MAX_DEADLINE_SECONDS: i64 = 31_536_000;
/// Shortest `spec.restartPolicy.progressTimeoutSeconds`: trainers report every few seconds.
pub const MIN_PROGRESS_TIMEOUT_SECONDS: u32 = 10;
/// Longest `spec.restartPolicy.progressTimeoutSeconds` (one day).
pub const MAX_PROGRESS_TIMEOUT_SECONDS: u32 = 86_400;
/// Largest step a trainer may report (the schema's bound on `status.progress`): 2^53 - 1, the
/// largest integer a JSON number (and the schema's float `maximum`) holds exactly. A larger
/// bound is rounded to 2^63 in the schema, which the API server reads back as a negative
/// int64 and then rejects every value.
pub const MAX_STEP: u64 = (1 << 53) - 1;
/// Largest count of the goodput ledger (GPU-milliseconds, micro-dollars): the same bound as
/// [`MAX_STEP`], 285,000 GPU-years or 9 billion dollars. The ledger stops counting there
/// rather than write a number the schema rejects.
pub const MAX_LEDGER: u64 = MAX_STEP;
/// [`MAX_LEDGER`] as a signed bound, for `microDollars.saved`.
const MAX_LEDGER_SIGNED: i64 = MAX_LEDGER as i64;

/// Desired state of a distributed training job.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "trainyard.dev",
    version = "v1alpha1",
    kind = "TrainingJob",
    plural = "trainingjobs",
    shortname = "tj",
    namespaced,
    status = "TrainingJobStatus",
    doc = "A gang of GPU worker pods that survives spot preemption by restarting from its latest checkpoint.",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Waiting","type":"string","jsonPath":".status.waitingFor"}"#,
    printcolumn = r#"{"name":"Workers","type":"integer","jsonPath":".spec.workers"}"#,
    printcolumn = r#"{"name":"World","type":"integer","jsonPath":".status.worldSize"}"#,
    printcolumn = r#"{"name":"GPUs","type":"integer","jsonPath":".spec.gpusPerWorker"}"#,
    printcolumn = r#"{"name":"Attempt","type":"integer","jsonPath":".status.attempt"}"#,
    printcolumn = r#"{"name":"Preemptions","type":"integer","jsonPath":".status.preemptions"}"#,
    printcolumn = r#"{"name":"Cost","type":"string","jsonPath":".status.ledger.cost"}"#,
    printcolumn = r#"{"name":"Goodput","type":"string","jsonPath":".status.ledger.goodput"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct TrainingJobSpec {
    /// Number of worker pods (one per node).
    #[serde(default = "default_workers")]
    #[schemars(range(min = 1, max = MAX_WORKERS))]
    pub workers: u32,

    /// GPUs per worker: the GPU limit on the trainer container. 0 runs on CPU.
    #[serde(default)]
    #[schemars(range(min = 0, max = MAX_GPUS_PER_WORKER))]
    pub gpus_per_worker: u32,

    /// Which GPUs the workers may land on.
    #[serde(default)]
    pub gpu: GpuSpec,

    /// Spot placement.
    #[serde(default)]
    pub spot: SpotSpec,

    /// The checkpoint volume mounted into the trainer.
    #[serde(default)]
    pub checkpoint: CheckpointSpec,

    /// Restart budgets and failure backoff.
    #[serde(default)]
    pub restart_policy: RestartPolicySpec,

    /// Seconds the trainer gets after SIGTERM to write its checkpoint.
    #[serde(default = "default_grace_seconds")]
    #[schemars(range(min = 0, max = MAX_GRACE_SECONDS))]
    pub termination_grace_period_seconds: i64,

    /// Wall-clock limit of the job, counted from its start or its latest resume (time spent
    /// suspended does not count); the job fails when it passes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_DEADLINE_SECONDS))]
    pub active_deadline_seconds: Option<i64>,

    /// true keeps the job without pods (for queueing systems such as Kueue).
    #[serde(default)]
    pub suspend: bool,

    /// Keep training with fewer workers when lost ones cannot be replaced, and grow back
    /// when capacity returns. Absent: every attempt runs `workers` workers, and waits for
    /// them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elastic: Option<ElasticSpec>,

    /// How long a gang may wait half placed.
    #[serde(default)]
    pub scheduling: SchedulingSpec,

    /// Pod template of every worker. The container named `trainer` (else the first) is the trainer.
    #[serde(default)]
    #[schemars(schema_with = "pod_template_schema")]
    pub template: PodTemplateSpec,
}

/// How an attempt that cannot place every worker lets go of the ones it placed
/// (`spec.scheduling`).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SchedulingSpec {
    /// How long some workers of an attempt may hold their nodes and GPUs while others cannot
    /// be placed. Past it the attempt releases every pod it holds (none has trained yet) and
    /// tries again after a backoff with jitter (restart reason `Requeue`, counted in
    /// `status.requeues`, against no budget), so that two jobs that each hold part of what
    /// the other needs do not wait for each other for ever. An elastic job that can shrink
    /// shrinks instead, after `elastic.replacementWaitSeconds`.
    #[serde(default = "default_placement_timeout_seconds")]
    #[schemars(range(min = 1, max = MAX_PLACEMENT_TIMEOUT_SECONDS))]
    pub placement_timeout_seconds: u32,
}

impl Default for SchedulingSpec {
    fn default() -> Self {
        Self {
            placement_timeout_seconds: default_placement_timeout_seconds(),
        }
    }
}

/// The longest `scheduling.placementTimeoutSeconds`: a day.
pub const MAX_PLACEMENT_TIMEOUT_SECONDS: u32 = 86_400;

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn default_placement_timeout_seconds() -> u32 {
    180
}

fn default_workers() -> u32 {
    1
}

/// How an elastic job shrinks and grows (`spec.elastic`).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ElasticSpec {
    /// The fewest workers the job trains with. When some workers of an attempt cannot be
    /// placed for `replacementWaitSeconds` and at least this many are placed, the gang
    /// restarts with the placed ones; with fewer placed, it waits.
    #[schemars(range(min = 1, max = MAX_WORKERS))]
    pub min_workers: u32,

    /// How long the workers that cannot be placed are waited for before the gang shrinks.
    #[serde(default = "default_replacement_wait_seconds")]
    #[schemars(range(min = 0, max = MAX_REPLACEMENT_WAIT_SECONDS))]
    pub replacement_wait_seconds: u32,
}

/// The longest `elastic.replacementWaitSeconds`: a day.
pub const MAX_REPLACEMENT_WAIT_SECONDS: u32 = 86_400;

fn default_replacement_wait_seconds() -> u32 {
    60
}

fn default_grace_seconds() -> i64 {
    60
}

/// The template is a whole PodTemplateSpec; embedding its full schema would make the CRD
/// enormous, so the API server only checks that it is an object and the operator validates
/// what it relies on.
fn pod_template_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "description": "A PodTemplateSpec (core/v1). The container named `trainer` (else the first) is the trainer.",
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// GPU selection.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuSpec {
    /// Extended resource the GPUs are requested as.
    #[serde(default = "default_gpu_resource")]
    #[schemars(length(min = 1))]
    pub resource_name: String,

    /// Allowed values of the node label `nvidia.com/gpu.product`; empty allows any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub products: Vec<String>,

    /// Minimum GPU memory in GiB, compared with the node label `nvidia.com/gpu.memory` (MiB).
    #[serde(
        default,
        rename = "minMemoryGiB",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 1, max = MAX_MIN_MEMORY_GIB))]
    pub min_memory_gib: Option<u32>,

    /// How to choose among the allowed products.
    #[serde(default)]
    pub selection: GpuSelection,

    /// Lowest CUDA version the node's driver must support, "major.minor" (e.g. "12.4").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]{1,3}\.[0-9]{1,3}$"))]
    pub min_cuda_version: Option<String>,

    /// Lowest GPU compute capability, "major.minor" (e.g. "8.0").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]{1,3}\.[0-9]{1,3}$"))]
    pub min_compute_capability: Option<String>,
}

impl Default for GpuSpec {
    fn default() -> Self {
        Self {
            resource_name: default_gpu_resource(),
            products: Vec::new(),
            min_memory_gib: None,
            selection: GpuSelection::default(),
            min_cuda_version: None,
            min_compute_capability: None,
        }
    }
}

fn default_gpu_resource() -> String {
    DEFAULT_GPU_RESOURCE.to_owned()
}

/// How the product is chosen among the allowed ones.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum GpuSelection {
    /// Pin the allowed product with the lowest price among those the cluster offers.
    #[default]
    Cheapest,
    /// Let the scheduler pick any allowed product.
    Any,
}

/// Spot placement.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SpotSpec {
    /// Whether workers run on spot nodes.
    #[serde(default)]
    pub policy: SpotPolicy,

    /// With `fallback: Count`: after this many preemptions later attempts avoid spot; 0
    /// never falls back. Not used with `fallback: Cost`.
    #[serde(default = "default_fallback")]
    #[schemars(range(min = 0, max = MAX_RESTARTS))]
    pub fallback_to_on_demand_after: u32,

    /// The rule that moves later attempts off spot for good: `Count` after
    /// `fallbackToOnDemandAfter` preemptions; `Cost` once the job's spot GPU time has cost
    /// more per useful GPU-hour than on-demand would.
    #[serde(default)]
    pub fallback: SpotFallback,
}

impl Default for SpotSpec {
    fn default() -> Self {
        Self {
            policy: SpotPolicy::default(),
            fallback_to_on_demand_after: default_fallback(),
            fallback: SpotFallback::default(),
        }
    }
}

/// The rule that moves later attempts off spot for good. Either is judged only when the next
/// attempt is placed, and only under policy `Prefer` or `Require`.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum SpotFallback {
    /// After `fallbackToOnDemandAfter` preemptions.
    #[default]
    Count,
    /// Once the job's spot GPU time has cost more per useful GPU-hour than the product's
    /// on-demand price, from the goodput ledger and the operator's price table (the Event
    /// `SpotNoLongerPays` and the condition `SpotFallback` say the numbers).
    Cost,
}

fn default_fallback() -> u32 {
    3
}

/// Spot policy.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum SpotPolicy {
    /// Prefer spot nodes, accept on-demand ones.
    #[default]
    Prefer,
    /// Only spot nodes.
    Require,
    /// Never spot nodes.
    Never,
}

/// The checkpoint volume.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointSpec {
    /// Where the volume is mounted in the trainer.
    #[serde(default = "default_mount_path")]
    #[schemars(regex(pattern = r"^/.*"))]
    pub mount_path: String,

    /// Size of the created PVC.
    #[serde(default = "default_checkpoint_size")]
    pub size: Quantity,

    /// StorageClass of the created PVC; empty uses the cluster default.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub storage_class_name: String,

    /// Access modes of the created PVC; empty means ReadWriteOnce for one worker, ReadWriteMany otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub access_modes: Vec<AccessMode>,

    /// Mount this existing PVC instead of creating one.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub existing_claim: String,

    /// Keep a created PVC after the job is deleted.
    #[serde(default = "default_true")]
    pub retain_on_delete: bool,
}

impl Default for CheckpointSpec {
    fn default() -> Self {
        Self {
            mount_path: default_mount_path(),
            size: default_checkpoint_size(),
            storage_class_name: String::new(),
            access_modes: Vec::new(),
            existing_claim: String::new(),
            retain_on_delete: true,
        }
    }
}

fn default_mount_path() -> String {
    "/mnt/checkpoints".to_owned()
}

fn default_checkpoint_size() -> Quantity {
    Quantity("50Gi".to_owned())
}

fn default_true() -> bool {
    true
}

/// PersistentVolumeClaim access modes.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum AccessMode {
    /// Mounted read-write by one node.
    ReadWriteOnce,
    /// Mounted read-write by many nodes.
    ReadWriteMany,
    /// Mounted read-only by many nodes.
    ReadOnlyMany,
    /// Mounted read-write by one pod.
    ReadWriteOncePod,
}

impl AccessMode {
    /// The Kubernetes spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            AccessMode::ReadWriteOnce => "ReadWriteOnce",
            AccessMode::ReadWriteMany => "ReadWriteMany",
            AccessMode::ReadOnlyMany => "ReadOnlyMany",
            AccessMode::ReadWriteOncePod => "ReadWriteOncePod",
        }
    }
}

/// Restart budgets.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestartPolicySpec {
    /// Restarts caused by preemption before the job fails.
    #[serde(default = "default_max_preemptions")]
    #[schemars(range(min = 0, max = MAX_RESTARTS))]
    pub max_preemptions: u32,

    /// Restarts caused by failures before the job fails.
    #[serde(default = "default_max_failures")]
    #[schemars(range(min = 0, max = MAX_RESTARTS))]
    pub max_failures: u32,

    /// Base of the exponential failure backoff, doubled per failure and capped at 10 minutes.
    #[serde(default = "default_backoff_seconds")]
    #[schemars(range(min = 0, max = MAX_BACKOFF_SECONDS))]
    pub backoff_seconds: u32,

    /// Restart the gang (reason `Hang`) when a job that reports progress stops advancing for
    /// this long while its workers run. Unset: never (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = MIN_PROGRESS_TIMEOUT_SECONDS, max = MAX_PROGRESS_TIMEOUT_SECONDS))]
    pub progress_timeout_seconds: Option<u32>,

    /// Restarts caused by hangs before the job fails.
    #[serde(default = "default_max_hangs")]
    #[schemars(range(min = 0, max = MAX_RESTARTS))]
    pub max_hangs: u32,

    /// Restart the gang in place where the pods allow it: a worker whose pod and node are
    /// healthy keeps its pod (and its GPUs), and the supervisor in its container
    /// (`examples/trainyard_launch.py`) stops the old attempt's processes and starts the next
    /// attempt's; only lost, noticed or failed pods are created again. Needs the progress
    /// channel; a pod whose supervisor does not answer is replaced as without it. Unset:
    /// true. `false`: every restart creates every pod again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_place: Option<bool>,

    /// Make before break on a termination notice, for a job that restarts in place: the
    /// noticed workers' replacements are created at once, beside them, and wait there (holding
    /// their GPUs) until the checkpoint the notice asks for; the restart then starts on them.
    /// A replacement with no room within 15 s is given up. Unset: true. `false`: a notice's
    /// replacements are created once the noticed pods are gone, as in any restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replace_ahead_on_notice: Option<bool>,
}

impl RestartPolicySpec {
    /// Whether restarts keep the pods they can (`inPlace`, true unless set to false).
    pub fn in_place(&self) -> bool {
        self.in_place.unwrap_or(true)
    }

    /// Whether a notice's replacements are created ahead (`replaceAheadOnNotice`, true unless
    /// set to false; only with [`Self::in_place`]).
    pub fn replace_ahead_on_notice(&self) -> bool {
        self.replace_ahead_on_notice.unwrap_or(true)
    }
}

impl Default for RestartPolicySpec {
    fn default() -> Self {
        Self {
            max_preemptions: default_max_preemptions(),
            max_failures: default_max_failures(),
            backoff_seconds: default_backoff_seconds(),
            progress_timeout_seconds: None,
            max_hangs: default_max_hangs(),
            in_place: None,
            replace_ahead_on_notice: None,
        }
    }
}

fn default_max_preemptions() -> u32 {
    100
}

fn default_max_failures() -> u32 {
    3
}

fn default_backoff_seconds() -> u32 {
    10
}

fn default_max_hangs() -> u32 {
    3
}

/// Observed state of a TrainingJob.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrainingJobStatus {
    /// Where the job is in its life.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,

    /// 0-based attempt; each gang restart increments it, and so does resuming a suspended job
    /// whose workers had been created: every attempt after the first resumes from the
    /// checkpoint.
    #[serde(default)]
    #[schemars(range(min = 0, max = u32::MAX))]
    pub attempt: u32,

    /// Restarts caused by preemption.
    #[serde(default)]
    #[schemars(range(min = 0, max = u32::MAX))]
    pub preemptions: u32,

    /// Restarts caused by failures (and the final failure, if the budget ran out).
    #[serde(default)]
    #[schemars(range(min = 0, max = u32::MAX))]
    pub failures: u32,

    /// Restarts caused by hangs (progress stopped advancing; and the final one, if the budget
    /// ran out).
    #[serde(default)]
    #[schemars(range(min = 0, max = u32::MAX))]
    pub hangs: u32,

    /// Restarts because the gang could not be placed whole within
    /// `scheduling.placementTimeoutSeconds` (restart reason `Requeue`): counted against no
    /// budget; they set the backoff before the next try.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(range(min = 0, max = u32::MAX))]
    pub requeues: u32,

    /// What the trainers report of their progress (only for trainers that report).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<ProgressStatus>,

    /// The generation this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Running, Restarting, Succeeded, Failed, Unschedulable, InvalidSpec.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<JobCondition>,

    /// The GPU product the workers were pinned to, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selected_gpu: Option<SelectedGpu>,

    /// The current attempt's workers, as the operator has seen them: every worker of a gang
    /// of up to 32 ([`MAX_WORKER_ENTRIES`]); of a larger gang, 32 of them, those that are not
    /// running first (failed, preempted, pending, succeeded). `workerSummary` counts them all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_WORKER_ENTRIES))]
    pub workers: Vec<WorkerStatus>,

    /// The current attempt's workers in numbers, and which ranks the operator has seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_summary: Option<WorkerSummary>,

    /// The latest gang restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_restart: Option<LastRestart>,

    /// With `spec.elastic`: the workers of the current attempt (`spec.workers` unless the
    /// gang shrank; the condition `Shrunk` says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_WORKERS))]
    pub world_size: Option<u32>,

    /// With `spec.elastic`: grows in a row whose new workers could not be placed, so that the
    /// gang shrank again; each doubles the wait before the next grow. Back to 0 once a grow
    /// runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = u32::MAX))]
    pub failed_grows: Option<u32>,

    /// The step-addressed checkpoint the next attempt resumes from (`RESUME_FROM`): the
    /// newest one the workers of the newest attempt that saved one reported. A writer of an
    /// older attempt that replaces `latest.pt` cannot move it back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_point: Option<ResumePoint>,

    /// The PVC holding the checkpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_claim: Option<String>,

    /// When the first pods were created, or when the job was last resumed after that;
    /// `activeDeadlineSeconds` counts from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,

    /// When the job succeeded or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,

    /// Where the job's GPU time went and what it cost (jobs that request GPUs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ledger: Option<GoodputLedger>,

    /// What a job that does not run waits for, in a word (the `WAITING` column):
    /// `Admission` (Kueue has not admitted its Workload), `Capacity` (workers cannot be
    /// placed), `Requeue` (released for want of room, waiting out its backoff), `Backoff`
    /// (after a failure); absent while it runs or has ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
}

/// The trainers' progress, from their reports (`TRAINYARD_PROGRESS_URL`).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProgressStatus {
    /// The attempt the figures below belong to.
    #[schemars(range(min = 0, max = u32::MAX))]
    pub attempt: u32,
    /// The highest step any worker of the attempt has reported.
    #[schemars(range(min = 0, max = MAX_STEP))]
    pub step: u64,
    /// The step of the latest checkpoint a worker reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_STEP))]
    pub checkpoint_step: Option<u64>,
    /// The file in the checkpoint directory that holds the checkpoint at `checkpointStep`,
    /// when the report named one (a step-addressed checkpoint, docs/env-contract.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_CHECKPOINT_FILE_BYTES))]
    pub checkpoint_file: Option<String>,
    /// When that checkpoint was first reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_time: Option<Time>,
    /// The step the attempt resumed from, as its trainer reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_STEP))]
    pub resumed_from: Option<u64>,
    /// Steps the restart before this attempt lost: the step reported before it, minus
    /// `resumedFrom`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_STEP))]
    pub steps_lost: Option<u64>,
    /// When the operator asked the trainers for a checkpoint (a termination notice on a
    /// worker's node) while that notice stands in this attempt; cleared when the notice goes,
    /// so that a later notice asks for a new checkpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_requested_time: Option<Time>,
}

/// A step-addressed checkpoint a worker reported saved.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResumePoint {
    /// The attempt that saved it.
    #[schemars(range(min = 0, max = u32::MAX))]
    pub attempt: u32,
    /// Its step.
    #[schemars(range(min = 0, max = MAX_STEP))]
    pub step: u64,
    /// Its file in the checkpoint directory.
    #[schemars(length(max = MAX_CHECKPOINT_FILE_BYTES))]
    pub file: String,
}

/// Job phase.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Phase {
    /// Waiting for pods to be created or scheduled.
    Pending,
    /// Every worker runs.
    Running,
    /// A gang restart is under way.
    Restarting,
    /// Every trainer exited 0.
    Succeeded,
    /// A budget ran out, the deadline passed, or the job is invalid.
    Failed,
    /// `spec.suspend` is true.
    Suspended,
}

impl Phase {
    /// The Kubernetes spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Running => "Running",
            Phase::Restarting => "Restarting",
            Phase::Succeeded => "Succeeded",
            Phase::Failed => "Failed",
            Phase::Suspended => "Suspended",
        }
    }

    /// Succeeded and Failed are final.
    pub fn is_terminal(self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed)
    }
}

// Empty strings here and elsewhere are omitted rather than defaulted: Kubernetes 1.20
// rejects `default: ""` in a CRD schema.
/// A status condition, shaped like metav1.Condition.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobCondition {
    /// Running, Restarting, Succeeded, Failed, Unschedulable, InvalidSpec, WriteRejected or
    /// NameConflict.
    #[serde(rename = "type")]
    pub type_: String,
    /// "True", "False" or "Unknown".
    pub status: String,
    /// CamelCase reason.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Human-readable detail, cut to 1024 characters ([`MAX_MESSAGE_CHARS`]).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = MAX_MESSAGE_CHARS))]
    pub message: String,
    /// When `status` last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    /// The generation the condition was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The product chosen for the workers.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SelectedGpu {
    /// Value of `nvidia.com/gpu.product`, or empty when any allowed product will do.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub product: String,
    /// $ per GPU-hour from the operator's price table, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price_per_hour: Option<f64>,
    /// Whether the workers go to spot nodes.
    #[serde(default)]
    pub spot: bool,
    /// Why this product and capacity type.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

/// One worker of the current attempt.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkerStatus {
    /// 0-based rank, below `spec.workers` (a larger one is ignored).
    #[schemars(range(min = 0, max = MAX_WORKERS - 1))]
    pub rank: u32,
    /// Pod name.
    #[schemars(length(max = 253))]
    pub pod: String,
    /// Node the pod runs on, once scheduled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub node: Option<String>,
    /// Pending, Running, Succeeded, Preempted or Failed.
    #[schemars(length(max = 16))]
    pub phase: String,
    /// Why the worker is not running yet, or how it ended (e.g. ImagePullBackOff), cut to 256
    /// characters ([`MAX_REASON_CHARS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_REASON_CHARS))]
    pub reason: Option<String>,
}

/// The current attempt's workers in numbers (all of them, however many `workers` lists), and
/// which ranks the operator has seen, as ranges (`"0-9999"`, `"0-3,5"`).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkerSummary {
    /// The attempt these workers belong to: a summary of another attempt than
    /// `status.attempt` (a status written by hand or by an older tool) is not read.
    #[serde(default)]
    #[schemars(range(min = 0, max = u32::MAX))]
    pub attempt: u32,
    /// Workers waiting for a node or for their containers.
    #[serde(default)]
    #[schemars(range(min = 0, max = MAX_WORKERS))]
    pub pending: u32,
    /// Workers running.
    #[serde(default)]
    #[schemars(range(min = 0, max = MAX_WORKERS))]
    pub running: u32,
    /// Workers that finished.
    #[serde(default)]
    #[schemars(range(min = 0, max = MAX_WORKERS))]
    pub succeeded: u32,
    /// Workers lost to a preemption.
    #[serde(default)]
    #[schemars(range(min = 0, max = MAX_WORKERS))]
    pub preempted: u32,
    /// Workers that failed.
    #[serde(default)]
    #[schemars(range(min = 0, max = MAX_WORKERS))]
    pub failed: u32,
    /// The ranks of the current attempt whose pods the operator has seen: a rank seen whose
    /// pod is gone without trainyard deleting it was preempted (or succeeded, below).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = MAX_RANK_SET_CHARS))]
    pub seen_ranks: String,
    /// The ranks that succeeded.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = MAX_RANK_SET_CHARS))]
    pub succeeded_ranks: String,
}

impl TrainingJobStatus {
    /// Whether the latest gang restart was for `reason`.
    pub fn restarted_for(&self, reason: RestartReason) -> bool {
        self.last_restart
            .as_ref()
            .is_some_and(|l| l.reason == reason)
    }

    /// The ranks of the current attempt the operator has recorded: `workerSummary.seenRanks`
    /// and every rank `workers` lists (a status written before the summary existed lists them
    /// all there).
    pub fn recorded_ranks(&self) -> RankSet {
        let mut ranks = self.summary_ranks(|s| &s.seen_ranks);
        ranks.extend(self.workers.iter().map(|w| w.rank));
        ranks
    }

    /// The ranks recorded as succeeded: `workerSummary.succeededRanks` and those `workers`
    /// lists as `Succeeded`.
    pub fn succeeded_ranks(&self) -> RankSet {
        let mut ranks = self.summary_ranks(|s| &s.succeeded_ranks);
        ranks.extend(
            self.workers
                .iter()
                .filter(|w| w.phase == "Succeeded")
                .map(|w| w.rank),
        );
        ranks
    }

    /// Forgets the workers of the attempt (a restart, a suspend).
    pub fn clear_workers(&mut self) {
        self.workers.clear();
        self.worker_summary = None;
    }

    fn summary_ranks(&self, field: impl Fn(&WorkerSummary) -> &String) -> RankSet {
        self.worker_summary
            .as_ref()
            .filter(|s| s.attempt == self.attempt)
            .map(|s| RankSet::parse(field(s)))
            .unwrap_or_default()
    }
}

/// The latest gang restart.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LastRestart {
    /// When it was decided.
    pub time: Time,
    /// Preemption, Failure or Resume.
    pub reason: RestartReason,
    /// What happened, e.g. "worker 1: DisruptionTarget/TerminationByKubelet on node n-3", cut
    /// to 1024 characters ([`MAX_MESSAGE_CHARS`]).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = MAX_MESSAGE_CHARS))]
    pub detail: String,
    /// The ranks that keep their pods and restart in place (`spec.restartPolicy.inPlace`),
    /// e.g. "0,2-3": their supervisors stop the old attempt and start this one. The other
    /// ranks' pods are created again.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = MAX_RANK_SET_CHARS))]
    pub in_place_ranks: String,
    /// The ranks that switch to replacements created ahead of a termination notice (make
    /// before break, `spec.restartPolicy.replaceAheadOnNotice`), e.g. "1".
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = MAX_RANK_SET_CHARS))]
    pub replaced_ahead_ranks: String,
    /// With `replacedAheadRanks`: how long before the decision the first of those replacements
    /// was created, in milliseconds (the time they waited beside the old attempt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_LEDGER))]
    pub ahead_millis: Option<u64>,
    /// How long after the decision every worker of the new attempt ran, in milliseconds (the
    /// restart's own duration: for make before break, the switch's); absent until they do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_LEDGER))]
    pub running_after_millis: Option<u64>,
}

impl LastRestart {
    /// A restart decided at `time`, with nothing of its course known yet.
    pub fn new(time: Time, reason: RestartReason, detail: String) -> Self {
        Self {
            time,
            reason,
            detail,
            in_place_ranks: String::new(),
            replaced_ahead_ranks: String::new(),
            ahead_millis: None,
            running_after_millis: None,
        }
    }
}

/// Why a gang restart happened.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum RestartReason {
    /// A worker was preempted: counted against `maxPreemptions`, no backoff.
    Preemption,
    /// A worker failed: counted against `maxFailures`, with backoff.
    Failure,
    /// `spec.suspend` went back to false after the job's workers had been created: counted
    /// against no budget, no backoff. The new attempt resumes from the checkpoint.
    Resume,
    /// The trainers' reported progress stopped advancing for
    /// `restartPolicy.progressTimeoutSeconds` while they ran: counted against `maxHangs`, no
    /// backoff.
    Hang,
    /// `spec.elastic`: workers could not be placed for `replacementWaitSeconds`, so the gang
    /// restarts with the placed ones: counted against no budget, no backoff.
    Shrink,
    /// `spec.elastic`: capacity for missing workers returned, so the gang restarts larger
    /// from a checkpoint: counted against no budget, no backoff.
    Grow,
    /// Some workers could not be placed for `scheduling.placementTimeoutSeconds` while others
    /// held their nodes: every pod was released, and the gang tries again after a backoff
    /// with jitter. Counted in `requeues`, against no budget.
    Requeue,
}

impl RestartReason {
    /// The Kubernetes spelling, also used in `TRAINYARD_RESTART_REASON`.
    pub fn as_str(self) -> &'static str {
        match self {
            RestartReason::Preemption => "Preemption",
            RestartReason::Failure => "Failure",
            RestartReason::Resume => "Resume",
            RestartReason::Hang => "Hang",
            RestartReason::Shrink => "Shrink",
            RestartReason::Grow => "Grow",
            RestartReason::Requeue => "Requeue",
        }
    }

    /// Whether a gang restart for this reason counts against a budget (`maxPreemptions`,
    /// `maxFailures`, `maxHangs`): a resume, a shrink, a grow and a requeue count against none.
    pub fn counted(self) -> bool {
        matches!(
            self,
            RestartReason::Preemption | RestartReason::Failure | RestartReason::Hang
        )
    }
}

/// Where a job's GPU time went and what it cost: the goodput ledger.
///
/// The operator folds each stretch of the job's life into it when the stretch ends (the
/// workers all running, a gang restart, success, failure, a suspend), from the status and
/// what it observes in that round; it never recomputes anything from pods that are gone, so
/// the ledger survives operator restarts and leader changes. GPU time is counted in exact
/// integer GPU-milliseconds (wall time × the GPUs the attempt's pods request) and money in
/// integer micro-dollars, so sums never drift; `cost` and `goodput` are those integers
/// rounded for display. Every GPU-millisecond of the job lands in exactly one bucket: the
/// buckets of both capacity types sum to the wall time × GPUs of every closed stretch.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GoodputLedger {
    /// GPU time on spot nodes.
    #[serde(default)]
    pub spot: GpuMillis,
    /// GPU time on on-demand nodes (and that of an attempt whose capacity was not known).
    #[serde(default)]
    pub on_demand: GpuMillis,
    /// Money, in micro-dollars, from the operator's price table.
    #[serde(default)]
    pub micro_dollars: LedgerCost,
    /// GPU-milliseconds, of any bucket but `pending`, whose product has no price in the
    /// operator's price table: they count in no sum of `microDollars`.
    #[serde(default)]
    #[schemars(range(min = 0, max = MAX_LEDGER))]
    pub unpriced_gpu_millis: u64,
    /// useful × 1000 / every bucket of both capacity types, rounded down; absent while
    /// nothing is counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000))]
    pub goodput_permille: Option<u32>,
    /// `goodputPermille` for display, e.g. "87.5%" (the GOODPUT column).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub goodput: String,
    /// `microDollars.spent` for display, rounded to cents, e.g. "$12.34" (the COST column).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cost: String,
    /// The stretch under way, not counted yet: folded in when it ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open: Option<LedgerStretch>,
    /// Wall milliseconds the job waited for Kueue to admit it, no pod created and no GPU held
    /// (in no GPU bucket and no cost).
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    #[schemars(range(min = 0, max = MAX_LEDGER))]
    pub queued_millis: u64,
    /// With `spec.elastic`: the running time by the gang's size, and what running shrunk
    /// cost against its alternatives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elastic: Option<ElasticLedger>,
}

/// The elastic part of the ledger: every closed `Running` stretch of an elastic job, by the
/// number of workers it ran.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ElasticLedger {
    /// Running time by gang size, smallest first.
    #[serde(default)]
    #[schemars(length(max = MAX_LEDGER_SIZES))]
    pub by_workers: Vec<SizeMillis>,
    /// What the stretches that ran shrunk cost: waiting for the missing workers instead would
    /// have billed the same GPUs for the same time, idle.
    #[serde(default)]
    #[schemars(range(min = 0, max = MAX_LEDGER))]
    pub shrunk_micro_dollars: u64,
    /// What the same wall time would have cost with every worker on on-demand nodes (the
    /// on-demand fallback instead of the shrink).
    #[serde(default)]
    #[schemars(range(min = 0, max = MAX_LEDGER))]
    pub on_demand_instead_micro_dollars: u64,
}

/// Running time of an elastic gang at one size.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SizeMillis {
    /// Workers of the gang.
    #[schemars(range(min = 1, max = MAX_WORKERS))]
    pub workers: u32,
    /// Of the job's `spec.workers`.
    #[schemars(range(min = 1, max = MAX_WORKERS))]
    pub of: u32,
    /// Wall milliseconds every worker ran at this size.
    #[schemars(range(min = 0, max = MAX_LEDGER))]
    pub wall_millis: u64,
    /// Those × the gang's GPUs.
    #[schemars(range(min = 0, max = MAX_LEDGER))]
    pub gpu_millis: u64,
}

/// GPU-milliseconds of one capacity type, by what they were used for.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuMillis {
    /// Training that was kept: the running time of attempts, less what a restart lost.
    #[serde(default)]
    #[schemars(range(min = 0, max = MAX_LEDGER))]
    pub useful: u64,
    /// Work a preemption or a suspend lost and the next attempt computes again: the steps
    /// past the last checkpoint × the measured step time, plus the time since the last step.
    #[serde(default)]
    #[schemars(range(min = 0, max = MAX_LEDGER))]
    pub lost_to_recompute: u64,
    /// From a worker's interruption (its container's end, its pod's disruption) to the gang
    /// restart the operator decided on it.
    #[serde(default)]
    #[schemars(range(min = 0, max = MAX_LEDGER))]
    pub lost_to_detection: u64,
    /// From a gang restart's decision to every worker of the next attempt running (old pods
    /// terminating, failure backoff, new pods starting).
    #[serde(default)]
    #[schemars(range(min = 0, max = MAX_LEDGER))]
    pub lost_to_restart: u64,
    /// From the first pods' creation (or a resume's) to every worker running: waiting for
    /// nodes and images. Not charged: no GPU is held yet.
    #[serde(default)]
    #[schemars(range(min = 0, max = MAX_LEDGER))]
    pub pending: u64,
    /// Work a worker's failure lost, and the lost work of an attempt the job failed in.
    #[serde(default)]
    #[schemars(range(min = 0, max = MAX_LEDGER))]
    pub failed_attempts: u64,
    /// Work a hang lost: past the last checkpoint, including the time the gang was stuck.
    #[serde(default)]
    #[schemars(range(min = 0, max = MAX_LEDGER))]
    pub hangs: u64,
    /// Running time of attempts that ended while the operator knew of no checkpoint and no
    /// step time (trainers that do not report progress): useful or lost, it cannot say.
    #[serde(default)]
    #[schemars(range(min = 0, max = MAX_LEDGER))]
    pub recompute_unknown: u64,
    /// GPUs held for a termination notice: replacements created ahead of it (make before
    /// break), from when each was scheduled to the switch, or to its deletion when it was
    /// given up or the notice withdrawn. Charged; the time they train after the switch counts
    /// as any attempt's.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    #[schemars(range(min = 0, max = MAX_LEDGER))]
    pub held_for_notice: u64,
}

impl GpuMillis {
    /// Every bucket.
    pub fn total(&self) -> u64 {
        [
            self.useful,
            self.lost_to_recompute,
            self.lost_to_detection,
            self.lost_to_restart,
            self.pending,
            self.failed_attempts,
            self.hangs,
            self.recompute_unknown,
            self.held_for_notice,
        ]
        .iter()
        .fold(0u64, |sum, b| sum.saturating_add(*b))
    }
}

/// Money, in integer micro-dollars (1 $ = 1,000,000).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LedgerCost {
    /// Every charged bucket (all but `pending`) × the price of its product on its capacity
    /// type.
    #[serde(default)]
    #[schemars(range(min = 0, max = MAX_LEDGER))]
    pub spent: u64,
    /// The useful GPU time × its product's on-demand price: what the kept work would have
    /// cost on on-demand nodes with nothing lost.
    #[serde(default)]
    #[schemars(range(min = 0, max = MAX_LEDGER))]
    pub on_demand_equivalent: u64,
    /// `onDemandEquivalent` − `spent`: negative when spot did not pay.
    #[serde(default)]
    #[schemars(range(min = -MAX_LEDGER_SIGNED, max = MAX_LEDGER_SIGNED))]
    pub saved: i64,
}

/// The stretch of the job's life under way, as the ledger will count it once it ends.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LedgerStretch {
    /// What the stretch is.
    #[serde(rename = "use")]
    pub use_: StretchUse,
    /// When it began.
    pub since: Time,
    /// The attempt it belongs to.
    #[schemars(range(min = 0, max = u32::MAX))]
    pub attempt: u32,
    /// GPUs of the attempt's pods on spot nodes.
    #[serde(default)]
    #[schemars(range(min = 0, max = u32::MAX))]
    pub spot_gpus: u32,
    /// GPUs of the attempt's pods on on-demand nodes (or on nodes not known yet).
    #[serde(default)]
    #[schemars(range(min = 0, max = u32::MAX))]
    pub on_demand_gpus: u32,
    /// The GPU product priced, when known.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub product: String,
    /// With `spec.elastic`: the attempt's workers, and the job's full size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<GangSize>,
}

/// An elastic attempt's workers, of the job's full size.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GangSize {
    /// The attempt's workers.
    #[schemars(range(min = 1, max = MAX_WORKERS))]
    pub workers: u32,
    /// `spec.workers`.
    #[schemars(range(min = 1, max = MAX_WORKERS))]
    pub of: u32,
}

/// What an open stretch of the ledger is.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum StretchUse {
    /// Pods created, not every worker running yet (counts to `pending`).
    Pending,
    /// Every worker running (split into `useful` and a loss when it ends).
    Running,
    /// A gang restart decided, the next attempt not running yet (counts to `lostToRestart`).
    Restarting,
    /// Waiting for Kueue to admit the job's Workload, no pod created: no GPU is held (counts
    /// to `queuedMillis`, wall time).
    Queued,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_written_before_the_ledger_existed_still_parses() {
        let old: TrainingJobStatus =
            serde_json::from_str(r#"{"phase":"Running","attempt":2,"preemptions":1}"#)
                .expect("parses");
        assert_eq!(old.ledger, None);
        let text = serde_json::to_string(&old).expect("serializes");
        assert!(!text.contains("ledger"), "{text}");
    }

    #[test]
    fn the_ledger_is_spelled_as_the_printer_columns_and_docs_read_it() {
        let ledger = GoodputLedger {
            goodput: "88.9%".to_owned(),
            cost: "$0.55".to_owned(),
            ..GoodputLedger::default()
        };
        let value = serde_json::to_value(&ledger).expect("serializes");
        assert_eq!(value["goodput"], "88.9%");
        assert_eq!(value["cost"], "$0.55");
        assert_eq!(value["spot"]["lostToRecompute"], 0);
        assert_eq!(value["onDemand"]["recomputeUnknown"], 0);
        assert_eq!(value["microDollars"]["onDemandEquivalent"], 0);
        assert_eq!(value["unpricedGpuMillis"], 0);
    }

    #[test]
    fn a_spot_spec_without_fallback_keeps_the_count_rule() {
        let old: SpotSpec =
            serde_json::from_str(r#"{"policy":"Require","fallbackToOnDemandAfter":2}"#)
                .expect("parses");
        assert_eq!(old.fallback, SpotFallback::Count);
        assert_eq!(old.fallback_to_on_demand_after, 2);
        let cost: SpotSpec = serde_json::from_str(r#"{"fallback":"Cost"}"#).expect("parses");
        assert_eq!(
            (cost.fallback, cost.fallback_to_on_demand_after),
            (SpotFallback::Cost, 3)
        );
        assert!(serde_json::from_str::<SpotSpec>(r#"{"fallback":"Price"}"#).is_err());
    }
}
