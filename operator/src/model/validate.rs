//! The first pipeline step: checks what the schema cannot and resolves defaults.
//!
//! A [`ValidJob`] is a TrainingJob the builders can trust: it has a name, namespace and uid,
//! its template has a trainer container, and its version constraints are parsed.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Resource;

use crate::config::TemplatePolicy;
use crate::model::crd::{
    AccessMode, ElasticSpec, MAX_BACKOFF_SECONDS, MAX_DEADLINE_SECONDS, MAX_GPUS_PER_WORKER,
    MAX_GRACE_SECONDS, MAX_MIN_MEMORY_GIB, MAX_PLACEMENT_TIMEOUT_SECONDS,
    MAX_PROGRESS_TIMEOUT_SECONDS, MAX_REPLACEMENT_WAIT_SECONDS, MAX_RESTARTS, MAX_WORKERS,
    MIN_PROGRESS_TIMEOUT_SECONDS, TrainingJob, TrainingJobSpec,
};
use crate::model::trainer;
use trainyard_api::Version;

/// Why a TrainingJob cannot run as written (shown in its InvalidSpec condition).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct InvalidSpec {
    /// The offending field, e.g. `spec.template.spec.containers`.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

impl InvalidSpec {
    fn new(field: &str, message: impl Into<String>) -> Self {
        Self {
            field: field.to_owned(),
            message: message.into(),
        }
    }
}

/// A validated TrainingJob.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidJob {
    /// metadata.name.
    pub name: String,
    /// metadata.namespace.
    pub namespace: String,
    /// metadata.uid.
    pub uid: String,
    /// metadata.creationTimestamp as unix seconds (0 when unset): a job applied again under
    /// the same name is created later, which orders its fence tokens after the old job's.
    pub created: i64,
    /// metadata.generation.
    pub generation: Option<i64>,
    /// The spec, with defaults applied by serde.
    pub spec: TrainingJobSpec,
    /// Index of the trainer in `spec.template.spec.containers`.
    pub trainer_index: usize,
    /// Parsed `spec.gpu.minCudaVersion`.
    pub min_cuda: Option<Version>,
    /// Parsed `spec.gpu.minComputeCapability`.
    pub min_compute: Option<Version>,
    /// The PVC mounted at the checkpoint path.
    pub claim_name: String,
    /// Whether the operator creates that PVC (no existingClaim).
    pub creates_claim: bool,
    /// Access modes of the created PVC.
    pub access_modes: Vec<String>,
    /// Controller owner reference to the TrainingJob.
    pub owner: OwnerReference,
    /// The Kueue LocalQueue its label `kueue.x-k8s.io/queue-name` names: Kueue admits it
    /// ([`crate::model::kueue`]).
    pub queue: Option<String>,
    /// An edit of the spec that does not validate: the job runs on as this, its last valid
    /// spec, and the condition `InvalidSpec` says why the edit was not applied
    /// ([`ValidJob::with_rejected_edit`]).
    pub rejected_edit: Option<InvalidSpec>,
}

impl ValidJob {
    /// The job as last validly specified, with the edit that did not validate (`edit`) and
    /// the generation that holds it: its pods keep being managed (preemptions, failures,
    /// success, restarts) while the condition `InvalidSpec` asks for a fix.
    pub fn with_rejected_edit(mut self, edit: InvalidSpec, generation: Option<i64>) -> Self {
        self.rejected_edit = Some(edit);
        self.generation = generation;
        self
    }

    /// Name of the pod of one rank: `<job>-worker-<rank>`.
    pub fn pod_name(&self, rank: u32) -> String {
        pod_name(&self.name, rank)
    }

    /// The two names a pod of one rank may have ([`worker_pod_names`]).
    pub fn worker_pod_names(&self, rank: u32) -> [String; 2] {
        worker_pod_names(&self.name, rank)
    }

    /// What the operator's seal covers for its pod `pod` of `rank` in `attempt`.
    pub fn sealed_worker<'a>(
        &'a self,
        pod: &'a str,
        rank: u32,
        attempt: u32,
    ) -> crate::model::seal::Worker<'a> {
        crate::model::seal::Worker {
            namespace: &self.namespace,
            pod,
            job_uid: &self.uid,
            rank,
            attempt,
        }
    }
}

