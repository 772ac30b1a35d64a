//! Builds the worker pods of one attempt, including the trainer's environment contract
//! (docs/env-contract.md). Pure: the same inputs always give the same pod.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Container, EnvVar, NodeAffinity, NodeSelector, NodeSelectorTerm,
    PersistentVolumeClaimVolumeSource, Pod, PodSpec, ProjectedVolumeSource,
    ServiceAccountTokenProjection, Volume, VolumeMount, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::config::ProgressChannel;
use crate::model::crd::{
    ANNOTATION_STANDBY_CREATED_AT, LABEL_ATTEMPT, LABEL_JOB, LABEL_JOB_UID, LABEL_RANK,
    LABEL_STANDBY, RestartReason,
};
use crate::model::placement::Placement;
use crate::model::seal;
use crate::model::validate::ValidJob;
use trainyard_api::env;

/// Port of the torch.distributed rendezvous on worker 0.
pub const MASTER_PORT: u16 = 29500;
/// Name of the checkpoint volume in the pod.
pub const CHECKPOINT_VOLUME: &str = "trainyard-checkpoints";
/// The checkpoint file name inside the checkpoint directory.
pub const CHECKPOINT_FILE: &str = "latest.pt";
/// Name of the volume holding the progress channel's token.
pub const PROGRESS_TOKEN_VOLUME: &str = "trainyard-progress-token";
/// Where the trainer finds that token's directory.
pub const PROGRESS_TOKEN_DIR: &str = "/var/run/secrets/trainyard.dev/progress";
/// Lifetime of the progress token; the kubelet rotates it well before it runs out.
const PROGRESS_TOKEN_SECONDS: i64 = 3600;

/// Why an attempt starts, as the trainer's environment tells it (`RESUME_FROM`,
/// `TRAINYARD_RESTART_REASON`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptStart {
    /// The job's first attempt, on a checkpoint claim the job created: nothing to resume.
    Fresh,
    /// The job's first attempt, on a claim that was there before the job (a job deleted and
    /// applied again over the claim `retainOnDelete` kept, or an `existingClaim`): it resumes
    /// from the checkpoint the claim may hold instead of overwriting it with step 0.
    ExistingClaim,
    /// A later attempt: a gang restart (for the reason given) or a resume after a suspend.
    Later(Option<RestartReason>),
}

impl AttemptStart {
    /// How attempt `attempt` starts, after the restart `last_restart` (the latest recorded),
    /// on a claim that was there before the job (`claim_inherited`) or not.
    pub fn of(attempt: u32, last_restart: Option<RestartReason>, claim_inherited: bool) -> Self {
        match (attempt, claim_inherited) {
            (0, false) => Self::Fresh,
            (0, true) => Self::ExistingClaim,
            _ => Self::Later(last_restart),
        }
    }

    /// Whether the trainer gets `RESUME_FROM`: every start that may follow saved progress.
    pub fn resumes(self) -> bool {
        self != Self::Fresh
    }

    /// The value of `TRAINYARD_RESTART_REASON`.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Fresh | Self::Later(None) => env::REASON_NONE,
            Self::ExistingClaim => env::REASON_EXISTING_CLAIM,
            Self::Later(Some(r)) => r.as_str(),
        }
    }
}

/// Which worker of which attempt a pod is, and how many workers that attempt has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seat {
    /// The worker's rank.
    pub rank: u32,
    /// The attempt.
    pub attempt: u32,
    /// The attempt's workers: `spec.workers`, fewer after an elastic job shrank.
    pub workers: u32,
}

impl Seat {
    /// `rank` of an attempt with every worker the spec asks for.
    pub fn full(job: &ValidJob, rank: u32, attempt: u32) -> Self {
        Self {
            rank,
            attempt,
            workers: job.spec.workers,
        }
    }
}

