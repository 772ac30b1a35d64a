//! What the scenarios share: the chart installed once with 8 fake GPUs on node 1, the jobs'
//! namespace, TrainingJobs created and waited on, their pods, Events and final digests, and
//! the spot node made schedulable for a two-node scenario.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ContainerStatus, Node, PersistentVolumeClaim, Pod};
use kube::api::{Api, ListParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use trainyard_api::crd::{DEFAULT_GPU_RESOURCE, LABEL_ATTEMPT, LABEL_JOB, LABEL_RANK};

use crate::{
    allocatable, node_name, node2, node2_name, pod_log, repo_root, set_schedulable, state_dir,
    wait_for,
};

/// The chart's Helm release and its namespace.
pub const RELEASE: &str = "trainyard";
pub const RELEASE_NS: &str = "trainyard-system";
/// The chart's operator watches only this namespace here, so it never
/// competes with the in-process operators of other cluster tests.
pub const JOBS_NS: &str = "trainyard-e2e";
/// The GPU resource the fake GPUs are advertised as.
pub const GPU: &str = DEFAULT_GPU_RESOURCE;

pub fn fake_gpu_file() -> PathBuf {
    state_dir().join("fake-gpus/fake-gpus.yaml")
}

pub fn fake_gpus_8() -> Result<String> {
    let p = repo_root().join("device-plugin/examples/fake-gpus-8.yaml");
    std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))
}

/// Writes the fake GPU file atomically (the plugin must never see half a file).
pub fn write_fake_gpus(content: &str) -> Result<()> {
    let path = fake_gpu_file();
    let dir = path.parent().context("fake GPU file has no parent")?;
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(".fake-gpus.yaml.tmp");
    std::fs::write(&tmp, content)?;
    std::fs::rename(&tmp, &path)?;
    Ok(())
}

/// Installs the CRD `crd` unless it is there, and waits until it is served.
pub async fn ensure_crd(
    client: &Client,
    crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> Result<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    let name = crd.name_any();
    if crds.get_opt(&name).await?.is_none() {
        crds.create(&PostParams::default(), &crd).await?;
    }
    wait_for(
        &format!("CRD {name} established"),
        Duration::from_secs(60),
        || async {
            let crd = crds.get(&name).await?;
            let established = crd
                .status
                .iter()
                .flat_map(|s| s.conditions.iter().flatten())
                .any(|c| c.type_ == "Established" && c.status == "True");
            Ok(established.then_some(()))
        },
    )
    .await
}

/// Kueue's Workload and ResourceFlavor CRDs, from the types the operator writes: no Kueue
/// controller can run on the local cluster (Go, and a newer Kubernetes), so the scenarios play
/// its part against the real API server. Installed before the operator starts, which looks
/// for Kueue once.
pub async fn install_kueue_crds(client: &Client) -> Result<()> {
    use kube::CustomResourceExt;
    use trainyard_operator::surface::kueue::{ResourceFlavor, Workload};
    ensure_crd(client, Workload::crd()).await?;
    ensure_crd(client, ResourceFlavor::crd()).await
}

/// `helm install` or `helm upgrade` of the scenarios' release: `e2e/values-local.yaml`, the
/// operator watching the jobs' namespace, and the top-level values of `extra` (other than
/// `operator`, which this sets) beside it; Helm merges the lot over the values file.
pub fn chart_release(action: &str, extra: Value) -> Result<String> {
    let chart = repo_root().join("charts/trainyard");
    let values = repo_root().join("e2e/values-local.yaml");
    // TRAINYARD_DEFAULT_TIMERS=1 (with e2e/cluster/up.sh's): the operator at its default
    // NotReady timeout, to measure a loss as production sees it.
    let mut operator = json!({"watchNamespace": JOBS_NS});
    if std::env::var_os("TRAINYARD_DEFAULT_TIMERS").is_some() {
        operator["config"] = json!({"nodeNotReadyTimeoutSeconds": 60});
    }
    // TRAINYARD_E2E_OPERATOR_LOG: the operator's tracing filter (RUST_LOG), to look closer.
    if let Ok(filter) = std::env::var("TRAINYARD_E2E_OPERATOR_LOG") {
        operator["logLevel"] = json!(filter);
    }
    let mut set = json!({ "operator": operator });
    if let (Some(set), Some(extra)) = (set.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            set.insert(k.clone(), v.clone());
        }
    }
    crate::helm(&[
        action,
        RELEASE,
        chart.to_str().context("chart path is not UTF-8")?,
        RELEASE_NS,
        "--values",
        values.to_str().context("values path is not UTF-8")?,
        "--set-json",
        &set.to_string(),
    ])
}

