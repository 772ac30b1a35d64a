//! Harness of the cluster tests: a namespace, the CRD, fake GPU nodes kept alive by a fake
//! kubelet, and the operator running in-process against the real API server.
//!
//! The fake kubelet does what a kubelet would for pods bound to the fake nodes: it reports
//! them Running once scheduled, and confirms graceful deletions (grace 0) once asked.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tokio::task::JoinHandle;
use trainyard_api::crd::{DEFAULT_GPU_RESOURCE, LABEL_ATTEMPT};
use trainyard_operator::OperatorConfig;
use trainyard_operator::RunConfig;
use trainyard_operator::surface::TrainingJob;

/// Taint on every fake node, so that nothing but the tests' pods lands there.
pub const FAKE_TAINT: &str = "trainyard.dev/fake-node";
/// The taint the API server puts on every new node until the node lifecycle controller sees it.
const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";
/// Label on every fake node of one test: its namespace.
pub const RUN_LABEL: &str = "trainyard.dev/test-run";

pub const WAIT: Duration = Duration::from_secs(90);

/// A running operator.
pub struct Operator {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: JoinHandle<Result<(), trainyard_operator::Error>>,
}

impl Operator {
    /// Stops it gracefully.
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(20), &mut self.task).await;
    }

    /// Kills it at once, like SIGKILL would (no graceful shutdown).
    pub fn kill(self) {
        self.task.abort();
    }

    /// Whether `run` has not returned (the process would still be alive).
    pub fn is_running(&self) -> bool {
        !self.task.is_finished()
    }
}

#[derive(Default)]
struct KubeletState {
    nodes: Vec<String>,
    not_ready: Vec<String>,
}

/// One test's world.
pub struct TestEnv {
    pub client: Client,
    pub ns: String,
    kubelet_state: Arc<Mutex<KubeletState>>,
    /// While false the fake kubelet leaves terminating pods alone.
    pub kubelet_deletes: Arc<AtomicBool>,
    /// While false the fake kubelet does not start pods.
    pub kubelet_starts: Arc<AtomicBool>,
    kubelet: JoinHandle<()>,
    cleaned: bool,
}

fn unique(prefix: &str) -> String {
    let nanos = Timestamp::now().as_nanosecond();
    format!(
        "{prefix}-{:x}",
        (nanos as u64 ^ u64::from(std::process::id())) & 0xffffff
    )
}

/// With TRAINYARD_TEST_LOG=<file>, the in-process operators log there.
fn init_logs() {
    let Ok(path) = std::env::var("TRAINYARD_TEST_LOG") else {
        return;
    };
    let Ok(file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    else {
        return;
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(
            "trainyard_operator=debug,kube_runtime=debug",
        ))
        .with_ansi(false)
        .with_writer(Mutex::new(file))
        .try_init();
}

/// The operator's default bound on reconciles in flight.
const DEFAULT_RECONCILES: u16 = trainyard_operator::DEFAULT_MAX_CONCURRENT_RECONCILES;

pub async fn client() -> Client {
    Client::try_default()
        .await
        .expect("these tests need a cluster: set KUBECONFIG (make test does)")
}

/// Installs or updates the CRD and waits until it is established.
pub async fn install_crd(client: &Client) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    api.patch(
        "trainingjobs.trainyard.dev",
        &PatchParams::apply("trainyard-operator").force(),
        &Patch::Apply(trainyard_operator::surface::crd()),
    )
    .await
    .expect("apply CRD");
    wait_for("CRD established", WAIT, || {
        let api = api.clone();
        async move {
            let crd = api.get("trainingjobs.trainyard.dev").await.ok()?;
            crd.status?
                .conditions?
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
                .then_some(())
        }
    })
    .await;
}

/// Lets a running attempt cross at least two whole-second boundaries: the goodput ledger
/// counts whole seconds, so a shorter attempt's useful time could round to nothing.
pub async fn run_for_whole_seconds() {
    tokio::time::sleep(Duration::from_millis(2_500)).await;
}

