//! Each fault of a [`super::schedule`] as a real action against the local cluster, and its
//! undoing. Nothing here writes a status or fakes what a component would see: processes are
//! killed and restarted, nodes lost and brought back, taints and files changed.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use trainyard_api::crd::{LABEL_ATTEMPT, LABEL_JOB, LABEL_RANK};
use trainyard_api::spot::KARPENTER_DISRUPTED;

use super::noise::{self, Restore};
use super::schedule::FaultKind;
use crate::jobs::{RELEASE, RELEASE_NS, tj_api};
use crate::{node_name, node2, node2_name, state_dir};

/// What a fault needs to know of the run.
pub struct Target {
    pub client: Client,
    pub namespace: String,
    pub job: String,
}

impl Target {
    /// The job's phase now, if it can be read.
    pub async fn phase(&self) -> Option<String> {
        let st = crate::jobs::job_status(&self.client, &self.namespace, &self.job)
            .await
            .ok()?;
        st["phase"].as_str().map(str::to_owned)
    }
}

/// What a fault came to, as the run counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    /// It went in.
    Injected,
    /// It found nothing to act on (no running worker, say): it did not go in.
    Skipped,
    /// A `SuspendResume` whose job had ended by the time it was undone: it went in, but the
    /// operator had nothing to resume, so no attempt follows.
    NoResume,
}

/// One fault's line in the run's report: when it came due, what it was, what it came to and
/// what was done (with what undoing it found).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    pub at: Duration,
    pub kind: FaultKind,
    pub effect: Effect,
    pub what: String,
}

/// A fault as [`inject`] left it, with what its undoing needs.
#[derive(Debug)]
pub struct Injected {
    pub kind: FaultKind,
    /// Whether it went in ([`Effect::Injected`]) or found nothing to act on.
    pub effect: Effect,
    /// What was done (or why nothing was), for the run's log.
    pub what: String,
    /// The node a taint went on.
    node: Option<String>,
    /// A harness process stopped for the hold (`DnsOutage`).
    stopped: Option<Stopped>,
    /// The connections of a `ProgressFlood` or `PluginMetricsFlood`: aborted when it is undone.
    flood: Option<tokio::task::JoinHandle<()>>,
    /// What a fault on a node's plumbing changed (`SlowEtcdDisk`, `ImagePullFailure`).
    restore: Option<Restore>,
    /// The pod a `ForgedWorker` created.
    forged: Option<String>,
}

/// Injects `kind`; `pick` chooses among candidates (seeded by the run).
pub async fn inject(
    target: &Target,
    kind: FaultKind,
    pick: &mut fastrand::Rng,
) -> Result<Injected> {
    let (mut node, mut stopped) = (None, None);
    let what = match kind {
        FaultKind::KillOperatorLeader => kill_operator_leader(&target.client).await?,
        FaultKind::RestartApiServer
        | FaultKind::RestartEtcd
        | FaultKind::RestartKubelet
        | FaultKind::KubeletsRestart
        | FaultKind::DnsOutage => {
            let (what, process) = process_fault(target, kind).await?;
            stopped = process;
            what
        }
        FaultKind::RestartDevicePlugin => {
            let nodes = [node_name(), node2_name()];
            let on = &nodes[pick.usize(..nodes.len())];
            let Some(what) = delete_device_plugin(&target.client, on).await? else {
                return Ok(skipped(kind, &format!("no device plugin pod on {on}")));
            };
            what
        }
        FaultKind::GpuUnhealthy => set_gpu_healthy(false)?,
        FaultKind::LoseNode2 => {
            blocking(|| node2("lose")).await?;
            "node 2 lost".to_owned()
        }
        FaultKind::PartitionNode2 => {
            blocking(|| node2("partition")).await?;
            "node 2 partitioned".to_owned()
        }
        FaultKind::TerminationTaint => {
            // A node of a running worker, each node as likely as the other: a notice on node 2
            // leaves room on node 1 for the replacements made ahead, one on node 1 none on the
            // full spot node, so the seeds take both paths.
            let pods = running_workers(target).await?;
            let nodes: BTreeSet<String> = pods
                .iter()
                .filter_map(|p| p.spec.as_ref().and_then(|s| s.node_name.clone()))
                .collect();
            let Some(on) = pick.choice(&nodes).cloned() else {
                return Ok(skipped(kind, "no running worker to taint the node of"));
            };
            set_termination_taint(&target.client, &on, true).await?;
            node = Some(on.clone());
            format!("{KARPENTER_DISRUPTED} taint on {on}")
        }
        FaultKind::DeleteWorkerPod => match delete_a_worker(target, pick).await? {
            Some(what) => what,
            None => return Ok(skipped(kind, "no running worker to delete")),
        },
        FaultKind::SuspendResume => {
            set_suspend(target, true).await?;
            "job suspended".to_owned()
        }
        FaultKind::TrainerFailure => match fail_a_trainer(target, pick).await? {
            Ok(what) => what,
            Err(why) => return Ok(skipped(kind, &why)),
        },
        FaultKind::ForgedWorker => {
            let Some((pod, what)) = forge_a_worker(target, pick).await? else {
                return Ok(skipped(kind, "no running worker to copy"));
            };
            return Ok(Injected {
                forged: Some(pod),
                ..injected(kind, what)
            });
        }
        FaultKind::ProgressFlood
        | FaultKind::Node2CutFromApi
        | FaultKind::ApiLatency
        | FaultKind::PluginMetricsFlood
        | FaultKind::SlowEtcdDisk
        | FaultKind::ImagePullFailure
        | FaultKind::OperatorClockSkew => return inject_noise(target, kind, pick).await,
    };
    Ok(Injected {
        node,
        stopped,
        ..injected(kind, what)
    })
}