/// The environment the operator gives the trainer, in a stable order.
///
/// `RESUME_FROM` names `resume_file` in the checkpoint directory when the trainers reported a
/// step-addressed checkpoint (`status.resumePoint`), `latest.pt` otherwise.
pub fn trainer_env(
    job: &ValidJob,
    seat: Seat,
    start: AttemptStart,
    resume_file: Option<&str>,
) -> Vec<(String, String)> {
    let Seat {
        rank,
        attempt,
        workers,
    } = seat;
    let dir = job.spec.checkpoint.mount_path.trim_end_matches('/');
    let dir = if dir.is_empty() { "/" } else { dir };
    let checkpoint = format!("{}/{CHECKPOINT_FILE}", dir.trim_end_matches('/'));
    let master = format!("{}.{}", job.pod_name(0), job.name);
    // torchrun needs at least one process per node, also for CPU-only jobs.
    let nproc = job.spec.gpus_per_worker.max(1);
    let world = u64::from(workers) * u64::from(nproc);
    let mut env = vec![
        (env::CHECKPOINT_DIR.to_owned(), dir.to_owned()),
        (env::CHECKPOINT_PATH.to_owned(), checkpoint.clone()),
    ];
    if start.resumes() {
        // Status is input too: a name that is not a plain file in the directory is not used.
        let resume = match resume_file.filter(|f| env::is_checkpoint_file_name(f)) {
            Some(file) => format!("{}/{file}", dir.trim_end_matches('/')),
            None => checkpoint,
        };
        env.push((env::RESUME_FROM.to_owned(), resume));
    }
    let reason = start.reason();
    env.extend(
        [
            (env::TRAINYARD_JOB, job.name.clone()),
            (env::TRAINYARD_ATTEMPT, attempt.to_string()),
            (env::TRAINYARD_FENCE_TOKEN, fence_token(job, attempt)),
            (env::TRAINYARD_RESTART_REASON, reason.to_owned()),
            (env::MASTER_ADDR, master.clone()),
            (env::MASTER_PORT, MASTER_PORT.to_string()),
            (env::NNODES, workers.to_string()),
            (env::NODE_RANK, rank.to_string()),
            (env::NPROC_PER_NODE, nproc.to_string()),
            (env::WORLD_SIZE, world.to_string()),
            (env::PET_NNODES, workers.to_string()),
            (env::PET_NODE_RANK, rank.to_string()),
            (env::PET_NPROC_PER_NODE, nproc.to_string()),
            (env::PET_MASTER_ADDR, master),
            (env::PET_MASTER_PORT, MASTER_PORT.to_string()),
            (env::PET_RDZV_ID, format!("{}-{attempt}", job.uid)),
            (
                env::PYTORCH_CUDA_ALLOC_CONF,
                "expandable_segments:True".to_owned(),
            ),
            (env::TORCH_NCCL_ASYNC_ERROR_HANDLING, "1".to_owned()),
        ]
        .map(|(k, v)| (k.to_owned(), v)),
    );
    if job.spec.elastic.is_some() {
        let full = u64::from(job.spec.workers) * u64::from(nproc);
        env.push((env::TRAINYARD_FULL_WORLD_SIZE.to_owned(), full.to_string()));
    }
    env
}

/// The attempt's checkpoint fencing token (`TRAINYARD_FENCE_TOKEN`): ordered by the job's
/// creation and then the attempt, so a job applied again over its retained claim (attempt 0
/// again) fences every trainer of the job before it.
pub fn fence_token(job: &ValidJob, attempt: u32) -> String {
    format!("{}:{attempt}:{}", job.created, job.uid)
}

/// Labels every pod of the job carries (selector of the Service, index of the operator, and
/// the selector that removes one attempt's pods).
pub fn pod_labels(job: &str, uid: &str, rank: u32, attempt: u32) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_JOB.to_owned(), job.to_owned()),
        (LABEL_JOB_UID.to_owned(), uid.to_owned()),
        (LABEL_RANK.to_owned(), rank.to_string()),
        (LABEL_ATTEMPT.to_owned(), attempt.to_string()),
    ])
}

/// ANDs two required node selectors: their ORed terms are crossed.
fn and_selectors(user: Option<NodeSelector>, ours: Option<NodeSelector>) -> Option<NodeSelector> {
    match (user, ours) {
        (None, x) | (x, None) => x,
        (Some(u), Some(o)) if u.node_selector_terms.is_empty() => Some(o),
        (Some(u), Some(o)) => Some(NodeSelector {
            node_selector_terms: u
                .node_selector_terms
                .iter()
                .flat_map(|a| {
                    o.node_selector_terms.iter().map(move |b| NodeSelectorTerm {
                        match_expressions: concat(&a.match_expressions, &b.match_expressions),
                        match_fields: concat(&a.match_fields, &b.match_fields),
                    })
                })
                .collect(),
        }),
    }
}