/// Polls `f` until it returns Some, or panics naming `what`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    match poll_until(timeout, f).await {
        Some(v) => v,
        None => panic!("timed out after {timeout:?} waiting for {what}"),
    }
}

/// Polls `f` until it returns Some; None once `timeout` has passed.
async fn poll_until<T, F, Fut>(timeout: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if tokio::time::Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn fake_node(
    name: &str,
    ns: &str,
    labels: &BTreeMap<String, String>,
    gpus: u32,
    ready: bool,
) -> serde_json::Value {
    let mut all = labels.clone();
    all.insert(RUN_LABEL.to_owned(), ns.to_owned());
    all.insert("kubernetes.io/hostname".to_owned(), name.to_owned());
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": all},
        "spec": {"taints": [{"key": FAKE_TAINT, "value": "true", "effect": "NoSchedule"}]},
        "status": node_status(gpus, ready),
    })
}

fn node_status(gpus: u32, ready: bool) -> serde_json::Value {
    let now = Timestamp::now().to_string();
    let resources = json!({"cpu": "64", "memory": "256Gi", "pods": "110", DEFAULT_GPU_RESOURCE: gpus.to_string()});
    json!({
        "capacity": resources, "allocatable": resources,
        "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" },
                        "reason": if ready { "KubeletReady" } else { "KubeletNotReady" },
                        "lastHeartbeatTime": now, "lastTransitionTime": now}],
    })
}