pub async fn install_chart(client: &Client) -> Result<()> {
    install_kueue_crds(client).await?;
    write_fake_gpus(&fake_gpus_8()?)?;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), RELEASE_NS);
    let already = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .get_opt(RELEASE_NS)
        .await?
        .is_some()
        && !deployments
            .list(&ListParams::default())
            .await?
            .items
            .is_empty();
    // Before the chart: its Role for the watched namespace goes there.
    let ns: k8s_openapi::api::core::v1::Namespace = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": JOBS_NS}
    }))?;
    let namespaces = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone());
    if namespaces.get_opt(JOBS_NS).await?.is_none() {
        namespaces.create(&PostParams::default(), &ns).await?;
    }
    if !already {
        chart_release("install", json!({}))?;
    }
    wait_for(
        "the operator Deployment to be Available with 2 ready replicas",
        Duration::from_secs(180),
        || {
            let deployments = deployments.clone();
            async move {
                for d in deployments.list(&ListParams::default()).await?.items {
                    if d.name_any().contains("operator") {
                        let ready = d
                            .status
                            .as_ref()
                            .and_then(|s| s.ready_replicas)
                            .unwrap_or(0);
                        return Ok((ready >= 2).then_some(()));
                    }
                }
                Ok(None)
            }
        },
    )
    .await?;
    let node = node_name();
    wait_for(
        "node allocatable nvidia.com/gpu = 8",
        Duration::from_secs(120),
        || {
            let (client, node) = (client.clone(), node.clone());
            async move { Ok((allocatable(&client, &node, GPU).await? == Some(8)).then_some(())) }
        },
    )
    .await?;
    Ok(())
}

/// The scenarios' namespace, and the jobs a scenario created in it (deleted,
/// with their checkpoint PVCs, by [`Jobs::cleanup`]).
pub struct Jobs {
    pub name: String,
    pub client: Client,
}

impl Jobs {
    pub fn new(client: &Client) -> Self {
        Self {
            name: JOBS_NS.to_owned(),
            client: client.clone(),
        }
    }

    /// Deletes every job of the namespace and their checkpoint PVCs, and waits until their
    /// pods are gone: a pod still stopping holds its GPUs, and the next scenario's pods, bound
    /// to a node by hand, would be refused by its kubelet (`UnexpectedAdmissionError`).
    pub async fn cleanup(self) -> Result<()> {
        let dp = kube::api::DeleteParams::default();
        let lp = ListParams::default();
        tj_api(&self.client, &self.name)
            .delete_collection(&dp, &lp)
            .await?;
        Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), &self.name)
            .delete_collection(&dp, &lp)
            .await?;
        let pods = Api::<Pod>::namespaced(self.client.clone(), &self.name);
        let of_jobs = ListParams::default().labels(LABEL_JOB);
        wait_for(
            &format!("the pods of the jobs in {} gone", self.name),
            Duration::from_secs(180),
            || async {
                let left = pods.list(&of_jobs).await?;
                Ok(left.items.is_empty().then_some(()))
            },
        )
        .await
    }
}

pub fn tj_api(client: &Client, ns: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("trainyard.dev", "v1alpha1", "TrainingJob");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "trainingjobs");
    Api::namespaced_with(client.clone(), ns, &ar)
}

pub async fn create_job(client: &Client, ns: &str, job: Value) -> Result<()> {
    let obj: DynamicObject = serde_json::from_value(job)?;
    tj_api(client, ns)
        .create(&PostParams::default(), &obj)
        .await
        .context("creating the TrainingJob")?;
    Ok(())
}

pub async fn job_status(client: &Client, ns: &str, name: &str) -> Result<Value> {
    let obj = tj_api(client, ns).get(name).await?;
    Ok(obj.data.get("status").cloned().unwrap_or(Value::Null))
}

