//! End-to-end harness for trainyard.
//!
//! The scenarios in `e2e/tests/` run against the local two-node cluster
//! that `e2e/cluster/up.sh` brings up (or any cluster `KUBECONFIG` points at):
//! node 1 (on-demand) in the host's namespaces, node 2 (spot) in its own,
//! which `e2e/cluster/node2.sh lose` takes away like a reclaimed VM.
//! They are `#[ignore]`d in a plain `cargo test`; `make test` starts the
//! cluster and runs them with `--ignored`. The exception is `tests/contract.rs`, a plain
//! test that feeds the device plugin's node labels to the operator's placement (this crate
//! depends on both, so the check lives here). This library holds what every
//! scenario needs: a client, polling with a deadline, Helm
//! through `e2e/helm.py`, pod logs read from `/var/log/pods`, and control of
//! the harness's kubelet.
#![forbid(unsafe_code)]

pub mod chaos;
pub mod forged;
pub mod jobs;
pub mod ledger_check;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, ResourceExt};
use trainyard_api::crd::{LABEL_ATTEMPT, LABEL_JOB};

/// The repository root (the e2e crate's parent directory).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Where the harness keeps its state (`TRAINYARD_E2E_STATE`).
pub fn state_dir() -> PathBuf {
    std::env::var_os("TRAINYARD_E2E_STATE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/lib/trainyard-e2e"))
}

/// The container port named `name` of a pod's first container (the chart's pods have one).
pub fn named_port(pod: &Pod, name: &str) -> Option<i32> {
    pod.spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.ports.as_ref())
        .and_then(|ports| ports.iter().find(|p| p.name.as_deref() == Some(name)))
        .map(|p| p.container_port)
}

/// The node the harness's kubelet registers.
pub fn node_name() -> String {
    std::env::var("TRAINYARD_NODE_NAME").unwrap_or_else(|_| "trainyard-node".to_owned())
}

/// The harness's second node, the spot node (`e2e/cluster/node2.sh`).
pub fn node2_name() -> String {
    std::env::var("TRAINYARD_NODE2_NAME").unwrap_or_else(|_| "trainyard-node-2".to_owned())
}

/// Runs `e2e/cluster/node2.sh ACTION`: `lose` kills the spot node's kubelet, containerd,
/// kube-proxy and containers at once; `start` brings it back and waits until it is Ready.
pub fn node2(action: &str) -> Result<()> {
    let out = Command::new("bash")
        .arg(repo_root().join("e2e/cluster/node2.sh"))
        .arg(action)
        .output()
        .context("running e2e/cluster/node2.sh")?;
    if !out.status.success() {
        bail!(
            "node2.sh {action} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// The PIDs of this machine's processes whose environment has `name` set to a value for which
/// `matches` holds: both nodes' containers are processes of this host (node 2's in its own
/// namespaces), so the harness can see whether a trainer the API no longer shows still runs.
/// Processes that end or whose environment cannot be read while scanning are skipped.
pub fn processes_with_env(name: &str, matches: impl Fn(&str) -> bool) -> Result<Vec<u32>> {
    let prefix = format!("{name}=");
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").context("reading /proc")? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        let found = environ
            .split(|b| *b == 0)
            .filter_map(|var| std::str::from_utf8(var).ok())
            .filter_map(|var| var.strip_prefix(&prefix))
            .any(&matches);
        if found {
            pids.push(pid);
        }
    }
    Ok(pids)
}

/// Cordons (`schedulable: false`) or uncordons a node.
pub async fn set_schedulable(client: &Client, node: &str, schedulable: bool) -> Result<()> {
    use kube::api::{Patch, PatchParams};
    let patch = serde_json::json!({"spec": {"unschedulable": !schedulable}});
    Api::<Node>::all(client.clone())
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("setting node {node} schedulable={schedulable}"))?;
    Ok(())
}

/// A client for the cluster under test. Fails loudly when no cluster is
/// configured, so a cluster test never passes vacuously.
pub async fn client() -> Result<Client> {
    let config = match std::env::var_os("KUBECONFIG") {
        Some(_) => Config::infer()
            .await
            .context("reading KUBECONFIG for the cluster under test")?,
        None => {
            let default = state_dir().join("kubeconfig");
            if !default.exists() {
                bail!(
                    "no cluster: KUBECONFIG is unset and {} does not exist; run `make test` or `make cluster-up`",
                    default.display()
                );
            }
            let kc = Kubeconfig::read_from(&default)
                .with_context(|| format!("reading {}", default.display()))?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("loading {}", default.display()))?
        }
    };
    Client::try_from(config).context("building the Kubernetes client")
}