impl TestEnv {
    /// A fresh namespace with the CRD installed and the fake kubelet running.
    pub async fn new(prefix: &str) -> Self {
        init_logs();
        let client = client().await;
        install_crd(&client).await;
        let ns = unique(prefix);
        let nss: Api<Namespace> = Api::all(client.clone());
        nss.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).expect("ns"),
        )
        .await
        .expect("create namespace");
        let kubelet_state: Arc<Mutex<KubeletState>> = Arc::default();
        let kubelet_deletes = Arc::new(AtomicBool::new(true));
        let kubelet_starts = Arc::new(AtomicBool::new(true));
        let kubelet = tokio::spawn(fake_kubelet(
            client.clone(),
            ns.clone(),
            kubelet_state.clone(),
            kubelet_deletes.clone(),
            kubelet_starts.clone(),
        ));
        Self {
            client,
            ns,
            kubelet_state,
            kubelet_deletes,
            kubelet_starts,
            kubelet,
            cleaned: false,
        }
    }

    /// Starts the operator in-process, watching only this namespace.
    pub fn start_operator(&self, config: OperatorConfig) -> Operator {
        self.start_operator_with(config, None, None, DEFAULT_RECONCILES)
    }

    /// Starts the operator in-process serving `/metrics` on a free local port, which it returns.
    pub fn start_operator_serving_metrics(
        &self,
        config: OperatorConfig,
    ) -> (Operator, std::net::SocketAddr) {
        self.start_operator_with_reconciles(config, DEFAULT_RECONCILES)
    }

    /// As [`Self::start_operator_serving_metrics`], with at most `reconciles` in flight.
    pub fn start_operator_with_reconciles(
        &self,
        config: OperatorConfig,
        reconciles: u16,
    ) -> (Operator, std::net::SocketAddr) {
        // The port is free now; the operator binds it again at once.
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free local port");
        (
            self.start_operator_with(config, None, Some(addr), reconciles),
            addr,
        )
    }

    /// Starts a replica that reconciles only while it holds the Lease `trainyard-operator`
    /// in this namespace.
    pub fn start_replica(&self, identity: &str) -> Operator {
        let election = trainyard_operator::LeaderElection {
            lease_name: "trainyard-operator".to_owned(),
            lease_namespace: self.ns.clone(),
            identity: identity.to_owned(),
            lease_duration_seconds: 6,
            renew_grace_seconds: 3,
        };
        self.start_operator_with(fast_config(), Some(election), None, DEFAULT_RECONCILES)
    }

    fn start_operator_with(
        &self,
        config: OperatorConfig,
        leader_election: Option<trainyard_operator::LeaderElection>,
        metrics_addr: Option<std::net::SocketAddr>,
        reconciles: u16,
    ) -> Operator {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let run = RunConfig {
            progress: None,
            namespace: Some(self.ns.clone()),
            operator: config,
            metrics_addr,
            metrics_limits: trainyard_operator::HttpLimits::METRICS,
            leader_election,
            instance: format!("test-{}", self.ns),
            max_concurrent_reconciles: reconciles,
        };
        let task = tokio::spawn(trainyard_operator::run(
            self.client.clone(),
            run,
            async move {
                let _ = rx.await;
            },
        ));
        Operator {
            stop: Some(tx),
            task,
        }
    }

    /// Creates a Ready fake node with `gpus` GPUs and these labels; returns its name.
    pub async fn add_node(&self, suffix: &str, labels: &[(&str, &str)], gpus: u32) -> String {
        let name = format!("{}-{suffix}", self.ns);
        let labels: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let api: Api<Node> = Api::all(self.client.clone());
        let node: Node =
            serde_json::from_value(fake_node(&name, &self.ns, &labels, gpus, true)).expect("node");
        api.create(&PostParams::default(), &node)
            .await
            .expect("create node");
        // Status on create is not kept by every version; set it explicitly.
        api.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": node_status(gpus, true)})),
        )
        .await
        .expect("node status");
        // The API server taints a new node not-ready; the node lifecycle controller takes that
        // taint off once it sees the node, with a patch that writes the whole list as it read
        // it: a taint written before that patch lands is lost (a notice a test put on the node
        // went, and its pods were scheduled there: twice in about 20 runs). So wait for that
        // patch, then put the fake-node taint back (it goes with the list on 1.20).
        wait_for(
            "the node lifecycle controller to untaint the new node",
            WAIT,
            || {
                let api = api.clone();
                let name = name.clone();
                async move {
                    let node = api.get(&name).await.ok()?;
                    let taints = node.spec.and_then(|s| s.taints).unwrap_or_default();
                    (!taints.iter().any(|t| t.key == NOT_READY_TAINT)).then_some(())
                }
            },
        )
        .await;
        let taints = json!({"spec": {"taints": [{"key": FAKE_TAINT, "value": "true", "effect": "NoSchedule"}]}});
        api.patch(&name, &PatchParams::default(), &Patch::Merge(taints))
            .await
            .expect("node taints");
        self.kubelet_state
            .lock()
            .expect("state")
            .nodes
            .push(name.clone());
        name
    }

    /// Sets node labels (null removes).
    pub async fn label_node(&self, node: &str, labels: serde_json::Value) {
        let api: Api<Node> = Api::all(self.client.clone());
        api.patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": labels}})),
        )
        .await
        .expect("label node");
    }

    /// Adds a NoSchedule taint to a node, keeping the fake-node taint.
    pub async fn taint_node(&self, node: &str, key: &str) {
        let api: Api<Node> = Api::all(self.client.clone());
        let patch = json!({"spec": {"taints": [
            {"key": FAKE_TAINT, "value": "true", "effect": "NoSchedule"},
            {"key": key, "effect": "NoSchedule"}]}});
        api.patch(node, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .expect("taint node");
    }

    /// Takes every taint but the fake-node one off a node (a notice withdrawn).
    pub async fn untaint_node(&self, node: &str) {
        let api: Api<Node> = Api::all(self.client.clone());
        let patch = json!({"spec": {"taints": [
            {"key": FAKE_TAINT, "value": "true", "effect": "NoSchedule"}]}});
        api.patch(node, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .expect("untaint node");
    }

    /// Marks a node NotReady (its fake kubelet stops heartbeating).
    pub async fn node_not_ready(&self, node: &str, gpus: u32) {
        self.kubelet_state
            .lock()
            .expect("state")
            .not_ready
            .push(node.to_owned());
        let api: Api<Node> = Api::all(self.client.clone());
        api.patch_status(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": node_status(gpus, false)})),
        )
        .await
        .expect("node NotReady");
    }

    /// Deletes a node object.
    pub async fn delete_node(&self, node: &str) {
        let api: Api<Node> = Api::all(self.client.clone());
        let _ = api.delete(node, &DeleteParams::default()).await;
        self.kubelet_state
            .lock()
            .expect("state")
            .nodes
            .retain(|n| n != node);
    }

    /// A job template pinned to this test's fake nodes.
    pub fn template(&self) -> serde_json::Value {
        json!({
            "spec": {
                "nodeSelector": {RUN_LABEL: self.ns},
                "tolerations": [{"key": FAKE_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [{"name": "trainer", "image": "trainyard/trainer:dev", "command": ["sleep", "3600"]}],
            }
        })
    }

    /// Creates a TrainingJob from a spec (the template defaults to [`Self::template`]).
    pub async fn create_job(&self, name: &str, mut spec: serde_json::Value) {
        if spec.get("template").is_none() {
            spec["template"] = self.template();
        }
        let api: Api<TrainingJob> = Api::namespaced(self.client.clone(), &self.ns);
        let job: TrainingJob = serde_json::from_value(json!({
            "apiVersion": "trainyard.dev/v1alpha1", "kind": "TrainingJob",
            "metadata": {"name": name, "namespace": self.ns}, "spec": spec,
        }))
        .expect("TrainingJob");
        api.create(&PostParams::default(), &job)
            .await
            .expect("create TrainingJob");
    }

    pub fn jobs(&self) -> Api<TrainingJob> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    pub fn pods_api(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    pub async fn job(&self, name: &str) -> TrainingJob {
        self.jobs().get(name).await.expect("get TrainingJob")
    }

    pub async fn pods(&self) -> Vec<Pod> {
        self.pods_api()
            .list(&ListParams::default())
            .await
            .expect("list pods")
            .items
    }

    /// Waits until the job's status satisfies `f`.
    pub async fn wait_job(
        &self,
        name: &str,
        what: &str,
        f: impl Fn(&TrainingJob) -> bool,
    ) -> TrainingJob {
        let api = self.jobs();
        let found = poll_until(WAIT, || {
            let api = api.clone();
            let f = &f;
            async move { api.get(name).await.ok().filter(|j| f(j)) }
        })
        .await;
        match found {
            Some(job) => job,
            None => panic!(
                "timed out after {WAIT:?} waiting for {what}; what the cluster showed then:\n{}",
                self.describe(name).await
            ),
        }
    }

    /// The job's status, its pods and the namespace's Events, for a failed wait's message.
    async fn describe(&self, name: &str) -> String {
        let mut out = match self.jobs().get(name).await {
            Ok(j) => format!(
                "job {name} status: {}\n",
                serde_json::to_string(&j.status).unwrap_or_default()
            ),
            Err(e) => format!("job {name}: {e}\n"),
        };
        for p in self.pods().await {
            let s = p.status.unwrap_or_default();
            out += &format!(
                "pod {} node {:?} phase {:?} conditions {}\n",
                p.metadata.name.unwrap_or_default(),
                p.spec.and_then(|s| s.node_name),
                s.phase,
                serde_json::to_string(&s.conditions).unwrap_or_default()
            );
        }
        let events: Api<k8s_openapi::api::core::v1::Event> =
            Api::namespaced(self.client.clone(), &self.ns);
        if let Ok(list) = events.list(&ListParams::default()).await {
            for e in list.items {
                out += &format!(
                    "event {} {} {}: {}\n",
                    e.type_.unwrap_or_default(),
                    e.involved_object.name.unwrap_or_default(),
                    e.reason.unwrap_or_default(),
                    e.message.unwrap_or_default()
                );
            }
        }
        out
    }

    /// Waits for the job `name` to be Succeeded.
    pub async fn wait_succeeded(&self, name: &str) -> TrainingJob {
        self.wait_job(name, "phase Succeeded", |j| {
            j.status.as_ref().and_then(|s| s.phase).map(|p| p.as_str()) == Some("Succeeded")
        })
        .await
    }

    /// Waits until exactly `n` pods of `attempt` are Running.
    pub async fn wait_running(&self, attempt: u32, n: usize) -> Vec<Pod> {
        let api = self.pods_api();
        wait_for(
            &format!("{n} running pods of attempt {attempt}"),
            WAIT,
            || {
                let api = api.clone();
                async move {
                    let pods = api.list(&ListParams::default()).await.ok()?.items;
                    let running: Vec<Pod> = pods
                        .into_iter()
                        .filter(|p| p.labels().get(LABEL_ATTEMPT) == Some(&attempt.to_string()))
                        .filter(|p| p.metadata.deletion_timestamp.is_none())
                        .filter(|p| {
                            p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                        })
                        .collect();
                    (running.len() == n).then_some(running)
                }
            },
        )
        .await
    }

    /// Overwrites a pod's status (merge patch on the status subresource).
    pub async fn set_pod_status(&self, pod: &str, status: serde_json::Value) {
        self.pods_api()
            .patch_status(
                pod,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": status})),
            )
            .await
            .expect("pod status");
    }

    /// The trainer exits with `code`.
    pub async fn exit_pod(&self, pod: &str, code: i32) {
        let reason = if code == 0 { "Completed" } else { "Error" };
        self.end_pod(pod, code, reason).await;
    }

    /// Ends the pod's trainer with `code` and the runtime's `reason` (`Unknown`: containerd
    /// lost the container with its shim).
    pub async fn end_pod(&self, pod: &str, code: i32, reason: &str) {
        let phase = if code == 0 { "Succeeded" } else { "Failed" };
        self.set_pod_status(pod, json!({"phase": phase, "containerStatuses": [{
            "name": "trainer", "ready": false, "restartCount": 0, "image": "trainyard/trainer:dev", "imageID": "",
            "state": {"terminated": {"exitCode": code, "reason": reason}}}]}))
            .await;
    }

    /// Deletes everything the test created.
    pub async fn cleanup(mut self) {
        self.kubelet.abort();
        let nodes = self.kubelet_state.lock().expect("state").nodes.clone();
        cleanup(&self.client, &self.ns, &nodes).await;
        self.cleaned = true;
    }
}

impl Drop for TestEnv {
    /// A failed test still removes its namespace and fake nodes. The test's runtime may be
    /// unwinding, so this uses its own thread, runtime and client.
    fn drop(&mut self) {
        if self.cleaned {
            return;
        }
        self.kubelet.abort();
        let ns = self.ns.clone();
        let nodes = self
            .kubelet_state
            .lock()
            .map(|s| s.nodes.clone())
            .unwrap_or_default();
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                if let Ok(client) = Client::try_default().await {
                    cleanup(&client, &ns, &nodes).await;
                }
            });
        })
        .join();
    }
}