pub async fn wait_phase(
    client: &Client,
    ns: &str,
    name: &str,
    phase: &str,
    timeout: Duration,
) -> Result<Value> {
    wait_for(
        &format!("TrainingJob {ns}/{name} to reach phase {phase}"),
        timeout,
        || async move {
            let st = job_status(client, ns, name).await?;
            let now = st.get("phase").and_then(Value::as_str).unwrap_or("");
            if now == phase {
                return Ok(Some(st));
            }
            if matches!(now, "Failed" | "Succeeded") {
                bail!("job ended in phase {now}, wanted {phase}: {st}");
            }
            Ok(None)
        },
    )
    .await
}

pub async fn job_pods(client: &Client, ns: &str, job: &str) -> Result<Vec<Pod>> {
    let lp = ListParams::default().labels(&format!("{LABEL_JOB}={job}"));
    Ok(Api::<Pod>::namespaced(client.clone(), ns)
        .list(&lp)
        .await?
        .items)
}

pub async fn running_pods(
    client: &Client,
    ns: &str,
    job: &str,
    attempt: u32,
    n: usize,
) -> Result<Vec<Pod>> {
    wait_for(
        &format!("{n} running pods of {job} attempt {attempt}"),
        Duration::from_secs(120),
        || async move {
            let pods: Vec<Pod> = job_pods(client, ns, job)
                .await?
                .into_iter()
                .filter(|p| {
                    p.labels().get(LABEL_ATTEMPT).map(String::as_str) == Some(&attempt.to_string())
                        && p.metadata.deletion_timestamp.is_none()
                        && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                })
                .collect();
            Ok((pods.len() == n).then_some(pods))
        },
    )
    .await
}

/// Runs `body` with the spot node schedulable; afterwards (also on failure) the spot node is
/// running and Ready again and cordoned, as the other scenarios expect it.
pub async fn with_spot_node<F, Fut>(client: &Client, body: F) -> Result<()>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let spot = node2_name();
    set_schedulable(client, &spot, true).await?;
    // After an earlier scenario lost and restarted node 2, its kubelet is Ready before the
    // device plugin pod there has re-registered: wait for both GPUs.
    let res = match spot_node_ready_with_gpus(client, &spot).await {
        Ok(()) => body().await,
        Err(e) => Err(e),
    };
    // Cordon first, so nothing lands on the spot node while it comes back; both always run.
    let cordoned = set_schedulable(client, &spot, false).await;
    let started = node2("start");
    res.and(cordoned).and(started)
}

/// Waits until `node` is Ready and advertises its two fake GPUs.
pub async fn spot_node_ready_with_gpus(client: &Client, node: &str) -> Result<()> {
    wait_for(
        &format!("{node} Ready with 2 allocatable {GPU}"),
        Duration::from_secs(180),
        || async move {
            let n = Api::<Node>::all(client.clone()).get(node).await?;
            let ready = n
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            let gpus = allocatable(client, node, GPU).await?;
            Ok((ready && gpus == Some(2)).then_some(()))
        },
    )
    .await
}

/// Sets `vars` in the environment of `job`'s trainer container, replacing any of the same
/// names.
pub fn set_env(job: &mut Value, vars: &[(&str, &str)]) {
    let env = &mut job["spec"]["template"]["spec"]["containers"][0]["env"];
    if let Some(env) = env.as_array_mut() {
        env.retain(|e| !vars.iter().any(|(k, _)| e["name"] == *k));
        env.extend(vars.iter().map(|(k, v)| json!({"name": k, "value": v})));
    }
}

/// `job` restarts by creating every pod again (`restartPolicy.inPlace: false`): the path the
/// recreate figures of docs/benchmarks.md measure.
pub fn recreating(mut job: Value) -> Value {
    job["spec"]["restartPolicy"]["inPlace"] = json!(false);
    job
}

