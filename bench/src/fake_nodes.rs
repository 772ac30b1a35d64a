//! Fake GPU nodes: Node objects with `nvidia.com/gpu` capacity and GPU Feature Discovery
//! labels, kept Ready by renewing their Lease in `kube-node-lease` the way a kubelet does.
//!
//! No kubelet runs them: the benchmark's pods are pinned to them by a node selector and a
//! toleration of their taint, and the taint keeps everyone else's DaemonSets off them.

use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, stream};
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::task::JoinHandle;
use trainyard_api::crd::DEFAULT_GPU_RESOURCE;
use trainyard_api::gpu_labels::{LABEL_GPU_COUNT, LABEL_GPU_MEMORY, LABEL_GPU_PRODUCT};

use crate::error::{Error, Result};

/// Label on every object a run creates; the value is the run id.
pub const LABEL_RUN: &str = "trainyard.dev/bench-run";
/// Taint on the fake nodes (NoSchedule), tolerated only by the benchmark's pods.
pub const TAINT_KEY: &str = "trainyard.dev/bench";
/// GPU product the fake nodes advertise.
pub const GPU_PRODUCT: &str = "NVIDIA-A100-SXM4-80GB";
/// GPUs per fake node.
pub const GPUS_PER_NODE: u32 = 8;
/// Namespace of node Leases.
const LEASE_NAMESPACE: &str = "kube-node-lease";
/// How often Leases are renewed: the kubelet's default, well inside the node lifecycle
/// controller's grace period (40 s on the local cluster).
const RENEW_EVERY: Duration = Duration::from_secs(10);
/// In-flight requests while creating and deleting nodes.
const CONCURRENCY: usize = 16;
/// In-flight requests while renewing Leases. One renewal round must end well inside the
/// grace period even while the API server answers in about a second: at 16, a round of 500
/// Leases can take 30 s, and a Lease renewed early in one round and late in the next goes
/// unrenewed past the grace. Seen at 16: 5 of 500 nodes NotReady during the 1,000-job floor
/// with no renewal failing, so 40 of its pods never scheduled and the floor waited out its
/// phase timeout.
const RENEW_CONCURRENCY: usize = 100;

/// The Node object of one fake GPU node.
pub fn fake_node(name: &str, run: &str, now: Timestamp) -> Result<Node> {
    let now = now.to_string();
    let resources = json!({
        "cpu": "96", "memory": "1Ti", "pods": "110", "ephemeral-storage": "1Ti",
        DEFAULT_GPU_RESOURCE: GPUS_PER_NODE.to_string(),
    });
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                LABEL_GPU_PRODUCT: GPU_PRODUCT,
                LABEL_GPU_MEMORY: "81920",
                LABEL_GPU_COUNT: GPUS_PER_NODE.to_string(),
                LABEL_RUN: run,
            },
        },
        "spec": {
            "taints": [{"key": TAINT_KEY, "value": run, "effect": "NoSchedule"}],
        },
        // The API server keeps a Node's status on create, so the node is Ready at once.
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [{
                "type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "trainyard-bench fake node (no kubelet)",
                "lastHeartbeatTime": now, "lastTransitionTime": now,
            }],
            "nodeInfo": {
                "architecture": "amd64", "bootID": "", "containerRuntimeVersion": "fake://0",
                "kernelVersion": "", "kubeProxyVersion": "", "kubeletVersion": "v1.20.2",
                "machineID": "", "operatingSystem": "linux", "osImage": "trainyard-bench",
                "systemUUID": "",
            },
        },
    }))
    .map_err(|e| Error::Build {
        what: format!("Node {name}"),
        message: e.to_string(),
    })
}

/// N fake nodes of one run, with the task that keeps them Ready.
pub struct FakeNodes {
    client: Client,
    run: String,
    names: Vec<String>,
    heartbeat: Option<JoinHandle<()>>,
}

impl FakeNodes {
    /// Name of the i-th node of a run.
    pub fn node_name(run: &str, i: u32) -> String {
        format!("tybench-{run}-{i:04}")
    }