/// Name of the pod of one rank: `<job>-worker-<rank>`.
pub fn pod_name(job: &str, rank: u32) -> String {
    format!("{job}-worker-{rank}")
}

/// The two names a pod of one rank may have: `<job>-worker-<rank>`, and `<job>-worker-<rank>-b`
/// for a replacement created beside the pod it replaces, ahead of a termination notice
/// ([`crate::plan`]'s standby), which takes whichever of the two that pod does not use. Its
/// hostname is `<job>-worker-<rank>` whichever it has.
pub fn worker_pod_names(job: &str, rank: u32) -> [String; 2] {
    let name = pod_name(job, rank);
    let twin = format!("{name}-b");
    [name, twin]
}

/// `value` must lie in `min..=max`, the range the CRD schema gives `field`.
fn within<T: PartialOrd + std::fmt::Display>(
    field: &str,
    value: T,
    min: T,
    max: T,
) -> Result<(), InvalidSpec> {
    if value < min {
        return Err(InvalidSpec::new(
            field,
            format!("{value} is below the minimum {min}"),
        ));
    }
    if value > max {
        return Err(InvalidSpec::new(
            field,
            format!("{value} is above the maximum {max}"),
        ));
    }
    Ok(())
}

/// The schema's bounds, checked again: an API server may not have enforced them (an object
/// stored before the bounds existed, or a schema applied without them).
fn check_bounds(spec: &TrainingJobSpec) -> Result<(), InvalidSpec> {
    within("spec.workers", spec.workers, 1, MAX_WORKERS)?;
    within(
        "spec.gpusPerWorker",
        spec.gpus_per_worker,
        0,
        MAX_GPUS_PER_WORKER,
    )?;
    if let Some(gib) = spec.gpu.min_memory_gib {
        within("spec.gpu.minMemoryGiB", gib, 1, MAX_MIN_MEMORY_GIB)?;
    }
    within(
        "spec.spot.fallbackToOnDemandAfter",
        spec.spot.fallback_to_on_demand_after,
        0,
        MAX_RESTARTS,
    )?;
    let policy = &spec.restart_policy;
    within(
        "spec.restartPolicy.maxPreemptions",
        policy.max_preemptions,
        0,
        MAX_RESTARTS,
    )?;
    within(
        "spec.restartPolicy.maxFailures",
        policy.max_failures,
        0,
        MAX_RESTARTS,
    )?;
    within(
        "spec.restartPolicy.backoffSeconds",
        policy.backoff_seconds,
        0,
        MAX_BACKOFF_SECONDS,
    )?;
    within(
        "spec.restartPolicy.maxHangs",
        policy.max_hangs,
        0,
        MAX_RESTARTS,
    )?;
    if let Some(timeout) = policy.progress_timeout_seconds {
        within(
            "spec.restartPolicy.progressTimeoutSeconds",
            timeout,
            MIN_PROGRESS_TIMEOUT_SECONDS,
            MAX_PROGRESS_TIMEOUT_SECONDS,
        )?;
    }
    within(
        "spec.terminationGracePeriodSeconds",
        spec.termination_grace_period_seconds,
        0,
        MAX_GRACE_SECONDS,
    )?;
    if let Some(d) = spec.active_deadline_seconds {
        within("spec.activeDeadlineSeconds", d, 1, MAX_DEADLINE_SECONDS)?;
    }
    within(
        "spec.scheduling.placementTimeoutSeconds",
        spec.scheduling.placement_timeout_seconds,
        1,
        MAX_PLACEMENT_TIMEOUT_SECONDS,
    )?;
    if let Some(elastic) = &spec.elastic {
        check_elastic(spec, elastic)?;
    }
    Ok(())
}