fn concat<T: Clone>(a: &Option<Vec<T>>, b: &Option<Vec<T>>) -> Option<Vec<T>> {
    match (a, b) {
        (None, None) => None,
        _ => Some(
            a.iter()
                .flatten()
                .chain(b.iter().flatten())
                .cloned()
                .collect(),
        ),
    }
}

fn merge_node_affinity(
    user: Option<NodeAffinity>,
    ours: Option<NodeAffinity>,
) -> Option<NodeAffinity> {
    let Some(ours) = ours else { return user };
    let user = user.unwrap_or_default();
    let preferred = concat(
        &user.preferred_during_scheduling_ignored_during_execution,
        &ours.preferred_during_scheduling_ignored_during_execution,
    );
    Some(NodeAffinity {
        required_during_scheduling_ignored_during_execution: and_selectors(
            user.required_during_scheduling_ignored_during_execution,
            ours.required_during_scheduling_ignored_during_execution,
        ),
        preferred_during_scheduling_ignored_during_execution: preferred,
    })
}

/// The pod of one rank in one attempt.
pub fn desired_pod(
    job: &ValidJob,
    seat: Seat,
    start: AttemptStart,
    resume_file: Option<&str>,
    placement: &Placement,
    progress: Option<&ProgressChannel>,
) -> Pod {
    let Seat { rank, attempt, .. } = seat;
    let template = &job.spec.template;
    let name = job.pod_name(rank);
    let tmeta = template.metadata.clone().unwrap_or_default();
    let mut labels = tmeta.labels.unwrap_or_default();
    labels.extend(pod_labels(&job.name, &job.uid, rank, attempt));

    let mut spec: PodSpec = template.spec.clone().unwrap_or_default();
    spec.hostname = Some(name.clone());
    spec.subdomain = Some(job.name.clone());
    spec.restart_policy = Some("Never".to_owned());
    spec.termination_grace_period_seconds = Some(job.spec.termination_grace_period_seconds);

    place(&mut spec, placement);
    mount_checkpoint_claim(&mut spec, job);
    if let Some(trainer) = spec.containers.get_mut(job.trainer_index) {
        equip_trainer(trainer, job, seat, start, resume_file);
    }
    if let Some(channel) = progress {
        // The supervisor's grace for the old attempt is the pod's, as if it were deleted.
        let supervised = job
            .spec
            .restart_policy
            .in_place()
            .then_some(job.spec.termination_grace_period_seconds);
        connect_progress_channel(&mut spec, job.trainer_index, channel, supervised);
    }

    let mut annotations = tmeta.annotations;
    if let Some(channel) = progress {
        let worker = job.sealed_worker(&name, rank, attempt);
        annotations
            .get_or_insert_with(Default::default)
            .insert(seal::SEAL_ANNOTATION.to_owned(), channel.seal.seal(&worker));
    }
    Pod {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(job.namespace.clone()),
            labels: Some(labels),
            annotations,
            owner_references: Some(vec![job.owner.clone()]),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// A replacement created ahead of a termination notice: the pod of `seat` (the attempt the
/// notice's restart will start) under `name` (the rank's name its noticed pod does not use),
/// labelled standby, its supervisor told to run nothing before the start order, sealed under
/// its own name. Its hostname is the rank's, whichever name it has.
pub fn standby_pod(
    job: &ValidJob,
    seat: Seat,
    start: AttemptStart,
    placement: &Placement,
    progress: &ProgressChannel,
    name: &str,
    now: jiff::Timestamp,
) -> Pod {
    let mut pod = desired_pod(job, seat, start, None, placement, Some(progress));
    pod.metadata.name = Some(name.to_owned());
    pod.metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert(LABEL_STANDBY.to_owned(), "true".to_owned());
    let worker = job.sealed_worker(name, seat.rank, seat.attempt);
    pod.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(
            seal::SEAL_ANNOTATION.to_owned(),
            progress.seal.seal(&worker),
        );
    pod.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(ANNOTATION_STANDBY_CREATED_AT.to_owned(), now.to_string());
    let trainer = pod
        .spec
        .as_mut()
        .and_then(|s| s.containers.get_mut(job.trainer_index));
    if let Some(trainer) = trainer {
        let env = trainer.env.get_or_insert_with(Vec::new);
        env.retain(|e| e.name != env::TRAINYARD_STANDBY);
        env.push(EnvVar {
            name: env::TRAINYARD_STANDBY.to_owned(),
            value: Some("1".to_owned()),
            value_from: None,
        });
    }
    pod
}

/// Whether `pod` was created as a standby ([`standby_pod`]).
pub fn is_standby(pod: &impl kube::Resource) -> bool {
    pod.meta()
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_STANDBY))
        .is_some_and(|v| v == "true")
}