/// A TrainingJob running `torchrun /app/train.py` under `trainyard_launch.py`, with no flags
/// (the PET_* contract).
pub fn torch_job(name: &str, gpus: u32, steps: u32, step_seconds: &str, spot: Value) -> Value {
    json!({
        "apiVersion": "trainyard.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "workers": 2,
            "gpusPerWorker": gpus,
            "spot": spot,
            "checkpoint": {"size": "1Gi", "accessModes": ["ReadWriteOnce"]},
            "restartPolicy": {"maxFailures": 0, "backoffSeconds": 1},
            "terminationGracePeriodSeconds": 20,
            "template": {"spec": {"containers": [{
                "name": "trainer",
                "image": "trainyard/torch-trainer:dev",
                "imagePullPolicy": "Never",
                "command": ["python3", "/app/trainyard_launch.py", "torchrun", "/app/train.py"],
                "env": [
                    {"name": "TOTAL_STEPS", "value": steps.to_string()},
                    {"name": "CHECKPOINT_EVERY", "value": "5"},
                    {"name": "STEP_SECONDS", "value": step_seconds},
                ],
            }]}},
        },
    })
}

pub fn rank_pod(pods: &[Pod], rank: u32) -> Result<&Pod> {
    pods.iter()
        .find(|p| p.labels().get(LABEL_RANK).map(String::as_str) == Some(&rank.to_string()))
        .with_context(|| format!("no rank {rank} pod"))
}

pub fn node_of(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default()
}

/// The digest rank 0 prints at the end: `final weights sha256 <hex>`.
pub async fn final_digest(client: &Client, ns: &str, job: &str, attempt: u32) -> Result<String> {
    let pods: Vec<Pod> = job_pods(client, ns, job)
        .await?
        .into_iter()
        .filter(|p| p.labels().get(LABEL_ATTEMPT).map(String::as_str) == Some(&attempt.to_string()))
        .collect();
    let log = pod_log(ns, rank_pod(&pods, 0)?, "trainer")?;
    log.lines()
        .find_map(|l| l.split("final weights sha256 ").nth(1))
        .map(|d| d.trim().to_owned())
        .with_context(|| format!("{job} printed no digest; rank 0 log:\n{log}"))
}

/// Events of the namespace whose reason is `reason`, as "object: message".
pub async fn events(client: &Client, ns: &str, reason: &str) -> Result<Vec<String>> {
    events_where(client, ns, reason, |_| true).await
}

/// Events whose reason is `reason` about this very TrainingJob (its UID: the namespace is
/// shared, and keeps Events of earlier jobs, also of one with the same name, for an hour).
pub async fn job_events(client: &Client, ns: &str, job: &str, reason: &str) -> Result<Vec<String>> {
    let uid = tj_api(client, ns)
        .get(job)
        .await?
        .uid()
        .context("the job has no UID")?;
    events_where(client, ns, reason, |o| {
        o.kind.as_deref() == Some("TrainingJob")
            && o.name.as_deref() == Some(job)
            && o.uid.as_deref() == Some(uid.as_str())
    })
    .await
}

pub async fn events_where(
    client: &Client,
    ns: &str,
    reason: &str,
    about: impl Fn(&k8s_openapi::api::core::v1::ObjectReference) -> bool,
) -> Result<Vec<String>> {
    let list = Api::<k8s_openapi::api::core::v1::Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await?;
    Ok(list
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason) && about(&e.involved_object))
        .map(|e| {
            format!(
                "{}: {}",
                e.involved_object.name.unwrap_or_default(),
                e.message.unwrap_or_default()
            )
        })
        .collect())
}

/// How long a restart after a loss took, as a user feels it, each stage measured from the
/// moment of the loss: the operator's decision (`status.lastRestart.time`), the next
/// attempt's pods all running (their trainer containers' start), and its first training step
/// (rank 0's `first step of attempt N` line, timed by the container runtime).
#[derive(Debug, Clone, Copy)]
pub struct RecoveryStages {
    pub decided: f64,
    pub running: f64,
    pub first_step: f64,
}

impl std::fmt::Display for RecoveryStages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "loss -> restart decided {:.1} s -> attempt running {:.1} s -> first step {:.1} s",
            self.decided, self.running, self.first_step
        )
    }
}

