//! Facts the operator reads off Node objects: readiness, GPU counts, labels and taints.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;

// The GPU label keys are the device plugin's contract; re-exported so `nodes::LABEL_*` reads on.
pub use trainyard_api::gpu_labels::{
    LABEL_COMPUTE_MAJOR, LABEL_COMPUTE_MINOR, LABEL_CUDA_MAJOR, LABEL_CUDA_MINOR, LABEL_GPU_MEMORY,
    LABEL_GPU_PRODUCT,
};

/// Whether a node's kubelet reports Ready.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// Ready=True.
    Ready,
    /// Ready is False or Unknown (or missing); `since` is the condition's last transition.
    NotReady {
        /// When the node stopped being Ready, if known.
        since: Option<Timestamp>,
    },
}

/// Reads the Ready condition.
pub fn readiness(node: &Node) -> Readiness {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
    match ready {
        Some(c) if c.status == "True" => Readiness::Ready,
        Some(c) => Readiness::NotReady {
            since: c.last_transition_time.as_ref().map(|t| t.0),
        },
        None => Readiness::NotReady { since: None },
    }
}

/// Whether the node is Ready and accepts new pods (not cordoned).
pub fn is_schedulable(node: &Node) -> bool {
    readiness(node) == Readiness::Ready
        && !node
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false)
}

/// The node's value of a label.
pub fn label<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(key))
        .map(String::as_str)
}

/// Allocatable count of an extended resource (whole units; 0 when absent or unparsable).
pub fn allocatable(node: &Node, resource: &str) -> u64 {
    node.status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .and_then(|a| a.get(resource))
        .and_then(|q| q.0.trim().parse::<u64>().ok())
        .unwrap_or(0)
}

/// The first of `taints` (keys) the node carries.
pub fn termination_taint<'a>(node: &Node, taints: &'a [String]) -> Option<&'a str> {
    let carried = node.spec.as_ref().and_then(|s| s.taints.as_ref())?;
    taints
        .iter()
        .find(|t| carried.iter().any(|c| &c.key == *t))
        .map(String::as_str)
}

/// A "major.minor" version read from two labels.
pub fn version(node: &Node, major: &str, minor: &str) -> Option<(u32, u32)> {
    let major = label(node, major)?.trim().parse().ok()?;
    let minor = label(node, minor)
        .and_then(|m| m.trim().parse().ok())
        .unwrap_or(0);
    Some((major, minor))
}

/// Name of a node (empty when unset, which the API server never allows).
pub fn name(node: &Node) -> &str {
    node.metadata.name.as_deref().unwrap_or("")
}