/// `spec.elastic`: at least one worker, no more than the spec has, and GPUs to judge
/// capacity by (the gang grows back when the free GPUs of fitting nodes hold the missing
/// workers).
fn check_elastic(spec: &TrainingJobSpec, elastic: &ElasticSpec) -> Result<(), InvalidSpec> {
    within(
        "spec.elastic.minWorkers",
        elastic.min_workers,
        1,
        spec.workers,
    )?;
    within(
        "spec.elastic.replacementWaitSeconds",
        elastic.replacement_wait_seconds,
        0,
        MAX_REPLACEMENT_WAIT_SECONDS,
    )?;
    if spec.gpus_per_worker == 0 {
        return Err(InvalidSpec::new(
            "spec.elastic",
            "needs gpusPerWorker of at least 1: the gang grows back when the free GPUs of the \
             nodes that fit hold its missing workers, and a CPU job's capacity cannot be read \
             so",
        ));
    }
    Ok(())
}

fn is_dns1035_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[b.len() - 1] != b'-'
}

/// Checks a TrainingJob and resolves what the builders need.
pub fn validate(job: &TrainingJob) -> Result<ValidJob, InvalidSpec> {
    let meta = &job.metadata;
    let name = meta
        .name
        .clone()
        .ok_or_else(|| InvalidSpec::new("metadata.name", "must be set"))?;
    let namespace = meta
        .namespace
        .clone()
        .ok_or_else(|| InvalidSpec::new("metadata.namespace", "must be set"))?;
    let uid = meta
        .uid
        .clone()
        .ok_or_else(|| InvalidSpec::new("metadata.uid", "must be set"))?;
    let spec = job.spec.clone();

    check_name(&name, &spec)?;
    let trainer_index = check_template(&spec)?;
    let (min_cuda, min_compute) = gpu_minimums(&spec)?;
    let (claim_name, creates_claim, access_modes) = checkpoint(&name, &spec)?;

    let owner = job.controller_owner_ref(&()).ok_or_else(|| {
        InvalidSpec::new("metadata", "name and uid are needed for owner references")
    })?;

    Ok(ValidJob {
        name,
        namespace,
        uid,
        created: meta
            .creation_timestamp
            .as_ref()
            .map_or(0, |t| t.0.as_second()),
        generation: meta.generation,
        spec,
        trainer_index,
        min_cuda,
        min_compute,
        claim_name,
        creates_claim,
        access_modes,
        owner,
        queue: meta
            .labels
            .as_ref()
            .and_then(|l| l.get(crate::model::kueue::QUEUE_LABEL))
            .filter(|q| !q.is_empty())
            .cloned(),
        rejected_edit: None,
    })
}

/// The job's name (it names the Service and, with the rank, each pod) and the spec's bounds.
fn check_name(name: &str, spec: &TrainingJobSpec) -> Result<(), InvalidSpec> {
    // The job name is the Service name and the pods' subdomain, and `<job>-worker-<rank>` their hostname.
    if !is_dns1035_label(name) {
        return Err(InvalidSpec::new(
            "metadata.name",
            format!(
                "{name:?} must be a DNS-1035 label (lowercase letters, digits and '-', starting with a letter): it names the rendezvous Service"
            ),
        ));
    }
    check_bounds(spec)?;
    let longest = pod_name(name, spec.workers - 1);
    if longest.len() > 63 {
        return Err(InvalidSpec::new(
            "metadata.name",
            format!(
                "pod hostname {longest:?} would be longer than 63 characters; shorten the job name"
            ),
        ));
    }
    Ok(())
}

/// The pod template: its trainer container (the index) and the GPU resource it requests.
fn check_template(spec: &TrainingJobSpec) -> Result<usize, InvalidSpec> {
    let containers = spec
        .template
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default();
    if containers.is_empty() {
        return Err(InvalidSpec::new(
            "spec.template.spec.containers",
            "the template has no containers; add one (named \"trainer\", or the first is the trainer)",
        ));
    }
    let trainer_index = trainer::trainer_index(containers).unwrap_or(0);
    check_reserved_env(spec)?;
    if spec.gpus_per_worker > 0 && spec.gpu.resource_name.trim().is_empty() {
        return Err(InvalidSpec::new(
            "spec.gpu.resourceName",
            "must not be empty when gpusPerWorker > 0",
        ));
    }
    Ok(trainer_index)
}

/// The prefix of the variables the operator sets in every worker (the attempt, its fence
/// token, its rendezvous id, ...): a template that set one would run every attempt with the
/// template's value, a fence token that never changes among them.
pub const RESERVED_ENV_PREFIX: &str = "TRAINYARD_";