/// Injects a fault of a noisy cluster: a slow or cut path to the API server, a flooded port,
/// a node's plumbing ([`noise`]), the operator's clock.
async fn inject_noise(
    target: &Target,
    kind: FaultKind,
    pick: &mut fastrand::Rng,
) -> Result<Injected> {
    let (mut flood, mut restore) = (None, None);
    let what = match kind {
        FaultKind::ProgressFlood => {
            let Some(addr) = progress_endpoint(&target.client).await? else {
                return Ok(skipped(kind, "no progress endpoint"));
            };
            flood = Some(tokio::spawn(hold_connections(
                None,
                addr,
                FLOOD_CONNECTIONS,
            )));
            format!("{FLOOD_CONNECTIONS} connections held open to the progress endpoint {addr}")
        }
        FaultKind::Node2CutFromApi => {
            let ip = node_ip(&target.client, &node2_name()).await?;
            set_api_blocked(Some(&ip))?;
            format!("node 2 ({ip}) cut off from the API server")
        }
        FaultKind::ApiLatency => {
            let ms = pick.u64(500..=2000);
            set_api_delay(ms)?;
            format!("{ms} ms of latency each way between the pods and the API server")
        }
        FaultKind::PluginMetricsFlood => {
            let nodes = [node_name(), node2_name()];
            let on = &nodes[pick.usize(..nodes.len())];
            let Some(addr) = noise::plugin_metrics(&target.client, on).await? else {
                return Ok(skipped(kind, &format!("no device plugin serving on {on}")));
            };
            // Not from the node's address, which the kubelet probes from ([`FLOOD_SOURCE`]).
            let from = FLOOD_SOURCE;
            let held = hold_connections(Some(from), addr, FLOOD_CONNECTIONS);
            flood = Some(tokio::spawn(held));
            format!(
                "{FLOOD_CONNECTIONS} connections from {from} held open to {on}'s device plugin \
                 metrics {addr}"
            )
        }
        FaultKind::OperatorClockSkew => {
            let offset = pick.i64(2..=5) * if pick.bool() { 1 } else { -1 };
            let (what, undo) = noise::skew_operator_clock(&target.client, offset).await?;
            restore = Some(undo);
            what
        }
        FaultKind::SlowEtcdDisk => {
            let iops = pick.u32(20..=60);
            let (what, undo) = blocking(move || noise::slow_etcd_disk(iops)).await?;
            restore = Some(undo);
            what
        }
        FaultKind::ImagePullFailure => {
            let (what, undo) = blocking(noise::hide_trainer_image).await?;
            // The restart that needs the image: a worker deleted, as a user would.
            let deleted = delete_a_worker(target, pick).await;
            let deleted = match deleted {
                Ok(Some(deleted)) => deleted,
                done => {
                    undo.undo(&target.client).await?;
                    return match done {
                        Err(e) => Err(e),
                        _ => Ok(skipped(kind, "no running worker to delete")),
                    };
                }
            };
            restore = Some(undo);
            format!("{what}; {deleted}")
        }
        other => bail!("{other} is not a fault of a noisy cluster"),
    };
    Ok(Injected {
        flood,
        restore,
        ..injected(kind, what)
    })
}

