//! The operator's cached view of a worker pod: the fields decisions read, and nothing else.
//!
//! The pod watch decodes straight into [`CachedPod`], so the parts of a pod the operator never
//! reads (environment, volumes, commands, affinity, tolerations, ...) are skipped while parsing
//! instead of being allocated and dropped. The cache holds every worker of every job, and a
//! `k8s_openapi` `Pod` costs about 2.2 kB inline plus 2.1 kB per container before any of its
//! strings (heaptrack at 1,000 jobs: the pod cache was most of the operator's peak heap).
//!
//! Decisions take a `Pod` ([`CachedPod::to_pod`] builds it for the few pods of the job being
//! reconciled). The one decision that needs a pod's placement reads the pod whole from the API
//! server (see the controller's `sibling_to_read`).

use std::borrow::Cow;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::Deserialize;

/// A worker pod as the operator caches it.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct CachedPod {
    /// Metadata, less managedFields and annotations (dropped by [`CachedPod::strip`]).
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The node and the container names.
    #[serde(default)]
    pub spec: CachedPodSpec,
    /// The whole status: the preemption classifier reads it.
    #[serde(default)]
    pub status: Option<PodStatus>,
}

/// What the operator reads of a pod's spec.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedPodSpec {
    /// The node the pod was bound to.
    #[serde(default)]
    pub node_name: Option<String>,
    /// The containers, by name (which one is the trainer).
    #[serde(default)]
    pub containers: Vec<CachedContainer>,
}

/// A container, by name.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct CachedContainer {
    /// Container name.
    pub name: String,
}

impl Resource for CachedPod {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("Pod")
    }
    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("")
    }
    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("v1")
    }
    fn api_version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("v1")
    }
    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("pods")
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl CachedPod {
    /// Drops the metadata no decision reads.
    pub fn strip(&mut self) {
        self.metadata.managed_fields = None;
        self.metadata.annotations = None;
    }

    /// The node the pod was bound to.
    pub fn node_name(&self) -> Option<&str> {
        self.spec.node_name.as_deref()
    }

    /// A `Pod` with what the cache holds, for the pure decision steps.
    pub fn to_pod(&self) -> Pod {
        Pod {
            metadata: self.metadata.clone(),
            spec: Some(PodSpec {
                node_name: self.spec.node_name.clone(),
                containers: self
                    .spec
                    .containers
                    .iter()
                    .map(|c| Container {
                        name: c.name.clone(),
                        ..Container::default()
                    })
                    .collect(),
                ..PodSpec::default()
            }),
            status: self.status.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{DEFAULT_GPU_RESOURCE, LABEL_JOB};
    use crate::preemption::{ClassifierConfig, NodeView, classify};
    use crate::trainer::trainer_container;
    use k8s_openapi::api::core::v1::Node;
    use serde_json::json;
    use trainyard_api::env::WORLD_SIZE;
    use trainyard_api::spot::KARPENTER_CAPACITY_TYPE;

    fn full_pod() -> serde_json::Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "j-worker-1", "namespace": "ns", "uid": "u1",
                         "labels": {LABEL_JOB: "j"},
                         "ownerReferences": [{"apiVersion": "trainyard.dev/v1alpha1", "kind": "TrainingJob",
                                              "name": "j", "uid": "ju", "controller": true}],
                         "annotations": {"big": "x".repeat(4096)},
                         "managedFields": [{"manager": "kubectl", "operation": "Update"}]},
            "spec": {
                "nodeName": "n",
                "containers": [
                    {"name": "sidecar", "image": "s"},
                    {"name": "trainer", "image": "t", "command": ["python", "train.py"],
                     "env": [{"name": WORLD_SIZE, "value": "8"}],
                     "volumeMounts": [{"name": "ckpt", "mountPath": "/mnt"}]},
                ],
                "volumes": [{"name": "ckpt", "persistentVolumeClaim": {"claimName": "c"}}],
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                    {"nodeSelectorTerms": [{"matchExpressions": [
                        {"key": KARPENTER_CAPACITY_TYPE, "operator": "In", "values": ["spot"]}]}]}}},
                "tolerations": [{"key": DEFAULT_GPU_RESOURCE, "operator": "Exists"}],
            },
            "status": {
                "phase": "Failed",
                "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet"}],
                "containerStatuses": [{"name": "trainer", "ready": false, "restartCount": 0, "image": "t", "imageID": "",
                    "state": {"terminated": {"exitCode": 143}}}],
            },
        })
    }

    #[test]
    fn a_cached_pod_classifies_like_the_full_one() {
        let full: Pod = serde_json::from_value(full_pod()).expect("pod");
        let mut cached: CachedPod = serde_json::from_value(full_pod()).expect("cached pod");
        cached.strip();
        let pod = cached.to_pod();

        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }))
        .expect("node");
        let now = jiff::Timestamp::now();
        let config = ClassifierConfig::from_config(&crate::config::OperatorConfig::default());
        assert_eq!(
            format!(
                "{:?}",
                classify(&pod, NodeView::Present(&node), &config, now)
            ),
            format!(
                "{:?}",
                classify(&full, NodeView::Present(&node), &config, now)
            ),
        );
        assert_eq!(trainer_container(&pod), Some("trainer"));
        assert_eq!(cached.node_name(), Some("n"));
        assert_eq!(pod.status, full.status);
        assert_eq!(pod.metadata.labels, full.metadata.labels);
        assert_eq!(
            pod.metadata.owner_references,
            full.metadata.owner_references
        );
        assert_eq!(pod.metadata.uid, full.metadata.uid);
        // What no decision reads is not kept.
        let spec = pod.spec.as_ref().expect("spec");
        assert!(spec.volumes.is_none() && spec.affinity.is_none() && spec.tolerations.is_none());
        assert!(
            spec.containers
                .iter()
                .all(|c| c.env.is_none() && c.command.is_none() && c.image.is_none())
        );
        assert!(pod.metadata.annotations.is_none() && pod.metadata.managed_fields.is_none());
    }

    #[test]
    fn a_pod_without_spec_or_status_still_decodes() {
        let cached: CachedPod =
            serde_json::from_value(json!({"metadata": {"name": "p"}})).expect("cached pod");
        assert_eq!(cached.node_name(), None);
        assert!(cached.to_pod().status.is_none());
    }
}
