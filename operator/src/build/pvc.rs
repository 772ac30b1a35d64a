//! The checkpoint PVC `<job>-checkpoints`, created unless `existingClaim` is set.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::model::crd::{LABEL_JOB, LABEL_JOB_UID};
use crate::model::validate::ValidJob;

/// The PVC to create, or None when the job mounts an existing claim.
pub fn desired_pvc(job: &ValidJob) -> Option<PersistentVolumeClaim> {
    if !job.creates_claim {
        return None;
    }
    let c = &job.spec.checkpoint;
    // Without an owner reference the garbage collector leaves the checkpoints behind.
    let owner_references = (!c.retain_on_delete).then(|| vec![job.owner.clone()]);
    Some(PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(job.claim_name.clone()),
            namespace: Some(job.namespace.clone()),
            // The uid says which job created the claim: a later job of the same name finds it
            // inherited and resumes from it (`plan::ObservedClaim::inherited`).
            labels: Some(BTreeMap::from([
                (LABEL_JOB.to_owned(), job.name.clone()),
                (LABEL_JOB_UID.to_owned(), job.uid.clone()),
            ])),
            owner_references,
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(job.access_modes.clone()),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".to_owned(), c.size.clone())])),
                limits: None,
            }),
            storage_class_name: (!c.storage_class_name.is_empty())
                .then(|| c.storage_class_name.clone()),
            ..PersistentVolumeClaimSpec::default()
        }),
        status: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::job_yaml;
    use crate::model::validate::validate;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn pvc(yaml: &str) -> Option<PersistentVolumeClaim> {
        desired_pvc(&validate(&job_yaml(yaml)).expect("valid"))
    }

    #[test]
    fn created_pvc_has_size_class_and_modes() {
        let p = pvc("workers: 2\ncheckpoint: {size: 5Gi, storageClassName: fast}\n").expect("pvc");
        assert_eq!(p.metadata.name.as_deref(), Some("train-checkpoints"));
        let spec = p.spec.expect("spec");
        assert_eq!(spec.access_modes, Some(vec!["ReadWriteMany".to_owned()]));
        assert_eq!(spec.storage_class_name.as_deref(), Some("fast"));
        assert_eq!(
            spec.resources.expect("res").requests.expect("req")["storage"],
            Quantity("5Gi".into())
        );
    }

    #[test]
    fn empty_storage_class_uses_the_cluster_default() {
        let p = pvc("checkpoint: {accessModes: [ReadWriteOnce]}\n").expect("pvc");
        let spec = p.spec.expect("spec");
        assert_eq!(spec.storage_class_name, None);
        assert_eq!(spec.access_modes, Some(vec!["ReadWriteOnce".to_owned()]));
    }

    #[test]
    fn retained_pvc_has_no_owner_so_it_outlives_the_job() {
        assert!(
            pvc("checkpoint: {retainOnDelete: true}\n")
                .expect("pvc")
                .metadata
                .owner_references
                .is_none()
        );
        let owned = pvc("checkpoint: {retainOnDelete: false}\n").expect("pvc");
        assert_eq!(owned.metadata.owner_references.expect("owner").len(), 1);
    }

    #[test]
    fn created_pvc_names_the_job_and_the_uid_that_created_it() {
        let p = pvc("workers: 2\n").expect("pvc");
        let labels = p.metadata.labels.expect("labels");
        assert_eq!(labels[LABEL_JOB], "train");
        assert_eq!(
            labels[LABEL_JOB_UID],
            job_yaml("workers: 2\n").metadata.uid.expect("uid")
        );
    }

    #[test]
    fn existing_claim_creates_no_pvc() {
        assert!(pvc("checkpoint: {existingClaim: shared}\n").is_none());
    }
}