async fn cleanup(client: &Client, ns: &str, nodes: &[String]) {
    let nodes_api: Api<Node> = Api::all(client.clone());
    for n in nodes {
        let _ = nodes_api.delete(n, &DeleteParams::default()).await;
    }
    // Pods on fake nodes need a "kubelet" to go away; force them so the namespace can finish.
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    if let Ok(list) = pods.list(&ListParams::default()).await {
        for p in list.items {
            let _ = pods
                .delete(
                    &p.name_any(),
                    &DeleteParams {
                        grace_period_seconds: Some(0),
                        ..DeleteParams::default()
                    },
                )
                .await;
        }
    }
    let nss: Api<Namespace> = Api::all(client.clone());
    let _ = nss.delete(ns, &DeleteParams::default()).await;
}

fn running_status(now: &str) -> serde_json::Value {
    json!({"phase": "Running", "startTime": now,
           "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
           "containerStatuses": [{"name": "trainer", "ready": true, "restartCount": 0,
                                  "image": "trainyard/trainer:dev", "imageID": "",
                                  "state": {"running": {"startedAt": now}}}]})
}

async fn fake_kubelet(
    client: Client,
    ns: String,
    state: Arc<Mutex<KubeletState>>,
    deletes: Arc<AtomicBool>,
    starts: Arc<AtomicBool>,
) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let nodes: Api<Node> = Api::all(client);
    let mut tick = 0u32;
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        tick += 1;
        let (ours, not_ready) = {
            let s = state.lock().expect("state");
            (s.nodes.clone(), s.not_ready.clone())
        };
        if tick.is_multiple_of(25) {
            // Heartbeats keep the node lifecycle controller from marking fake nodes NotReady.
            for n in ours.iter().filter(|n| !not_ready.contains(n)) {
                if let Ok(node) = nodes.get_status(n).await {
                    let mut conditions = node.status.and_then(|s| s.conditions).unwrap_or_default();
                    for c in conditions.iter_mut().filter(|c| c.type_ == "Ready") {
                        c.last_heartbeat_time = Some(
                            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now()),
                        );
                    }
                    let _ = nodes
                        .patch_status(
                            n,
                            &PatchParams::default(),
                            &Patch::Merge(json!({"status": {"conditions": conditions}})),
                        )
                        .await;
                }
            }
        }
        let Ok(list) = pods.list(&ListParams::default()).await else {
            continue;
        };
        for p in list.items {
            let name = p.name_any();
            let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
            let on_fake = node
                .as_ref()
                .is_some_and(|n| ours.contains(n) || n.starts_with(&ns));
            if p.metadata.deletion_timestamp.is_some() {
                let node_alive = node
                    .as_ref()
                    .is_some_and(|n| ours.contains(n) && !not_ready.contains(n));
                if deletes.load(Ordering::Relaxed) && node_alive {
                    let _ = pods
                        .delete(
                            &name,
                            &DeleteParams {
                                grace_period_seconds: Some(0),
                                ..DeleteParams::default()
                            },
                        )
                        .await;
                }
                continue;
            }
            let phase = p
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .unwrap_or("Pending");
            let node_ready = node.as_ref().is_some_and(|n| !not_ready.contains(n));
            if on_fake && node_ready && phase == "Pending" && starts.load(Ordering::Relaxed) {
                let now = Timestamp::now().to_string();
                let _ = pods
                    .patch_status(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"status": running_status(&now)})),
                    )
                    .await;
            }
        }
    }
}

