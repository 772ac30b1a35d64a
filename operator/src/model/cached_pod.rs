//! The operator's cached view of a worker pod: the fields decisions read, and nothing else.
//!
//! The pod watch decodes straight into [`CachedPod`], so the parts of a pod the operator never
//! reads (environment, volumes, commands, affinity, tolerations, ...) are skipped while parsing
//! instead of being allocated and dropped. The cache holds every worker of every job, and a
//! `k8s_openapi` `Pod` costs about 2.2 kB inline plus 2.1 kB per container before any of its
//! strings (heaptrack at 1,000 jobs: the pod cache was most of the operator's peak heap).
//!
//! Decisions read this type, so the compiler keeps them to what the cache holds. The one
//! thing a decision needs beyond it, the placement of a half-created attempt's first pod, the
//! controller reads whole from the API server before deciding and hands over as
//! [`crate::plan::Observed::sibling_placement`] (see the controller's `sibling_to_read`).

use std::borrow::Cow;

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStatus, NodeSelectorRequirement, Pod, PodCondition, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Resource;
use serde::Deserialize;

/// A worker pod as the operator caches it.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct CachedPod {
    /// Metadata, less managedFields and every annotation but the operator's own
    /// ([`CachedPod::strip`]).
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The node and the container names.
    #[serde(default)]
    pub spec: CachedPodSpec,
    /// What the preemption classifier and the decisions read of the status.
    #[serde(default)]
    pub status: Option<CachedPodStatus>,
}

/// What the operator reads of a pod's status: its phase and reason, conditions, start time
/// and how its containers are doing. Addresses, QoS class and most of each container's status
/// (image, ids, resources, volume mounts) are skipped while parsing: a `k8s_openapi`
/// `ContainerStatus` is most of a running pod's cached bytes.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CachedPodStatus {
    /// Pending, Running, Succeeded, Failed or Unknown.
    #[serde(default)]
    pub phase: Option<String>,
    /// Why the pod is in this phase (`Evicted`, `NodeLost`, ...).
    #[serde(default)]
    pub reason: Option<String>,
    /// The kubelet's or control plane's message about it.
    #[serde(default)]
    pub message: Option<String>,
    /// When the kubelet took the pod.
    #[serde(default)]
    pub start_time: Option<Time>,
    /// The pod's conditions.
    #[serde(default)]
    pub conditions: Option<Vec<PodCondition>>,
    /// Its containers.
    #[serde(default)]
    pub container_statuses: Option<Vec<CachedContainerStatus>>,
    /// Its init containers.
    #[serde(default)]
    pub init_container_statuses: Option<Vec<CachedContainerStatus>>,
    /// Its ephemeral containers.
    #[serde(default)]
    pub ephemeral_container_statuses: Option<Vec<CachedContainerStatus>>,
}

/// What the operator reads of a container's status.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CachedContainerStatus {
    /// The container's name.
    #[serde(default)]
    pub name: String,
    /// Whether it passes its readiness probe.
    #[serde(default)]
    pub ready: bool,
    /// Whether it has started (its startup probe passed).
    #[serde(default)]
    pub started: Option<bool>,
    /// How often it restarted.
    #[serde(default)]
    pub restart_count: i32,
    /// Waiting, running or terminated, and why.
    #[serde(default)]
    pub state: Option<ContainerState>,
}

impl From<&ContainerStatus> for CachedContainerStatus {
    fn from(c: &ContainerStatus) -> Self {
        Self {
            name: c.name.clone(),
            ready: c.ready,
            started: c.started,
            restart_count: c.restart_count,
            state: c.state.clone(),
        }
    }
}

