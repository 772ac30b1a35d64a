//! Node labels against the real API server of the local cluster.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::*;
use futures::FutureExt;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use trainyard_api::gpu_labels::{
    LABEL_COMPUTE_MAJOR, LABEL_CUDA_MINOR, LABEL_DRIVER_FULL, LABEL_DRIVER_MINOR,
    LABEL_DRIVER_REVISION, LABEL_GPU_COUNT, LABEL_GPU_MEMORY, LABEL_GPU_PRODUCT, LABEL_PREFIX,
};

async fn gpu_labels(nodes: &Api<Node>, name: &str) -> BTreeMap<String, String> {
    nodes
        .get(name)
        .await
        .ok()
        .and_then(|n| n.metadata.labels)
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| k.starts_with(LABEL_PREFIX))
        .collect()
}

async fn wait_labels(
    nodes: &Api<Node>,
    name: &str,
    check: impl Fn(&BTreeMap<String, String>) -> bool,
) -> BTreeMap<String, String> {
    let start = Instant::now();
    loop {
        let labels = gpu_labels(nodes, name).await;
        if check(&labels) || start.elapsed() > Duration::from_secs(30) {
            return labels;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The cluster's Node API and the kubeconfig the plugin is given.
async fn cluster() -> (Api<Node>, PathBuf) {
    let kubeconfig =
        std::env::var_os("KUBECONFIG").expect("KUBECONFIG must point at the local cluster");
    let client = kube::Client::try_default()
        .await
        .expect("a reachable local cluster");
    (Api::all(client), PathBuf::from(kubeconfig))
}

/// What a kubelet registers: a Node with no nvidia.com labels, here with
/// `trainyard.dev/test: <test>` and tainted so nothing lands on it.
fn test_node(name: &str, test: &str) -> Node {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": { "name": name, "labels": { "trainyard.dev/test": test } },
        "spec": { "taints": [{ "key": "trainyard.dev/test", "effect": "NoSchedule" }] },
    }))
    .unwrap()
}

/// Runs `body` for at most `limit`, then stops `plugin` and deletes the
/// node `name` whatever happened; a failed or timed-out body panics with
/// the plugin's log.
async fn run_then_clean_up(
    limit: Duration,
    body: impl Future<Output = ()>,
    plugin: Plugin,
    nodes: &Api<Node>,
    name: &str,
) {
    let outcome =
        tokio::time::timeout(limit, std::panic::AssertUnwindSafe(body).catch_unwind()).await;
    let log = plugin.log_text();
    drop(plugin);
    let _ = nodes.delete(name, &DeleteParams::default()).await;
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(panic)) => {
            eprintln!("plugin log:\n{log}");
            std::panic::resume_unwind(panic);
        }
        Err(_) => panic!("timed out; plugin log:\n{log}"),
    }
}

/// The field managers of the node `name`, with their operations.
async fn field_managers(nodes: &Api<Node>, name: &str) -> Vec<(String, String)> {
    nodes
        .get(name)
        .await
        .unwrap()
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .map(|m| {
            (
                m.manager.unwrap_or_default(),
                m.operation.unwrap_or_default(),
            )
        })
        .collect()
}

