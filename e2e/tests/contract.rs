//! The GPU node labels tie the device plugin (their writer) to the operator's placement
//! (their reader). This test renders the labels with the plugin's own function for a fake
//! GPU, puts them on a Node, and asks the operator's own placement whether jobs fit there.
//! Plain unit test: no cluster.

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::core::v1::{Node, NodeSelectorRequirement};
use serde_json::json;
use trainyard_api::crd::{DEFAULT_GPU_RESOURCE, TrainingJob};
use trainyard_api::gpu_labels::LABEL_GPU_COUNT;
use trainyard_device_plugin::labels::node_labels;
use trainyard_device_plugin::rm::backend::fake::FakeNode;
use trainyard_operator::OperatorConfig;
use trainyard_operator::surface::validate;
use trainyard_operator::surface::{Placement, place};

/// One A100 80GB node: CUDA 12.4, compute capability 8.0, in the fake backend's file format.
const FAKE_GPUS: &str = r#"
driverVersion: "550.54.15"
cudaVersion: "12.4"
gpus:
  - {uuid: GPU-0, index: 0, name: NVIDIA A100-SXM4-80GB, memoryMiB: 81920, computeCapability: "8.0"}
  - {uuid: GPU-1, index: 1, name: NVIDIA A100-SXM4-80GB, memoryMiB: 81920, computeCapability: "8.0"}
"#;

/// The product label the plugin writes for that GPU (spaces become dashes, as GFD does).
const PRODUCT: &str = "NVIDIA-A100-SXM4-80GB";

/// A Ready node carrying the labels the device plugin renders; the kubelet's part, the
/// allocatable GPUs, is the count the labels announce.
fn labelled_node() -> (Node, BTreeMap<String, String>) {
    let fake = FakeNode::parse(Path::new("fake-gpus.yaml"), FAKE_GPUS).expect("fake GPU file");
    let labels = node_labels(fake.inventory());
    let gpus = labels[LABEL_GPU_COUNT].clone();
    let node = serde_json::from_value(json!({
        "metadata": {"name": "gpu-node", "labels": labels},
        "status": {
            "capacity": {DEFAULT_GPU_RESOURCE: gpus},
            "allocatable": {DEFAULT_GPU_RESOURCE: gpus},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }))
    .expect("Node");
    (node, labels)
}

fn placement_for(spec: serde_json::Value, node: &Node) -> Placement {
    let job: TrainingJob = serde_json::from_value(json!({
        "apiVersion": "trainyard.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "train", "namespace": "ml", "uid": "uid-1", "generation": 1},
        "spec": {
            "template": {"spec": {"containers": [{"name": "trainer", "image": "trainer:dev"}]}},
            "gpusPerWorker": spec["gpusPerWorker"].as_u64().unwrap_or(1),
            "gpu": spec.get("gpu").cloned().unwrap_or_else(|| json!({})),
        },
    }))
    .expect("TrainingJob");
    let job = validate(&job).expect("valid job");
    place(&job, &OperatorConfig::default(), &[node], 0)
}

/// Whether one node-affinity expression holds for these labels (the scheduler's rule).
fn holds(e: &NodeSelectorRequirement, labels: &BTreeMap<String, String>) -> bool {
    let value = labels.get(&e.key);
    let values = e.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    match e.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => !value.is_some_and(|v| values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => value.and_then(|v| number(v)) > values.first().and_then(|v| number(v)),
        "Lt" => match (
            value.and_then(|v| number(v)),
            values.first().and_then(|v| number(v)),
        ) {
            (Some(v), Some(limit)) => v < limit,
            _ => false,
        },
        other => panic!("unknown operator {other}"),
    }
}

/// Whether the required node affinity the operator wrote admits a node with these labels.
fn affinity_admits(p: &Placement, labels: &BTreeMap<String, String>) -> bool {
    let Some(required) = p.node_affinity.as_ref().and_then(|a| {
        a.required_during_scheduling_ignored_during_execution
            .as_ref()
    }) else {
        return true;
    };
    required.node_selector_terms.iter().any(|term| {
        term.match_expressions
            .iter()
            .flatten()
            .all(|e| holds(e, labels))
    })
}

#[test]
fn a_job_asking_for_what_the_plugin_labels_fits_the_node_and_its_affinity_admits_it() {
    let (node, labels) = labelled_node();
    let p = placement_for(
        json!({"gpusPerWorker": 2, "gpu": {
            "products": [PRODUCT], "minMemoryGiB": 80,
            "minCudaVersion": "12.4", "minComputeCapability": "8.0"}}),
        &node,
    );
    assert_eq!(p.unschedulable, None, "labels: {labels:?}");
    assert!(
        affinity_admits(&p, &labels),
        "{:?} vs {labels:?}",
        p.node_affinity
    );
}

#[test]
fn a_job_asking_for_more_than_the_plugin_labels_does_not_fit() {
    let (node, labels) = labelled_node();
    let more = [
        ("a third GPU", json!({"gpusPerWorker": 3})),
        (
            "another product",
            json!({"gpu": {"products": ["NVIDIA-H100-80GB-HBM3"]}}),
        ),
        ("more memory", json!({"gpu": {"minMemoryGiB": 81}})),
        ("a newer CUDA", json!({"gpu": {"minCudaVersion": "12.5"}})),
        (
            "a newer major CUDA",
            json!({"gpu": {"minCudaVersion": "13.0"}}),
        ),
        (
            "a higher compute capability",
            json!({"gpu": {"minComputeCapability": "8.6"}}),
        ),
    ];
    for (what, spec) in more {
        let p = placement_for(spec, &node);
        assert!(p.unschedulable.is_some(), "{what}: placed on {labels:?}");
    }
}

#[test]
fn version_minimums_become_an_affinity_that_rejects_an_older_node() {
    let (node, labels) = labelled_node();
    for spec in [
        json!({"gpu": {"minCudaVersion": "12.5", "selection": "Any"}}),
        json!({"gpu": {"minComputeCapability": "9.0", "selection": "Any"}}),
    ] {
        let p = placement_for(spec.clone(), &node);
        assert!(
            !affinity_admits(&p, &labels),
            "{spec}: {:?}",
            p.node_affinity
        );
    }
}
