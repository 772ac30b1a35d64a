//! The headless rendezvous Service `<job>`: gives every worker the DNS name
//! `<job>-worker-<rank>.<job>`, including before it is Ready.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::build::pods::MASTER_PORT;
use crate::model::crd::LABEL_JOB;
use crate::model::validate::ValidJob;

/// The Service of a job.
pub fn desired_service(job: &ValidJob) -> Service {
    let labels = BTreeMap::from([(LABEL_JOB.to_owned(), job.name.clone())]);
    Service {
        metadata: ObjectMeta {
            name: Some(job.name.clone()),
            namespace: Some(job.namespace.clone()),
            labels: Some(labels.clone()),
            owner_references: Some(vec![job.owner.clone()]),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_owned()),
            selector: Some(labels),
            // Rendezvous happens before any worker is Ready.
            publish_not_ready_addresses: Some(true),
            ports: Some(vec![ServicePort {
                name: Some("rendezvous".to_owned()),
                port: i32::from(MASTER_PORT),
                protocol: Some("TCP".to_owned()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::job_yaml;
    use crate::model::validate::validate;

    #[test]
    fn service_is_headless_selects_the_job_and_publishes_not_ready() {
        let svc = desired_service(&validate(&job_yaml("workers: 2\n")).expect("valid"));
        assert_eq!(svc.metadata.name.as_deref(), Some("train"));
        let spec = svc.spec.expect("spec");
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(spec.publish_not_ready_addresses, Some(true));
        assert_eq!(spec.selector.expect("selector")[LABEL_JOB], "train");
        assert_eq!(
            svc.metadata.owner_references.expect("owner")[0].controller,
            Some(true)
        );
    }
}