/// Undoes a fault that [`FaultKind::is_undone`]; single actions have nothing to undo. Says
/// what the undoing found when that changes what the fault came to, and in what words: a
/// `SuspendResume` whose job was not suspended when it was resumed (it had ended first) is
/// [`Effect::NoResume`].
pub async fn undo(target: &Target, fault: &Injected) -> Result<Option<(Effect, String)>> {
    if fault.kind == FaultKind::SuspendResume {
        let phase = target.phase().await;
        set_suspend(target, false).await?;
        return Ok((phase.as_deref() != Some("Suspended")).then(|| {
            (
                Effect::NoResume,
                format!(
                    "not suspended when resumed: no resume (phase {})",
                    phase.as_deref().unwrap_or("unknown")
                ),
            )
        }));
    }
    if let (FaultKind::ForgedWorker, Some(pod)) = (fault.kind, &fault.forged) {
        return unforge(target, pod)
            .await
            .map(|said| Some((Effect::Injected, said)));
    }
    undo_effect(target, fault).await.map(|()| None)
}

/// Copies a running worker as a namespace user could ([`crate::forged::forged_copy`]), under
/// `<job>-forged-<n>`, its attempt label kept: the pod's name and what it posts, or none when
/// no worker runs.
async fn forge_a_worker(
    target: &Target,
    pick: &mut fastrand::Rng,
) -> Result<Option<(String, String)>> {
    let pods = running_workers(target).await?;
    let Some(worker) = pick.choice(&pods) else {
        return Ok(None);
    };
    let attempt: u32 = worker
        .labels()
        .get(LABEL_ATTEMPT)
        .and_then(|a| a.parse().ok())
        .context("a running worker without an attempt label")?;
    let name = format!("{}-forged-{}", target.job, pick.u32(..));
    let pod: Pod = serde_json::from_value(crate::forged::forged_copy(worker, &name, attempt)?)?;
    Api::<Pod>::namespaced(target.client.clone(), &target.namespace)
        .create(&Default::default(), &pod)
        .await
        .with_context(|| format!("creating the forged pod {name}"))?;
    let what = format!(
        "{name}, a copy of {} (seal, ownerReference, token), posting its rank's reports and \
         supervisor polls",
        worker.name_any()
    );
    Ok(Some((name, what)))
}

/// Deletes a forged pod and says what it was answered; fails when any of its posts was
/// accepted.
async fn unforge(target: &Target, pod: &str) -> Result<String> {
    let pods = Api::<Pod>::namespaced(target.client.clone(), &target.namespace);
    let log = match pods.get_opt(pod).await? {
        Some(p) => crate::pod_log(&target.namespace, &p, "trainer").unwrap_or_default(),
        None => String::new(),
    };
    pods.delete(pod, &DeleteParams::default().grace_period(0))
        .await
        .with_context(|| format!("deleting the forged pod {pod}"))?;
    let (accepted, refused, other) = crate::forged::answers(&log);
    ensure!(
        accepted == 0,
        "{accepted} posts of the forged pod {pod} were accepted (200); its log:\n{log}"
    );
    Ok(format!(
        "{refused} posts refused (403), {other} unanswered, none accepted"
    ))
}

async fn undo_effect(target: &Target, fault: &Injected) -> Result<()> {
    match fault.kind {
        FaultKind::GpuUnhealthy => set_gpu_healthy(true).map(drop),
        FaultKind::ApiLatency => set_api_delay(0),
        FaultKind::Node2CutFromApi => set_api_blocked(None),
        FaultKind::ProgressFlood | FaultKind::PluginMetricsFlood => {
            if let Some(flood) = &fault.flood {
                flood.abort();
            }
            Ok(())
        }
        FaultKind::DnsOutage => match &fault.stopped {
            Some(dns) => {
                let dns = dns.clone();
                blocking(move || start_process(&dns).map(drop)).await
            }
            None => Ok(()),
        },
        FaultKind::SlowEtcdDisk | FaultKind::ImagePullFailure | FaultKind::OperatorClockSkew => {
            match &fault.restore {
                Some(restore) => restore.undo(&target.client).await,
                None => Ok(()),
            }
        }
        FaultKind::LoseNode2 => blocking(|| node2("start")).await,
        FaultKind::PartitionNode2 => blocking(|| node2("heal")).await,
        FaultKind::TerminationTaint => match &fault.node {
            Some(node) => set_termination_taint(&target.client, node, false).await,
            None => Ok(()),
        },
        _ => Ok(()),
    }
}

/// Waits until the API server is ready again after a control-plane restart (`/readyz`: it
/// serves, reaches etcd, and its post-start hooks are done): the restart is over when the
/// component is back, as it would be for whoever restarted it.
///
/// Serving reads is not enough (found by `make chaos` at 11d3ce4, seed 6): a kube-apiserver
/// 1.20 that loses etcd while a post-start hook still runs exits (`Unable to perform initial
/// service nodePort check`), and an etcd restart injected right after the API server answered
/// its first list killed it for good, since nothing in the local cluster restarts it.
async fn api_serving(client: &Client) -> Result<()> {
    crate::wait_for(
        "the API server to be ready again",
        Duration::from_secs(120),
        || async move {
            let ready = http::Request::get("/readyz").body(Vec::new())?;
            Ok(client.request_text(ready).await.ok().map(drop))
        },
    )
    .await
}