/// The placement's node affinity merged into the template's, and its tolerations added.
fn place(spec: &mut PodSpec, placement: &Placement) {
    let mut affinity: Affinity = spec.affinity.take().unwrap_or_default();
    affinity.node_affinity = merge_node_affinity(
        affinity.node_affinity.take(),
        placement.node_affinity.clone(),
    );
    spec.affinity = (affinity != Affinity::default()).then_some(affinity);

    let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
    for t in &placement.tolerations {
        if !tolerations.contains(t) {
            tolerations.push(t.clone());
        }
    }
    if tolerations.is_empty() {
        spec.tolerations = None;
    }
}

/// The checkpoint claim as the pod's checkpoint volume (replacing one of that name).
fn mount_checkpoint_claim(spec: &mut PodSpec, job: &ValidJob) {
    let volumes = spec.volumes.get_or_insert_with(Vec::new);
    volumes.retain(|v| v.name != CHECKPOINT_VOLUME);
    volumes.push(Volume {
        name: CHECKPOINT_VOLUME.to_owned(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: job.claim_name.clone(),
            read_only: None,
        }),
        ..Volume::default()
    });
}

/// The progress channel (docs/env-contract.md): its URL, and a service-account token for the
/// operator's audience, bound to this pod (the operator checks both with a TokenReview), in
/// a projected volume the kubelet rotates. Values the user sets win.
fn connect_progress_channel(
    spec: &mut PodSpec,
    trainer_index: usize,
    channel: &ProgressChannel,
    supervised: Option<i64>,
) {
    let volumes = spec.volumes.get_or_insert_with(Vec::new);
    volumes.retain(|v| v.name != PROGRESS_TOKEN_VOLUME);
    volumes.push(Volume {
        name: PROGRESS_TOKEN_VOLUME.to_owned(),
        projected: Some(ProjectedVolumeSource {
            sources: Some(vec![VolumeProjection {
                service_account_token: Some(ServiceAccountTokenProjection {
                    audience: Some(channel.audience.clone()),
                    expiration_seconds: Some(PROGRESS_TOKEN_SECONDS),
                    path: "token".to_owned(),
                }),
                ..VolumeProjection::default()
            }]),
            default_mode: None,
        }),
        ..Volume::default()
    });
    let Some(trainer) = spec.containers.get_mut(trainer_index) else {
        return;
    };
    let env = trainer.env.get_or_insert_with(Vec::new);
    let supervisor = supervised.into_iter().flat_map(|grace| {
        [
            (env::TRAINYARD_SUPERVISOR_URL, channel.supervisor_url()),
            (env::TRAINYARD_STOP_GRACE_SECONDS, grace.to_string()),
        ]
    });
    for (k, v) in [
        (env::TRAINYARD_PROGRESS_URL, channel.url.clone()),
        (
            env::TRAINYARD_PROGRESS_TOKEN_FILE,
            format!("{PROGRESS_TOKEN_DIR}/token"),
        ),
    ]
    .into_iter()
    .chain(supervisor)
    {
        if !env.iter().any(|e| e.name == k) {
            env.push(EnvVar {
                name: k.to_owned(),
                value: Some(v),
                value_from: None,
            });
        }
    }
    let mounts = trainer.volume_mounts.get_or_insert_with(Vec::new);
    mounts.retain(|m| m.name != PROGRESS_TOKEN_VOLUME);
    mounts.push(VolumeMount {
        name: PROGRESS_TOKEN_VOLUME.to_owned(),
        mount_path: PROGRESS_TOKEN_DIR.to_owned(),
        read_only: Some(true),
        ..VolumeMount::default()
    });
}

