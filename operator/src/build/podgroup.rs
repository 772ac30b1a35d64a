//! The PodGroup `<job>` of the gang scheduler the job's pod template names
//! ([`crate::model::podgroup`]), and the mark that puts each worker pod in it.
//!
//! `minMember` is the gang: `spec.workers`, or `elastic.minWorkers` for an elastic job (which
//! trains with fewer). `minResources` asks for the GPUs of that many workers at once. The
//! coscheduling scheduler gives a group that waits `scheduling.placementTimeoutSeconds` its
//! placed members back, as the operator's own [requeue](crate::plan) would.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::config::OperatorConfig;
use crate::model::crd::LABEL_JOB;
use crate::model::podgroup::{
    COSCHEDULING_GROUP_LABEL, CoschedulingPodGroup, CoschedulingPodGroupSpec, PodGroup,
    VOLCANO_GROUP_ANNOTATION, VolcanoPodGroup, VolcanoPodGroupSpec,
};
use crate::model::validate::ValidJob;

/// The job's PodGroup, when its pod template's `schedulerName` is one of the gang schedulers
/// the operator is configured with; `None` for the default scheduler and any other.
pub fn desired_pod_group(job: &ValidJob, config: &OperatorConfig) -> Option<PodGroup> {
    let scheduler = job
        .spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.scheduler_name.as_deref())?;
    let gangs = &config.gang_schedulers;
    let min_member = job
        .spec
        .elastic
        .as_ref()
        .map_or(job.spec.workers, |e| e.min_workers);
    let gpus = u64::from(min_member) * u64::from(job.spec.gpus_per_worker);
    let min_resources = (gpus > 0).then(|| {
        BTreeMap::from([(
            job.spec.gpu.resource_name.clone(),
            Quantity(gpus.to_string()),
        )])
    });
    let metadata = ObjectMeta {
        name: Some(job.name.clone()),
        namespace: Some(job.namespace.clone()),
        labels: Some(BTreeMap::from([(LABEL_JOB.to_owned(), job.name.clone())])),
        owner_references: Some(vec![job.owner.clone()]),
        ..ObjectMeta::default()
    };
    let min_member = i32::try_from(min_member).unwrap_or(i32::MAX);
    if gangs.volcano.iter().any(|n| n == scheduler) {
        return Some(PodGroup::Volcano(VolcanoPodGroup {
            metadata,
            spec: VolcanoPodGroupSpec {
                min_member,
                min_resources,
                queue: None,
            },
        }));
    }
    if gangs.coscheduling.iter().any(|n| n == scheduler) {
        let timeout = job.spec.scheduling.placement_timeout_seconds;
        return Some(PodGroup::Coscheduling(CoschedulingPodGroup {
            metadata,
            spec: CoschedulingPodGroupSpec {
                min_member,
                min_resources,
                schedule_timeout_seconds: Some(i32::try_from(timeout).unwrap_or(i32::MAX)),
            },
        }));
    }
    None
}