/// No container of the template sets a [`RESERVED_ENV_PREFIX`] variable.
fn check_reserved_env(spec: &TrainingJobSpec) -> Result<(), InvalidSpec> {
    let Some(pod) = spec.template.spec.as_ref() else {
        return Ok(());
    };
    for (at, container) in containers(pod) {
        let env = container.env.as_deref().unwrap_or_default();
        if let Some((j, var)) = env
            .iter()
            .enumerate()
            .find(|(_, v)| v.name.starts_with(RESERVED_ENV_PREFIX))
        {
            return Err(InvalidSpec::new(
                &format!("{at}.env[{j}].name"),
                format!(
                    "{} is set by the operator for each attempt; a template must not set \
                     {RESERVED_ENV_PREFIX}* variables",
                    var.name
                ),
            ));
        }
    }
    Ok(())
}

/// Every container and init container of a pod template, each with its field path
/// (`spec.template.spec.containers[0]`).
fn containers(
    pod: &k8s_openapi::api::core::v1::PodSpec,
) -> impl Iterator<Item = (String, &k8s_openapi::api::core::v1::Container)> {
    let lists = [
        ("containers", pod.containers.as_slice()),
        (
            "initContainers",
            pod.init_containers.as_deref().unwrap_or_default(),
        ),
    ];
    lists.into_iter().flat_map(|(list, containers)| {
        containers
            .iter()
            .enumerate()
            .map(move |(i, c)| (format!("spec.template.spec.{list}[{i}]"), c))
    })
}