/// Polls `probe` every 250 ms until it yields `Some`, or fails after
/// `timeout` with `what` and the last observation in the message.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let start = Instant::now();
    let mut last_err = None;
    loop {
        match probe().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last_err = Some(e),
        }
        if start.elapsed() > timeout {
            return Err(anyhow!(
                "timed out after {timeout:?} waiting for {what}{}",
                last_err
                    .map(|e| format!(" (last error: {e:#})"))
                    .unwrap_or_default()
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `nvidia.com/gpu` (or another extended resource) in the node's allocatable.
pub async fn allocatable(client: &Client, node: &str, resource: &str) -> Result<Option<i64>> {
    let n = Api::<Node>::all(client.clone()).get(node).await?;
    Ok(n.status
        .and_then(|s| s.allocatable)
        .and_then(|a| a.get(resource).cloned())
        .and_then(|q| q.0.parse::<i64>().ok()))
}

/// Same as [`allocatable`] for the node's capacity.
pub async fn capacity(client: &Client, node: &str, resource: &str) -> Result<Option<i64>> {
    let n = Api::<Node>::all(client.clone()).get(node).await?;
    Ok(n.status
        .and_then(|s| s.capacity)
        .and_then(|a| a.get(resource).cloned())
        .and_then(|q| q.0.parse::<i64>().ok()))
}

/// The log of a pod's container, read from the node's `/var/log/pods` (node
/// 2's is its private copy under the harness state), so that it can still be
/// read after the node is lost. Concatenates every restart's file in order.
pub fn pod_log(namespace: &str, pod: &Pod, container: &str) -> Result<String> {
    let mut out = String::new();
    for (_, msg) in pod_log_lines(namespace, pod, container)? {
        out.push_str(&msg);
        out.push('\n');
    }
    Ok(out)
}

/// When the container first logged a line containing `text`, from the CRI log's own
/// timestamp (the time the runtime read the line), or `None` if it has not.
pub fn first_log_time(
    namespace: &str,
    pod: &Pod,
    container: &str,
    text: &str,
) -> Result<Option<jiff::Timestamp>> {
    let Some((time, msg)) = first_log(namespace, pod, container, text)? else {
        return Ok(None);
    };
    let time = time
        .parse()
        .with_context(|| format!("the CRI log time of {msg:?}: {time:?}"))?;
    Ok(Some(time))
}

/// The first line of the container's log (every restart's file in order) that contains
/// `text`, without its time.
pub fn first_log_line(
    namespace: &str,
    pod: &Pod,
    container: &str,
    text: &str,
) -> Result<Option<String>> {
    Ok(first_log(namespace, pod, container, text)?.map(|(_, msg)| msg))
}

/// The first CRI log line, as (time, message), whose message contains `text`.
fn first_log(
    namespace: &str,
    pod: &Pod,
    container: &str,
    text: &str,
) -> Result<Option<(String, String)>> {
    Ok(pod_log_lines(namespace, pod, container)?
        .into_iter()
        .find(|(_, msg)| msg.contains(text)))
}

/// The container's CRI log lines (`<time> <stream> <P|F> <message>`) as (time, message),
/// every restart's file in order.
fn pod_log_lines(namespace: &str, pod: &Pod, container: &str) -> Result<Vec<(String, String)>> {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let on_node2 = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(&node2_name());
    let root = if on_node2 {
        state_dir().join("node2/private/var/log/pods")
    } else {
        PathBuf::from("/var/log/pods")
    };
    let dir = root
        .join(format!("{namespace}_{name}_{uid}"))
        .join(container);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let raw =
            std::fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?;
        for line in raw.lines() {
            let mut fields = line.splitn(4, ' ');
            let time = fields.next().unwrap_or_default().to_owned();
            let msg = fields.nth(2).unwrap_or(line).to_owned();
            out.push((time, msg));
        }
    }
    Ok(out)
}

/// Runs `e2e/helm.py` (helm-python-sdk in the venv `make prereqs` creates).
pub fn helm(args: &[&str]) -> Result<String> {
    let cache = std::env::var_os("TRAINYARD_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/trainyard")))
        .ok_or_else(|| anyhow!("neither TRAINYARD_CACHE nor HOME is set"))?;
    let python = cache.join("venv/bin/python");
    let out = Command::new(&python)
        .arg(repo_root().join("e2e/helm.py"))
        .args(args)
        .output()
        .with_context(|| format!("running {} e2e/helm.py", python.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "helm {} failed: {}{}",
            args.join(" "),
            stdout,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(stdout)
}

/// Stops the harness's kubelet by its PID file and starts it again through
/// `up.sh` (which only restarts what is not running).
pub fn restart_kubelet() -> Result<()> {
    let pid_file = state_dir().join("pids/kubelet.pid");
    let pid = std::fs::read_to_string(&pid_file)
        .with_context(|| format!("reading {}", pid_file.display()))?;
    let pid = pid.trim();
    let status = Command::new("kill").arg(pid).status()?;
    if !status.success() {
        bail!("kill {pid} (kubelet) failed");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while Path::new(&format!("/proc/{pid}")).exists() {
        if Instant::now() > deadline {
            bail!("kubelet (pid {pid}) did not stop within 20 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = Command::new("bash")
        .arg(repo_root().join("e2e/cluster/up.sh"))
        .output()
        .context("running e2e/cluster/up.sh")?;
    if !out.status.success() {
        bail!(
            "up.sh failed restarting the kubelet: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Preempts a pod the way a kubelet's graceful node shutdown does on a newer
/// cluster: the `DisruptionTarget` condition first (1.26+; written here since
/// a 1.20 kubelet never sets it), then deletion with the pod's grace period,
/// so the trainer gets SIGTERM and can checkpoint.
pub async fn preempt_pod(client: &Client, namespace: &str, pod: &str, reason: &str) -> Result<()> {
    use kube::api::{Patch, PatchParams};
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let now = jiff::Timestamp::now().to_string();
    let patch = serde_json::json!({
        "status": {"conditions": [{
            "type": "DisruptionTarget",
            "status": "True",
            "reason": reason,
            "message": "trainyard-e2e: simulated node shutdown",
            "lastTransitionTime": now,
        }]}
    });
    pods.patch_status(pod, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .with_context(|| format!("setting DisruptionTarget on pod {namespace}/{pod}"))?;
    pods.delete(pod, &DeleteParams::default())
        .await
        .with_context(|| format!("deleting pod {namespace}/{pod}"))?;
    Ok(())
}

/// One pod watch event as a [`PodTimeline`] saw it.
#[derive(Clone, Debug)]
pub struct PodEvent {
    /// When the watch delivered it (this machine's clock, which is the API server's).
    pub seen: jiff::Timestamp,
    /// The pod left the API server (a watch `DELETED`).
    pub deleted: bool,
    pub name: String,
    /// The `trainyard.dev/attempt` label.
    pub attempt: Option<u32>,
    /// The pod is in a final phase (`Succeeded` or `Failed`): its containers have stopped.
    pub finished: bool,
    /// `metadata.creationTimestamp` (whole seconds).
    pub created: Option<jiff::Timestamp>,
}

/// Records every watch event of one job's pods, from a watch opened before the scenario acts.
pub struct PodTimeline {
    /// When the watch was opened.
    pub started: jiff::Timestamp,
    events: std::sync::Arc<std::sync::Mutex<Vec<PodEvent>>>,
    task: tokio::task::JoinHandle<()>,
}

impl PodTimeline {
    /// Starts watching the pods of job `job` in `namespace`; returns once the watch is open.
    pub async fn start(client: &Client, namespace: &str, job: &str) -> Result<Self> {
        use futures::StreamExt;
        use kube::runtime::watcher::{self, Event};
        let started = jiff::Timestamp::now();
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let config = watcher::Config::default().labels(&format!("{LABEL_JOB}={job}"));
        let events = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let sink = events.clone();
        let task = tokio::spawn(async move {
            let mut ready = Some(ready_tx);
            let mut stream = watcher::watcher(pods, config).boxed();
            while let Some(event) = stream.next().await {
                let (pod, deleted) = match event {
                    Ok(Event::InitDone) => {
                        if let Some(tx) = ready.take() {
                            let _ = tx.send(());
                        }
                        continue;
                    }
                    Ok(Event::Apply(pod) | Event::InitApply(pod)) => (pod, false),
                    Ok(Event::Delete(pod)) => (pod, true),
                    Ok(Event::Init) | Err(_) => continue,
                };
                let record = PodEvent {
                    seen: jiff::Timestamp::now(),
                    deleted,
                    name: pod.name_any(),
                    attempt: pod.labels().get(LABEL_ATTEMPT).and_then(|a| a.parse().ok()),
                    finished: jobs::pod_finished(&pod),
                    created: pod.metadata.creation_timestamp.as_ref().map(|t| t.0),
                };
                if let Ok(mut all) = sink.lock() {
                    all.push(record);
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(30), ready_rx)
            .await
            .context("the pod watch did not open within 30 s")?
            .context("the pod watch ended")?;
        Ok(Self {
            started,
            events,
            task,
        })
    }

    /// Everything seen so far.
    pub fn events(&self) -> Vec<PodEvent> {
        self.events.lock().map(|e| e.clone()).unwrap_or_default()
    }

    /// When the last pod of `attempt` left the watch.
    pub fn last_gone(&self, attempt: u32) -> Option<jiff::Timestamp> {
        self.events()
            .iter()
            .filter(|e| e.deleted && e.attempt == Some(attempt))
            .map(|e| e.seen)
            .max()
    }

    /// The longest a pod of `attempt` stayed in the API server after the watch first showed it
    /// in a final phase, with its name; `None` until every such pod is gone.
    pub fn longest_stopped_to_gone(&self, attempt: u32) -> Option<(String, jiff::SignedDuration)> {
        let events = self.events();
        let mut longest: Option<(String, jiff::SignedDuration)> = None;
        let mut names: Vec<&str> = events
            .iter()
            .filter(|e| e.attempt == Some(attempt) && e.finished)
            .map(|e| e.name.as_str())
            .collect();
        names.sort_unstable();
        names.dedup();
        for name in names {
            let of = |f: fn(&PodEvent) -> bool| {
                events
                    .iter()
                    .filter(|e| e.name == name && e.attempt == Some(attempt) && f(e))
                    .map(|e| e.seen)
                    .min()
            };
            let stopped = of(|e| e.finished)?;
            let gone = of(|e| e.deleted)?;
            let took = gone.duration_since(stopped);
            if longest.as_ref().is_none_or(|(_, d)| took > *d) {
                longest = Some((name.to_owned(), took));
            }
        }
        longest
    }

    /// When the watch first showed a pod of `attempt` (its own clock: sub-second, unlike the
    /// creation timestamp).
    pub fn first_seen(&self, attempt: u32) -> Option<jiff::Timestamp> {
        self.events()
            .iter()
            .filter(|e| e.attempt == Some(attempt))
            .map(|e| e.seen)
            .min()
    }

    /// The earliest creation timestamp of a pod of `attempt`.
    pub fn first_created(&self, attempt: u32) -> Option<jiff::Timestamp> {
        self.events()
            .iter()
            .filter(|e| e.attempt == Some(attempt))
            .filter_map(|e| e.created)
            .min()
    }
}

impl Drop for PodTimeline {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_found_by_its_environment_while_it_runs() -> Result<()> {
        let mark = format!("{}-{:?}", std::process::id(), Instant::now());
        let mut child = Command::new("sleep")
            .arg("30")
            .env("TRAINYARD_E2E_TEST_MARK", &mark)
            .spawn()?;
        // Between fork and exec the child still has this process's environment.
        let deadline = Instant::now() + Duration::from_secs(10);
        let found = loop {
            let found = processes_with_env("TRAINYARD_E2E_TEST_MARK", |v| v == mark);
            if !matches!(&found, Ok(f) if f.is_empty()) || Instant::now() > deadline {
                break found;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        child.kill()?;
        child.wait()?;
        assert_eq!(found?, vec![child.id()]);
        let after = processes_with_env("TRAINYARD_E2E_TEST_MARK", |v| v == mark)?;
        assert!(after.is_empty(), "still found after it ended: {after:?}");
        Ok(())
    }
}