/// The trainer gets the job's environment, the checkpoint mount and its GPUs.
fn equip_trainer(
    trainer: &mut Container,
    job: &ValidJob,
    seat: Seat,
    start: AttemptStart,
    resume_file: Option<&str>,
) {
    let env = trainer.env.get_or_insert_with(Vec::new);
    // Values the user sets win: ours only fill in what is missing.
    for (k, v) in trainer_env(job, seat, start, resume_file) {
        if !env.iter().any(|e| e.name == k) {
            env.push(EnvVar {
                name: k,
                value: Some(v),
                value_from: None,
            });
        }
    }
    let mount_path = job.spec.checkpoint.mount_path.clone();
    let mounts = trainer.volume_mounts.get_or_insert_with(Vec::new);
    if !mounts.iter().any(|m| m.mount_path == mount_path) {
        mounts.push(VolumeMount {
            name: CHECKPOINT_VOLUME.to_owned(),
            mount_path,
            ..VolumeMount::default()
        });
    }
    if job.spec.gpus_per_worker > 0 {
        let resources = trainer.resources.get_or_insert_with(Default::default);
        let gpus = Quantity(job.spec.gpus_per_worker.to_string());
        resources
            .limits
            .get_or_insert_with(BTreeMap::new)
            .insert(job.spec.gpu.resource_name.clone(), gpus.clone());
        // Extended resources need requests == limits; keep a user request consistent.
        if let Some(requests) = resources.requests.as_mut()
            && requests.contains_key(&job.spec.gpu.resource_name)
        {
            requests.insert(job.spec.gpu.resource_name.clone(), gpus);
        }
    }
}

/// The trainer container's environment variables that have a literal value, in order: what a
/// supervisor starting an attempt in place hands its trainer ([`crate::plan`]'s in-place
/// restarts).
pub fn literal_trainer_env(pod: &Pod, trainer_index: usize) -> Vec<(String, String)> {
    pod.spec
        .as_ref()
        .and_then(|s| s.containers.get(trainer_index))
        .and_then(|c| c.env.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|e| Some((e.name.clone(), e.value.clone()?)))
        .collect()
}