/// The text `/metrics` serves at `addr` (empty while nothing answers there).
pub async fn scrape(addr: std::net::SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
        return String::new();
    };
    let request = "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    let mut out = String::new();
    if s.write_all(request.as_bytes()).await.is_err() || s.read_to_string(&mut out).await.is_err() {
        return String::new();
    }
    out
}

/// The value of a metric sample, e.g. `trainyard_operator_state_entries{map="written"}`.
pub fn sample(metrics: &str, name_and_labels: &str) -> Option<f64> {
    metrics.lines().find_map(|l| {
        l.strip_prefix(name_and_labels)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// The value of an env var of the trainer container.
pub fn env(pod: &Pod, key: &str) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    let c = spec.containers.iter().find(|c| c.name == "trainer")?;
    c.env
        .as_ref()?
        .iter()
        .find(|e| e.name == key)?
        .value
        .clone()
}

/// The condition of a job, if present.
pub fn condition<'a>(
    job: &'a TrainingJob,
    type_: &str,
) -> Option<&'a trainyard_operator::surface::JobCondition> {
    job.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
}

/// Config with short timeouts for tests.
pub fn fast_config() -> OperatorConfig {
    OperatorConfig {
        node_not_ready_timeout_seconds: 2,
        ..OperatorConfig::default()
    }
}
