//! Test fixtures: small builders for jobs, pods and nodes.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use serde_json::json;

use crate::model::cached_pod::CachedPod;
use crate::model::crd::{DEFAULT_GPU_RESOURCE, TrainingJob};
use crate::model::nodes::{
    LABEL_COMPUTE_MAJOR, LABEL_COMPUTE_MINOR, LABEL_CUDA_MAJOR, LABEL_CUDA_MINOR, LABEL_GPU_PRODUCT,
};
use trainyard_api::spot::KARPENTER_CAPACITY_TYPE;

/// An API server's answer for a scripted `kube::Client`: `answer` as JSON with status `code`.
pub fn json_response(code: u16, answer: &serde_json::Value) -> http::Response<kube::client::Body> {
    http::Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(kube::client::Body::from(
            serde_json::to_vec(answer).expect("json"),
        ))
        .expect("response")
}

/// Parses an RFC 3339 timestamp.
pub fn ts(s: &str) -> Timestamp {
    s.parse().expect("valid timestamp")
}

/// A TrainingJob `train` in namespace `ml` whose spec is `spec_yaml` (template defaulted).
pub fn job_yaml(spec_yaml: &str) -> TrainingJob {
    let mut spec: serde_json::Value = serde_saphyr::from_str(spec_yaml).expect("spec yaml");
    if spec.get("template").is_none() {
        spec["template"] = json!({
            "metadata": {"labels": {"app": "from-template"}},
            "spec": {"containers": [{"name": "trainer", "image": "trainyard/trainer:dev"}]}
        });
    }
    serde_json::from_value(json!({
        "apiVersion": "trainyard.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "train", "namespace": "ml", "uid": "uid-1", "generation": 1},
        "spec": spec,
    }))
    .expect("TrainingJob")
}

/// A pod with one `trainer` container and the given status.
pub fn pod_json(name: &str, status: &serde_json::Value) -> CachedPod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"),
                     "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"nodeName": "n-1", "containers": [{"name": "trainer", "image": "x"}]},
        "status": status,
    }))
    .expect("CachedPod")
}

/// Builder for fake nodes.
pub struct NodeBuilder {
    name: String,
    labels: BTreeMap<String, String>,
    gpus: u64,
    ready: (bool, String),
    taints: Vec<String>,
}

/// A Ready node without GPUs.
pub fn node(name: &str) -> NodeBuilder {
    NodeBuilder {
        name: name.to_owned(),
        labels: BTreeMap::new(),
        gpus: 0,
        ready: (true, "2026-01-01T00:00:00Z".to_owned()),
        taints: Vec::new(),
    }
}

impl NodeBuilder {
    /// Allocatable and capacity `nvidia.com/gpu`.
    pub fn gpus(mut self, n: u64) -> Self {
        self.gpus = n;
        self
    }
    /// Sets a label.
    pub fn label(mut self, k: &str, v: &str) -> Self {
        self.labels.insert(k.to_owned(), v.to_owned());
        self
    }
    /// Sets the GPU product label.
    pub fn product(self, p: &str) -> Self {
        self.label(LABEL_GPU_PRODUCT, p)
    }
    /// Sets the CUDA runtime version labels.
    pub fn cuda(self, major: u32, minor: u32) -> Self {
        self.label(LABEL_CUDA_MAJOR, &major.to_string())
            .label(LABEL_CUDA_MINOR, &minor.to_string())
    }
    /// Sets the compute capability labels.
    pub fn compute(self, major: u32, minor: u32) -> Self {
        self.label(LABEL_COMPUTE_MAJOR, &major.to_string())
            .label(LABEL_COMPUTE_MINOR, &minor.to_string())
    }
    /// Marks it a Karpenter spot node.
    pub fn spot(self) -> Self {
        self.label(KARPENTER_CAPACITY_TYPE, "spot")
    }
    /// Ready=False since the given time.
    pub fn not_ready_since(mut self, since: &str) -> Self {
        self.ready = (false, since.to_owned());
        self
    }
    /// Adds a NoSchedule taint.
    pub fn taint(mut self, key: &str) -> Self {
        self.taints.push(key.to_owned());
        self
    }
    /// The Node.
    pub fn build(self) -> Node {
        let taints: Vec<_> = self
            .taints
            .iter()
            .map(|k| json!({"key": k, "effect": "NoSchedule"}))
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": self.name, "labels": self.labels},
            "spec": {"taints": taints},
            "status": {
                "capacity": {DEFAULT_GPU_RESOURCE: self.gpus.to_string(), "cpu": "64"},
                "allocatable": {DEFAULT_GPU_RESOURCE: self.gpus.to_string(), "cpu": "64"},
                "conditions": [{"type": "Ready", "status": if self.ready.0 { "True" } else { "False" },
                                "lastTransitionTime": self.ready.1}]
            }
        }))
        .expect("Node")
    }
}