impl From<&PodStatus> for CachedPodStatus {
    fn from(s: &PodStatus) -> Self {
        let containers = |list: &Option<Vec<ContainerStatus>>| {
            list.as_ref()
                .map(|l| l.iter().map(CachedContainerStatus::from).collect())
        };
        Self {
            phase: s.phase.clone(),
            reason: s.reason.clone(),
            message: s.message.clone(),
            start_time: s.start_time.clone(),
            conditions: s.conditions.clone(),
            container_statuses: containers(&s.container_statuses),
            init_container_statuses: containers(&s.init_container_statuses),
            ephemeral_container_statuses: containers(&s.ephemeral_container_statuses),
        }
    }
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
    /// Of the affinity, only the node names its required terms exclude.
    #[serde(default)]
    pub affinity: CachedAffinity,
}

/// What the operator reads of a pod's affinity: the nodes the pod was created to avoid (by
/// name, for their termination notices), so that a pod still waiting for a node after a
/// notice was withdrawn can be told apart (the rest of the affinity is skipped while parsing).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedAffinity {
    /// The node affinity.
    #[serde(default)]
    pub node_affinity: Option<CachedNodeAffinity>,
}

/// The required part of a node affinity.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct CachedNodeAffinity {
    /// The required node selector.
    #[serde(default, rename = "requiredDuringSchedulingIgnoredDuringExecution")]
    pub required: Option<CachedNodeSelector>,
}

/// A required node selector's terms.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedNodeSelector {
    /// Its terms (ORed).
    #[serde(default)]
    pub node_selector_terms: Vec<CachedNodeSelectorTerm>,
}

/// A term's field requirements (its label expressions are skipped).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedNodeSelectorTerm {
    /// Requirements on the node's fields.
    #[serde(default)]
    pub match_fields: Option<Vec<NodeSelectorRequirement>>,
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
    /// Since when the pod's condition `type_` is True, as the control plane dates it.
    pub fn true_since(&self, type_: &str) -> Option<&Time> {
        self.status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .find(|c| c.type_ == type_ && c.status == "True")?
            .last_transition_time
            .as_ref()
    }

    /// When the operator created this standby ([`trainyard_api::crd::ANNOTATION_STANDBY_CREATED_AT`]),
    /// on its own clock; for a standby without the annotation, its `creationTimestamp`.
    pub fn standby_created_at(&self) -> Option<jiff::Timestamp> {
        self.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(trainyard_api::crd::ANNOTATION_STANDBY_CREATED_AT))
            .and_then(|t| t.parse().ok())
            .or_else(|| self.metadata.creation_timestamp.as_ref().map(|t| t.0))
    }

    /// Drops the metadata no decision reads: every annotation but the operator's own (the
    /// seal, a standby's creation time).
    pub fn strip(&mut self) {
        const KEPT: [&str; 2] = [
            crate::model::seal::SEAL_ANNOTATION,
            trainyard_api::crd::ANNOTATION_STANDBY_CREATED_AT,
        ];
        self.metadata.managed_fields = None;
        self.metadata.annotations = self.metadata.annotations.take().and_then(|mut a| {
            a.retain(|k, _| KEPT.contains(&k.as_str()));
            (!a.is_empty()).then_some(a)
        });
    }

    /// The node the pod was bound to.
    pub fn node_name(&self) -> Option<&str> {
        self.spec.node_name.as_deref()
    }

    /// The nodes every required term of the pod's affinity excludes by name (`metadata.name
    /// NotIn`), sorted: where the pod may never go.
    pub fn avoided_nodes(&self) -> Vec<&str> {
        let terms = self
            .spec
            .affinity
            .node_affinity
            .as_ref()
            .and_then(|a| a.required.as_ref())
            .map(|r| r.node_selector_terms.as_slice())
            .unwrap_or_default();
        let mut names: Vec<&str> = terms
            .iter()
            .flat_map(|t| t.match_fields.iter().flatten())
            .filter(|r| r.key == NODE_NAME_FIELD && r.operator == "NotIn")
            .flat_map(|r| r.values.iter().flatten().map(String::as_str))
            .collect();
        names.sort_unstable();
        names.dedup();
        names
    }
}

/// The one field a node selector term may match on: the node's name.
pub const NODE_NAME_FIELD: &str = "metadata.name";