    /// Creates `count` nodes and their Leases, and starts renewing the Leases. Nodes created
    /// before a failure are deleted again.
    pub async fn create(client: &Client, run: &str, count: u32) -> Result<Self> {
        let mut nodes = FakeNodes {
            client: client.clone(),
            run: run.to_owned(),
            names: Vec::new(),
            heartbeat: None,
        };
        let results: Vec<Result<String>> = stream::iter(0..count)
            .map(|i| create_one(client.clone(), run.to_owned(), Self::node_name(run, i)))
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        let mut first_error = None;
        for r in results {
            match r {
                Ok(name) => nodes.names.push(name),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        nodes.names.sort();
        if let Some(e) = first_error {
            nodes.delete().await;
            return Err(e);
        }
        let names = Arc::new(nodes.names.clone());
        let client = client.clone();
        let run = run.to_owned();
        nodes.heartbeat = Some(tokio::spawn(async move {
            let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
            let all: Api<Node> = Api::all(client);
            let mut tick = tokio::time::interval(RENEW_EVERY);
            tick.tick().await;
            loop {
                tick.tick().await;
                renew(&leases, &names).await;
                post_ready(&all, &run).await;
            }
        }));
        Ok(nodes)
    }

    /// The node names.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The run id the nodes are labelled with.
    pub fn run(&self) -> &str {
        &self.run
    }

    /// Stops the heartbeat and deletes the nodes and their Leases. Best effort: failures are
    /// logged, since this runs while cleaning up after another error too.
    pub async fn delete(mut self) {
        if let Some(h) = self.heartbeat.take() {
            h.abort();
        }
        let nodes: Api<Node> = Api::all(self.client.clone());
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), LEASE_NAMESPACE);
        let names = std::mem::take(&mut self.names);
        stream::iter(names)
            .for_each_concurrent(CONCURRENCY, |name| {
                let (nodes, leases) = (nodes.clone(), leases.clone());
                async move {
                    for r in [
                        nodes.delete(&name, &DeleteParams::default()).await.err(),
                        leases.delete(&name, &DeleteParams::default()).await.err(),
                    ]
                    .into_iter()
                    .flatten()
                    {
                        if !matches!(&r, kube::Error::Api(s) if s.code == 404) {
                            tracing::warn!(node = %name, error = %r, "deleting a fake node or its Lease");
                        }
                    }
                }
            })
            .await;
    }
}

impl Drop for FakeNodes {
    fn drop(&mut self) {
        if let Some(h) = self.heartbeat.take() {
            h.abort();
        }
    }
}

async fn create_one(client: Client, run: String, name: String) -> Result<String> {
    let now = Timestamp::now();
    let node = fake_node(&name, &run, now)?;
    let created = Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .map_err(Error::kube(format!("creating fake node {name}")))?;
    // Owned by the node, like a kubelet's Lease, so the garbage collector removes it with the
    // node even if the benchmark dies before cleaning up.
    let lease: Lease = serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": name,
            "namespace": LEASE_NAMESPACE,
            "labels": {LABEL_RUN: run},
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "Node", "name": name,
                "uid": created.uid().unwrap_or_default(),
            }],
        },
        "spec": {
            "holderIdentity": name,
            "leaseDurationSeconds": 40,
            "renewTime": micro_time(now),
        },
    }))
    .map_err(|e| Error::Build {
        what: format!("Lease {name}"),
        message: e.to_string(),
    })?;
    Api::<Lease>::namespaced(client, LEASE_NAMESPACE)
        .create(&PostParams::default(), &lease)
        .await
        .map_err(Error::kube(format!(
            "creating the Lease of fake node {name}"
        )))?;
    Ok(name)
}

/// A MicroTime as the 1.20 API server parses it: exactly six fractional digits.
fn micro_time(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

/// Posts Ready again for the run's nodes the node lifecycle controller marked otherwise, as a
/// kubelet posts its node status. A Lease renewed too late (the API server slow, the machine
/// busy) leaves a node Ready=Unknown for good, since only a status post brings it back: seen
/// twice in a 1,000-job run, whose fair floor then waited for 16 pods that only those two
/// nodes could take. One LIST per round; a patch only for a node not Ready.
async fn post_ready(nodes: &Api<Node>, run: &str) {
    let selector = kube::api::ListParams::default().labels(&format!("{LABEL_RUN}={run}"));
    let listed = match nodes.list(&selector).await {
        Ok(list) => list.items,
        Err(e) => {
            tracing::warn!(error = %e, "listing fake nodes");
            return;
        }
    };
    let now = Timestamp::now().to_string();
    let patch = json!({"status": {"conditions": [{
        "type": "Ready", "status": "True", "reason": "KubeletReady",
        "message": "trainyard-bench fake node (no kubelet)",
        "lastHeartbeatTime": now, "lastTransitionTime": now,
    }]}});
    for node in listed.iter().filter(|n| !is_ready(n)) {
        let name = node.name_any();
        tracing::info!(node = %name, "posting Ready for a fake node marked not Ready");
        if let Err(e) = nodes
            .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
        {
            tracing::warn!(node = %name, error = %e, "posting Ready for a fake node");
        }
    }
}

fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn renew(leases: &Api<Lease>, names: &[String]) {
    let now = micro_time(Timestamp::now());
    let patch = json!({"spec": {"renewTime": now}});
    stream::iter(names)
        .for_each_concurrent(RENEW_CONCURRENCY, |name| {
            let patch = &patch;
            async move {
                if let Err(e) = leases
                    .patch(name, &PatchParams::default(), &Patch::Merge(patch))
                    .await
                {
                    let e = match e {
                        kube::Error::Api(s) => format!("{} {}", s.code, s.reason),
                        e => e.to_string(),
                    };
                    tracing::warn!(node = %name, error = %e, "renewing a fake node's Lease");
                }
            }
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn micro_times_have_exactly_six_fractional_digits() {
        let t: Timestamp = "2026-11-21T09:07:52.088144183Z"
            .parse()
            .expect("valid timestamp");
        assert_eq!(micro_time(t), "2026-11-21T09:07:52.088144Z");
        let whole: Timestamp = "2026-11-21T09:07:52Z".parse().expect("valid timestamp");
        assert_eq!(micro_time(whole), "2026-11-21T09:07:52.000000Z");
    }
}