/// The labels of the 8-GPU example file as written.
fn assert_example_labels(labels: &BTreeMap<String, String>) {
    assert_eq!(
        labels.get(LABEL_GPU_PRODUCT).map(String::as_str),
        Some("NVIDIA-A100-SXM4-80GB")
    );
    assert_eq!(labels.get(LABEL_GPU_COUNT).map(String::as_str), Some("8"));
    assert_eq!(
        labels.get(LABEL_GPU_MEMORY).map(String::as_str),
        Some("81920")
    );
    assert_eq!(
        labels.get(LABEL_DRIVER_FULL).map(String::as_str),
        Some("550.54.15")
    );
    assert_eq!(labels.get(LABEL_CUDA_MINOR).map(String::as_str), Some("4"));
    assert_eq!(
        labels.get(LABEL_COMPUTE_MAJOR).map(String::as_str),
        Some("8")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local cluster (make test)"]
async fn node_labels_follow_the_fake_file_with_server_side_apply() {
    let (nodes, kubeconfig) = cluster().await;
    // A Node object of our own (no kubelet behind it), deleted at the end
    // whatever happens.
    let name = format!("trainyard-dp-labels-{}", std::process::id());
    nodes
        .create(
            &PostParams::default(),
            &test_node(&name, "device-plugin-labels"),
        )
        .await
        .expect("create test node");

    let ws = Workspace::new(&example("fake-gpus-8.yaml"));
    let plugin =
        Plugin::start_with_kubeconfig(&ws.dir, &ws.fake_file, &["--node-name", &name], &kubeconfig);
    let body = async {
        let labels = wait_labels(&nodes, &name, |l| l.len() == 11).await;
        assert_example_labels(&labels);

        // A new driver in the file is a new set of labels on the node.
        ws.rewrite(|t| {
            t.replace(
                "driverVersion: \"550.54.15\"",
                "driverVersion: \"550.90.7\"",
            )
        });
        let labels = wait_labels(&nodes, &name, |l| {
            l.get(LABEL_DRIVER_FULL).map(String::as_str) == Some("550.90.7")
        })
        .await;
        assert_eq!(
            labels.get(LABEL_DRIVER_MINOR).map(String::as_str),
            Some("90")
        );
        assert_eq!(
            labels.get(LABEL_DRIVER_REVISION).map(String::as_str),
            Some("7")
        );

        let managers = field_managers(&nodes, &name).await;
        assert!(
            managers.contains(&("trainyard-device-plugin".to_string(), "Apply".to_string())),
            "{managers:?}"
        );
    };
    run_then_clean_up(Duration::from_secs(60), body, plugin, &nodes, &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local cluster (make test)"]
async fn node_labels_come_back_when_the_node_object_is_deleted_and_recreated() {
    let (nodes, kubeconfig) = cluster().await;
    let name = format!("trainyard-dp-recreated-{}", std::process::id());
    let node = test_node(&name, "device-plugin-recreated");
    nodes
        .create(&PostParams::default(), &node)
        .await
        .expect("create test node");

    let ws = Workspace::new(&example("fake-gpus-8.yaml"));
    let plugin = Plugin::start_with_kubeconfig(
        &ws.dir,
        &ws.fake_file,
        &["--node-name", &name, "--label-check-interval", "1s"],
        &kubeconfig,
    );
    let body = async {
        let first = wait_labels(&nodes, &name, |l| l.len() == 11).await;
        assert_eq!(first.len(), 11, "{first:?}");
        let first_uid = nodes.get(&name).await.unwrap().metadata.uid;

        // The node is deleted and its kubelet registers it again: a new
        // object, a new uid, none of our labels. The fake file is unchanged,
        // so nothing but the Node itself tells the plugin.
        nodes
            .delete(&name, &DeleteParams::default())
            .await
            .expect("delete test node");
        let start = Instant::now();
        while nodes.get_opt(&name).await.unwrap().is_some() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "node not deleted"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        nodes
            .create(&PostParams::default(), &node)
            .await
            .expect("recreate test node");
        let recreated = nodes.get(&name).await.unwrap();
        assert_ne!(recreated.metadata.uid, first_uid, "a new Node object");

        let labels = wait_labels(&nodes, &name, |l| *l == first).await;
        assert_eq!(labels, first, "labels re-applied on the recreated node");
        // Applied to the recreated object, not by creating one of our own.
        let after = nodes.get(&name).await.unwrap();
        assert_eq!(after.metadata.uid, recreated.metadata.uid);
        assert_eq!(
            after
                .metadata
                .labels
                .unwrap_or_default()
                .get("trainyard.dev/test")
                .map(String::as_str),
            Some("device-plugin-recreated")
        );
    };
    run_then_clean_up(Duration::from_secs(90), body, plugin, &nodes, &name).await;
}