/// Puts `pod` in `group`: Volcano's annotation, or coscheduling's label.
pub fn join(pod: &mut Pod, group: &PodGroup) {
    let name = group.metadata().name.clone().unwrap_or_default();
    let meta = &mut pod.metadata;
    match group {
        PodGroup::Volcano(_) => {
            meta.annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(VOLCANO_GROUP_ANNOTATION.to_owned(), name);
        }
        PodGroup::Coscheduling(_) => {
            meta.labels
                .get_or_insert_with(BTreeMap::new)
                .insert(COSCHEDULING_GROUP_LABEL.to_owned(), name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::job_yaml;
    use crate::model::validate::validate;

    fn job(extra: &str, scheduler: &str) -> ValidJob {
        let mut job = validate(&job_yaml(extra)).expect("valid");
        if let Some(spec) = job.spec.template.spec.as_mut() {
            spec.scheduler_name = Some(scheduler.to_owned());
        }
        job
    }

    #[test]
    fn volcano_gets_a_group_of_every_worker_with_their_gpus_owned_by_the_job() {
        let job = job("workers: 4\ngpusPerWorker: 2\n", "volcano");
        let Some(PodGroup::Volcano(g)) = desired_pod_group(&job, &OperatorConfig::default()) else {
            panic!("a Volcano PodGroup");
        };
        assert_eq!(g.metadata.name.as_deref(), Some("train"));
        assert_eq!(
            g.metadata.namespace.as_deref(),
            Some(job.namespace.as_str())
        );
        let owner = &g.metadata.owner_references.as_ref().expect("owner")[0];
        assert_eq!(
            (owner.uid.as_str(), owner.controller),
            (job.uid.as_str(), Some(true))
        );
        assert_eq!(g.spec.min_member, 4);
        assert_eq!(
            g.spec.min_resources.as_ref().expect("minResources")["nvidia.com/gpu"],
            Quantity("8".into())
        );
        let value = serde_json::to_value(PodGroup::Volcano(g.clone()).metadata()).expect("meta");
        assert_eq!(value["name"], "train");
        let json = serde_json::to_value(&g).expect("json");
        assert_eq!(json["apiVersion"], "scheduling.volcano.sh/v1beta1");
        assert_eq!(json["kind"], "PodGroup");
        assert_eq!(json["spec"]["minMember"], 4);
    }

    #[test]
    fn coscheduling_waits_the_jobs_placement_timeout_and_an_elastic_gang_its_minimum() {
        let job = job(
            "workers: 4\ngpusPerWorker: 1\nelastic: {minWorkers: 2}\n\
             scheduling: {placementTimeoutSeconds: 90}\n",
            "scheduler-plugins-scheduler",
        );
        let Some(PodGroup::Coscheduling(g)) = desired_pod_group(&job, &OperatorConfig::default())
        else {
            panic!("a coscheduling PodGroup");
        };
        assert_eq!(g.spec.min_member, 2);
        assert_eq!(g.spec.schedule_timeout_seconds, Some(90));
        let json = serde_json::to_value(&g).expect("json");
        assert_eq!(json["apiVersion"], "scheduling.x-k8s.io/v1alpha1");
        assert_eq!(json["spec"]["scheduleTimeoutSeconds"], 90);
    }

    #[test]
    fn the_default_scheduler_and_unknown_ones_get_no_group() {
        let config = OperatorConfig::default();
        assert_eq!(
            desired_pod_group(&job("", "default-scheduler"), &config),
            None
        );
        assert_eq!(desired_pod_group(&job("", "my-scheduler"), &config), None);
        let plain = validate(&job_yaml("")).expect("valid");
        assert_eq!(desired_pod_group(&plain, &config), None);
        // A name the operator is configured with is one.
        let mut config = OperatorConfig::default();
        config
            .gang_schedulers
            .coscheduling
            .push("my-scheduler".into());
        assert!(matches!(
            desired_pod_group(&job("", "my-scheduler"), &config),
            Some(PodGroup::Coscheduling(_))
        ));
    }

    #[test]
    fn pods_join_by_volcanos_annotation_or_coschedulings_label() {
        let config = OperatorConfig::default();
        let volcano = desired_pod_group(&job("", "volcano"), &config).expect("group");
        let mut pod = Pod::default();
        join(&mut pod, &volcano);
        assert_eq!(
            pod.metadata.annotations.expect("annotations")[VOLCANO_GROUP_ANNOTATION],
            "train"
        );
        let cosched =
            desired_pod_group(&job("", "scheduler-plugins-scheduler"), &config).expect("group");
        let mut pod = Pod::default();
        join(&mut pod, &cosched);
        assert_eq!(
            pod.metadata.labels.expect("labels")[COSCHEDULING_GROUP_LABEL],
            "train"
        );
    }
}
