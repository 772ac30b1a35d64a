//! The objects a run writes: the benchmark's TrainingJobs, and what the floors write for them:
//! pods and Services built by the operator's own builders through
//! [`trainyard_operator::surface`] (so that a floor writes the operator's objects, not copies of
//! them), and the floors' least status writes.

use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{Resource, ResourceExt};
use serde_json::json;
use trainyard_operator::surface::{
    self, AttemptStart, OperatorConfig, Phase, RestartReason, Seat, TrainingJob, TrainingJobStatus,
    desired_pod, desired_service, validate,
};

use super::params::OperatorBenchParams;
use crate::error::{Error, Result};
use crate::fake_nodes::{GPU_PRODUCT, LABEL_RUN, TAINT_KEY};

/// The PVC every benchmark job mounts as its checkpoint volume (`spec.checkpoint.existingClaim`):
/// the local cluster's hostPath provisioner cannot give each job a ReadWriteMany claim, and an
/// unbound claim would keep every pod unschedulable.
pub const CHECKPOINT_CLAIM: &str = "bench-checkpoints";

/// Field manager of the fair floor's status writes.
pub(super) const FAIR_FIELD_MANAGER: &str = "trainyard-bench-fair";

/// Image of the trainer container (never pulled: no kubelet runs these pods).
pub(super) const TRAINER_IMAGE: &str = "docker.io/trainyard/trainer:dev";