/// A numeric label of a pod (`trainyard.dev/rank`, `trainyard.dev/attempt`).
pub(crate) fn label_u32(pod: &impl kube::Resource, key: &str) -> Option<u32> {
    pod.meta().labels.as_ref()?.get(key)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::OperatorConfig;
    use crate::fixtures::{job_yaml, node};
    use crate::model::crd::DEFAULT_GPU_RESOURCE;
    use crate::model::nodes::LABEL_GPU_PRODUCT;
    use crate::model::placement::place;
    use crate::model::validate::validate;

    fn env_of(pod: &Pod) -> BTreeMap<String, String> {
        pod.spec.as_ref().expect("spec").containers[0]
            .env
            .iter()
            .flatten()
            .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
            .collect()
    }

    fn build(yaml: &str, rank: u32, attempt: u32, restart: Option<RestartReason>) -> Pod {
        let job = validate(&job_yaml(yaml)).expect("valid");
        let n = node("n-1").gpus(8).product("NVIDIA-A100-SXM4-80GB").build();
        let placement = place(&job, &OperatorConfig::default(), &[&n], 0);
        let start = AttemptStart::of(attempt, restart, false);
        desired_pod(
            &job,
            Seat::full(&job, rank, attempt),
            start,
            None,
            &placement,
            None,
        )
    }

    #[test]
    fn pod_has_deterministic_name_labels_hostname_and_owner() {
        let pod = build("workers: 2\ngpusPerWorker: 4\n", 1, 3, None);
        assert_eq!(pod.metadata.name.as_deref(), Some("train-worker-1"));
        let labels = pod.metadata.labels.clone().expect("labels");
        assert_eq!(labels[LABEL_JOB], "train");
        assert_eq!(labels[LABEL_RANK], "1");
        assert_eq!(labels[LABEL_ATTEMPT], "3");
        assert_eq!(
            labels[LABEL_JOB_UID],
            job_yaml("workers: 2\n").metadata.uid.expect("uid")
        );
        assert_eq!(labels["app"], "from-template");
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(spec.hostname.as_deref(), Some("train-worker-1"));
        assert_eq!(spec.subdomain.as_deref(), Some("train"));
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        assert_eq!(spec.termination_grace_period_seconds, Some(60));
        let owner = &pod.metadata.owner_references.as_ref().expect("owner")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("TrainingJob", Some(true))
        );
    }

    #[test]
    fn first_attempt_env_has_the_contract_without_resume_from() {
        let env = env_of(&build("workers: 2\ngpusPerWorker: 4\n", 1, 0, None));
        let expect = [
            (env::CHECKPOINT_DIR, "/mnt/checkpoints"),
            (env::CHECKPOINT_PATH, "/mnt/checkpoints/latest.pt"),
            (env::TRAINYARD_JOB, "train"),
            (env::TRAINYARD_ATTEMPT, "0"),
            (env::TRAINYARD_RESTART_REASON, "none"),
            (env::MASTER_ADDR, "train-worker-0.train"),
            (env::MASTER_PORT, "29500"),
            (env::NNODES, "2"),
            (env::NODE_RANK, "1"),
            (env::NPROC_PER_NODE, "4"),
            (env::WORLD_SIZE, "8"),
            (env::PET_NNODES, "2"),
            (env::PET_NODE_RANK, "1"),
            (env::PET_NPROC_PER_NODE, "4"),
            (env::PET_MASTER_ADDR, "train-worker-0.train"),
            (env::PET_MASTER_PORT, "29500"),
            (env::PYTORCH_CUDA_ALLOC_CONF, "expandable_segments:True"),
            (env::TORCH_NCCL_ASYNC_ERROR_HANDLING, "1"),
        ];
        for (k, v) in expect {
            assert_eq!(env.get(k).map(String::as_str), Some(v), "{k}");
        }
        assert!(!env.contains_key(env::RESUME_FROM));
    }

    #[test]
    fn later_attempt_sets_resume_from_and_reason() {
        let env = env_of(&build(
            "workers: 2\ngpusPerWorker: 4\n",
            0,
            2,
            Some(RestartReason::Preemption),
        ));
        assert_eq!(env[env::RESUME_FROM], "/mnt/checkpoints/latest.pt");
        assert_eq!(env[env::TRAINYARD_ATTEMPT], "2");
        assert_eq!(env[env::TRAINYARD_RESTART_REASON], "Preemption");
        // Each attempt meets at its own rendezvous.
        assert_eq!(env[env::PET_RDZV_ID], "uid-1-2");
    }

    #[test]
    fn the_fence_token_orders_a_job_applied_again_after_every_attempt_of_the_old_one() {
        let mut old = validate(&job_yaml("workers: 2\n")).expect("valid");
        old.created = 1_800_000_000;
        let mut again = old.clone();
        again.created = old.created + 1;
        again.uid = "uid-again".to_owned();
        let order = |token: &str| -> (i64, u32) {
            let mut parts = token.split(':');
            let created = parts.next().and_then(|c| c.parse().ok()).expect("created");
            let attempt = parts.next().and_then(|a| a.parse().ok()).expect("attempt");
            (created, attempt)
        };
        let env: BTreeMap<_, _> = trainer_env(
            &old,
            Seat::full(&old, 0, 5),
            AttemptStart::of(5, None, false),
            None,
        )
        .into_iter()
        .collect();
        let old_token = env[env::TRAINYARD_FENCE_TOKEN].clone();
        assert_eq!(old_token, format!("1800000000:5:{}", old.uid));
        let new_token = fence_token(&again, 0);
        assert!(
            order(&new_token) > order(&old_token),
            "{new_token} after {old_token}"
        );
        assert!(order(&fence_token(&old, 6)) > order(&old_token));
    }

    #[test]
    fn first_attempt_on_a_claim_that_was_there_resumes_from_it() {
        let job = validate(&job_yaml("workers: 2\n")).expect("valid");
        let start = AttemptStart::of(0, None, true);
        let env: BTreeMap<_, _> = trainer_env(&job, Seat::full(&job, 0, 0), start, None)
            .into_iter()
            .collect();
        assert_eq!(env[env::RESUME_FROM], "/mnt/checkpoints/latest.pt");
        assert_eq!(env[env::TRAINYARD_ATTEMPT], "0");
        assert_eq!(env[env::TRAINYARD_RESTART_REASON], "ExistingClaim");
        // A later attempt on such a claim says why it restarted.
        let later = AttemptStart::of(1, Some(RestartReason::Hang), true);
        let env: BTreeMap<_, _> = trainer_env(&job, Seat::full(&job, 0, 1), later, None)
            .into_iter()
            .collect();
        assert_eq!(env[env::RESUME_FROM], "/mnt/checkpoints/latest.pt");
        assert_eq!(env[env::TRAINYARD_RESTART_REASON], "Hang");
    }

    #[test]
    fn a_reported_step_addressed_checkpoint_is_what_the_next_attempt_resumes_from() {
        let job = validate(&job_yaml("workers: 2\n")).expect("valid");
        let later = AttemptStart::of(3, Some(RestartReason::Preemption), false);
        let resume = |file| -> String {
            let env: BTreeMap<_, _> = trainer_env(&job, Seat::full(&job, 1, 3), later, file)
                .into_iter()
                .collect();
            env[env::RESUME_FROM].clone()
        };
        assert_eq!(
            resume(Some("step-000000120-a2.pt")),
            "/mnt/checkpoints/step-000000120-a2.pt"
        );
        // A name written into status that leaves the directory is not used.
        assert_eq!(
            resume(Some("../../etc/shadow")),
            "/mnt/checkpoints/latest.pt"
        );
        assert_eq!(resume(None), "/mnt/checkpoints/latest.pt");
        // A fresh start resumes from nothing, whatever the status says.
        let fresh: BTreeMap<_, _> = trainer_env(
            &job,
            Seat::full(&job, 0, 0),
            AttemptStart::Fresh,
            Some("step-1-a0.pt"),
        )
        .into_iter()
        .collect();
        assert!(!fresh.contains_key(env::RESUME_FROM));
    }

    #[test]
    fn cpu_job_counts_one_process_per_node() {
        let env = env_of(&build("workers: 3\ngpusPerWorker: 0\n", 0, 0, None));
        assert_eq!(env[env::NPROC_PER_NODE], "1");
        assert_eq!(env[env::WORLD_SIZE], "3");
    }

    #[test]
    fn user_set_env_values_win() {
        let pod = build(
            "workers: 2\ngpusPerWorker: 1\ntemplate:\n  spec:\n    containers:\n    - name: trainer\n      image: busybox\n      env: [{name: MASTER_PORT, value: \"1234\"}, {name: TORCH_NCCL_ASYNC_ERROR_HANDLING, value: \"0\"}]\n",
            0,
            0,
            None,
        );
        let env = env_of(&pod);
        assert_eq!(env[env::MASTER_PORT], "1234");
        assert_eq!(env[env::TORCH_NCCL_ASYNC_ERROR_HANDLING], "0");
        assert_eq!(env[env::PET_MASTER_PORT], "29500");
        let names: Vec<_> = pod.spec.expect("spec").containers[0]
            .env
            .iter()
            .flatten()
            .map(|e| e.name.clone())
            .collect();
        assert_eq!(
            names.iter().filter(|n| *n == env::MASTER_PORT).count(),
            1,
            "no duplicate env names"
        );
    }

    #[test]
    fn trainer_gets_gpu_limit_and_checkpoint_mount() {
        let pod = build(
            "workers: 1\ngpusPerWorker: 4\ncheckpoint: {mountPath: /ckpt}\n",
            0,
            0,
            None,
        );
        let spec = pod.spec.expect("spec");
        let c = &spec.containers[0];
        let limits = c
            .resources
            .as_ref()
            .and_then(|r| r.limits.clone())
            .expect("limits");
        assert_eq!(limits[DEFAULT_GPU_RESOURCE], Quantity("4".into()));
        let mount = c
            .volume_mounts
            .as_ref()
            .expect("mounts")
            .iter()
            .find(|m| m.name == CHECKPOINT_VOLUME)
            .expect("mount");
        assert_eq!(mount.mount_path, "/ckpt");
        let vol = spec
            .volumes
            .expect("volumes")
            .into_iter()
            .find(|v| v.name == CHECKPOINT_VOLUME)
            .expect("volume");
        assert_eq!(
            vol.persistent_volume_claim.expect("pvc").claim_name,
            "train-checkpoints"
        );
    }

    #[test]
    fn sidecar_is_left_alone_and_trainer_is_found_by_name() {
        let pod = build(
            "gpusPerWorker: 2\ntemplate:\n  spec:\n    containers:\n    - {name: sidecar, image: busybox}\n    - {name: trainer, image: busybox}\n",
            0,
            0,
            None,
        );
        let spec = pod.spec.expect("spec");
        assert!(spec.containers[0].env.is_none());
        assert!(spec.containers[0].resources.is_none());
        assert!(
            spec.containers[1]
                .env
                .as_ref()
                .is_some_and(|e| e.iter().any(|v| v.name == env::NODE_RANK))
        );
    }

    #[test]
    fn same_inputs_build_the_same_pod() {
        let a = build(
            "workers: 2\ngpusPerWorker: 4\n",
            1,
            1,
            Some(RestartReason::Failure),
        );
        let b = build(
            "workers: 2\ngpusPerWorker: 4\n",
            1,
            1,
            Some(RestartReason::Failure),
        );
        assert_eq!(a, b);
    }

    #[test]
    fn user_required_affinity_is_anded_with_ours() {
        let pod = build(
            "gpusPerWorker: 1\ngpu: {products: [NVIDIA-A100-SXM4-80GB]}\ntemplate:\n  spec:\n    affinity:\n      nodeAffinity:\n        requiredDuringSchedulingIgnoredDuringExecution:\n          nodeSelectorTerms:\n          - matchExpressions: [{key: zone, operator: In, values: [a]}]\n          - matchExpressions: [{key: zone, operator: In, values: [b]}]\n    containers: [{name: trainer, image: busybox}]\n",
            0,
            0,
            None,
        );
        let terms = pod
            .spec
            .expect("spec")
            .affinity
            .expect("affinity")
            .node_affinity
            .expect("na")
            .required_during_scheduling_ignored_during_execution
            .expect("required")
            .node_selector_terms;
        assert_eq!(terms.len(), 2);
        for t in terms {
            let keys: Vec<_> = t
                .match_expressions
                .expect("exprs")
                .into_iter()
                .map(|e| e.key)
                .collect();
            assert!(
                keys.contains(&"zone".to_owned()) && keys.contains(&LABEL_GPU_PRODUCT.to_owned()),
                "{keys:?}"
            );
        }
    }

    #[test]
    fn the_progress_channel_gives_the_trainer_its_url_and_a_pod_bound_token_of_the_audience() {
        let job = validate(&job_yaml("workers: 2\n")).expect("valid");
        let n = node("n-1").gpus(8).product("NVIDIA-A100-SXM4-80GB").build();
        let placement = place(&job, &OperatorConfig::default(), &[&n], 0);
        let channel = ProgressChannel {
            url: "http://trainyard-progress.ops.svc.cluster.local:8082/v1/progress".to_owned(),
            audience: "trainyard-progress".to_owned(),
            seal: seal::SealKey::new(b"k", None),
        };
        let pod = desired_pod(
            &job,
            Seat::full(&job, 1, 0),
            AttemptStart::Fresh,
            None,
            &placement,
            Some(&channel),
        );
        // Sealed for this worker: rank 1 of attempt 0 of this job, under this name.
        let worker = seal::Worker {
            namespace: &job.namespace,
            pod: &job.pod_name(1),
            job_uid: &job.uid,
            rank: 1,
            attempt: 0,
        };
        assert_eq!(
            channel.seal.check(&pod.metadata, &worker),
            seal::Sealed::Valid
        );
        let env = env_of(&pod);
        assert_eq!(env[env::TRAINYARD_PROGRESS_URL], channel.url);
        assert_eq!(
            env[env::TRAINYARD_PROGRESS_TOKEN_FILE],
            format!("{PROGRESS_TOKEN_DIR}/token")
        );
        let spec = pod.spec.as_ref().expect("spec");
        let volume = spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == PROGRESS_TOKEN_VOLUME)
            .expect("token volume");
        let token = volume
            .projected
            .as_ref()
            .and_then(|p| p.sources.as_ref())
            .and_then(|s| s[0].service_account_token.clone())
            .expect("service account token projection");
        assert_eq!(token.audience.as_deref(), Some("trainyard-progress"));
        assert_eq!(token.path, "token");
        let mount = spec.containers[0]
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == PROGRESS_TOKEN_VOLUME)
            .expect("mount");
        assert_eq!(
            (mount.mount_path.as_str(), mount.read_only),
            (PROGRESS_TOKEN_DIR, Some(true))
        );

        // Without the channel the pod is as before: no URL, no token.
        let plain = desired_pod(
            &job,
            Seat::full(&job, 1, 0),
            AttemptStart::Fresh,
            None,
            &placement,
            None,
        );
        assert!(!env_of(&plain).contains_key(env::TRAINYARD_PROGRESS_URL));
        assert!(
            plain
                .spec
                .as_ref()
                .and_then(|s| s.volumes.as_ref())
                .is_none_or(|v| v.iter().all(|v| v.name != PROGRESS_TOKEN_VOLUME))
        );
    }
}