/// The name exclusions of a whole pod's required node affinity, as the cache keeps them.
fn cached_affinity(pod: &Pod) -> CachedAffinity {
    let required = pod
        .spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    CachedAffinity {
        node_affinity: required.map(|r| CachedNodeAffinity {
            required: Some(CachedNodeSelector {
                node_selector_terms: r
                    .node_selector_terms
                    .iter()
                    .map(|t| CachedNodeSelectorTerm {
                        match_fields: t.match_fields.clone(),
                    })
                    .collect(),
            }),
        }),
    }
}

/// What the cache would hold of a whole pod (a pod read from the API server, or one a test
/// builds).
impl From<&Pod> for CachedPod {
    fn from(pod: &Pod) -> Self {
        let spec = pod.spec.as_ref();
        let mut cached = Self {
            metadata: pod.metadata.clone(),
            spec: CachedPodSpec {
                node_name: spec.and_then(|s| s.node_name.clone()),
                containers: spec
                    .map(|s| s.containers.as_slice())
                    .unwrap_or_default()
                    .iter()
                    .map(|c| CachedContainer {
                        name: c.name.clone(),
                    })
                    .collect(),
                affinity: cached_affinity(pod),
            },
            status: pod.status.as_ref().map(CachedPodStatus::from),
        };
        cached.strip();
        cached
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::crd::{DEFAULT_GPU_RESOURCE, LABEL_JOB};
    use crate::model::preemption::{ClassifierConfig, NodeView, classify};
    use crate::model::trainer::trainer_container;
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
                         "annotations": {"big": "x".repeat(4096), crate::model::seal::SEAL_ANNOTATION: "s"},
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
                    {"nodeSelectorTerms": [
                        {"matchExpressions": [
                            {"key": KARPENTER_CAPACITY_TYPE, "operator": "In", "values": ["spot"]}],
                         "matchFields": [
                            {"key": NODE_NAME_FIELD, "operator": "NotIn", "values": ["going"]},
                            {"key": NODE_NAME_FIELD, "operator": "NotIn", "values": ["gone"]}]},
                        {"matchFields": [
                            {"key": NODE_NAME_FIELD, "operator": "NotIn", "values": ["going"]}]}]}}},
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
    fn a_cached_pod_decoded_from_the_watch_is_the_whole_pods_projection() {
        let full: Pod = serde_json::from_value(full_pod()).expect("pod");
        let mut cached: CachedPod = serde_json::from_value(full_pod()).expect("cached pod");
        cached.strip();
        let projected = CachedPod::from(&full);

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
                classify(&cached, NodeView::Present(&node), &config, now)
            ),
            format!(
                "{:?}",
                classify(&projected, NodeView::Present(&node), &config, now)
            ),
        );
        assert_eq!(trainer_container(&cached), Some("trainer"));
        assert_eq!(cached.node_name(), Some("n"));
        assert_eq!(cached.avoided_nodes(), vec!["going", "gone"]);
        assert_eq!(projected.avoided_nodes(), cached.avoided_nodes());
        assert_eq!(cached.status, projected.status);
        let containers = cached
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref());
        assert_eq!(containers.map(Vec::len), Some(1));
        assert_eq!(cached.metadata, projected.metadata);
        assert_eq!(
            cached.metadata.owner_references,
            full.metadata.owner_references
        );
        // What no decision reads is not kept; the seal is.
        let kept = cached.metadata.annotations.as_ref().expect("the seal");
        assert_eq!(
            kept.keys().collect::<Vec<_>>(),
            [crate::model::seal::SEAL_ANNOTATION]
        );
        assert!(cached.metadata.managed_fields.is_none());
    }

    #[test]
    fn a_pod_without_spec_or_status_still_decodes() {
        let cached: CachedPod =
            serde_json::from_value(json!({"metadata": {"name": "p"}})).expect("cached pod");
        assert_eq!(cached.node_name(), None);
        assert!(cached.avoided_nodes().is_empty());
        assert!(cached.status.is_none());
    }
}