/// The capabilities Pod Security's baseline lets a container add.
const BASELINE_CAPABILITIES: [&str; 13] = [
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// Checks a template against the operator's [`TemplatePolicy`]: what reaches the node or
/// names a ServiceAccount the policy does not allow is refused, naming the field.
pub fn check_policy(spec: &TrainingJobSpec, policy: &TemplatePolicy) -> Result<(), InvalidSpec> {
    let Some(pod) = spec.template.spec.as_ref() else {
        return Ok(());
    };
    if !policy.service_accounts.is_empty() {
        // `serviceAccount` is the deprecated name the API server still honours.
        let account = [&pod.service_account_name, &pod.service_account]
            .into_iter()
            .find_map(|a| a.as_deref().filter(|a| !a.is_empty()))
            .unwrap_or("default");
        if !policy.service_accounts.iter().any(|a| a == account) {
            return Err(InvalidSpec::new(
                "spec.template.spec.serviceAccountName",
                format!(
                    "ServiceAccount {account:?} is not among those the operator's template \
                     policy allows ({})",
                    policy.service_accounts.join(", ")
                ),
            ));
        }
    }
    if policy.refuse_host_access {
        check_host_access(pod)?;
    }
    Ok(())
}

/// A template that reaches the host (a named node, a host namespace, a hostPath volume, a
/// privileged container or a capability beyond the baseline) is refused, naming the field.
fn check_host_access(pod: &k8s_openapi::api::core::v1::PodSpec) -> Result<(), InvalidSpec> {
    let refused = |field: String, what: &str| {
        Err(InvalidSpec::new(
            &field,
            format!("{what}: the operator's template policy refuses access to the host"),
        ))
    };
    if pod.node_name.as_deref().is_some_and(|n| !n.is_empty()) {
        return refused(
            "spec.template.spec.nodeName".to_owned(),
            "a node named in the template skips the scheduler",
        );
    }
    for (field, set) in [
        ("hostNetwork", pod.host_network),
        ("hostPID", pod.host_pid),
        ("hostIPC", pod.host_ipc),
    ] {
        if set == Some(true) {
            return refused(format!("spec.template.spec.{field}"), "a host namespace");
        }
    }
    for (i, volume) in pod.volumes.iter().flatten().enumerate() {
        if volume.host_path.is_some() {
            return refused(
                format!("spec.template.spec.volumes[{i}].hostPath"),
                "a hostPath volume",
            );
        }
    }
    for (at, container) in containers(pod) {
        let Some(context) = container.security_context.as_ref() else {
            continue;
        };
        let at = format!("{at}.securityContext");
        if context.privileged == Some(true) {
            return refused(format!("{at}.privileged"), "a privileged container");
        }
        let added = context.capabilities.as_ref().and_then(|c| c.add.as_deref());
        if let Some(cap) = added
            .unwrap_or_default()
            .iter()
            .find(|c| !BASELINE_CAPABILITIES.contains(&c.trim_start_matches("CAP_")))
        {
            return refused(
                format!("{at}.capabilities.add"),
                &format!("capability {cap} beyond Pod Security's baseline"),
            );
        }
    }
    Ok(())
}

/// `spec.gpu.minCudaVersion` and `spec.gpu.minComputeCapability`.
fn gpu_minimums(spec: &TrainingJobSpec) -> Result<(Option<Version>, Option<Version>), InvalidSpec> {
    let parse = |field: &str, v: &Option<String>| -> Result<Option<Version>, InvalidSpec> {
        v.as_deref()
            .map(|s| {
                Version::parse(s).ok_or_else(|| {
                    InvalidSpec::new(field, format!("{s:?} is not a \"major.minor\" version"))
                })
            })
            .transpose()
    };
    let min_cuda = parse("spec.gpu.minCudaVersion", &spec.gpu.min_cuda_version)?;
    let min_compute = parse(
        "spec.gpu.minComputeCapability",
        &spec.gpu.min_compute_capability,
    )?;
    Ok((min_cuda, min_compute))
}

/// The checkpoint claim: its name, whether the job creates it, and its access modes.
fn checkpoint(
    name: &str,
    spec: &TrainingJobSpec,
) -> Result<(String, bool, Vec<String>), InvalidSpec> {
    if !spec.checkpoint.mount_path.starts_with('/') {
        return Err(InvalidSpec::new(
            "spec.checkpoint.mountPath",
            "must be an absolute path",
        ));
    }

    let existing = spec.checkpoint.existing_claim.trim();
    let (claim_name, creates_claim) = if existing.is_empty() {
        (format!("{name}-checkpoints"), true)
    } else {
        (existing.to_owned(), false)
    };
    let access_modes = if spec.checkpoint.access_modes.is_empty() {
        vec![if spec.workers == 1 {
            AccessMode::ReadWriteOnce
        } else {
            AccessMode::ReadWriteMany
        }]
    } else {
        spec.checkpoint.access_modes.clone()
    }
    .into_iter()
    .map(|m| m.as_str().to_owned())
    .collect();
    Ok((claim_name, creates_claim, access_modes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::job_yaml;

    #[test]
    fn minimal_job_is_valid_with_defaults() {
        let job = validate(&job_yaml("workers: 2\ngpusPerWorker: 4\n")).expect("valid");
        assert_eq!(job.claim_name, "train-checkpoints");
        assert!(job.creates_claim);
        assert_eq!(job.access_modes, vec!["ReadWriteMany"]);
        assert_eq!(job.spec.checkpoint.mount_path, "/mnt/checkpoints");
        assert_eq!(job.spec.restart_policy.max_failures, 3);
        assert_eq!(job.owner.controller, Some(true));
    }

    #[test]
    fn single_worker_defaults_to_read_write_once() {
        let job = validate(&job_yaml("workers: 1\n")).expect("valid");
        assert_eq!(job.access_modes, vec!["ReadWriteOnce"]);
    }

    #[test]
    fn template_without_containers_is_invalid() {
        let mut tj = job_yaml("workers: 1\n");
        if let Some(s) = tj.spec.template.spec.as_mut() {
            s.containers.clear();
        }
        let err = validate(&tj).expect_err("invalid");
        assert_eq!(err.field, "spec.template.spec.containers");
    }

    #[test]
    fn template_without_pod_spec_is_invalid() {
        let mut tj = job_yaml("workers: 1\n");
        tj.spec.template.spec = None;
        assert_eq!(
            validate(&tj).expect_err("invalid").field,
            "spec.template.spec.containers"
        );
    }

    /// A fence token (or any TRAINYARD_* variable) in the template would outlive its attempt:
    /// refused, naming the field.
    #[test]
    fn a_template_setting_a_trainyard_variable_is_invalid_naming_the_field() {
        let mut job = job_yaml("workers: 1\n");
        let pod = job.spec.template.spec.as_mut().expect("pod spec");
        pod.containers[0].env = Some(vec![
            k8s_openapi::api::core::v1::EnvVar {
                name: "LR".to_owned(),
                value: Some("0.1".to_owned()),
                ..Default::default()
            },
            k8s_openapi::api::core::v1::EnvVar {
                name: "TRAINYARD_FENCE_TOKEN".to_owned(),
                value: Some("1:0:mine".to_owned()),
                ..Default::default()
            },
        ]);
        let err = validate(&job).expect_err("a reserved variable");
        assert_eq!(err.field, "spec.template.spec.containers[0].env[1].name");
        assert!(err.message.contains("TRAINYARD_FENCE_TOKEN"), "{err}");

        let mut job = job_yaml("workers: 1\n");
        let pod = job.spec.template.spec.as_mut().expect("pod spec");
        let mut init = pod.containers[0].clone();
        init.env = Some(vec![k8s_openapi::api::core::v1::EnvVar {
            name: "TRAINYARD_ATTEMPT".to_owned(),
            value: Some("0".to_owned()),
            ..Default::default()
        }]);
        pod.init_containers = Some(vec![init]);
        let err = validate(&job).expect_err("in an init container too");
        assert_eq!(
            err.field,
            "spec.template.spec.initContainers[0].env[0].name"
        );
    }

    /// The template policy: off by default; with host access refused, each way to the host
    /// is named; with an allow-list, only those ServiceAccounts (the default one when the
    /// template names none).
    #[test]
    fn the_template_policy_refuses_what_reaches_the_host_naming_the_field() {
        let strict = TemplatePolicy {
            refuse_host_access: true,
            service_accounts: Vec::new(),
        };
        let refused = |yaml: &str, policy: &TemplatePolicy| {
            let job = validate(&job_yaml(yaml)).expect("valid without a policy");
            check_policy(&job.spec, policy).map_err(|e| e.field)
        };
        let template = |pod: &str| {
            format!(
                "workers: 1\ntemplate:\n  spec:\n    containers: [{{name: trainer, image: t}}]\n{pod}"
            )
        };
        let plain = template("");
        assert_eq!(refused(&plain, &strict), Ok(()));
        for (pod, field) in [
            ("    nodeName: gpu-7\n", "spec.template.spec.nodeName"),
            ("    hostNetwork: true\n", "spec.template.spec.hostNetwork"),
            ("    hostPID: true\n", "spec.template.spec.hostPID"),
            (
                "    volumes: [{name: c, emptyDir: {}}, {name: h, hostPath: {path: /}}]\n",
                "spec.template.spec.volumes[1].hostPath",
            ),
        ] {
            let yaml = template(pod);
            assert_eq!(refused(&yaml, &TemplatePolicy::default()), Ok(()), "{pod}");
            assert_eq!(refused(&yaml, &strict), Err(field.to_owned()), "{pod}");
        }
        let container = |security: &str| {
            format!(
                "workers: 1\ntemplate:\n  spec:\n    containers:\n    - {{name: trainer, image: t, securityContext: {security}}}\n"
            )
        };
        let at = "spec.template.spec.containers[0].securityContext";
        assert_eq!(
            refused(&container("{privileged: true}"), &strict),
            Err(format!("{at}.privileged"))
        );
        assert_eq!(
            refused(&container("{capabilities: {add: [SYS_ADMIN]}}"), &strict),
            Err(format!("{at}.capabilities.add"))
        );
        assert_eq!(
            refused(
                &container("{capabilities: {add: [CAP_NET_BIND_SERVICE]}}"),
                &strict
            ),
            Ok(()),
            "within the baseline"
        );

        let allowed = TemplatePolicy {
            refuse_host_access: false,
            service_accounts: vec!["trainer".to_owned()],
        };
        assert_eq!(
            refused(&plain, &allowed),
            Err("spec.template.spec.serviceAccountName".to_owned()),
            "the default ServiceAccount is not on the list"
        );
        assert_eq!(
            refused(&template("    serviceAccountName: trainer\n"), &allowed),
            Ok(())
        );
        assert_eq!(
            refused(&template("    serviceAccount: admin\n"), &allowed),
            Err("spec.template.spec.serviceAccountName".to_owned())
        );
    }

    #[test]
    fn trainer_is_found_by_name_then_first() {
        let mut tj = job_yaml("workers: 1\n");
        if let Some(s) = tj.spec.template.spec.as_mut() {
            let mut sidecar = s.containers[0].clone();
            sidecar.name = "sidecar".into();
            s.containers.insert(0, sidecar);
        }
        assert_eq!(validate(&tj).expect("valid").trainer_index, 1);
    }

    #[test]
    fn existing_claim_is_mounted_instead_of_creating_one() {
        let job = validate(&job_yaml("checkpoint: {existingClaim: shared}\n")).expect("valid");
        assert_eq!(job.claim_name, "shared");
        assert!(!job.creates_claim);
    }

    #[test]
    fn bad_version_is_invalid_naming_the_field() {
        let err = validate(&job_yaml("gpu: {minCudaVersion: \"twelve\"}\n")).expect_err("invalid");
        assert_eq!(err.field, "spec.gpu.minCudaVersion");
    }

    #[test]
    fn name_that_makes_a_too_long_hostname_is_invalid() {
        let mut tj = job_yaml("workers: 10\n");
        tj.metadata.name = Some("a".repeat(55));
        assert_eq!(validate(&tj).expect_err("invalid").field, "metadata.name");
    }

    #[test]
    fn values_beyond_the_crd_limits_are_invalid_naming_the_field() {
        let table = [
            ("workers: 10001\n", "spec.workers"),
            ("gpusPerWorker: 65\n", "spec.gpusPerWorker"),
            ("gpu: {minMemoryGiB: 1025}\n", "spec.gpu.minMemoryGiB"),
            ("gpu: {minMemoryGiB: 0}\n", "spec.gpu.minMemoryGiB"),
            (
                "spot: {fallbackToOnDemandAfter: 10001}\n",
                "spec.spot.fallbackToOnDemandAfter",
            ),
            (
                "restartPolicy: {maxPreemptions: 4294967295}\n",
                "spec.restartPolicy.maxPreemptions",
            ),
            (
                "restartPolicy: {maxFailures: 10001}\n",
                "spec.restartPolicy.maxFailures",
            ),
            (
                "restartPolicy: {backoffSeconds: 601}\n",
                "spec.restartPolicy.backoffSeconds",
            ),
            (
                "restartPolicy: {maxHangs: 10001}\n",
                "spec.restartPolicy.maxHangs",
            ),
            (
                "restartPolicy: {progressTimeoutSeconds: 9}\n",
                "spec.restartPolicy.progressTimeoutSeconds",
            ),
            (
                "restartPolicy: {progressTimeoutSeconds: 86401}\n",
                "spec.restartPolicy.progressTimeoutSeconds",
            ),
            (
                "terminationGracePeriodSeconds: 86401\n",
                "spec.terminationGracePeriodSeconds",
            ),
            (
                "terminationGracePeriodSeconds: -1\n",
                "spec.terminationGracePeriodSeconds",
            ),
            (
                "activeDeadlineSeconds: 9223372036854775807\n",
                "spec.activeDeadlineSeconds",
            ),
        ];
        for (yaml, field) in table {
            let err = validate(&job_yaml(yaml)).expect_err(yaml);
            assert_eq!(err.field, field, "{yaml}");
            assert!(err.to_string().starts_with(field), "{err}");
        }
    }

    #[test]
    fn values_at_the_crd_limits_are_valid() {
        let mut tj = job_yaml(
            "workers: 10000\ngpusPerWorker: 64\ngpu: {minMemoryGiB: 1024}\nspot: {fallbackToOnDemandAfter: 10000}\nrestartPolicy: {maxPreemptions: 10000, maxFailures: 10000, backoffSeconds: 600, maxHangs: 10000, progressTimeoutSeconds: 86400}\nterminationGracePeriodSeconds: 86400\nactiveDeadlineSeconds: 31536000\n",
        );
        tj.metadata.name = Some("t".into());
        validate(&tj).expect("valid");
    }

    #[test]
    fn name_that_is_not_a_service_name_is_invalid() {
        let mut tj = job_yaml("workers: 1\n");
        tj.metadata.name = Some("1train".into());
        assert_eq!(validate(&tj).expect_err("invalid").field, "metadata.name");
    }
}