/// Runs a blocking action (a process stopped and started, `node2.sh`) off the runtime, so that
/// the run's watches keep feeding the checker while it waits.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .context("a fault's action panicked")?
}

/// A fault that went in, with nothing its undoing needs.
fn injected(kind: FaultKind, what: String) -> Injected {
    Injected {
        kind,
        effect: Effect::Injected,
        what,
        node: None,
        stopped: None,
        flood: None,
        restore: None,
        forged: None,
    }
}

/// A fault that found nothing to act on, and why.
fn skipped(kind: FaultKind, why: &str) -> Injected {
    Injected {
        effect: Effect::Skipped,
        ..injected(kind, format!("skipped: {why}"))
    }
}

/// How long `KillOperatorLeader` waits for a replica to lead: after a control-plane outage
/// the leader has stepped down and the replicas campaign again, so for a few seconds after the
/// API server returns the Lease has no holder (seed 8 at 356d93b met it 4 s before the standby
/// took the Lease).
const LEADER_WAIT: Duration = Duration::from_secs(60);

/// `kill -9` of the process of the operator replica that holds the leader Lease, through the
/// containerd of its node: the standby must take over. When no replica leads yet, or the
/// Lease and the pod's container status name a container that has just ended (a replica
/// restarting), both are read again, for up to [`LEADER_WAIT`].
async fn kill_operator_leader(client: &Client) -> Result<String> {
    let started = Instant::now();
    loop {
        let retry = |why: String| -> Result<()> {
            if started.elapsed() >= LEADER_WAIT {
                bail!("{why} after {}s", LEADER_WAIT.as_secs());
            }
            Ok(())
        };
        let Some((holder, id, socket)) = leader_container(client).await? else {
            retry("no replica holds the leader Lease".to_owned())?;
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        let killed = run(Command::new("ctr").arg("--address").arg(&socket).args([
            "-n",
            "k8s.io",
            "tasks",
            "kill",
            "-s",
            "SIGKILL",
            id.as_str(),
        ]));
        match killed {
            Ok(_) => {
                let waited = started.elapsed().as_secs();
                return Ok(match waited {
                    0 => format!("operator leader {holder} killed (-9)"),
                    s => format!("operator leader {holder} killed (-9), a leader awaited {s}s"),
                });
            }
            Err(e) if format!("{e:#}").contains("not found") => {
                retry(format!("the leader's container is gone: {e:#}"))?;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Who holds `lease`: none when nobody does (a released Lease keeps an empty holder).
fn lease_holder(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty())
}

/// The leader Lease's holder, its container's id and the containerd socket of its node; none
/// while no replica leads.
async fn leader_container(client: &Client) -> Result<Option<(String, String, PathBuf)>> {
    let lease = Api::<Lease>::namespaced(client.clone(), RELEASE_NS)
        .get(RELEASE)
        .await
        .context("reading the operator's leader Lease")?;
    let Some(holder) = lease_holder(&lease).map(str::to_owned) else {
        return Ok(None);
    };
    let pod = Api::<Pod>::namespaced(client.clone(), RELEASE_NS)
        .get(&holder)
        .await
        .with_context(|| format!("reading the leader's pod {holder}"))?;
    let container = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.first())
        .and_then(|c| c.container_id.clone())
        .context("the leader's container has no id yet")?;
    let id = container.trim_start_matches("containerd://").to_owned();
    let on = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    let socket = containerd_socket(on.as_deref() == Some(node2_name().as_str()));
    Ok(Some((holder, id, socket)))
}

/// The containerd socket of node 1, or of node 2.
pub(super) fn containerd_socket(node2: bool) -> PathBuf {
    let state = state_dir();
    if node2 {
        state.join("node2/containerd/containerd.sock")
    } else {
        state.join("containerd/containerd.sock")
    }
}

/// A harness process stopped by [`stop_process`], with what starting it again needs.
#[derive(Clone, Debug)]
pub struct Stopped {
    name: String,
    pid: String,
    argv: Vec<String>,
    environ: Vec<String>,
    cwd: PathBuf,
}

/// Stops a harness process by its PID file and starts it again with the same command line,
/// environment and working directory (read from `/proc` before it stops), its output appended
/// to its log, its new PID recorded where the harness keeps it.
pub fn restart_process(name: &str) -> Result<String> {
    let stopped = stop_process(name)?;
    let pid = stopped.pid.clone();
    let new = start_process(&stopped)?;
    Ok(format!("{name} restarted (pid {pid} -> {new})"))
}

/// Stops a harness process by its PID file: SIGTERM first, as an operator stopping it would
/// (the API server finishes its in-flight requests, up to its 60 s request timeout), SIGKILL
/// if it is still there after that. What [`start_process`] needs is read before.
pub fn stop_process(name: &str) -> Result<Stopped> {
    let pid_file = state_dir().join(format!("pids/{name}.pid"));
    let pid = std::fs::read_to_string(&pid_file)
        .with_context(|| format!("reading {}", pid_file.display()))?;
    let pid = pid.trim().to_owned();
    let proc = Path::new("/proc").join(&pid);
    let split = |bytes: Vec<u8>| -> Vec<String> {
        bytes
            .split(|b| *b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect()
    };
    let argv = split(std::fs::read(proc.join("cmdline")).context("reading its command line")?);
    let environ = split(std::fs::read(proc.join("environ")).context("reading its environment")?);
    let cwd = std::fs::read_link(proc.join("cwd")).context("reading its working directory")?;
    ensure!(
        !argv.is_empty(),
        "{name} (pid {pid}): an empty command line"
    );
    run(Command::new("kill").arg(&pid))?;
    if !wait_gone(&proc, Duration::from_secs(75)) {
        run(Command::new("kill").args(["-9", &pid]))?;
        if !wait_gone(&proc, Duration::from_secs(15)) {
            bail!("{name} (pid {pid}) did not stop, even after SIGKILL");
        }
    }
    Ok(Stopped {
        name: name.to_owned(),
        pid,
        argv,
        environ,
        cwd,
    })
}

impl Stopped {
    /// The same process without the command-line flag `flag` and the value after it, to
    /// start it again with that setting at its default.
    #[must_use]
    pub fn without_flag(mut self, flag: &str) -> Self {
        if let Some(at) = self.argv.iter().position(|a| a == flag) {
            let end = (at + 2).min(self.argv.len());
            self.argv.drain(at..end);
        }
        self
    }
}

/// Starts a process [`stop_process`] stopped, as it ran; returns its new PID.
pub fn start_process(stopped: &Stopped) -> Result<u32> {
    let Stopped {
        name,
        argv,
        environ,
        cwd,
        ..
    } = stopped;
    let state = state_dir();
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(state.join(format!("logs/{name}.log")))?;
    let (program, args) = argv.split_first().context("an empty command line")?;
    let mut command = Command::new(program);
    command
        .args(args)
        .env_clear()
        .envs(environ.iter().filter_map(|kv| kv.split_once('=')))
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let child = command
        .spawn()
        .with_context(|| format!("starting {name} again"))?;
    std::fs::write(
        state.join(format!("pids/{name}.pid")),
        format!("{}\n", child.id()),
    )?;
    Ok(child.id())
}

/// Whether the process at `proc` exits within `limit`. A zombie has exited: a process this
/// run restarted earlier is its child, and nothing reaps it.
fn wait_gone(proc: &Path, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        let gone = match std::fs::read_to_string(proc.join("stat")) {
            // The state follows the command name, which is in parentheses.
            Ok(stat) => stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
            Err(_) => true,
        };
        if gone {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Deletes the device plugin pod on `node`; `None` when there is none.
async fn delete_device_plugin(client: &Client, node: &str) -> Result<Option<String>> {
    let Some(pod) = noise::device_plugin_pod(client, node).await? else {
        return Ok(None);
    };
    let pods = Api::<Pod>::namespaced(client.clone(), RELEASE_NS);
    let name = pod.name_any();
    pods.delete(&name, &DeleteParams::default()).await?;
    Ok(Some(format!("device plugin pod {name} on {node} deleted")))
}

/// Marks the first GPU of node 1's fake GPU file unhealthy, or every GPU healthy again.
fn set_gpu_healthy(healthy: bool) -> Result<String> {
    let path = state_dir().join("fake-gpus/fake-gpus.yaml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let text = if healthy {
        text.replace("healthy: false", "healthy: true")
    } else {
        text.replacen("healthy: true", "healthy: false", 1)
    };
    let tmp = path.with_extension("chaos.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, &path)?;
    Ok(if healthy {
        "every GPU of node 1 healthy".to_owned()
    } else {
        "GPU 0 of node 1 unhealthy".to_owned()
    })
}

/// The job's running workers; while a restart is under way (none runs), waits up to 90 s for
/// the next attempt's, so that a fault aimed at a worker is injected rather than skipped.
async fn running_workers(target: &Target) -> Result<Vec<Pod>> {
    let lp = ListParams::default().labels(&format!("{LABEL_JOB}={}", target.job));
    let pods = Api::<Pod>::namespaced(target.client.clone(), &target.namespace);
    let running = || async {
        let running: Vec<Pod> = pods
            .list(&lp)
            .await?
            .items
            .into_iter()
            .filter(|p| {
                p.metadata.deletion_timestamp.is_none()
                    && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            })
            .collect();
        Ok((!running.is_empty()).then_some(running))
    };
    let waited = crate::wait_for("a running worker", Duration::from_secs(90), running).await;
    Ok(waited.unwrap_or_default())
}

/// Sets the milliseconds `trainyard-api-delay` holds the pods' API traffic back
/// (`e2e/cluster/up.sh`; it reads the file every 200 ms).
pub fn set_api_delay(ms: u64) -> Result<()> {
    let file = state_dir().join("api-delay-ms");
    std::fs::write(&file, format!("{ms}\n")).with_context(|| format!("writing {}", file.display()))
}

/// Deletes a running worker pod as a user would (what was done); None when none runs.
async fn delete_a_worker(target: &Target, pick: &mut fastrand::Rng) -> Result<Option<String>> {
    let pods = running_workers(target).await?;
    let Some(pod) = pick.choice(&pods) else {
        return Ok(None);
    };
    let name = pod.name_any();
    Api::<Pod>::namespaced(target.client.clone(), &target.namespace)
        .delete(&name, &DeleteParams::default())
        .await
        .with_context(|| format!("deleting worker pod {name}"))?;
    Ok(Some(format!("worker pod {name} deleted")))
}

/// How many connections a flood holds open: four times the device plugin metrics port's cap
/// (64), four times the progress port's per-source share (64 of 2,048).
const FLOOD_CONNECTIONS: usize = 256;
/// The source address of the device plugin metrics flood: the host's end of node 2's link
/// (`NODE2_HOST_IP` in e2e/cluster/env.sh), which neither kubelet probes from (each probes
/// from its own node's bridge).
pub const FLOOD_SOURCE: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 91, 0, 1);

/// Where the leader serves the progress endpoint: the address of the progress Endpoints.
async fn progress_endpoint(client: &Client) -> Result<Option<std::net::SocketAddr>> {
    use k8s_openapi::api::core::v1::Endpoints;
    let all = Api::<Endpoints>::namespaced(client.clone(), RELEASE_NS)
        .list(&ListParams::default())
        .await?;
    let Some(eps) = all
        .items
        .into_iter()
        .find(|e| e.name_any().ends_with("-progress"))
    else {
        return Ok(None);
    };
    let subset = eps.subsets.unwrap_or_default().into_iter().next();
    let Some(subset) = subset else {
        return Ok(None);
    };
    let ip = subset
        .addresses
        .unwrap_or_default()
        .into_iter()
        .next()
        .map(|a| a.ip);
    let port = subset
        .ports
        .unwrap_or_default()
        .into_iter()
        .next()
        .map(|p| p.port);
    let (Some(ip), Some(port)) = (ip, port) else {
        return Ok(None);
    };
    let port = u16::try_from(port).context("the progress port")?;
    Ok(Some(std::net::SocketAddr::new(
        ip.parse().context("the progress address")?,
        port,
    )))
}

/// How long a flooding connection the server closed waits before it dials again. Those past
/// a cap are closed at accept, so this sets the dial rate of the flood: 5 a second each, what
/// a misbehaving client's retry loop does. Faster would measure how many dials this machine's
/// CPUs can make, not whether the listener keeps its shares.
const REDIAL: Duration = Duration::from_millis(200);

/// Holds `n` connections open to `addr`, each sending nothing and opened again [`REDIAL`]
/// after the server closes it, until the task is aborted (which ends every connection).
pub async fn hold_connections(
    from: Option<std::net::Ipv4Addr>,
    addr: std::net::SocketAddr,
    n: usize,
) {
    let connect = move || async move {
        let socket = tokio::net::TcpSocket::new_v4()?;
        if let Some(from) = from {
            socket.bind(std::net::SocketAddr::from((from, 0)))?;
        }
        socket.connect(addr).await
    };
    let mut held = tokio::task::JoinSet::new();
    for _ in 0..n {
        held.spawn(async move {
            loop {
                if let Ok(mut stream) = connect().await {
                    let mut buf = [0_u8; 512];
                    while let Ok(read) = tokio::io::AsyncReadExt::read(&mut stream, &mut buf).await
                    {
                        if read == 0 {
                            break;
                        }
                    }
                }
                tokio::time::sleep(REDIAL).await;
            }
        });
    }
    while held.join_next().await.is_some() {}
}

/// A fault on a harness process: a restart, or a stop until the fault is undone (then the
/// stopped process comes back with it).
async fn process_fault(target: &Target, kind: FaultKind) -> Result<(String, Option<Stopped>)> {
    let what = match kind {
        FaultKind::RestartApiServer | FaultKind::RestartEtcd => {
            let name = if kind == FaultKind::RestartEtcd {
                "etcd"
            } else {
                "kube-apiserver"
            };
            let what = blocking(move || restart_process(name)).await?;
            api_serving(&target.client).await?;
            what
        }
        FaultKind::RestartKubelet => blocking(|| restart_process("kubelet")).await?,
        FaultKind::KubeletsRestart => {
            let node1 = blocking(|| restart_process("kubelet"));
            let node2 = blocking(|| node2("restart-kubelet"));
            let (node1, node2) = tokio::join!(node1, node2);
            node2?;
            format!("{}, and node 2's kubelet at the same time", node1?)
        }
        FaultKind::DnsOutage => {
            let dns = blocking(|| stop_process("dnsmasq")).await?;
            let what = format!("cluster DNS (dnsmasq, pid {}) stopped", dns.pid);
            return Ok((what, Some(dns)));
        }
        other => bail!("{other} is not a fault on a harness process"),
    };
    Ok((what, None))
}

/// Kills the training process of a running worker (what was done), or says why it could not
/// (the fault is then skipped).
async fn fail_a_trainer(
    target: &Target,
    pick: &mut fastrand::Rng,
) -> Result<std::result::Result<String, String>> {
    let pods = running_workers(target).await?;
    let Some(pod) = pick.choice(&pods) else {
        return Ok(Err("no running worker to fail".to_owned()));
    };
    let (name, job) = (pod.name_any(), target.job.clone());
    let labels = pod.labels().clone();
    let label = |key: &str| labels.get(key).cloned().unwrap_or_default();
    let (rank, attempt) = (label(LABEL_RANK), label(LABEL_ATTEMPT));
    let found = blocking(move || kill_training_process(&job, &rank, &attempt)).await?;
    Ok(match found {
        Some(pid) => Ok(format!(
            "training process {pid} of {name} killed (SIGKILL): its trainer exits 1"
        )),
        None => Err(format!("no training process of {name} within 60 s")),
    })
}

/// Cuts `ip` off from the API server through `trainyard-api-delay` (its `.blocked` file), or
/// lets every source through again.
pub fn set_api_blocked(ip: Option<&str>) -> Result<()> {
    let file = state_dir().join("api-delay-ms.blocked");
    match ip {
        Some(ip) => std::fs::write(&file, format!("{ip}\n")),
        None => match std::fs::remove_file(&file) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            done => done,
        },
    }
    .with_context(|| format!("writing {}", file.display()))
}

/// A node's InternalIP.
async fn node_ip(client: &Client, name: &str) -> Result<String> {
    let node = Api::<Node>::all(client.clone()).get(name).await?;
    let addresses = node.status.and_then(|s| s.addresses).unwrap_or_default();
    addresses
        .into_iter()
        .find(|a| a.type_ == "InternalIP")
        .map(|a| a.address)
        .with_context(|| format!("node {name} has no InternalIP"))
}

/// The training process (a torchrun worker: it has `LOCAL_RANK`) of rank `rank`, attempt
/// `attempt`, of the job `job`, found by its environment in `/proc` (the local cluster's
/// containers run on this machine) and killed with SIGKILL, as the kernel's OOM killer kills
/// a worker; torchrun then exits 1. Looks for up to 60 s (the worker may still be starting);
/// None when there was none.
pub fn kill_training_process(job: &str, rank: &str, attempt: &str) -> Result<Option<String>> {
    let wanted = [
        format!("{}={job}", trainyard_api::env::TRAINYARD_JOB),
        format!("{}={rank}", trainyard_api::env::NODE_RANK),
        format!("{}={attempt}", trainyard_api::env::TRAINYARD_ATTEMPT),
    ];
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(60) {
        for entry in std::fs::read_dir("/proc")
            .context("listing /proc")?
            .flatten()
        {
            let pid = entry.file_name().to_string_lossy().into_owned();
            if !pid.bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            // A process that ends meanwhile, or is not readable, is not ours.
            let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
                continue;
            };
            let vars: Vec<&[u8]> = environ.split(|b| *b == 0).collect();
            let has = |v: &str| vars.contains(&v.as_bytes());
            let worker = vars.iter().any(|v| v.starts_with(b"LOCAL_RANK="));
            if worker && wanted.iter().all(|w| has(w)) {
                run(Command::new("kill").args(["-9", &pid]))?;
                return Ok(Some(pid));
            }
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    Ok(None)
}

/// Adds or removes Karpenter's termination taint, keeping every other taint of the node.
///
/// The taints are written with the node's resourceVersion (so no other taint is lost), and a
/// kubelet updates its node all the time, most of all right after a control-plane restart: a
/// conflict is read again and retried, as `kubectl taint` does.
async fn set_termination_taint(client: &Client, node: &str, on: bool) -> Result<()> {
    let nodes = Api::<Node>::all(client.clone());
    let mut conflicts = 0;
    loop {
        let current = nodes.get(node).await?;
        let patch = json!({
            "metadata": {"resourceVersion": current.metadata.resource_version},
            "spec": {"taints": with_termination_taint(current.spec.and_then(|s| s.taints), on)?},
        });
        match nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Err(kube::Error::Api(e)) if e.code == 409 && conflicts < TAINT_CONFLICTS => {
                conflicts += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            written => {
                written.with_context(|| {
                    format!("setting the termination taint on {node} to {on} ({conflicts} conflicts retried)")
                })?;
                return Ok(());
            }
        }
    }
}

/// Conflicts a taint write retries before it gives up.
const TAINT_CONFLICTS: u32 = 20;

/// `taints` with Karpenter's termination taint on or off, every other taint kept.
fn with_termination_taint(taints: Option<Vec<Taint>>, on: bool) -> Result<Vec<Taint>> {
    let mut taints: Vec<Taint> = taints
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.key != KARPENTER_DISRUPTED)
        .collect();
    if on {
        taints.push(serde_json::from_value(json!({
            "key": KARPENTER_DISRUPTED, "effect": "NoSchedule"
        }))?);
    }
    Ok(taints)
}

async fn set_suspend(target: &Target, suspend: bool) -> Result<()> {
    let patch = json!({"spec": {"suspend": suspend}});
    tj_api(&target.client, &target.namespace)
        .patch(&target.job, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("setting suspend={suspend} on {}", target.job))?;
    Ok(())
}

fn run(command: &mut Command) -> Result<()> {
    let out = command
        .output()
        .with_context(|| format!("running {command:?}"))?;
    if !out.status.success() {
        bail!(
            "{command:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by seed 6 at 11d3ce4: a control-plane restart counted as over once the API
    /// server answered a read, and the etcd restart after it killed an API server whose
    /// post-start hooks still ran. The restart is over only once `/readyz` says ready.
    #[tokio::test]
    async fn a_control_plane_restart_is_over_when_readyz_says_ready_not_when_reads_answer() {
        let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let recorder = asked.clone();
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let asked = recorder.clone();
            async move {
                let path = request.uri().path().to_owned();
                let readyz = {
                    let mut asked = asked.lock().expect("log");
                    asked.push(path.clone());
                    asked.iter().filter(|p| *p == "/readyz").count()
                };
                // Reads answer at once; /readyz fails until its third try (hooks still run).
                let code = if path != "/readyz" || readyz >= 3 {
                    200
                } else {
                    500
                };
                let response = http::Response::builder()
                    .status(code)
                    .body(kube::client::Body::from(b"ok".to_vec()))
                    .expect("response");
                Ok::<_, kube::Error>(response)
            }
        });
        let client = Client::new(service, "default");
        api_serving(&client).await.expect("ready on the third try");
        let asked = asked.lock().expect("log").clone();
        assert_eq!(asked, ["/readyz", "/readyz", "/readyz"], "what was asked");
    }

    #[test]
    fn a_lease_nobody_holds_has_no_leader_to_kill() {
        let lease = |holder: Option<&str>| Lease {
            spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(lease_holder(&lease(Some("operator-a"))), Some("operator-a"));
        assert_eq!(lease_holder(&lease(None)), None);
        assert_eq!(lease_holder(&lease(Some(""))), None, "a released Lease");
        assert_eq!(lease_holder(&Lease::default()), None);
    }

    fn taint(key: &str) -> Taint {
        Taint {
            key: key.to_owned(),
            effect: "NoSchedule".to_owned(),
            ..Taint::default()
        }
    }

    #[test]
    fn the_termination_taint_goes_on_and_off_and_other_taints_stay() {
        let other = taint("node.kubernetes.io/unschedulable");
        let on = with_termination_taint(Some(vec![other.clone()]), true).expect("on");
        assert_eq!(on, vec![other.clone(), taint(KARPENTER_DISRUPTED)]);
        let again = with_termination_taint(Some(on.clone()), true).expect("on again");
        assert_eq!(again, on, "never two termination taints");
        let off = with_termination_taint(Some(on), false).expect("off");
        assert_eq!(off, vec![other]);
        assert_eq!(with_termination_taint(None, false).expect("none"), []);
    }
}
