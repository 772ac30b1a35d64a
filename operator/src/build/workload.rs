//! The Kueue Workload `trainingjob-<job>` of a job that names a LocalQueue
//! ([`crate::model::kueue`]): one pod set, the workers, each as the operator would create it
//! (the trainer's GPU limit, the placement's node affinity), so that Kueue reserves what the
//! pods will ask for and can match the flavors' node labels against it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::build::pods::{AttemptStart, Seat, desired_pod};
use crate::model::crd::LABEL_JOB;
use crate::model::kueue::{POD_SET, PodSet, Workload, WorkloadSpec};
use crate::model::placement::Placement;
use crate::model::validate::ValidJob;

/// The name of the Workload of job `job`.
pub fn workload_name(job: &str) -> String {
    format!("trainingjob-{job}")
}

/// The job's Workload, or `None` when it names no queue. `placement` is where its first
/// attempt's pods would go.
pub fn desired_workload(job: &ValidJob, placement: &Placement) -> Option<Workload> {
    let queue = job.queue.clone()?;
    let seat = Seat {
        rank: 0,
        attempt: 0,
        workers: job.spec.workers,
    };
    let start = AttemptStart::of(0, None, false);
    let pod: Pod = desired_pod(job, seat, start, None, placement, None);
    let spec = pod.spec.unwrap_or_default();
    let template = PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: pod.metadata.labels,
            ..ObjectMeta::default()
        }),
        spec: Some(spec.clone()),
    };
    Some(Workload {
        metadata: ObjectMeta {
            name: Some(workload_name(&job.name)),
            namespace: Some(job.namespace.clone()),
            labels: Some(BTreeMap::from([(LABEL_JOB.to_owned(), job.name.clone())])),
            owner_references: Some(vec![job.owner.clone()]),
            ..ObjectMeta::default()
        },
        spec: WorkloadSpec {
            pod_sets: vec![PodSet {
                name: POD_SET.to_owned(),
                template,
                count: i32::try_from(job.spec.workers).unwrap_or(i32::MAX),
                min_count: job
                    .spec
                    .elastic
                    .as_ref()
                    .map(|e| i32::try_from(e.min_workers).unwrap_or(i32::MAX)),
            }],
            queue_name: queue,
            priority_class_name: spec.priority_class_name,
        },
        status: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::job_yaml;
    use crate::model::validate::validate;

    fn queued(yaml: &str) -> ValidJob {
        let mut tj = job_yaml(yaml);
        tj.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(crate::model::kueue::QUEUE_LABEL.into(), "team-a".into());
        validate(&tj).expect("valid")
    }

    #[test]
    fn a_queued_job_gets_a_workload_of_its_workers_owned_by_it() {
        let job = queued("workers: 3\ngpusPerWorker: 2\n");
        let w = desired_workload(&job, &Placement::default()).expect("a Workload");
        assert_eq!(w.metadata.name.as_deref(), Some("trainingjob-train"));
        let owner = &w.metadata.owner_references.as_ref().expect("owner")[0];
        assert_eq!(
            (owner.uid.as_str(), owner.controller),
            (job.uid.as_str(), Some(true))
        );
        assert_eq!(w.spec.queue_name, "team-a");
        let set = &w.spec.pod_sets[0];
        assert_eq!((set.name.as_str(), set.count), ("workers", 3));
        let spec = set.template.spec.as_ref().expect("spec");
        let limits = spec.containers[job.trainer_index]
            .resources
            .as_ref()
            .and_then(|r| r.limits.clone())
            .unwrap_or_default();
        assert_eq!(
            limits["nvidia.com/gpu"].0, "2",
            "Kueue reserves each worker's GPUs"
        );
        let json = serde_json::to_value(&w).expect("json");
        assert_eq!(json["apiVersion"], "kueue.x-k8s.io/v1beta1");
        assert_eq!(json["spec"]["podSets"][0]["count"], 3);
    }

    #[test]
    fn a_job_without_the_queue_label_gets_none() {
        let job = validate(&job_yaml("workers: 2\n")).expect("valid");
        assert_eq!(desired_workload(&job, &Placement::default()), None);
    }
}