/// One benchmark TrainingJob: W workers pinned to this run's fake nodes.
pub fn training_job(
    name: &str,
    ns: &str,
    run: &str,
    params: &OperatorBenchParams,
) -> Result<TrainingJob> {
    let v = json!({
        "apiVersion": "trainyard.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": ns, "labels": {LABEL_RUN: run}},
        "spec": {
            "workers": params.workers,
            "gpusPerWorker": params.gpus_per_worker,
            // Pinned, so that GPUs elsewhere in the cluster (a fake device plugin's) never win
            // the Cheapest choice.
            "gpu": {"products": [GPU_PRODUCT]},
            "checkpoint": {"existingClaim": CHECKPOINT_CLAIM},
            "template": {"spec": {
                "nodeSelector": {LABEL_RUN: run},
                "tolerations": [{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [{
                    "name": "trainer",
                    "image": TRAINER_IMAGE,
                    "command": ["sleep", "infinity"],
                }],
            }},
        },
    });
    serde_json::from_value(v).map_err(|e| Error::Build {
        what: format!("TrainingJob {name}"),
        message: e.to_string(),
    })
}

/// The uid the floors' jobs are validated with before they exist (the builders need one; the
/// owner references that carry it are removed or replaced).
const PLACEHOLDER_UID: &str = "00000000-0000-0000-0000-000000000000";

/// The pods the operator would create for `attempt` of each job (attempts after 0 as restarts
/// after a preemption), in namespace `ns` and without owner references, grouped by job.
pub(super) fn floor_pods(
    jobs: &[TrainingJob],
    ns: &str,
    nodes: &[Node],
    params: &OperatorBenchParams,
    attempt: u32,
) -> Result<Vec<Vec<Pod>>> {
    let config = OperatorConfig::default();
    let node_refs: Vec<&Node> = nodes.iter().collect();
    jobs.iter()
        .map(|job| {
            let mut job = job.clone();
            job.metadata.namespace = Some(ns.to_owned());
            // Any uid: the floor pods lose their owner reference below.
            job.metadata.uid = Some(PLACEHOLDER_UID.to_owned());
            let valid = validate(&job).map_err(|e| Error::Build {
                what: format!("the floor's pods of {}", job.name_any()),
                message: e.to_string(),
            })?;
            let place = surface::place(&valid, &config, &node_refs, 0);
            Ok((0..params.workers)
                .map(|rank| {
                    let restart = (attempt > 0).then_some(RestartReason::Preemption);
                    let start = AttemptStart::of(attempt, restart, false);
                    let mut pod = desired_pod(
                        &valid,
                        Seat::full(&valid, rank, attempt),
                        start,
                        None,
                        &place,
                        None,
                    );
                    pod.metadata.owner_references = None;
                    pod
                })
                .collect())
        })
        .collect()
}

/// One job of the fair floor: the TrainingJob the benchmark creates, and what a correct
/// controller must write for it at least (its Service and pods, built by the operator's own
/// builders, and one status write).
pub(super) struct FairJob {
    pub(super) job: TrainingJob,
    /// Without owner reference until the job exists.
    pub(super) service: Service,
    /// Without owner references until the job exists.
    pub(super) pods: Vec<Pod>,
}

/// The fair floor's jobs in namespace `ns`: the same TrainingJobs as the operator's, with the
/// Service and attempt-0 pods the operator would create for them.
pub(super) fn fair_floor_jobs(
    ns: &str,
    run: &str,
    nodes: &[Node],
    params: &OperatorBenchParams,
) -> Result<Vec<FairJob>> {
    let jobs: Vec<TrainingJob> = (0..params.jobs)
        .map(|i| training_job(&format!("job-{i:05}"), ns, run, params))
        .collect::<Result<_>>()?;
    let pods = floor_pods(&jobs, ns, nodes, params, 0)?;
    jobs.into_iter()
        .zip(pods)
        .map(|(job, pods)| {
            let mut placeholder = job.clone();
            placeholder.metadata.uid = Some(PLACEHOLDER_UID.to_owned());
            let valid = validate(&placeholder).map_err(|e| Error::Build {
                what: format!("the fair floor's Service of {}", job.name_any()),
                message: e.to_string(),
            })?;
            let mut service = desired_service(&valid);
            service.metadata.owner_references = None;
            Ok(FairJob { job, service, pods })
        })
        .collect()
}

/// Makes the created job the controller owner of its Service and pods, as the operator's are
/// (an owner reference to a uid that does not exist would have the garbage collector delete
/// them).
pub(super) fn set_owner(service: &mut Service, pods: &mut [Pod], owner: &OwnerReference) {
    service.metadata.owner_references = Some(vec![owner.clone()]);
    for pod in pods {
        pod.metadata.owner_references = Some(vec![owner.clone()]);
    }
}

/// The fair floor's one status write: a server-side apply of the least status a controller
/// writes for a new job (Pending, attempt 0, the generation it saw).
pub(super) fn fair_status_patch(job: &TrainingJob) -> Result<serde_json::Value> {
    let status = TrainingJobStatus {
        phase: Some(Phase::Pending),
        attempt: 0,
        observed_generation: job.metadata.generation,
        ..TrainingJobStatus::default()
    };
    status_apply(
        &format!("the status of TrainingJob {}", job.name_any()),
        &status,
    )
}

/// The body of a server-side apply of a TrainingJob's `status`; `what` names it in errors.
fn status_apply(what: &str, status: &TrainingJobStatus) -> Result<serde_json::Value> {
    let status = serde_json::to_value(status).map_err(|e| Error::Build {
        what: what.to_owned(),
        message: e.to_string(),
    })?;
    Ok(json!({
        "apiVersion": TrainingJob::api_version(&()),
        "kind": TrainingJob::kind(&()),
        "status": status,
    }))
}

/// The status a controller writes when it restarts a job: Restarting as attempt `attempt`.
pub(super) fn restart_status_patch(job: &str, attempt: u32) -> Result<serde_json::Value> {
    let status = TrainingJobStatus {
        phase: Some(Phase::Restarting),
        attempt,
        ..TrainingJobStatus::default()
    };
    status_apply(&format!("the restart status of TrainingJob {job}"), &status)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use super::*;

    fn params(jobs: u32, workers: u32) -> OperatorBenchParams {
        OperatorBenchParams {
            jobs,
            workers,
            nodes: 4,
            gpus_per_worker: 1,
            preempt: 0,
            concurrency: 16,
            rounds: 1,
            operator_bin: PathBuf::from("trainyard-operator"),
            phase_timeout: Duration::from_secs(60),
            work_dir: PathBuf::from("target/bench"),
            leader_elect: false,
            perf_record: None,
            max_concurrent_reconciles: None,
        }
    }

    #[test]
    fn the_fair_floor_builds_each_job_its_service_and_pods_in_its_namespace() {
        let jobs = fair_floor_jobs("tybench-x-fair", "x", &[], &params(3, 2)).expect("built");
        assert_eq!(jobs.len(), 3);
        for (i, fair) in jobs.iter().enumerate() {
            let name = format!("job-{i:05}");
            assert_eq!(fair.job.name_any(), name);
            assert_eq!(fair.job.namespace().as_deref(), Some("tybench-x-fair"));
            assert_eq!(fair.service.name_any(), name);
            assert_eq!(fair.service.namespace().as_deref(), Some("tybench-x-fair"));
            assert_eq!(fair.pods.len(), 2);
            assert!(
                fair.pods
                    .iter()
                    .all(|p| p.namespace().as_deref() == Some("tybench-x-fair"))
            );
            // No owner yet: the job's uid is only known once it is created.
            assert!(fair.service.metadata.owner_references.is_none());
            assert!(
                fair.pods
                    .iter()
                    .all(|p| p.metadata.owner_references.is_none())
            );
        }
    }

    #[test]
    fn the_created_job_owns_the_fair_floors_service_and_pods() {
        let mut fair = fair_floor_jobs("ns", "x", &[], &params(1, 2))
            .expect("built")
            .remove(0);
        let mut created = fair.job.clone();
        created.metadata.uid = Some("6c1f2e6a-0000-4000-8000-000000000001".to_owned());
        let owner = created.controller_owner_ref(&()).expect("name and uid");
        set_owner(&mut fair.service, &mut fair.pods, &owner);
        assert_eq!(
            fair.service.metadata.owner_references,
            Some(vec![owner.clone()])
        );
        for pod in &fair.pods {
            assert_eq!(pod.metadata.owner_references, Some(vec![owner.clone()]));
        }
    }

    #[test]
    fn the_fair_floors_status_write_is_an_apply_of_a_pending_first_attempt() {
        let mut job = training_job("job-00000", "ns", "x", &params(1, 2)).expect("built");
        job.metadata.generation = Some(1);
        let patch = fair_status_patch(&job).expect("built");
        assert_eq!(patch["apiVersion"], "trainyard.dev/v1alpha1");
        assert_eq!(patch["kind"], "TrainingJob");
        assert_eq!(patch["status"]["phase"], "Pending");
        assert_eq!(patch["status"]["attempt"], 0);
        assert_eq!(patch["status"]["observedGeneration"], 1);
        let status: TrainingJobStatus =
            serde_json::from_value(patch["status"].clone()).expect("a valid status");
        assert_eq!(status.phase, Some(Phase::Pending));
    }
}