/// Measures [`RecoveryStages`] of `job`'s `attempt`, whose `pods` all run, after a loss at
/// `lost_at`, waiting (up to two minutes) for rank 0's first step.
pub async fn recovery_stages(
    client: &Client,
    ns: &str,
    (job, attempt, pods): (&str, u32, &[Pod]),
    lost_at: jiff::Timestamp,
) -> Result<RecoveryStages> {
    let since = |t: jiff::Timestamp| t.duration_since(lost_at).as_secs_f64();
    let decided = restart_decided_at(client, ns, job).await?;
    let mut running = lost_at;
    for pod in pods {
        let started = trainer_started_at(pod)
            .with_context(|| format!("{}: the trainer's start", pod.name_any()))?;
        running = running.max(started);
    }
    let first_step = first_step_at(ns, rank_pod(pods, 0)?, attempt).await?;
    Ok(RecoveryStages {
        decided: since(decided),
        running: since(running),
        first_step: since(first_step),
    })
}

/// When the restart that started `job`'s current attempt was decided
/// (`status.lastRestart.time`, whole seconds).
pub async fn restart_decided_at(client: &Client, ns: &str, job: &str) -> Result<jiff::Timestamp> {
    let st = job_status(client, ns, job).await?;
    st["lastRestart"]["time"]
        .as_str()
        .context("status.lastRestart.time")?
        .parse()
        .context("status.lastRestart.time")
}

/// When `rank0` logged the first step of `attempt` (`first step of attempt N`, which rank 0
/// prints once every rank has trained the step), timed by the container runtime; waits up to
/// two minutes for it.
pub async fn first_step_at(ns: &str, rank0: &Pod, attempt: u32) -> Result<jiff::Timestamp> {
    let text = format!("first step of attempt {attempt}");
    wait_for(&text, Duration::from_secs(120), || {
        let text = text.clone();
        async move { crate::first_log_time(ns, rank0, TRAINER, &text) }
    })
    .await
}

/// The trainer container's name in the operator's pods.
pub const TRAINER: &str = "trainer";

/// The status of `pod`'s trainer container.
pub fn trainer_status(pod: &Pod) -> Option<&ContainerStatus> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == TRAINER)
}

/// When `pod`'s trainer container started the run it is in, while it runs.
pub fn trainer_started_at(pod: &Pod) -> Option<jiff::Timestamp> {
    let running = trainer_status(pod)?.state.as_ref()?.running.as_ref()?;
    Some(running.started_at.as_ref()?.0)
}

/// Whether `pod` has ended: phase `Succeeded` or `Failed`.
pub fn pod_finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// The GPUs `pod`'s containers ask for (their limits of [`GPU`]).
pub fn gpus_asked(pod: &Pod) -> u64 {
    pod.spec
        .iter()
        .flat_map(|s| &s.containers)
        .filter_map(|c| c.resources.as_ref()?.limits.as_ref()?.get(GPU))
        .filter_map(|q| q.0.parse::<u64>().ok())
        .sum()
}

/// The host directory of a claim's hostPath volume, once it is bound: the local cluster's
/// claims are hostPath volumes that both nodes share with this machine, so a test reads (and
/// writes) the files where the trainers do.
pub async fn volume_dir(client: &Client, ns: &str, claim: &str) -> Option<PathBuf> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let volume = claims.get_opt(claim).await.ok()??.spec?.volume_name?;
    let volumes: Api<k8s_openapi::api::core::v1::PersistentVolume> = Api::all(client.clone());
    let path = volumes.get_opt(&volume).await.ok()??.spec?.host_path?.path;
    Some(path.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_env_replaces_a_variable_of_the_same_name_and_adds_the_others() {
        let mut job = torch_job("j", 2, 10, "0", json!({"policy": "Never"}));
        set_env(
            &mut job,
            &[("CHECKPOINT_EVERY", "20"), ("PROGRESS_EVERY_SECONDS", "1")],
        );
        let env = &job["spec"]["template"]["spec"]["containers"][0]["env"];
        let named = |n: &str| -> Vec<Value> {
            env.as_array()
                .into_iter()
                .flatten()
                .filter(|e| e["name"] == n)
                .map(|e| e["value"].clone())
                .collect()
        };
        assert_eq!(named("CHECKPOINT_EVERY"), vec![json!("20")]);
        assert_eq!(named("PROGRESS_EVERY_SECONDS"), vec![json!("1")]);
        assert_eq!(named("TOTAL_STEPS"), vec![json!("10")]);
    }
}
