//! End-to-end scenarios on the local cluster, through the Helm chart.
//!
//! The scenarios share one chart installation, so they take a shared lock and
//! run one at a time in one namespace. Most of them run on node 1 alone: the
//! spot node (node 2) stays cordoned, as `make e2e` leaves it, except in the
//! two-node scenarios at the end, which uncordon it for their duration. Run with
//! `make test`, or against a running cluster:
//! `KUBECONFIG=/var/lib/trainyard-e2e/kubeconfig cargo test -p trainyard-e2e --test scenarios -- --ignored <name>`.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod, Service};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::{Mutex, MutexGuard};
use trainyard_api::crd::{GoodputLedger, LABEL_ATTEMPT, LABEL_RANK};
use trainyard_api::env::{RESUME_FROM, TRAINYARD_FENCE_TOKEN};
use trainyard_api::gpu_labels::{
    LABEL_CUDA_MINOR, LABEL_GPU_COUNT, LABEL_GPU_MEMORY, LABEL_GPU_PRODUCT,
};
use trainyard_api::spot::KARPENTER_CAPACITY_TYPE;
use trainyard_e2e::forged::{self, forged_copy};
use trainyard_e2e::jobs::*;
use trainyard_e2e::ledger_check::{self, Ended, PodTimesRecorder, SizedAttempt};
use trainyard_e2e::{
    PodTimeline, allocatable, capacity, node_name, node2, node2_name, pod_log, preempt_pod,
    processes_with_env, set_schedulable, wait_for,
};

static SERIAL: Mutex<bool> = Mutex::const_new(false);

/// Takes the scenario lock and makes sure the chart is installed and serving
/// 8 fake GPUs (installing it on first use).
async fn installed() -> Result<(MutexGuard<'static, bool>, Client)> {
    let mut guard = SERIAL.lock().await;
    let client = trainyard_e2e::client().await?;
    if !*guard {
        install_chart(&client).await?;
        *guard = true;
    }
    Ok((guard, client))
}

/// A busybox trainer: rank 0 writes the step to $CHECKPOINT_PATH every
/// second (temp file + rename); every rank resumes from $RESUME_FROM.
fn counting_trainer(steps: u32) -> String {
    format!(
        r#"step=0
if [ -n "$RESUME_FROM" ] && [ -f "$RESUME_FROM" ]; then step=$(cat "$RESUME_FROM"); echo "resumed from step $step"; fi
echo "start rank=$NODE_RANK attempt=$TRAINYARD_ATTEMPT reason=$TRAINYARD_RESTART_REASON gpus=$NVIDIA_VISIBLE_DEVICES world=$WORLD_SIZE master=$MASTER_ADDR:$MASTER_PORT"
trap 'echo "SIGTERM at step $step"; exit 143' TERM
while [ "$step" -lt {steps} ]; do
  step=$((step+1))
  if [ "$NODE_RANK" = 0 ]; then echo "$step" > "$CHECKPOINT_DIR/.latest.tmp" && mv "$CHECKPOINT_DIR/.latest.tmp" "$CHECKPOINT_PATH"; fi
  sleep 1 & wait $!
done
echo "done at step $step""#
    )
}

fn job_manifest(name: &str, workers: u32, gpus: u32, script: &str, extra_spec: Value) -> Value {
    let mut spec = json!({
        "workers": workers,
        "gpusPerWorker": gpus,
        "checkpoint": {"size": "1Gi", "accessModes": ["ReadWriteOnce"]},
        "terminationGracePeriodSeconds": 5,
        "template": {"spec": {"containers": [{
            "name": "trainer",
            "image": "trainyard/trainer:dev",
            "imagePullPolicy": "Never",
            "command": ["sh", "-c", script],
        }]}},
    });
    if let (Some(base), Some(extra)) = (spec.as_object_mut(), extra_spec.as_object()) {
        for (k, v) in extra {
            base.insert(k.clone(), v.clone());
        }
    }
    json!({
        "apiVersion": "trainyard.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": spec,
    })
}

fn visible_gpus(log: &str) -> Result<BTreeSet<String>> {
    let line = log
        .lines()
        .find(|l| l.starts_with("start "))
        .context("trainer printed no start line")?;
    let gpus = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("gpus="))
        .context("start line has no gpus=")?;
    Ok(gpus
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect())
}

#[tokio::test]
#[ignore = "needs the local cluster (make test)"]
async fn helm_install_makes_operator_ready_and_node_advertises_8_gpus() -> Result<()> {
    let (_guard, client) = installed().await?;
    let node = node_name();
    assert_eq!(
        capacity(&client, &node, GPU).await?,
        Some(8),
        "capacity from the 8-GPU fake file"
    );
    assert_eq!(allocatable(&client, &node, GPU).await?, Some(8));
    let n = Api::<Node>::all(client.clone()).get(&node).await?;
    let labels = n.labels();
    assert_eq!(
        labels.get(LABEL_GPU_PRODUCT).map(String::as_str),
        Some("NVIDIA-A100-SXM4-80GB")
    );
    assert_eq!(labels.get(LABEL_GPU_COUNT).map(String::as_str), Some("8"));
    assert_eq!(
        labels.get(LABEL_GPU_MEMORY).map(String::as_str),
        Some("81920")
    );
    // Exactly one operator replica holds the lease.
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), RELEASE_NS);
    let held: Vec<_> = leases
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|l| {
            l.spec
                .as_ref()
                .and_then(|s| s.holder_identity.as_ref())
                .is_some()
        })
        .collect();
    assert_eq!(held.len(), 1, "one leader lease in {RELEASE_NS}");
    Ok(())
}

#[tokio::test]
#[ignore = "needs the local cluster (make test)"]
async fn preempted_worker_triggers_gang_restart_that_resumes_from_checkpoint() -> Result<()> {
    let (_guard, client) = installed().await?;
    let ns = Jobs::new(&client);
    let name = "resume";
    // It asks for in-place restarts, but its image (busybox) runs no supervisor: the restart
    // recreates every pod, as without `inPlace`, and an Event says so.
    create_job(
        &client,
        &ns.name,
        job_manifest(
            name,
            2,
            2,
            &counting_trainer(25),
            json!({"restartPolicy": {"inPlace": true}}),
        ),
    )
    .await?;

    let pods = running_pods(&client, &ns.name, name, 0, 2).await?;
    // Each worker sees 2 distinct GPUs, and the workers don't share any.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut all = BTreeSet::new();
    for p in &pods {
        let gpus = visible_gpus(&pod_log(&ns.name, p, "trainer")?)?;
        assert_eq!(gpus.len(), 2, "{} sees {:?}", p.name_any(), gpus);
        assert!(
            gpus.iter().all(|g| g.starts_with("GPU-")),
            "UUIDs, got {gpus:?}"
        );
        all.extend(gpus);
    }
    assert_eq!(all.len(), 4, "workers got disjoint GPUs: {all:?}");

    // Let a few steps reach the checkpoint, then preempt worker 1.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let timeline = PodTimeline::start(&client, &ns.name, name).await?;
    preempt_pod(
        &client,
        &ns.name,
        &format!("{name}-worker-1"),
        "TerminationByKubelet",
    )
    .await?;

    let new_pods = running_pods(&client, &ns.name, name, 1, 2).await?;
    let st = job_status(&client, &ns.name, name).await?;
    assert_eq!(st["attempt"], 1, "status: {st}");
    assert_eq!(st["preemptions"], 1, "status: {st}");
    assert_eq!(st["failures"], 0, "status: {st}");
    assert_eq!(st["lastRestart"]["reason"], "Preemption", "status: {st}");
    let detail = st["lastRestart"]["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("DisruptionTarget"),
        "restart detail names the signal: {detail}"
    );
    no_restart_stall(&timeline)?;
    fell_back_for_want_of_a_supervisor(&client, &ns.name, name).await?;

    tokio::time::sleep(Duration::from_secs(2)).await;
    let rank0 = rank_pod(&new_pods, 0).context("attempt 1")?;
    let log = pod_log(&ns.name, rank0, "trainer")?;
    let resumed: u32 = log
        .lines()
        .find_map(|l| l.strip_prefix("resumed from step "))
        .context(format!("attempt 1 did not resume; log:\n{log}"))?
        .trim()
        .parse()?;
    assert!(
        resumed >= 3,
        "resumed from step {resumed}, expected the saved progress (>= 3)"
    );
    assert!(
        log.contains("attempt=1 reason=Preemption"),
        "env contract in log:\n{log}"
    );

    let st = wait_phase(
        &client,
        &ns.name,
        name,
        "Succeeded",
        Duration::from_secs(120),
    )
    .await?;
    assert_eq!(st["preemptions"], 1, "status: {st}");
    assert_eq!(st["failures"], 0, "status: {st}");
    ns.cleanup().await
}

/// The restart of `job`, which asked for in-place restarts in an image without the
/// supervisor, recreated every pod and said why in an `InPlaceFallback` Event.
async fn fell_back_for_want_of_a_supervisor(client: &Client, ns: &str, job: &str) -> Result<()> {
    let fallback = job_events(client, ns, job, "InPlaceFallback").await?;
    ensure!(
        fallback
            .iter()
            .any(|m| m.contains("every pod is created again")
                && m.contains("worker 0: no supervisor polled for this attempt")),
        "{fallback:?}"
    );
    let in_place = job_events(client, ns, job, "RestartingInPlace").await?;
    ensure!(in_place.is_empty(), "{in_place:?}");
    Ok(())
}

#[tokio::test]
#[ignore = "needs the local cluster (make test)"]
async fn always_failing_trainer_uses_failure_budget_with_backoff_then_fails() -> Result<()> {
    let (_guard, client) = installed().await?;
    let ns = Jobs::new(&client);
    let name = "crash";
    let spec =
        json!({"restartPolicy": {"maxFailures": 2, "backoffSeconds": 1, "maxPreemptions": 5}});
    create_job(
        &client,
        &ns.name,
        job_manifest(name, 1, 1, "echo boom; exit 1", spec),
    )
    .await?;
    let st = wait_phase(&client, &ns.name, name, "Failed", Duration::from_secs(150)).await?;
    assert_eq!(
        st["failures"], 3,
        "2 restarts allowed, the 3rd failure ends it: {st}"
    );
    assert_eq!(st["preemptions"], 0, "status: {st}");
    assert_eq!(st["attempt"], 2, "attempts 0, 1 and 2 ran: {st}");
    let failed = st["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Failed"))
        .context(format!("no Failed condition: {st}"))?;
    assert_eq!(failed["status"], "True");
    ns.cleanup().await
}

#[tokio::test]
#[ignore = "needs the local cluster (make test)"]
async fn unhealthy_gpu_drops_allocatable_and_kubelet_restart_restores_registration() -> Result<()> {
    let (_guard, client) = installed().await?;
    let node = node_name();
    let healthy = fake_gpus_8()?;
    // Mark the GPU with index 3 unhealthy (XID 79: fallen off the bus).
    let mut doc: Value = parse_yaml(&healthy)?;
    doc["gpus"][3]["healthy"] = json!(false);
    doc["gpus"][3]["xid"] = json!(79);
    write_fake_gpus(&serde_json::to_string_pretty(&doc)?)?;
    let restore = || write_fake_gpus(&healthy);

    let res = async {
        wait_for(
            "allocatable nvidia.com/gpu = 7",
            Duration::from_secs(60),
            || async { Ok((allocatable(&client, &node, GPU).await? == Some(7)).then_some(())) },
        )
        .await?;
        assert_eq!(
            capacity(&client, &node, GPU).await?,
            Some(8),
            "capacity still counts the sick GPU"
        );
        restore()?;
        wait_for(
            "allocatable back to 8 after recovery",
            Duration::from_secs(120),
            || async { Ok((allocatable(&client, &node, GPU).await? == Some(8)).then_some(())) },
        )
        .await?;

        let plugin_restarts = plugin_restart_count(&client).await?;
        for round in 0..2 {
            trainyard_e2e::restart_kubelet()?;
            wait_for(
                &format!("allocatable 8 after kubelet restart {round}"),
                Duration::from_secs(90),
                || async { Ok((allocatable(&client, &node, GPU).await? == Some(8)).then_some(())) },
            )
            .await?;
        }
        assert_eq!(
            plugin_restart_count(&client).await?,
            plugin_restarts,
            "the plugin re-registered without restarting"
        );
        Ok::<_, anyhow::Error>(())
    }
    .await;
    restore()?;
    res
}

/// Parses a fake GPU file. Writing it back as JSON is fine: JSON is YAML.
fn parse_yaml(yaml: &str) -> Result<Value> {
    serde_saphyr::from_str(yaml).context("parsing the fake GPU file")
}

async fn plugin_restart_count(client: &Client) -> Result<i32> {
    let pods = Api::<Pod>::namespaced(client.clone(), RELEASE_NS)
        .list(&ListParams::default())
        .await?;
    let p = pods
        .items
        .iter()
        .find(|p| p.name_any().contains("device-plugin"))
        .context("no device plugin pod")?;
    Ok(p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map(|cs| cs.iter().map(|c| c.restart_count).sum())
        .unwrap_or(0))
}

/// The device plugin pod of one node, and how often it has registered with a kubelet.
#[derive(Debug, Clone, PartialEq)]
struct PluginRegistrations {
    pod_uid: String,
    /// Container restarts: a restarted plugin starts its counters at 0 again.
    restarts: i32,
    /// `trainyard_device_plugin_registrations_total{result="success"}` from its `/metrics`.
    succeeded: u64,
}

/// Reads the registration counter of `node`'s device plugin through the API server's pod
/// proxy (the port the pod names `metrics`).
async fn plugin_registrations(client: &Client, node: &str) -> Result<PluginRegistrations> {
    let pods = Api::<Pod>::namespaced(client.clone(), RELEASE_NS);
    let pod = pods
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .find(|p| p.name_any().contains("device-plugin") && node_of(p) == node)
        .with_context(|| format!("no device plugin pod on {node}"))?;
    let port = trainyard_e2e::named_port(&pod, "metrics")
        .context("the plugin pod names no metrics port")?;
    let path = format!(
        "/api/v1/namespaces/{RELEASE_NS}/pods/{}:{port}/proxy/metrics",
        pod.name_any()
    );
    let text = client
        .request_text(http::Request::get(&path).body(Vec::new())?)
        .await
        .with_context(|| format!("GET {path}"))?;
    let succeeded = text
        .lines()
        .find_map(|l| {
            l.strip_prefix(r#"trainyard_device_plugin_registrations_total{result="success"} "#)
        })
        .map(|n| n.trim().parse::<u64>())
        .transpose()?
        .unwrap_or(0);
    let restarts = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map(|cs| cs.iter().map(|c| c.restart_count).sum())
        .unwrap_or(0);
    Ok(PluginRegistrations {
        pod_uid: pod.uid().unwrap_or_default(),
        restarts,
        succeeded,
    })
}

#[tokio::test]
#[ignore = "needs the local cluster (make test)"]
async fn spot_require_lands_on_spot_node_then_falls_back_to_on_demand() -> Result<()> {
    let (_guard, client) = installed().await?;
    let node = node_name();
    let nodes: Api<Node> = Api::all(client.clone());
    let label = |v: Option<&str>| json!({"metadata": {"labels": {KARPENTER_CAPACITY_TYPE: v}}});
    nodes
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(label(Some("spot"))),
        )
        .await?;
    let ns = Jobs::new(&client);
    let res = async {
        let name = "spotty";
        let spec = json!({"spot": {"policy": "Require", "fallbackToOnDemandAfter": 1}});
        create_job(
            &client,
            &ns.name,
            job_manifest(name, 1, 1, "sleep 600", spec),
        )
        .await?;
        let pods = running_pods(&client, &ns.name, name, 0, 1).await?;
        let aff = serde_json::to_value(&pods[0].spec.as_ref().context("pod spec")?.affinity)?;
        let required =
            aff["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"].to_string();
        assert!(
            required.contains(KARPENTER_CAPACITY_TYPE),
            "Require → required spot affinity: {aff}"
        );
        assert_eq!(
            pods[0].spec.as_ref().and_then(|s| s.node_name.as_deref()),
            Some(node.as_str())
        );

        preempt_pod(
            &client,
            &ns.name,
            &format!("{name}-worker-0"),
            "TerminationByKubelet",
        )
        .await?;
        // Attempt 1 avoids spot; the only node is spot, so it stays Pending.
        let p = wait_for("attempt 1 pod", Duration::from_secs(60), || async {
            Ok(job_pods(&client, &ns.name, name)
                .await?
                .into_iter()
                .find(|p| p.labels().get(LABEL_ATTEMPT).map(String::as_str) == Some("1")))
        })
        .await?;
        let aff = serde_json::to_value(&p.spec.as_ref().context("pod spec")?.affinity)?;
        let required =
            aff["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"].to_string();
        assert!(
            required.contains("NotIn") || required.contains("DoesNotExist"),
            "after fallback the pod must avoid spot nodes: {aff}"
        );
        tokio::time::sleep(Duration::from_secs(3)).await;
        let p = Api::<Pod>::namespaced(client.clone(), &ns.name)
            .get(&p.name_any())
            .await?;
        assert_eq!(
            p.spec.as_ref().and_then(|s| s.node_name.clone()),
            None,
            "on-demand pod must not land on the spot node"
        );
        let st = job_status(&client, &ns.name, name).await?;
        assert_eq!(
            st["selectedGpu"]["spot"], false,
            "status says the job left spot: {st}"
        );
        Ok::<_, anyhow::Error>(())
    }
    .await;
    // Back to the harness's label for node 1.
    nodes
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(label(Some("on-demand"))),
        )
        .await?;
    ns.cleanup().await?;
    res
}

fn kubectl(args: &[&str], stdin: &str) -> Result<String> {
    use std::io::Write;
    let mut child = Command::new("kubectl")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("running kubectl (PATH must hold the cluster's kubectl)")?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(stdin.as_bytes())?;
    let out = child.wait_with_output()?;
    ensure!(
        out.status.success(),
        "kubectl {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[tokio::test]
#[ignore = "needs the local cluster (make test)"]
async fn reapplying_manifests_changes_nothing_and_deleting_the_job_cleans_up() -> Result<()> {
    let (_guard, client) = installed().await?;
    let ns = Jobs::new(&client);
    let name = "gitops";
    // `sleep` as the container's PID 1 ignores SIGTERM, so deleting the job takes the whole
    // grace period: 60 s by default, as long as the wait below (it timed out on a loaded CI).
    let spec = json!({"terminationGracePeriodSeconds": 5});
    let manifest = serde_json::to_string(&job_manifest(name, 2, 1, "sleep 600", spec))?;
    kubectl(&["apply", "-n", &ns.name, "-f", "-"], &manifest)?;
    let pods = running_pods(&client, &ns.name, name, 0, 2).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = snapshot(&client, &ns.name, name).await?;
    ensure!(before.1.len() == 2, "pods: {:?}", before.1);

    let out = kubectl(&["apply", "-n", &ns.name, "-f", "-"], &manifest)?;
    assert!(out.contains("unchanged"), "client-side re-apply: {out}");
    kubectl(
        &["apply", "--server-side", "-n", &ns.name, "-f", "-"],
        &manifest,
    )?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = snapshot(&client, &ns.name, name).await?;
    assert_eq!(
        before, after,
        "re-applying the same manifests changed the job, its pods or its service"
    );
    assert_eq!(pods.len(), 2);

    kubectl(
        &["delete", "trainingjob", name, "-n", &ns.name, "--wait=true"],
        "",
    )?;
    // The garbage collector deletes them at once, but the kubelet removes a pod object only
    // once its volumes are torn down: a loaded CI run saw the containers stopped 5 s after
    // the delete and the objects still there 60 s after it. The bound is liveness, not speed.
    let gone = wait_for(
        "pods and service of the deleted job to be gone",
        Duration::from_secs(120),
        || async {
            let pods = job_pods(&client, &ns.name, name).await?;
            let svc = Api::<Service>::namespaced(client.clone(), &ns.name)
                .get_opt(name)
                .await?;
            Ok((pods.is_empty() && svc.is_none()).then_some(()))
        },
    )
    .await;
    if let Err(e) = gone {
        return Err(e.context(leftovers(&client, &ns.name, name).await?));
    }
    let pvc = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns.name)
        .get_opt(&format!("{name}-checkpoints"))
        .await?;
    assert!(
        pvc.is_some(),
        "retainOnDelete (default true) keeps the checkpoint PVC"
    );
    ns.cleanup().await
}

/// What is left of a deleted job: its pods (phase, node, since when deleting) and whether its
/// Service is still there.
async fn leftovers(client: &Client, ns: &str, job: &str) -> Result<String> {
    let pods: Vec<String> = job_pods(client, ns, job)
        .await?
        .iter()
        .map(|p| {
            format!(
                "{} (phase {:?}, node {:?}, deleting since {:?})",
                p.name_any(),
                p.status.as_ref().and_then(|s| s.phase.clone()),
                p.spec.as_ref().and_then(|s| s.node_name.clone()),
                p.metadata
                    .deletion_timestamp
                    .as_ref()
                    .map(|t| t.0.to_string()),
            )
        })
        .collect();
    let service = Api::<Service>::namespaced(client.clone(), ns)
        .get_opt(job)
        .await?
        .is_some();
    Ok(format!(
        "left of job {ns}/{job}: pods {pods:?}; Service {}",
        if service { "still there" } else { "gone" }
    ))
}

/// (job generation, pod name → resourceVersion, service resourceVersion)
async fn snapshot(
    client: &Client,
    ns: &str,
    job: &str,
) -> Result<(i64, Vec<(String, String)>, String)> {
    let tj = tj_api(client, ns).get(job).await?;
    let mut pods: Vec<(String, String)> = job_pods(client, ns, job)
        .await?
        .into_iter()
        .map(|p| (p.name_any(), p.resource_version().unwrap_or_default()))
        .collect();
    pods.sort();
    let svc = Api::<Service>::namespaced(client.clone(), ns)
        .get(job)
        .await?;
    Ok((
        tj.metadata.generation.unwrap_or_default(),
        pods,
        svc.resource_version().unwrap_or_default(),
    ))
}

async fn node_label(client: &Client, key: &str) -> Result<Option<String>> {
    let n = Api::<Node>::all(client.clone()).get(&node_name()).await?;
    Ok(n.labels().get(key).cloned())
}

/// The labels NVIDIA's GPU Feature Discovery gives a node of eight A100-SXM4-80GB under
/// driver 550.54.15 (CUDA 12.4): what the operator places by in operator-only mode.
const GFD_LABELS: [(&str, &str); 11] = [
    ("nvidia.com/gpu.present", "true"),
    (LABEL_GPU_PRODUCT, "NVIDIA-A100-SXM4-80GB"),
    (LABEL_GPU_MEMORY, "81920"),
    (LABEL_GPU_COUNT, "8"),
    ("nvidia.com/gpu.compute.major", "8"),
    ("nvidia.com/gpu.compute.minor", "0"),
    ("nvidia.com/cuda.driver-version.major", "550"),
    ("nvidia.com/cuda.driver-version.minor", "54"),
    ("nvidia.com/cuda.driver-version.revision", "15"),
    ("nvidia.com/cuda.runtime-version.major", "12"),
    (LABEL_CUDA_MINOR, "4"),
];

/// Node 1's labels under `nvidia.com/`, as a map.
async fn nvidia_labels(client: &Client) -> Result<std::collections::BTreeMap<String, String>> {
    let n = Api::<Node>::all(client.clone()).get(&node_name()).await?;
    Ok(n.labels()
        .iter()
        .filter(|(k, _)| k.starts_with("nvidia.com/"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect())
}

/// Replaces node 1's `nvidia.com/` labels with `labels`.
async fn set_nvidia_labels(client: &Client, labels: &[(&str, &str)]) -> Result<()> {
    let mut patch = serde_json::Map::new();
    for key in nvidia_labels(client).await?.into_keys() {
        patch.insert(key, Value::Null);
    }
    for (k, v) in labels {
        patch.insert((*k).to_owned(), json!(v));
    }
    Api::<Node>::all(client.clone())
        .patch(
            &node_name(),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": patch}})),
        )
        .await?;
    Ok(())
}

/// Another vendor's device plugin for `nvidia.com/gpu` on node 1, run outside the chart (as
/// NVIDIA's DaemonSet would be): trainyard's binary on the harness's fake GPU file, with no
/// node name, so it labels nothing. Stopped by its PID when dropped.
struct OtherDevicePlugin(std::process::Child);

impl OtherDevicePlugin {
    fn start() -> Result<Self> {
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map_or_else(|| trainyard_e2e::repo_root().join("target"), Into::into);
        let kubelet = std::env::var("TRAINYARD_KUBELET_ROOT")
            .unwrap_or_else(|_| "/var/lib/kubelet".to_owned());
        let log =
            std::fs::File::create(trainyard_e2e::state_dir().join("logs/other-device-plugin.log"))?;
        let child = Command::new(target.join("debug/trainyard-device-plugin"))
            .arg("run")
            .arg("--fake-gpus")
            .arg(fake_gpu_file())
            .arg("--device-plugin-dir")
            .arg(format!("{kubelet}/device-plugins"))
            .env_remove("NODE_NAME")
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting the stand-in device plugin")?;
        Ok(Self(child))
    }
}

impl Drop for OtherDevicePlugin {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits until node 1 advertises `gpus` allocatable GPUs.
async fn node1_gpus(client: &Client, gpus: i64) -> Result<()> {
    wait_for(
        &format!("node 1 allocatable {GPU} = {gpus}"),
        Duration::from_secs(120),
        || async move {
            Ok((allocatable(client, &node_name(), GPU).await? == Some(gpus)).then_some(()))
        },
    )
    .await
}

/// Operator-only mode (`devicePlugin.enabled=false`) on a node whose `nvidia.com/gpu` another
/// device plugin advertises and whose GPU facts NVIDIA's GPU Feature Discovery labels: the
/// chart's DaemonSet is gone, a stand-in plugin registers with node 1's kubelet, the node
/// carries GFD's labels only; a job that asks for the product, its memory, CUDA 12.4 and
/// compute 8.0 is placed there, gets its GPUs from that plugin and succeeds. The chart's
/// plugin comes back afterwards.
#[tokio::test]
#[ignore = "needs the local cluster (make test)"]
async fn operator_only_mode_runs_a_job_on_gpus_another_device_plugin_advertises() -> Result<()> {
    let (_guard, client) = installed().await?;
    let ns = Jobs::new(&client);
    let mut other = None;
    let res = async {
        chart_release("upgrade", json!({"devicePlugin": {"enabled": false}}))?;
        let pods = Api::<Pod>::namespaced(client.clone(), RELEASE_NS);
        wait_for(
            "the chart's device plugin pods gone",
            Duration::from_secs(120),
            || {
                let pods = pods.clone();
                async move {
                    let left = pods.list(&ListParams::default()).await?.items;
                    Ok(
                        (!left.iter().any(|p| p.name_any().contains("device-plugin")))
                            .then_some(()),
                    )
                }
            },
        )
        .await?;
        set_nvidia_labels(&client, &GFD_LABELS).await?;
        other = Some(OtherDevicePlugin::start()?);
        node1_gpus(&client, 8).await?;
        let name = "operator-only";
        let gpu = json!({"gpu": {
            "products": ["NVIDIA-A100-SXM4-80GB"], "minMemoryGiB": 80,
            "minCudaVersion": "12.4", "minComputeCapability": "8.0",
        }});
        let job = job_manifest(name, 1, 2, &counting_trainer(3), gpu);
        create_job(&client, &ns.name, job).await?;
        let st = wait_phase(
            &client,
            &ns.name,
            name,
            "Succeeded",
            Duration::from_secs(180),
        )
        .await?;
        ensure!(
            st["selectedGpu"]["product"] == "NVIDIA-A100-SXM4-80GB",
            "pinned to GFD's product: {st}"
        );
        let pod = job_pods(&client, &ns.name, name).await?;
        let pod = pod.first().context("the worker pod")?;
        let log = pod_log(&ns.name, pod, "trainer")?;
        ensure!(
            log.contains("gpus=GPU-"),
            "the other plugin's devices in the pod: {log}"
        );
        // Nothing of trainyard's labelled the node meanwhile.
        let labels = nvidia_labels(&client).await?;
        let gfd: std::collections::BTreeMap<String, String> = GFD_LABELS
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        ensure!(labels == gfd, "node 1's nvidia.com/ labels: {labels:?}");
        Ok(())
    }
    .await;
    drop(other);
    let cleaned = ns.cleanup().await;
    let back = async {
        set_nvidia_labels(&client, &[]).await?;
        chart_release("upgrade", json!({}))?;
        node1_gpus(&client, 8).await?;
        wait_for(
            "the chart's plugin to label node 1 again",
            Duration::from_secs(120),
            || async {
                Ok(nvidia_labels(&client)
                    .await?
                    .contains_key(LABEL_GPU_PRODUCT)
                    .then_some(()))
            },
        )
        .await
    }
    .await;
    res.and(cleaned).and(back)
}

#[tokio::test]
#[ignore = "needs the local cluster (make test)"]
async fn cuda_requirement_waits_for_a_driver_that_supports_it() -> Result<()> {
    let (_guard, client) = installed().await?;
    let healthy = fake_gpus_8()?;
    let with_cuda = |v: &str| -> Result<String> {
        let mut doc = parse_yaml(&healthy)?;
        doc["cudaVersion"] = json!(v);
        Ok(serde_json::to_string_pretty(&doc)?)
    };
    let key = LABEL_CUDA_MINOR;
    let res = async {
        // The plugin relabels the node from the file: the driver now offers CUDA 12.2.
        write_fake_gpus(&with_cuda("12.2")?)?;
        wait_for(
            "the plugin to label the node with CUDA 12.2",
            Duration::from_secs(60),
            || async {
                Ok((node_label(&client, key).await?.as_deref() == Some("2")).then_some(()))
            },
        )
        .await?;

        let ns = Jobs::new(&client);
        let name = "needs-cuda";
        let spec = json!({"gpu": {"minCudaVersion": "12.4"}});
        create_job(
            &client,
            &ns.name,
            job_manifest(name, 1, 1, "sleep 600", spec),
        )
        .await?;
        let cond = condition_true(&client, &ns.name, name, "Unschedulable", |_| true).await?;
        let msg = cond["message"].as_str().unwrap_or_default();
        assert!(msg.contains("12.4"), "message names the requirement: {msg}");
        assert!(
            msg.contains("12.2"),
            "message names what the cluster offers: {msg}"
        );
        tokio::time::sleep(Duration::from_secs(5)).await;
        let running = job_pods(&client, &ns.name, name)
            .await?
            .iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
            .count();
        assert_eq!(running, 0, "no pod may land on a node without CUDA 12.4");

        // A driver upgrade (here: the file) lets the same job run.
        write_fake_gpus(&with_cuda("12.4")?)?;
        running_pods(&client, &ns.name, name, 0, 1).await?;
        let st = job_status(&client, &ns.name, name).await?;
        let unsched = st["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == "Unschedulable").cloned())
            .unwrap_or(Value::Null);
        assert_ne!(
            unsched["status"], "True",
            "Unschedulable cleared once a node qualifies: {st}"
        );
        ns.cleanup().await
    }
    .await;
    write_fake_gpus(&healthy)?;
    res
}

// ---------------------------------------------------------------------------------------------
// Two nodes: node 1 on-demand, node 2 spot (e2e/cluster/node2.sh), and the real PyTorch trainer
// (examples/train.py under torchrun in trainyard/torch-trainer:dev, DDP over gloo on the CPU).

/// Creates the job `manifest()` with `rank` on `spot` and its other worker on `on_demand`,
/// and returns its name. The choice is ours, not the scheduler's: both nodes are cordoned
/// while the operator creates the pods, and the test binds each pod to its node through the
/// `binding` subresource, as the scheduler would. (Leaving it to the scheduler with one
/// node's room for one worker is a race the operator's creation order decides: under load in
/// CI, rank 0 won it twelve times in a row.) Both nodes are schedulable again afterwards.
async fn place_rank_on(
    client: &Client,
    ns: &str,
    (rank, spot): (&str, &str),
    on_demand: &str,
    manifest: impl Fn() -> Value,
) -> Result<String> {
    let job = manifest();
    let name = job["metadata"]["name"]
        .as_str()
        .context("the manifest names its job")?
        .to_owned();
    let workers = usize::try_from(job["spec"]["workers"].as_u64().unwrap_or(1))?;
    set_schedulable(client, spot, false).await?;
    set_schedulable(client, on_demand, false).await?;
    let placed = async {
        create_job(client, ns, job).await?;
        let pods = wait_for(
            &format!("the {workers} workers of {name} created"),
            Duration::from_secs(120),
            || async {
                let pods = job_pods(client, ns, &name).await?;
                Ok((pods.len() == workers).then_some(pods))
            },
        )
        .await?;
        for pod in &pods {
            let node = if pod.labels().get(LABEL_RANK).map(String::as_str) == Some(rank) {
                spot
            } else {
                on_demand
            };
            bind(client, ns, &pod.name_any(), node).await?;
        }
        anyhow::Ok(())
    }
    .await;
    let on_demand_back = set_schedulable(client, on_demand, true).await;
    let spot_back = set_schedulable(client, spot, true).await;
    placed.and(on_demand_back).and(spot_back)?;
    Ok(name)
}

/// Binds pod `name` to `node`, as the scheduler does.
async fn bind(client: &Client, ns: &str, name: &str, node: &str) -> Result<()> {
    let binding = json!({
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    });
    Api::<Pod>::namespaced(client.clone(), ns)
        .create_subresource::<_, Value>("binding", name, &PostParams::default(), &binding)
        .await
        .with_context(|| format!("binding pod {name} to {node}"))?;
    Ok(())
}

/// A gang restart wastes no time between the attempts (issue: a 35 s stall): the stopped pods
/// of attempt 0 leave the API server within 1 s of the watch showing them stopped (the kubelet
/// alone may keep them for tens of seconds), and attempt 1 is created (pod creation timestamps,
/// whole seconds, and the watch's first sight of it) within 1 s of the last of them leaving.
fn no_restart_stall(timeline: &PodTimeline) -> Result<()> {
    let one_second = jiff::SignedDuration::from_secs(1);
    let (pod, stopped_to_gone) = timeline
        .longest_stopped_to_gone(0)
        .context("the watch saw no stopped pod of attempt 0 leave")?;
    let gone = timeline.last_gone(0).context("attempt 0 never left")?;
    let created = timeline
        .first_created(1)
        .context("the watch saw no pod of attempt 1")?;
    let creating = timeline
        .first_seen(1)
        .context("the watch saw no pod of attempt 1")?;
    println!(
        "restart timeline: {pod} stopped→gone {stopped_to_gone:#}; last old pod gone {gone}, \
         first new pod created {created}, seen at {creating}"
    );
    ensure!(
        stopped_to_gone <= one_second,
        "{pod} stayed {stopped_to_gone:#} after it had stopped; timeline: {:?}",
        timeline.events()
    );
    ensure!(
        created.duration_since(gone) <= one_second && creating.duration_since(gone) <= one_second,
        "attempt 1 created at {created} (seen {creating}), the last old pod left at {gone}"
    );
    Ok(())
}

/// Waits (up to 300 s) for `job` to succeed after exactly one preemption and no failure;
/// returns its status.
async fn succeeded_after_one_preemption(client: &Client, ns: &str, job: &str) -> Result<Value> {
    let st = wait_phase(client, ns, job, "Succeeded", Duration::from_secs(300)).await?;
    ensure!(
        st["preemptions"] == 1 && st["failures"] == 0,
        "one preemption and no failure: {st}"
    );
    Ok(st)
}

/// Waits for `baseline` (the same job, never interrupted) to succeed, and checks that `job`,
/// which ended in `attempt`, ends with its final weights: the resumes were exact.
async fn ends_as_its_baseline(
    client: &Client,
    ns: &str,
    job: &str,
    attempt: u32,
    baseline: &str,
) -> Result<()> {
    wait_phase(client, ns, baseline, "Succeeded", Duration::from_secs(300)).await?;
    let interrupted = final_digest(client, ns, job, attempt).await?;
    let expected = final_digest(client, ns, baseline, 0).await?;
    ensure!(
        interrupted == expected,
        "{job} ends with {interrupted}, the uninterrupted run with {expected}"
    );
    Ok(())
}

/// The hard-loss scenarios' trainers checkpoint every 20 steps and report progress every
/// second, so that a loss falls between checkpoints and the operator hears the silence.
const LOSS_ENV: [(&str, &str); 2] = [("CHECKPOINT_EVERY", "20"), ("PROGRESS_EVERY_SECONDS", "1")];

/// How long before a node's loss the ledger may date it, for a job with [`LOSS_ENV`]: at its
/// ranks' last progress report (every second), to the whole second below.
const HEARD_BEFORE_LOSS: Duration = Duration::from_secs(3);

#[expect(
    clippy::too_many_lines,
    reason = "a cluster scenario reads as one story, in the order it happens"
)]
#[tokio::test]
#[ignore = "needs the local cluster (make test)"]
async fn torch_ddp_survives_spot_node_loss() -> Result<()> {
    let (_guard, client) = installed().await?;
    let ns = Jobs::new(&client);
    let res = with_spot_node(&client, || async {
        let (spot, on_demand) = (node2_name(), node_name());
        let steps = 60;
        // Rank 0 (torchrun's rendezvous store) on the spot node: losing it makes the surviving
        // agent on node 1 exit non-zero within seconds, before node 2 is NotReady, which is the
        // case the lost-peer rule must count as a preemption.
        // Checkpoints every 20 steps and progress reports every second, so that the steps
        // lost since the last checkpoint show in the operator's metric.
        // The pods' own timestamps, from before the job exists (a pod replaced while it
        // waits keeps its first creation) and past the gang restart that deletes attempt 0's.
        let pod_times = PodTimesRecorder::start(&client, &ns.name).await?;
        let name = place_rank_on(&client, &ns.name, ("0", &spot), &on_demand, || {
            let mut job = recreating(torch_job(
                "ddp",
                2,
                steps,
                "0.5",
                json!({"policy": "Prefer"}),
            ));
            set_env(&mut job, &LOSS_ENV);
            job
        })
        .await?;
        let name = name.as_str();
        let pods = running_pods(&client, &ns.name, name, 0, 2).await?;
        assert_eq!(node_of(rank_pod(&pods, 1)?), on_demand, "rank 1 on node 1");

        // Lose the spot node once rank 0 has written a periodic checkpoint.
        let rank0 = rank_pod(&pods, 0)?.clone();
        log_says(&ns.name, &rank0, "checkpoint saved at step").await?;
        let (lost_count, lost_sum) = steps_lost_metric(&client).await?;
        // Ten more steps, reported, that no checkpoint holds.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let lost_at = jiff::Timestamp::now();
        node2("lose")?;

        let new_pods = running_pods(&client, &ns.name, name, 1, 2).await?;
        let stages = recovery_stages(&client, &ns.name, (name, 1, &new_pods), lost_at).await?;
        println!("rank 0 lost with its node: {stages}");
        let st = job_status(&client, &ns.name, name).await?;
        assert_eq!(st["preemptions"], 1, "status: {st}");
        assert_eq!(st["failures"], 0, "status: {st}");
        assert_eq!(st["lastRestart"]["reason"], "Preemption", "status: {st}");
        // Decided by the lost-peer rule: rank 1 failed first, rank 0's node was lost under it.
        let detail = st["lastRestart"]["detail"].as_str().unwrap_or_default();
        assert!(
            detail.contains("worker 0 lost with its node") && detail.contains("worker 1 failed"),
            "status: {st}"
        );
        // The same job (same world size) never preempted, on node 1 only (8 GPUs: 4 here, 4
        // for attempt 1), for the digest.
        create_job(
            &client,
            &ns.name,
            torch_job("ddp-baseline", 2, steps, "0", json!({"policy": "Never"})),
        )
        .await?;
        for p in &new_pods {
            assert!(
                env_of(p, RESUME_FROM).is_some_and(|v| !v.is_empty()),
                "{} has RESUME_FROM",
                p.name_any()
            );
            assert_eq!(node_of(p), on_demand, "the spot node is gone");
        }
        let rank0 = rank_pod(&new_pods, 0)?.clone();
        let resumed: u32 = wait_for("rank 0 to resume", Duration::from_secs(120), || {
            let (ns, rank0) = (ns.name.clone(), rank0.clone());
            async move {
                let log = pod_log(&ns, &rank0, "trainer").unwrap_or_default();
                Ok(log
                    .lines()
                    .find_map(|l| l.split("resuming from step ").nth(1))
                    .and_then(|rest| rest.split_whitespace().next())
                    .and_then(|n| n.parse().ok()))
            }
        })
        .await?;
        assert!(resumed > 0, "resumed from step {resumed}");

        let st = succeeded_after_one_preemption(&client, &ns.name, name).await?;
        // Without a notice the steps since the last periodic checkpoint are lost, and the
        // operator's metric says how many.
        let lost = st["progress"]["stepsLost"].as_u64().unwrap_or_default();
        assert!(lost > 0, "steps lost without a notice: {st}");
        let (count, sum) = steps_lost_metric(&client).await?;
        assert_eq!(count, lost_count + 1, "one preemption observed");
        assert_eq!(
            sum - lost_sum,
            lost as f64,
            "the metric counts the same steps"
        );
        // The ledger accounts for every GPU-second of both attempts, within 1 s per pod.
        let ledger: GoodputLedger =
            serde_json::from_value(st["ledger"].clone()).context("status.ledger")?;
        let lost = Ended::NodeLost {
            at: lost_at,
            heard_before: HEARD_BEFORE_LOSS,
        };
        let from_pods = ledger_check::account(&pod_times.pods(name), |node| node == spot, lost)?;
        println!("ledger {ledger:?}\nfrom the pods' timestamps {from_pods:?}");
        ledger_check::check(&ledger, &from_pods)?;
        ends_as_its_baseline(&client, &ns.name, name, 1, "ddp-baseline").await?;
        // MASTER_ADDR (<job>-worker-0.<job>) resolved through the cluster DNS.
        let dns = events(&client, &ns.name, "MissingClusterDNS").await?;
        assert!(dns.is_empty(), "MissingClusterDNS events: {dns:?}");
        Ok(())
    })
    .await;
    ns.cleanup().await?;
    res
}

/// Issue 26, the other case of a hard loss: the spot node under rank 1 is lost, and rank 0
/// (torchrun's rendezvous store) survives on node 1. The operator tells the loss from the
/// kubelet's Lease and rank 1's silent progress reports, or from rank 0's broken collective,
/// and restarts the gang on node 1 without waiting for NotReady; the checkpoint the next
/// attempt resumes from is never older than one saved before the loss, and the run ends
/// bit-exact. With `fallbackToOnDemandAfter: 1` that one preemption moves the job off spot
/// capacity, which the `SpotFallback` Event on the job says.
#[tokio::test]
#[ignore = "needs the local cluster (make test)"]
async fn torch_ddp_survives_losing_the_spot_node_beside_rank_0() -> Result<()> {
    let (_guard, client) = installed().await?;
    let ns = Jobs::new(&client);
    let res = with_spot_node(&client, || async {
        let (spot, on_demand) = (node2_name(), node_name());
        let steps = 60;
        let name = place_rank_on(&client, &ns.name, ("1", &spot), &on_demand, || {
            let spot = json!({"policy": "Prefer", "fallbackToOnDemandAfter": 1});
            let mut job = recreating(torch_job("beside", 2, steps, "0.5", spot));
            set_env(&mut job, &LOSS_ENV);
            job
        })
        .await?;
        let name = name.as_str();
        let pods = running_pods(&client, &ns.name, name, 0, 2).await?;
        let rank0 = rank_pod(&pods, 0)?.clone();
        assert_eq!(node_of(&rank0), on_demand, "rank 0 on node 1");
        let st = job_status(&client, &ns.name, name).await?;
        assert_eq!(st["selectedGpu"]["spot"], true, "status: {st}");
        let saved: u64 = wait_for("a periodic checkpoint", Duration::from_secs(180), || {
            let (ns, rank0) = (ns.name.clone(), rank0.clone());
            async move {
                let log = pod_log(&ns, &rank0, "trainer").unwrap_or_default();
                Ok(log
                    .lines()
                    .filter_map(|l| l.split("checkpoint saved at step ").nth(1))
                    .filter_map(|n| n.trim().parse().ok())
                    .next_back())
            }
        })
        .await?;
        tokio::time::sleep(Duration::from_secs(4)).await;
        let lost_at = jiff::Timestamp::now();
        node2("lose")?;

        let new_pods = running_pods(&client, &ns.name, name, 1, 2).await?;
        let stages = recovery_stages(&client, &ns.name, (name, 1, &new_pods), lost_at).await?;
        println!("rank 0 survived on node 1: {stages}");
        for p in &new_pods {
            assert_eq!(node_of(p), on_demand, "the spot node is gone");
            let aff = serde_json::to_value(&p.spec.as_ref().context("pod spec")?.affinity)?;
            let required =
                aff["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"].to_string();
            assert!(
                required.contains("NotIn") || required.contains("DoesNotExist"),
                "after the fallback the pods must avoid spot nodes: {aff}"
            );
        }
        let st = job_status(&client, &ns.name, name).await?;
        println!("decided by: {}", st["lastRestart"]["detail"]);
        assert_eq!(st["preemptions"], 1, "status: {st}");
        assert_eq!(st["failures"], 0, "status: {st}");
        assert_eq!(st["lastRestart"]["reason"], "Preemption", "status: {st}");
        assert_eq!(st["selectedGpu"]["spot"], false, "status: {st}");
        let fallback = job_events(&client, &ns.name, name, "SpotFallback").await?;
        assert!(
            !fallback.is_empty(),
            "a SpotFallback Event about {name}; in the namespace: {:?}",
            events(&client, &ns.name, "SpotFallback").await?
        );
        create_job(
            &client,
            &ns.name,
            torch_job("beside-baseline", 2, steps, "0", json!({"policy": "Never"})),
        )
        .await?;
        let st = succeeded_after_one_preemption(&client, &ns.name, name).await?;
        let resumed = st["progress"]["resumedFrom"].as_u64().unwrap_or_default();
        assert!(
            resumed >= saved,
            "attempt 1 resumed from step {resumed}, older than step {saved} saved before the loss"
        );
        ends_as_its_baseline(&client, &ns.name, name, 1, "beside-baseline").await?;
        Ok(())
    })
    .await;
    ns.cleanup().await?;
    res
}

/// The steps of the partition scenario's job, and how long its trainers wait on a broken
/// collective: longer than the next attempt takes to start, so that the cut-off rank 0 tries
/// to save after the next attempt has claimed the checkpoint.
const PARTITION_STEPS: u32 = 80;
const PARTITION_COLLECTIVE_TIMEOUT: &str = "45";

/// Issue 26: the spot node under rank 0 is cut off the network with its trainer alive. Nobody
/// exits (rank 1 waits on its collective), the node is not NotReady before the grace period:
/// the operator tells the loss from the kubelet's Lease and rank 0's silent progress reports,
/// restarts the gang on node 1 without waiting, and the cut-off rank 0, which still reaches
/// the shared checkpoint volume, is fenced when it tries to save its older step. Healed, the
/// node's kubelet stops what is left of the old attempt; the run ends bit-exact.
#[expect(
    clippy::too_many_lines,
    reason = "a cluster scenario reads as one story, in the order it happens"
)]
#[tokio::test]
#[ignore = "needs the local cluster (make test)"]
async fn a_partitioned_spot_node_is_lost_from_its_heartbeat_and_its_trainer_is_fenced() -> Result<()>
{
    let (_guard, client) = installed().await?;
    let ns = Jobs::new(&client);
    let res = with_spot_node(&client, || async {
        let (spot, on_demand) = (node2_name(), node_name());
        let name = place_rank_on(&client, &ns.name, ("0", &spot), &on_demand, || {
            let mut job = recreating(torch_job(
                "cut",
                2,
                PARTITION_STEPS,
                "0.5",
                json!({"policy": "Prefer"}),
            ));
            // The surviving rank's pod goes within seconds of the restart (it waits on its
            // collective and cannot save: it is not rank 0).
            job["spec"]["terminationGracePeriodSeconds"] = json!(5);
            set_env(&mut job, &LOSS_ENV);
            set_env(
                &mut job,
                &[("COLLECTIVE_TIMEOUT_SECONDS", PARTITION_COLLECTIVE_TIMEOUT)],
            );
            job
        })
        .await?;
        let name = name.as_str();
        let pods = running_pods(&client, &ns.name, name, 0, 2).await?;
        let old_rank0 = rank_pod(&pods, 0)?.clone();
        log_says(&ns.name, &old_rank0, "checkpoint saved at step").await?;
        // Steps past the checkpoint that the cut-off rank 0 will try to save.
        tokio::time::sleep(Duration::from_secs(4)).await;
        let cut_at = jiff::Timestamp::now();
        node2("partition")?;
        let partitioned = async {
            let new_pods = running_pods(&client, &ns.name, name, 1, 2).await?;
            let stages = recovery_stages(&client, &ns.name, (name, 1, &new_pods), cut_at).await?;
            println!("rank 0 partitioned off: {stages}");
            let st = job_status(&client, &ns.name, name).await?;
            ensure!(
                st["preemptions"] == 1 && st["failures"] == 0,
                "status: {st}"
            );
            let detail = st["lastRestart"]["detail"].as_str().unwrap_or_default();
            ensure!(
                detail.contains("Lease not renewed"),
                "decided from the kubelet's heartbeat, not NotReady: {st}"
            );
            // The cut-off trainer tries to save its step after attempt 1 claimed the fence.
            wait_for(
                "the cut-off rank 0 to be fenced",
                Duration::from_secs(120),
                || {
                    let (ns, p) = (ns.name.clone(), old_rank0.clone());
                    async move {
                        let log = pod_log(&ns, &p, "trainer").unwrap_or_default();
                        Ok(log
                            .lines()
                            .find(|l| l.contains("fenced: attempt 1 of this job started"))
                            .map(str::to_owned))
                    }
                },
            )
            .await
        }
        .await;
        node2("heal")?;
        let fenced = partitioned?;
        println!("old rank 0: {fenced}");
        // Its save on the lost peer was refused, and it wrote nothing after.
        let log = pod_log(&ns.name, &old_rank0, "trainer").unwrap_or_default();
        let after_fence = log.split("fenced: ").nth(1).unwrap_or_default();
        ensure!(
            !log.contains("peer lost: checkpoint saved")
                && !after_fence.contains("checkpoint saved"),
            "the old rank 0 saved past the fence:\n{log}"
        );
        let forced = job_events(&client, &ns.name, name, "ForceDeleted").await?;
        ensure!(
            forced.iter().any(|e| e.contains(&old_rank0.name_any())),
            "the cut-off pod was force-deleted: {forced:?}"
        );
        // Healed, the node's kubelet finds the pod gone from the API and stops its containers:
        // no process of attempt 0 (torchrun's agent, the trainer) is left on either node.
        let token = old_rank0
            .spec
            .as_ref()
            .and_then(|s| s.containers[0].env.as_ref())
            .and_then(|env| env.iter().find(|e| e.name == TRAINYARD_FENCE_TOKEN))
            .and_then(|e| e.value.clone())
            .context("attempt 0's fence token")?;
        let healed = std::time::Instant::now();
        wait_for(
            "no process of attempt 0 left after the heal",
            Duration::from_secs(120),
            || {
                let token = token.clone();
                async move {
                    let left = processes_with_env(TRAINYARD_FENCE_TOKEN, |v| v == token)?;
                    Ok(left.is_empty().then_some(()))
                }
            },
        )
        .await?;
        println!(
            "attempt 0's processes gone {:.1}s after the heal",
            healed.elapsed().as_secs_f64()
        );
        create_job(
            &client,
            &ns.name,
            torch_job(
                "cut-baseline",
                2,
                PARTITION_STEPS,
                "0",
                json!({"policy": "Never"}),
            ),
        )
        .await?;
        succeeded_after_one_preemption(&client, &ns.name, name).await?;
        ends_as_its_baseline(&client, &ns.name, name, 1, "cut-baseline").await?;
        Ok(())
    })
    .await;
    ns.cleanup().await?;
    res
}

#[tokio::test]
#[ignore = "needs the local cluster (make test)"]
async fn kubelet_restart_on_the_surviving_node_re_registers_its_plugin_and_loses_nothing()
-> Result<()> {
    let (_guard, client) = installed().await?;
    let ns = Jobs::new(&client);
    let res = with_spot_node(&client, || async {
        let name = "steady";
        create_job(
            &client,
            &ns.name,
            job_manifest(name, 2, 2, &counting_trainer(600), json!({})),
        )
        .await?;
        let pods = running_pods(&client, &ns.name, name, 0, 2).await?;
        let uids: BTreeSet<String> = pods.iter().filter_map(|p| p.uid()).collect();
        let before = job_status(&client, &ns.name, name).await?;
        let node = node_name();
        let plugin_before = plugin_registrations(&client, &node).await?;

        // The on-demand node's kubelet restarts: its plugin re-registers, the job goes on.
        trainyard_e2e::restart_kubelet()?;
        // The same plugin process (same pod, no container restart) counts one more successful
        // registration: only a new Register call with the new kubelet moves that counter.
        let plugin_after = wait_for(
            "node 1's device plugin to register with the new kubelet",
            Duration::from_secs(120),
            || {
                let (client, node) = (client.clone(), node.clone());
                async move {
                    let now = plugin_registrations(&client, &node).await?;
                    Ok((now.succeeded > plugin_before.succeeded).then_some(now))
                }
            },
        )
        .await?;
        assert_eq!(
            (&plugin_after.pod_uid, plugin_after.restarts),
            (&plugin_before.pod_uid, plugin_before.restarts),
            "the plugin re-registered without being restarted: {plugin_before:?} -> {plugin_after:?}"
        );
        println!("node 1's plugin registrations: {plugin_before:?} -> {plugin_after:?}");
        wait_for(
            "node 1 allocatable nvidia.com/gpu = 8 again",
            Duration::from_secs(120),
            || {
                let (client, node) = (client.clone(), node.clone());
                async move { Ok((allocatable(&client, &node, GPU).await? == Some(8)).then_some(())) }
            },
        )
        .await?;
        tokio::time::sleep(Duration::from_secs(10)).await;
        let pods = running_pods(&client, &ns.name, name, 0, 2).await?;
        let after: BTreeSet<String> = pods.iter().filter_map(|p| p.uid()).collect();
        assert_eq!(uids, after, "the same pods run on");
        let st = job_status(&client, &ns.name, name).await?;
        for field in ["attempt", "preemptions", "failures"] {
            assert_eq!(st[field], before[field], "{field}: {st}");
        }
        assert_eq!(st["phase"], "Running", "status: {st}");
        Ok(())
    })
    .await;
    ns.cleanup().await?;
    res
}

#[tokio::test]
#[ignore = "needs the local cluster (make test)"]
async fn pods_on_both_nodes_resolve_cluster_names_and_reach_cluster_ip_services() -> Result<()> {
    let (_guard, client) = installed().await?;
    let ns = Jobs::new(&client);
    let res = with_spot_node(&client, || async {
        // The operator's metrics Service: a ClusterIP whose endpoint runs on node 1, so the
        // probe on node 2 crosses nodes through kube-proxy's rules.
        let services = Api::<Service>::namespaced(client.clone(), RELEASE_NS)
            .list(&ListParams::default())
            .await?;
        let metrics = services
            .items
            .iter()
            .find(|s| s.name_any().ends_with("operator-metrics"))
            .context("the operator's metrics Service")?;
        let ip = metrics
            .spec
            .as_ref()
            .and_then(|s| s.cluster_ip.clone())
            .context("a ClusterIP")?;
        let port = metrics
            .spec
            .as_ref()
            .and_then(|s| s.ports.as_ref())
            .and_then(|p| p.first())
            .map(|p| p.port)
            .context("a port")?;
        let fqdn = format!("{}.{RELEASE_NS}.svc.cluster.local", metrics.name_any());
        for node in [node_name(), node2_name()] {
            let pod = format!("probe-{}", node.trim_start_matches("trainyard-"));
            // Retried for up to 60 s: right after an install the Service's endpoints may not be
            // in kube-proxy's rules (nor the name in the DNS feeder's hosts) yet.
            let script = format!(
                "for i in $(seq 60); do nslookup {fqdn} | grep -q {ip} && echo resolved && break; sleep 1; done; \
                 for i in $(seq 60); do printf 'GET /metrics HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {ip} {port} \
                   | grep -m1 -o 'trainyard_[a-z_]*' && break; sleep 1; done"
            );
            let manifest: Pod = serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod},
                "spec": {"nodeName": node, "restartPolicy": "Never", "containers": [{
                    "name": "probe", "image": "trainyard/trainer:dev", "imagePullPolicy": "Never",
                    "command": ["sh", "-c", script],
                }]},
            }))?;
            let pods = Api::<Pod>::namespaced(client.clone(), &ns.name);
            pods.create(&PostParams::default(), &manifest).await?;
            let done = wait_for(&format!("{pod} to finish"), Duration::from_secs(180), || {
                let (pods, pod) = (pods.clone(), pod.clone());
                async move {
                    let p = pods.get(&pod).await?;
                    Ok(pod_finished(&p).then_some(p))
                }
            })
            .await?;
            let log = pod_log(&ns.name, &done, "probe")?;
            pods.delete(&pod, &Default::default()).await?;
            assert!(log.contains("resolved"), "{node}: {fqdn} -> {ip}; log:\n{log}");
            assert!(
                log.contains("trainyard_"),
                "{node}: GET /metrics through the ClusterIP; log:\n{log}"
            );
        }
        Ok(())
    })
    .await;
    ns.cleanup().await?;
    res
}

/// `trainyard_operator_steps_lost_per_preemption` summed over the operator's replicas (only
/// the leader observes it): `(count, sum)`, through the API server's pod proxy.
async fn steps_lost_metric(client: &Client) -> Result<(u64, f64)> {
    let pods = Api::<Pod>::namespaced(client.clone(), RELEASE_NS)
        .list(&ListParams::default())
        .await?
        .items;
    let mut total = (0, 0.0);
    for pod in pods.iter().filter(|p| {
        p.name_any().contains("operator")
            && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
    }) {
        let path = format!(
            "/api/v1/namespaces/{RELEASE_NS}/pods/{}:8080/proxy/metrics",
            pod.name_any()
        );
        let text = client
            .request_text(http::Request::get(&path).body(Vec::new())?)
            .await
            .with_context(|| format!("GET {path}"))?;
        let value = |name: &str| -> Result<f64> {
            Ok(text
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|n| n.trim().parse::<f64>())
                .transpose()?
                .unwrap_or(0.0))
        };
        total.0 += value("trainyard_operator_steps_lost_per_preemption_count ")? as u64;
        total.1 += value("trainyard_operator_steps_lost_per_preemption_sum ")?;
    }
    Ok(total)
}

/// Waits until the job's trainers have reported progress in `attempt` (status.progress).
async fn reported_progress(client: &Client, ns: &str, job: &str, attempt: u32) -> Result<Value> {
    wait_for(
        &format!("{job} to report progress in attempt {attempt}"),
        Duration::from_secs(180),
        || async move {
            let st = job_status(client, ns, job).await?;
            let p = st["progress"].clone();
            Ok((p["attempt"] == attempt && p["step"].as_u64().is_some_and(|s| s > 0)).then_some(p))
        },
    )
    .await
}

/// Karpenter's taint on a node it is about to disrupt: a termination notice.
const DISRUPTED: &str = "karpenter.sh/disrupted";

/// The provider announces `node`'s termination (Karpenter's taint); returns when.
fn notice(node: &str) -> Result<jiff::Timestamp> {
    let at = jiff::Timestamp::now();
    let taint = format!("{DISRUPTED}=:NoSchedule");
    kubectl(&["taint", "node", node, &taint, "--overwrite"], "")?;
    Ok(at)
}

/// The provider withdraws `node`'s termination notice.
fn withdraw_notice(node: &str) -> Result<()> {
    kubectl(&["taint", "node", node, &format!("{DISRUPTED}-")], "").map(|_| ())
}

#[tokio::test]
#[ignore = "needs the local cluster (make test)"]
async fn a_termination_notice_checkpoints_and_restarts_the_gang_losing_no_steps() -> Result<()> {
    let (_guard, client) = installed().await?;
    let ns = Jobs::new(&client);
    let spot = node2_name();
    let res = with_spot_node(&client, || async {
        let on_demand = node_name();
        let name = place_rank_on(&client, &ns.name, ("0", &spot), &on_demand, || {
            recreating(torch_job(
                "notice",
                2,
                80,
                "0.5",
                json!({"policy": "Prefer"}),
            ))
        })
        .await?;
        let name = name.as_str();
        running_pods(&client, &ns.name, name, 0, 2).await?;
        reported_progress(&client, &ns.name, name, 0).await?;
        let (count_before, sum_before) = steps_lost_metric(&client).await?;

        let noticed_at = notice(&spot)?;
        let new_pods = running_pods(&client, &ns.name, name, 1, 2).await?;
        for p in &new_pods {
            assert_eq!(
                node_of(p),
                on_demand,
                "the new attempt avoids the noticed node"
            );
        }
        let stages = recovery_stages(&client, &ns.name, (name, 1, &new_pods), noticed_at).await?;
        println!("recreated, notice on rank 0's node: {stages}");
        let st = job_status(&client, &ns.name, name).await?;
        assert_eq!(
            (&st["preemptions"], &st["failures"]),
            (&json!(1), &json!(0)),
            "status: {st}"
        );
        assert_eq!(st["lastRestart"]["reason"], "Preemption", "status: {st}");
        let detail = st["lastRestart"]["detail"].as_str().unwrap_or_default();
        assert!(
            detail.contains("termination notice karpenter.sh/disrupted")
                && detail.contains("saved a checkpoint at step"),
            "status: {st}"
        );
        let asked = job_events(&client, &ns.name, name, "CheckpointRequested").await?;
        assert_eq!(asked.len(), 1, "{asked:?}");

        let p = reported_progress(&client, &ns.name, name, 1).await?;
        let st = wait_phase(
            &client,
            &ns.name,
            name,
            "Succeeded",
            Duration::from_secs(300),
        )
        .await?;
        assert_eq!(st["preemptions"], 1, "status: {st}");
        let resumed = st["progress"]["resumedFrom"].as_u64().unwrap_or_default();
        assert!(resumed > 0, "resumed from a checkpoint: {p} / {st}");
        assert_eq!(st["progress"]["stepsLost"], 0, "status: {st}");
        let (count, sum) = steps_lost_metric(&client).await?;
        assert_eq!(count, count_before + 1, "one preemption observed");
        assert_eq!(sum, sum_before, "and it lost no steps");
        Ok(())
    })
    .await;
    let untainted = withdraw_notice(&spot);
    ns.cleanup().await?;
    res.and(untainted)
}

/// Make before break under a graceful preemption: the spot node under worker 1 gets its
/// termination notice. Worker 1's replacement is created at once on node 1 (the spot node is
/// noticed) and waits there, its launcher started, while worker 1 trains on; then the
/// checkpoint and the switch. Rank 0, on the on-demand node, keeps its pod and its container,
/// so its GPUs. Meanwhile a pod that needs rank 0's GPUs (every GPU of node 1 that no other
/// job holds) stays pending: the survivors' GPUs never go back to the scheduler. No step is
/// lost, no process of attempt 0 at rank 1 is left once attempt 1 trains, and the run ends
/// bit-exact with its uninterrupted twin.
#[expect(
    clippy::too_many_lines,
    reason = "a cluster scenario reads as one story, in the order it happens"
)]
#[tokio::test]
#[ignore = "needs the local cluster (make test)"]
async fn a_noticed_spot_worker_is_replaced_while_rank_0_restarts_in_place_on_its_gpus() -> Result<()>
{
    let (_guard, client) = installed().await?;
    let ns = Jobs::new(&client);
    let spot = node2_name();
    let steps = 80;
    let res = with_spot_node(&client, || async {
        let on_demand = node_name();
        let name = place_rank_on(&client, &ns.name, ("1", &spot), &on_demand, || {
            let mut job = torch_job("kept", 2, steps, "0.5", json!({"policy": "Prefer"}));
            job["spec"]["restartPolicy"]["inPlace"] = json!(true);
            job
        })
        .await?;
        let name = name.as_str();
        let pods = running_pods(&client, &ns.name, name, 0, 2).await?;
        let rank0 = rank_pod(&pods, 0)?.clone();
        assert_eq!(node_of(&rank0), on_demand, "rank 0 on node 1");
        let started = trainer_started_at(&rank0).context("rank 0's trainer start")?;
        reported_progress(&client, &ns.name, name, 0).await?;
        let competitor = competing_pod(&client, &ns.name, &on_demand, name).await?;

        let noticed_at = notice(&spot)?;
        let new_pods = running_pods(&client, &ns.name, name, 1, 2).await?;
        let kept = rank_pod(&new_pods, 0)?;
        assert_eq!(kept.uid(), rank0.uid(), "rank 0 kept its pod");
        assert_eq!(
            (trainer_started_at(kept), trainer_restarts(kept)),
            (Some(started), Some(0)),
            "and its container, so its GPUs"
        );
        let replaced = rank_pod(&new_pods, 1)?;
        assert_ne!(
            replaced.uid(),
            rank_pod(&pods, 1)?.uid(),
            "worker 1 is a new pod"
        );
        assert_eq!(node_of(replaced), on_demand, "away from the noticed node");
        let stages = recovery_stages(&client, &ns.name, (name, 1, &new_pods), noticed_at).await?;
        println!("make before break, notice on worker 1's node: {stages}");
        // Make before break: worker 1's replacement was created beside it (its twin name)
        // before the switch was decided, and waited there while worker 1 trained.
        let decided = restart_decided_at(&client, &ns.name, name).await?;
        let created = replaced
            .metadata
            .creation_timestamp
            .as_ref()
            .context("the replacement's creation")?
            .0;
        assert_eq!(replaced.name_any(), format!("{name}-worker-1-b"));
        assert!(
            created < decided,
            "created {created}, switch decided {decided}"
        );
        for said in ["StandbyCreated", "StandbyReady"] {
            let events = job_events(&client, &ns.name, name, said).await?;
            assert!(!events.is_empty(), "no {said} Event");
        }
        assert!(
            job_events(&client, &ns.name, name, "StandbyGivenUp")
                .await?
                .is_empty()
        );
        // Every process of the old rank-1 pod's attempt is gone once attempt 1 trains (the
        // supervisors start it only once its supervisor said so); the pod itself is gone or
        // on its way out: its teardown goes on beside attempt 1.
        let old = Api::<Pod>::namespaced(client.clone(), &ns.name)
            .get_opt(&rank_pod(&pods, 1)?.name_any())
            .await?;
        assert!(
            old.is_none_or(
                |p| p.uid() != rank_pod(&pods, 1).ok().and_then(ResourceExt::uid)
                    || p.metadata.deletion_timestamp.is_some()
            ),
            "the noticed pod is gone or being deleted"
        );
        let job_env = format!("{}={name}", trainyard_api::env::TRAINYARD_JOB);
        let left: Vec<u32> =
            processes_with_env(trainyard_api::env::TRAINYARD_ATTEMPT, |a| a == "0")?
                .into_iter()
                .filter(|pid| {
                    std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|e| {
                        let vars: Vec<&[u8]> = e.split(|b| *b == 0).collect();
                        vars.contains(&job_env.as_bytes())
                            && vars.contains(&b"NODE_RANK=1".as_slice())
                            && vars.iter().any(|v| v.starts_with(b"LOCAL_RANK="))
                    })
                })
                .collect();
        assert!(
            left.is_empty(),
            "attempt 0's rank-1 workers still run: {left:?}"
        );
        let st = job_status(&client, &ns.name, name).await?;
        let detail = st["lastRestart"]["detail"].as_str().unwrap_or_default();
        assert!(
            detail.contains("worker(s) 1 switch to their replacement(s) created"),
            "status: {st}"
        );
        let last = &st["lastRestart"];
        assert_eq!(last["replacedAheadRanks"], "1", "status: {st}");
        assert!(
            last["aheadMillis"].as_u64().is_some_and(|ms| ms > 0)
                && last["runningAfterMillis"].as_u64().is_some(),
            "status: {st}"
        );
        println!(
            "make before break: replacement created {} ms before the switch, every worker \
             running {} ms after it",
            last["aheadMillis"], last["runningAfterMillis"]
        );
        // Its GPUs (on node 1, on-demand) were held for the notice until the switch: charged.
        let held = &st["ledger"]["onDemand"]["heldForNotice"];
        assert!(held.as_u64().is_some_and(|ms| ms > 0), "status: {st}");
        assert_eq!(
            (&st["preemptions"], &st["failures"]),
            (&json!(1), &json!(0)),
            "status: {st}"
        );
        assert_eq!(st["lastRestart"]["reason"], "Preemption", "status: {st}");
        assert_eq!(st["lastRestart"]["inPlaceRanks"], "0", "status: {st}");
        let said = job_events(&client, &ns.name, name, "RestartingInPlace").await?;
        assert!(
            said.iter()
                .any(|m| m.contains("worker(s) 0 keep their pods")
                    && m.contains("worker 1: its node")
                    && m.contains("termination notice")),
            "{said:?}"
        );
        assert!(
            job_events(&client, &ns.name, name, "InPlaceFallback")
                .await?
                .is_empty()
        );
        // The new attempt trains; the pod that needs rank 0's GPUs never got them.
        let pending = Api::<Pod>::namespaced(client.clone(), &ns.name)
            .get(&competitor)
            .await?;
        assert_eq!(node_of(&pending), "", "{competitor} stayed unscheduled");

        let st = wait_phase(
            &client,
            &ns.name,
            name,
            "Succeeded",
            Duration::from_secs(300),
        )
        .await?;
        assert_eq!(st["preemptions"], 1, "status: {st}");
        assert_eq!(st["progress"]["stepsLost"], 0, "status: {st}");
        Api::<Pod>::namespaced(client.clone(), &ns.name)
            .delete(&competitor, &Default::default())
            .await?;
        create_job(
            &client,
            &ns.name,
            torch_job("kept-twin", 2, steps, "0", json!({"policy": "Never"})),
        )
        .await?;
        ends_as_its_baseline(&client, &ns.name, name, 1, "kept-twin").await
    })
    .await;
    let untainted = withdraw_notice(&spot);
    ns.cleanup().await?;
    res.and(untainted)
}

/// AWS's rebalance recommendation on `node`, as the AWS Node Termination Handler taints it.
const REBALANCE: &str = "aws-node-termination-handler/rebalance-recommendation";

/// An early warning (a rebalance recommendation) on spot node 2 under worker 1, rank 0 on
/// node 1 with room beside it: worker 1's replacement is created on node 1 while it trains;
/// no checkpoint is asked for; at the trainers' next periodic checkpoint the gang moves onto
/// it, rank 0 in place; no step lost, the run bit-exact with its twin.
#[tokio::test]
#[ignore = "needs the local cluster (make test)"]
async fn an_early_warning_moves_the_spot_worker_at_its_next_checkpoint_with_nothing_lost()
-> Result<()> {
    let (_guard, client) = installed().await?;
    let ns = Jobs::new(&client);
    let spot = node2_name();
    let steps = 80;
    let res = with_spot_node(&client, || async {
        let on_demand = node_name();
        let name = place_rank_on(&client, &ns.name, ("1", &spot), &on_demand, || {
            torch_job("warned", 2, steps, "0.5", json!({"policy": "Prefer"}))
        })
        .await?;
        let name = name.as_str();
        let pods = running_pods(&client, &ns.name, name, 0, 2).await?;
        let rank0 = rank_pod(&pods, 0)?.clone();
        reported_progress(&client, &ns.name, name, 0).await?;
        kubectl(
            &[
                "taint",
                "node",
                &spot,
                &format!("{REBALANCE}=:NoSchedule"),
                "--overwrite",
            ],
            "",
        )?;
        let new_pods = running_pods(&client, &ns.name, name, 1, 2).await?;
        assert_eq!(
            rank_pod(&new_pods, 0)?.uid(),
            rank0.uid(),
            "rank 0 kept its pod"
        );
        let replaced = rank_pod(&new_pods, 1)?;
        assert_eq!(replaced.name_any(), format!("{name}-worker-1-b"));
        assert_eq!(node_of(replaced), on_demand, "away from the warned node");
        let created = replaced
            .metadata
            .creation_timestamp
            .as_ref()
            .context("created")?
            .0;
        let decided = restart_decided_at(&client, &ns.name, name).await?;
        assert!(created < decided, "created {created}, moved {decided}");
        let st = job_status(&client, &ns.name, name).await?;
        let detail = st["lastRestart"]["detail"].as_str().unwrap_or_default();
        assert!(
            detail.contains(&format!("early warning {REBALANCE}"))
                && detail.contains("moved at the trainers' checkpoint at step"),
            "status: {st}"
        );
        assert_eq!(st["lastRestart"]["replacedAheadRanks"], "1", "status: {st}");
        assert_eq!(st["lastRestart"]["inPlaceRanks"], "0", "status: {st}");
        let asked = job_events(&client, &ns.name, name, "CheckpointRequested").await?;
        assert!(asked.is_empty(), "no checkpoint asked for: {asked:?}");
        let st = wait_phase(
            &client,
            &ns.name,
            name,
            "Succeeded",
            Duration::from_secs(300),
        )
        .await?;
        assert_eq!(
            (&st["preemptions"], &st["failures"]),
            (&json!(1), &json!(0)),
            "{st}"
        );
        assert_eq!(st["progress"]["stepsLost"], 0, "status: {st}");
        create_job(
            &client,
            &ns.name,
            torch_job("warned-twin", 2, steps, "0", json!({"policy": "Never"})),
        )
        .await?;
        ends_as_its_baseline(&client, &ns.name, name, 1, "warned-twin").await
    })
    .await;
    let untainted = kubectl(&["taint", "node", &spot, &format!("{REBALANCE}-")], "").map(drop);
    ns.cleanup().await?;
    res.and(untainted)
}

/// How a notice's restart is made, for [`figures_make_before_break_against_in_place_and_recreate`].
#[derive(Clone, Copy)]
enum NoticeRestart {
    /// The default: the noticed worker's replacement created ahead, rank 0 kept.
    MakeBeforeBreak,
    /// `replaceAheadOnNotice: false`: rank 0 kept, worker 1 created after the switch.
    InPlace,
    /// `inPlace: false`: every pod created again.
    Recreate,
}

impl NoticeRestart {
    fn label(self) -> &'static str {
        match self {
            Self::MakeBeforeBreak => "make before break",
            Self::InPlace => "in place",
            Self::Recreate => "recreate",
        }
    }

    fn job(self, round: u32) -> Value {
        let short = match self {
            Self::MakeBeforeBreak => "mbb",
            Self::InPlace => "inplace",
            Self::Recreate => "recreate",
        };
        let mut job = torch_job(
            &format!("fig-{short}-{round}"),
            2,
            1000,
            "0.5",
            json!({"policy": "Prefer"}),
        );
        match self {
            Self::MakeBeforeBreak => {}
            Self::InPlace => job["spec"]["restartPolicy"]["replaceAheadOnNotice"] = json!(false),
            Self::Recreate => job["spec"]["restartPolicy"]["inPlace"] = json!(false),
        }
        job
    }
}

/// The figures of docs/benchmarks.md "Make before break on a termination notice", all three
/// ways in one run: the same 2-worker torchrun job (rank 0 on node 1, worker 1 on spot node 2,
/// room on node 1), a termination notice on node 2, restarted with make before break, in place
/// without it, and by recreating every pod; `FIGURE_ROUNDS` rounds (default 3), the three ways
/// one after the other in each. The notice comes once rank 0's launcher has warmed the next
/// attempt's interpreter, as it has long before a notice hours into a run (the recreated
/// job's pods start cold whatever the time). Prints one table row a run and writes the table to
/// `target/bench/make-before-break.md`; asserts only that each run restarted once for the
/// notice and lost no step (no time: `make bench` runs it, never `make test`).
#[tokio::test]
#[ignore = "a benchmark on the local cluster (make bench)"]
async fn figures_make_before_break_against_in_place_and_recreate() -> Result<()> {
    let rounds: u32 = std::env::var("FIGURE_ROUNDS")
        .ok()
        .map_or(Ok(3), |r| r.parse())
        .context("FIGURE_ROUNDS")?;
    let (_guard, client) = installed().await?;
    let ns = Jobs::new(&client);
    let spot = node2_name();
    let mut rows = vec![
        "| round | restart | notice → decided | notice → first step | decided → first step | steps lost |".to_owned(),
        "|---:|---|---:|---:|---:|---:|".to_owned(),
    ];
    let res = with_spot_node(&client, || async {
        let on_demand = node_name();
        for round in 1..=rounds {
            for how in [
                NoticeRestart::MakeBeforeBreak,
                NoticeRestart::InPlace,
                NoticeRestart::Recreate,
            ] {
                let row = notice_figure(&client, &ns.name, (&spot, &on_demand), how, round).await?;
                println!("{row}");
                rows.push(row);
            }
        }
        Ok(())
    })
    .await;
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench");
    std::fs::create_dir_all(&out)?;
    std::fs::write(out.join("make-before-break.md"), rows.join("\n") + "\n")?;
    if res.is_err() {
        // A run that failed may have left its notice (each run withdraws its own).
        withdraw_notice(&spot).ok();
    }
    ns.cleanup().await?;
    res
}

/// One run of [`figures_make_before_break_against_in_place_and_recreate`]: its table row. The
/// job is deleted and the notice withdrawn after it.
async fn notice_figure(
    client: &Client,
    ns: &str,
    (spot, on_demand): (&str, &str),
    how: NoticeRestart,
    round: u32,
) -> Result<String> {
    let name = place_rank_on(client, ns, ("1", spot), on_demand, || how.job(round)).await?;
    let name = name.as_str();
    let pods = running_pods(client, ns, name, 0, 2).await?;
    reported_progress(client, ns, name, 0).await?;
    if !matches!(how, NoticeRestart::Recreate) {
        // As hours into a run: rank 0's launcher has warmed the next attempt's
        // interpreter (10 s after the attempt's start), which it does not on a
        // notice a few seconds in.
        let rank0 = rank_pod(&pods, 0)?;
        wait_for(
            "rank 0's spare interpreter",
            Duration::from_secs(120),
            || async { trainyard_e2e::first_log_time(ns, rank0, TRAINER, "ready: imported") },
        )
        .await?;
    }
    let noticed_at = notice(spot)?;
    let new_pods = running_pods(client, ns, name, 1, 2).await?;
    let stages = recovery_stages(client, ns, (name, 1, &new_pods), noticed_at).await?;
    let p = reported_progress(client, ns, name, 1).await?;
    let st = job_status(client, ns, name).await?;
    ensure!(
        (&st["preemptions"], &st["failures"]) == (&json!(1), &json!(0)),
        "{name}: one restart, for the notice: {st}"
    );
    ensure!(p["stepsLost"] == 0, "{name} lost steps: {p}");
    let row = format!(
        "| {round} | {} | {:.1} s | {:.1} s | {:.1} s | 0 |",
        how.label(),
        stages.decided,
        stages.first_step,
        stages.first_step - stages.decided
    );
    tj_api(client, ns).delete(name, &Default::default()).await?;
    withdraw_notice(spot)?;
    wait_for(
        &format!("{name}'s pods gone"),
        Duration::from_secs(120),
        || async { Ok(job_pods(client, ns, name).await?.is_empty().then_some(())) },
    )
    .await?;
    Ok(row)
}

/// Make before break without room, and a notice withdrawn before the switch: worker 1 on spot
/// node 2, node 1 full but for rank 0 (a filler pod holds its other GPUs). A notice withdrawn
/// while worker 1's replacement waits for room deletes the replacement, and the job trains on
/// in attempt 0, nothing asked of it. A notice that stands gives the replacement up after 15 s
/// (Warning `StandbyGivenUp`) and restarts as without one: the checkpoint, then worker 1
/// created after the switch, which runs once the filler goes. No step is lost.
#[expect(
    clippy::too_many_lines,
    reason = "a cluster scenario reads as one story, in the order it happens"
)]
#[tokio::test]
#[ignore = "needs the local cluster (make test)"]
async fn a_notice_with_no_room_for_the_replacement_restarts_as_before_and_a_withdrawn_one_changes_nothing()
-> Result<()> {
    let (_guard, client) = installed().await?;
    let ns = Jobs::new(&client);
    let spot = node2_name();
    let pod_api = Api::<Pod>::namespaced(client.clone(), &ns.name);
    let res = with_spot_node(&client, || async {
        let on_demand = node_name();
        let name = place_rank_on(&client, &ns.name, ("1", &spot), &on_demand, || {
            torch_job("roomless", 2, 200, "0.5", json!({"policy": "Prefer"}))
        })
        .await?;
        let name = name.as_str();
        running_pods(&client, &ns.name, name, 0, 2).await?;
        reported_progress(&client, &ns.name, name, 0).await?;
        let filler = filler_pod(&client, &ns.name, &on_demand, 0).await?;
        let standby = format!("{name}-worker-1-b");
        let standby_is = |there: bool| {
            let (pod_api, standby) = (pod_api.clone(), standby.clone());
            async move {
                let found = pod_api.get_opt(&standby).await?;
                let live = found.is_some_and(|p| p.metadata.deletion_timestamp.is_none());
                Ok((live == there).then_some(()))
            }
        };

        // Withdrawn while the replacement waits for room: it goes, and nothing else moves.
        notice(&spot)?;
        wait_for(
            "the replacement created ahead",
            Duration::from_secs(30),
            || standby_is(true),
        )
        .await?;
        withdraw_notice(&spot)?;
        wait_for("the replacement deleted", Duration::from_secs(30), || {
            standby_is(false)
        })
        .await?;
        let withdrawn = job_events(&client, &ns.name, name, "StandbyWithdrawn").await?;
        ensure!(!withdrawn.is_empty(), "no StandbyWithdrawn Event");
        let asked = job_events(&client, &ns.name, name, "CheckpointRequested").await?;
        ensure!(asked.is_empty(), "a checkpoint was asked for: {asked:?}");
        let st = job_status(&client, &ns.name, name).await?;
        ensure!(
            st["attempt"] == 0 && st["preemptions"] == 0 && st["phase"] == "Running",
            "status: {st}"
        );

        // A notice that stands: the replacement is given up, and the notice goes on as
        // without one.
        notice(&spot)?;
        let given_up = wait_for("StandbyGivenUp", Duration::from_secs(60), || async {
            let said = job_events(&client, &ns.name, name, "StandbyGivenUp").await?;
            Ok((!said.is_empty()).then_some(said))
        })
        .await?;
        ensure!(
            given_up
                .iter()
                .any(|m| m.contains("worker 1: not scheduled (no room)")),
            "{given_up:?}"
        );
        wait_for(
            "the restart after the checkpoint",
            Duration::from_secs(60),
            || async {
                let st = job_status(&client, &ns.name, name).await?;
                Ok((st["attempt"] == 1).then_some(()))
            },
        )
        .await?;
        pod_api.delete(&filler, &Default::default()).await?;
        let st = succeeded_after_one_preemption(&client, &ns.name, name).await?;
        ensure!(st["progress"]["stepsLost"] == 0, "status: {st}");
        let detail = st["lastRestart"]["detail"].as_str().unwrap_or_default();
        ensure!(
            detail.contains("termination notice") && !detail.contains("switch to their"),
            "status: {st}"
        );
        Ok(())
    })
    .await;
    let untainted = withdraw_notice(&spot);
    let _ = pod_api
        .delete(&format!("filler-{}", node_name()), &Default::default())
        .await;
    ns.cleanup().await?;
    res.and(untainted)
}

fn trainer_restarts(pod: &Pod) -> Option<i32> {
    Some(trainer_status(pod)?.restart_count)
}

/// Creates a pod `name` that sleeps on `node`, asking for `gpus` GPUs.
async fn gpu_pod(client: &Client, ns: &str, name: &str, node: &str, gpus: u64) -> Result<()> {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "sleep",
                "image": "trainyard/trainer:dev",
                "imagePullPolicy": "Never",
                "command": ["sleep", "3600"],
                "resources": {"limits": {GPU: gpus.to_string()}},
            }],
        },
    }))?;
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await?;
    Ok(())
}

/// Creates a pod on `node` that asks for every GPU there that no pod but `job`'s holds, so
/// that it fits only once `job`'s pods on `node` have given their GPUs back; checks that it
/// is unschedulable now, and returns its name.
async fn competing_pod(client: &Client, ns: &str, node: &str, job: &str) -> Result<String> {
    let on_node = Api::<Pod>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await?;
    let held_by_others: u64 = on_node
        .items
        .iter()
        .filter(|p| {
            !pod_finished(p)
                && p.labels()
                    .get(trainyard_api::crd::LABEL_JOB)
                    .map(String::as_str)
                    != Some(job)
        })
        .map(gpus_asked)
        .sum();
    let all = allocatable(client, node, GPU)
        .await?
        .context("node 1 advertises no GPUs")?;
    let asked = u64::try_from(all)?.saturating_sub(held_by_others);
    let name = "competitor";
    gpu_pod(client, ns, name, node, asked).await?;
    wait_for(
        &format!("{name} (asking {asked} of {all} GPUs) to be unschedulable"),
        Duration::from_secs(60),
        || async move {
            let p = Api::<Pod>::namespaced(client.clone(), ns).get(name).await?;
            let unschedulable = p
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| {
                    cs.iter().any(|c| {
                        c.type_ == "PodScheduled"
                            && c.status == "False"
                            && c.reason.as_deref() == Some("Unschedulable")
                    })
                });
            ensure!(
                node_of(&p).is_empty(),
                "{name} was scheduled: {asked} GPUs were free"
            );
            Ok(unschedulable.then_some(()))
        },
    )
    .await?;
    Ok(name.to_owned())
}

#[tokio::test]
#[ignore = "needs the local cluster (make test)"]
async fn a_gang_stuck_in_a_collective_is_restarted_as_a_hang_and_succeeds() -> Result<()> {
    let (_guard, client) = installed().await?;
    let ns = Jobs::new(&client);
    let res = async {
        let name = "hung";
        let hung = |name: &str, gpus: u32| {
            let mut job = torch_job(name, gpus, 40, "0.2", json!({"policy": "Never"}));
            job["spec"]["restartPolicy"]["progressTimeoutSeconds"] = json!(20);
            set_env(&mut job, &[("HANG_AT_STEP", "12"), ("HANG_RANK", "1")]);
            job
        };
        create_job(&client, &ns.name, recreating(hung(name, 2))).await?;
        // Beside it, the same hang in a job that restarts in place, and its uninterrupted twin.
        let mut in_place = hung("hung-in-place", 1);
        in_place["spec"]["restartPolicy"]["inPlace"] = json!(true);
        create_job(&client, &ns.name, in_place).await?;
        let twin = torch_job("hung-twin", 1, 40, "0.2", json!({"policy": "Never"}));
        create_job(&client, &ns.name, twin).await?;
        let kept = pod_uids(&running_pods(&client, &ns.name, "hung-in-place", 0, 2).await?);
        running_pods(&client, &ns.name, name, 0, 2).await?;
        // Rank 1 sleeps inside step 12 in attempt 0; rank 0 waits in the collective.
        running_pods(&client, &ns.name, name, 1, 2).await?;
        let took = decided_to_first_step(&client, &ns.name, name, 1).await?;
        println!("hang, recreated: restart decided -> first step of attempt 1 {took:.1} s");
        let st = job_status(&client, &ns.name, name).await?;
        assert_eq!(st["lastRestart"]["reason"], "Hang", "status: {st}");
        assert_eq!(
            (&st["hangs"], &st["preemptions"], &st["failures"]),
            (&json!(1), &json!(0), &json!(0)),
            "status: {st}"
        );
        let hang = job_events(&client, &ns.name, name, "Hang").await?;
        assert!(
                hang.iter()
                    .any(|m| m.contains("no progress for 20s")
                        && m.contains("stopped advancing first")),
                "{hang:?}"
            );
        let st = wait_phase(
            &client,
            &ns.name,
            name,
            "Succeeded",
            Duration::from_secs(300),
        )
        .await?;
        assert_eq!(st["hangs"], 1, "status: {st}");
        let took = decided_to_first_step(&client, &ns.name, "hung-in-place", 1).await?;
        println!("hang, in place: restart decided -> first step of attempt 1 {took:.1} s");
        println!(
            "hang, in place, rank 0's supervisor: {}",
            supervisor_stages(&client, &ns.name, "hung-in-place").await?
        );
        restarted_in_place_without_a_pod_written(&client, &ns.name, "hung-in-place", &kept).await?;
        ends_as_its_baseline(&client, &ns.name, "hung-in-place", 1, "hung-twin").await
    }
    .await;
    ns.cleanup().await?;
    res
}

/// Seconds from the decision of the restart that started `attempt` of `job`
/// (`status.lastRestart.time`, whole seconds) to its first step (rank 0's `first step of
/// attempt N` line, which it prints once every rank has trained the step).
async fn decided_to_first_step(client: &Client, ns: &str, job: &str, attempt: u32) -> Result<f64> {
    let decided = restart_decided_at(client, ns, job).await?;
    let pods = job_pods(client, ns, job).await?;
    let first = first_step_at(ns, rank_pod(&pods, 0)?, attempt).await?;
    Ok(first.duration_since(decided).as_secs_f64())
}

/// When rank 0's supervisor of `job` (restarted in place into attempt 1) logged each step of
/// the restart, in seconds after the decision (`status.lastRestart.time`, whole seconds).
async fn supervisor_stages(client: &Client, ns: &str, job: &str) -> Result<String> {
    let decided = restart_decided_at(client, ns, job).await?;
    let pods = job_pods(client, ns, job).await?;
    let rank0 = rank_pod(&pods, 0)?;
    let mut said = Vec::new();
    for text in [
        "stopping attempt 0 on the operator's order",
        "attempt 0 stopped on the operator's order",
        "starting attempt 1 in place",
        // torch imported ahead: the spare interpreter became attempt 1.
        "attempt 1 runs in the spare interpreter",
        "first step of attempt 1",
    ] {
        let at = trainyard_e2e::first_log_time(ns, rank0, "trainer", text)?
            .with_context(|| format!("rank 0 never logged {text:?}"))?;
        said.push(format!(
            "{text} {:.1} s",
            at.duration_since(decided).as_secs_f64()
        ));
    }
    // What the spare cost: its import time and its memory, as it said when ready.
    if let Some(ready) = trainyard_e2e::first_log_line(ns, rank0, "trainer", "spare interpreter")? {
        said.push(format!("({})", ready.trim()));
    }
    Ok(said.join(" -> "))
}

fn pod_uids(pods: &[Pod]) -> BTreeSet<String> {
    pods.iter().filter_map(ResourceExt::uid).collect()
}

/// The hang of `job` (`restartPolicy.inPlace`), whose attempt 0 ran in the pods `before`,
/// restarted every rank in place: the job succeeds in attempt 1 in those pods, relabelled,
/// none created or deleted.
async fn restarted_in_place_without_a_pod_written(
    client: &Client,
    ns: &str,
    job: &str,
    before: &BTreeSet<String>,
) -> Result<()> {
    let st = wait_phase(client, ns, job, "Succeeded", Duration::from_secs(300)).await?;
    ensure!(st["attempt"] == 1 && st["hangs"] == 1, "status: {st}");
    ensure!(
        st["lastRestart"]["reason"] == "Hang" && st["lastRestart"]["inPlaceRanks"] == "0-1",
        "status: {st}"
    );
    let pods = job_pods(client, ns, job).await?;
    let at_end = pod_uids(&pods);
    ensure!(
        at_end == *before,
        "pods at the end {at_end:?}, at the start {before:?}"
    );
    ensure!(
        pods.iter()
            .all(|p| p.labels().get(LABEL_ATTEMPT).map(String::as_str) == Some("1")),
        "every kept pod moved to attempt 1"
    );
    let said = job_events(client, ns, job, "RestartingInPlace").await?;
    ensure!(
        said.iter().any(|m| m.contains("no pod is created again")),
        "{said:?}"
    );
    ensure!(
        job_events(client, ns, job, "InPlaceFallback")
            .await?
            .is_empty(),
        "no rank fell back to a new pod"
    );
    Ok(())
}

/// The GitOps flow (delete the TrainingJob, apply it again) over the claim `retainOnDelete`
/// kept: the new job's attempt 0 resumes from the checkpoint the deleted one saved on SIGTERM,
/// and no checkpoint it saves is older than that.
#[tokio::test]
#[ignore = "needs the local cluster (make test)"]
async fn a_job_deleted_and_applied_again_resumes_from_its_retained_checkpoint() -> Result<()> {
    let (_guard, client) = installed().await?;
    let ns = Jobs::new(&client);
    let res = async {
        let name = "reapplied";
        let job = torch_job(name, 2, 60, "0.3", json!({"policy": "Never"}));
        create_job(&client, &ns.name, job.clone()).await?;
        running_pods(&client, &ns.name, name, 0, 2).await?;
        let saved = wait_for(
            "a checkpoint at step 10 or later",
            Duration::from_secs(180),
            || async {
                let st = job_status(&client, &ns.name, name).await?;
                Ok(st["progress"]["checkpointStep"]
                    .as_u64()
                    .filter(|s| *s >= 10))
            },
        )
        .await?;
        tj_api(&client, &ns.name)
            .delete(name, &kube::api::DeleteParams::background())
            .await?;
        wait_for(
            "the deleted job's pods to be gone",
            Duration::from_secs(120),
            || async {
                Ok(job_pods(&client, &ns.name, name)
                    .await?
                    .is_empty()
                    .then_some(()))
            },
        )
        .await?;
        let claim = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns.name)
            .get_opt(&format!("{name}-checkpoints"))
            .await?;
        ensure!(
            claim.is_some(),
            "retainOnDelete (the default) kept the claim"
        );

        create_job(&client, &ns.name, job).await?;
        let p = reported_progress(&client, &ns.name, name, 0).await?;
        let resumed = p["resumedFrom"]
            .as_u64()
            .context("resumedFrom in the first reports")?;
        ensure!(
            resumed >= saved,
            "attempt 0 of the job applied again resumed from step {resumed}, but step {saved} \
             was saved before the delete: {p}"
        );
        let st = wait_phase(
            &client,
            &ns.name,
            name,
            "Succeeded",
            Duration::from_secs(300),
        )
        .await?;
        ensure!(st["attempt"] == 0, "no restart needed: {st}");
        let last = st["progress"]["checkpointStep"]
            .as_u64()
            .unwrap_or_default();
        ensure!(
            last >= resumed,
            "latest.pt went back from {resumed} to {last}: {st}"
        );
        let events = job_events(&client, &ns.name, name, "CreatingWorkers").await?;
        ensure!(
            events
                .iter()
                .any(|m| m.contains("resuming from its checkpoint")),
            "{events:?}"
        );
        Ok(())
    }
    .await;
    ns.cleanup().await?;
    res
}

/// The GitOps flow with the claim deleted too (the job and its claim deleted, the job applied
/// again) while the claim lingers, being deleted (as it does while a pod of the deleted job
/// still mounts it; here a finalizer of the test's own holds it): the new job creates no worker
/// that would mount the claim on its way out, says why (`NameConflict`), and starts on a claim
/// of its own as soon as the old one is gone.
#[tokio::test]
#[ignore = "needs the local cluster (make test)"]
async fn a_job_applied_again_while_its_deleted_claim_lingers_starts_on_a_claim_of_its_own()
-> Result<()> {
    const HOLD: &str = "e2e.trainyard.dev/hold";
    let (_guard, client) = installed().await?;
    let ns = Jobs::new(&client);
    let name = "reclaimed";
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns.name);
    let claim = format!("{name}-checkpoints");
    let release = json!({"metadata": {"finalizers": null}});
    let res = async {
        let job = job_manifest(name, 1, 1, &counting_trainer(3), json!({}));
        create_job(&client, &ns.name, job.clone()).await?;
        wait_for("the job's claim", Duration::from_secs(60), || async {
            Ok(claims.get_opt(&claim).await?.map(|_| ()))
        })
        .await?;
        delete_with_its_claim_held(&client, &ns.name, name, &claim, HOLD).await?;
        create_job(&client, &ns.name, job).await?;
        let needle = format!("{claim} (being deleted");
        let conflict = condition_true(&client, &ns.name, name, "NameConflict", |m| {
            m.contains(&needle)
        })
        .await?;
        let message = &conflict["message"];
        // Given a few seconds to go wrong: no worker mounts the claim on its way out.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let pods = job_pods(&client, &ns.name, name).await?;
        ensure!(
            pods.is_empty(),
            "workers created while the claim is being deleted ({message}): {:?}",
            pods.iter().map(ResourceExt::name_any).collect::<Vec<_>>()
        );

        claims
            .patch(&claim, &PatchParams::default(), &Patch::Merge(&release))
            .await?;
        let st = wait_phase(
            &client,
            &ns.name,
            name,
            "Succeeded",
            Duration::from_secs(120),
        )
        .await?;
        let uid = tj_api(&client, &ns.name)
            .get(name)
            .await?
            .uid()
            .unwrap_or_default();
        let fresh = claims.get(&claim).await?;
        ensure!(
            fresh.labels().get(trainyard_api::crd::LABEL_JOB_UID) == Some(&uid),
            "the claim was created for the job applied again (uid {uid}): {:?}; status: {st}",
            fresh.metadata
        );
        Ok(())
    }
    .await;
    // Whatever happened, the claim is not left held by the test's finalizer.
    if claims.get_opt(&claim).await?.is_some() {
        claims
            .patch(&claim, &PatchParams::default(), &Patch::Merge(&release))
            .await?;
    }
    ns.cleanup().await?;
    res
}

/// Deletes `job` and its claim `claim`, which the finalizer `hold` keeps being deleted; returns
/// once the job's pods are gone and the claim is still there, being deleted.
async fn delete_with_its_claim_held(
    client: &Client,
    ns: &str,
    job: &str,
    claim: &str,
    hold: &str,
) -> Result<()> {
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns);
    let add = json!([{"op": "add", "path": "/metadata/finalizers/-", "value": hold}]);
    claims
        .patch(
            claim,
            &PatchParams::default(),
            &Patch::<()>::Json(serde_json::from_value(add)?),
        )
        .await?;
    tj_api(client, ns)
        .delete(job, &kube::api::DeleteParams::background())
        .await?;
    claims.delete(claim, &Default::default()).await?;
    wait_for(
        "the deleted job's pods to be gone",
        Duration::from_secs(120),
        || async { Ok(job_pods(client, ns, job).await?.is_empty().then_some(())) },
    )
    .await?;
    let lingering = claims.get(claim).await?;
    ensure!(
        lingering.metadata.deletion_timestamp.is_some(),
        "the claim is being deleted: {:?}",
        lingering.metadata
    );
    Ok(())
}

/// `job`'s condition `type_` once it is True with a message that `wanted` accepts (waited for
/// up to 60 s).
async fn condition_true(
    client: &Client,
    ns: &str,
    job: &str,
    type_: &str,
    wanted: impl Fn(&str) -> bool,
) -> Result<Value> {
    wait_for(
        &format!("condition {type_}=True"),
        Duration::from_secs(60),
        || async {
            let st = job_status(client, ns, job).await?;
            Ok(st["conditions"].as_array().and_then(|cs| {
                cs.iter()
                    .find(|c| {
                        c["type"] == type_
                            && c["status"] == "True"
                            && wanted(c["message"].as_str().unwrap_or_default())
                    })
                    .cloned()
            }))
        },
    )
    .await
}

/// `status.resumePoint` once the job's trainers reported a step-addressed checkpoint of
/// `attempt` at `at_least` or later: (step, file).
async fn resume_point(
    client: &Client,
    ns: &str,
    job: &str,
    attempt: u32,
    at_least: u64,
) -> Result<(u64, String)> {
    wait_for(
        &format!("{job}'s resume point in attempt {attempt} at step {at_least} or later"),
        Duration::from_secs(180),
        || async move {
            let point = job_status(client, ns, job).await?["resumePoint"].clone();
            let step = point["step"].as_u64().unwrap_or_default();
            let file = point["file"].as_str().unwrap_or_default().to_owned();
            Ok((point["attempt"] == attempt && step >= at_least).then_some((step, file)))
        },
    )
    .await
}

/// Sets `spec.suspend`; suspending waits until the job's pods are gone.
async fn set_suspend(client: &Client, ns: &str, job: &str, on: bool) -> Result<()> {
    let patch = json!({"spec": {"suspend": on}});
    tj_api(client, ns)
        .patch(job, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    if on {
        wait_for(
            "the suspended job's pods to be gone",
            Duration::from_secs(120),
            || async { Ok(job_pods(client, ns, job).await?.is_empty().then_some(())) },
        )
        .await?;
    }
    Ok(())
}

/// The value of the trainer's environment variable `name` in `pod`.
fn env_of(pod: &Pod, name: &str) -> Option<String> {
    pod.spec
        .as_ref()?
        .containers
        .first()?
        .env
        .as_ref()?
        .iter()
        .find(|e| e.name == name)?
        .value
        .clone()
}

/// A trainer of an old attempt that ignores the fence, still running after its pod went,
/// renames its older checkpoint over `latest.pt` after the newer attempt saved. The next
/// attempt still resumes from the newest step the trainers reported (`status.resumePoint`,
/// named in `RESUME_FROM`), not from what `latest.pt` holds. The stale write happens while
/// the job is suspended, so that no trainer of the job can save over it before the next
/// attempt loads.
#[tokio::test]
#[ignore = "needs the local cluster (make test)"]
async fn an_unfenced_stale_writer_cannot_move_the_resume_point_back() -> Result<()> {
    let (_guard, client) = installed().await?;
    let ns = Jobs::new(&client);
    let res = async {
        let name = "unfenced";
        let mut job = torch_job(name, 1, 60, "0.3", json!({"policy": "Never"}));
        // Every checkpoint kept: the test reads an early one after later ones were saved.
        set_env(&mut job, &[("KEEP_CHECKPOINTS", "100")]);
        create_job(&client, &ns.name, job).await?;
        running_pods(&client, &ns.name, name, 0, 2).await?;
        let dir = wait_for("the checkpoint volume", Duration::from_secs(60), || async {
            Ok(volume_dir(&client, &ns.name, &format!("{name}-checkpoints")).await)
        })
        .await?;
        // What the stale writer holds: an early checkpoint of the job.
        let (old_step, old_file) = resume_point(&client, &ns.name, name, 0, 5).await?;
        let stale = tokio::fs::read(dir.join(&old_file)).await?;
        let (newer, _) = resume_point(&client, &ns.name, name, 0, old_step + 10).await?;

        set_suspend(&client, &ns.name, name, true).await?;
        // The stale writer's rename, as a trainer makes it.
        let tmp = dir.join(".latest.pt.tmp.stale");
        tokio::fs::write(&tmp, &stale).await?;
        tokio::fs::rename(&tmp, dir.join("latest.pt")).await?;
        let latest = tokio::fs::read(dir.join("latest.pt")).await?;
        ensure!(trainyard_e2e::chaos::checkpoint::step(&latest).await? == old_step);
        set_suspend(&client, &ns.name, name, false).await?;
        let pods = running_pods(&client, &ns.name, name, 1, 2).await?;
        // The resume point as the pods were created with it (the trainers' SIGTERM save
        // included): a step-addressed file, at least the newest step seen before the suspend.
        let resume = env_of(&pods[0], RESUME_FROM).unwrap_or_default();
        let file = resume.rsplit('/').next().unwrap_or_default().to_owned();
        ensure!(
            file != "latest.pt" && !file.is_empty(),
            "RESUME_FROM={resume}"
        );
        for p in &pods {
            ensure!(env_of(p, RESUME_FROM).as_deref() == Some(resume.as_str()));
        }
        let point =
            trainyard_e2e::chaos::checkpoint::step(&tokio::fs::read(dir.join(&file)).await?)
                .await?;
        ensure!(
            point >= newer,
            "RESUME_FROM={resume} holds step {point}, before {newer}"
        );
        // The trainer may resume from a newer file it finds beside it, never from an older.
        let p = reported_progress(&client, &ns.name, name, 1).await?;
        ensure!(
            p["resumedFrom"].as_u64().is_some_and(|r| r >= point),
            "attempt 1 resumed from {} (latest.pt holds step {old_step}), before the resume \
             point {point} ({file}): {p}",
            p["resumedFrom"]
        );
        let st = wait_phase(
            &client,
            &ns.name,
            name,
            "Succeeded",
            Duration::from_secs(300),
        )
        .await?;
        ensure!(
            st["failures"] == 0 && st["preemptions"] == 0,
            "status: {st}"
        );
        Ok(())
    }
    .await;
    ns.cleanup().await?;
    res
}

/// The resident set of process `pid`, in MiB.
fn rss_mib(pid: u32) -> Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("no VmRSS for {pid}"))?;
    Ok(kib / 1024.0)
}

/// The process of pod `pod` of the release: the operator's by its `POD_NAME`, a device
/// plugin's by its `NODE_NAME` and its command line.
fn process_of(pod: &Pod) -> Result<u32> {
    let name = pod.name_any();
    let pids = if name.contains("device-plugin") {
        let node = node_of(pod);
        processes_with_env("NODE_NAME", |v| v == node)?
            .into_iter()
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains("trainyard-device-plugin"))
            })
            .collect()
    } else {
        processes_with_env("POD_NAME", |v| v == name)?
    };
    pids.first()
        .copied()
        .with_context(|| format!("no process of {name}"))
}

/// Restarts and readiness of the release's pods, by name.
async fn release_pods(client: &Client) -> Result<Vec<(Pod, i32, bool)>> {
    let pods = Api::<Pod>::namespaced(client.clone(), RELEASE_NS)
        .list(&ListParams::default())
        .await?
        .items;
    Ok(pods
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| {
            let st = p.status.clone().unwrap_or_default();
            let restarts = st
                .container_statuses
                .iter()
                .flatten()
                .map(|c| c.restart_count)
                .sum();
            let ready = st
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            (p, restarts, ready)
        })
        .collect())
}

/// Every port of both binaries flooded at once from an address that is not a node's (as a
/// pod's would be): connections past each port's per-source share held open to each
/// operator replica's progress and metrics ports and to each device plugin's metrics port,
/// dialled again soon after they are closed, for 20 s. No pod of the release restarts or turns
/// unready (the kubelet's probes, from the node's address, keep being answered), and each
/// binary's resident set stays under its memory limit in the chart (operator 256 Mi, device
/// plugin 128 Mi).
#[tokio::test]
#[ignore = "needs the local cluster (make test)"]
async fn a_flood_of_every_port_leaves_the_probes_green_and_memory_under_the_limits() -> Result<()> {
    use trainyard_e2e::chaos::faults::{FLOOD_SOURCE, hold_connections};
    let (_guard, client) = installed().await?;
    let before = release_pods(&client).await?;
    let mut floods = Vec::new();
    for (pod, _, ready) in &before {
        ensure!(*ready, "{} is not ready before the flood", pod.name_any());
        let ip: std::net::IpAddr = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.as_deref())
            .context("pod IP")?
            .parse()?;
        // Past each port's per-source share (8 of a metrics port's 64, 64 of the progress
        // port's 2,048), not so far past it that reopening the closed ones starves the CPU.
        for (port, connections) in [("metrics", 16), ("progress", 128)] {
            if let Some(port) =
                trainyard_e2e::named_port(pod, port).and_then(|p| u16::try_from(p).ok())
            {
                let addr = std::net::SocketAddr::new(ip, port);
                let held = hold_connections(Some(FLOOD_SOURCE), addr, connections);
                floods.push(tokio::spawn(held));
            }
        }
    }
    ensure!(floods.len() >= 4, "ports flooded: {}", floods.len());
    let mut peak: std::collections::BTreeMap<String, f64> = Default::default();
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_secs(2)).await;
        for (pod, _, _) in &before {
            let mib = rss_mib(process_of(pod)?)?;
            let top = peak.entry(pod.name_any()).or_default();
            *top = top.max(mib);
        }
    }
    for flood in &floods {
        flood.abort();
    }
    // Past a probe period after the flood, with the flood's effects, if any, visible.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = release_pods(&client).await?;
    for (pod, restarts, _) in &before {
        let name = pod.name_any();
        let now = after.iter().find(|(p, _, _)| p.name_any() == name);
        let (_, restarts_now, ready) = now.with_context(|| format!("{name} is gone"))?;
        if restarts_now != restarts || !*ready {
            let why = why_unready(&client, pod).await;
            bail!(
                "{name} {} under the flood\n{why}",
                if restarts_now == restarts {
                    "turned unready"
                } else {
                    "restarted"
                }
            );
        }
        let limit = if name.contains("device-plugin") {
            128.0
        } else {
            256.0
        };
        let top = peak[&name];
        println!("flood: {name} peak RSS {top:.1} MiB (limit {limit} MiB)");
        ensure!(
            top < limit,
            "{name} peaked at {top:.1} MiB, over its {limit} MiB limit"
        );
    }
    Ok(())
}

/// What the cluster says about a pod that turned unready or restarted: its conditions, its
/// node's Ready condition, the Events about it and the end of its log, so that a failure on a
/// machine whose logs are gone explains itself.
async fn why_unready(client: &Client, pod: &Pod) -> String {
    use k8s_openapi::api::core::v1::{Event, Node};
    let name = pod.name_any();
    let mut out = Vec::new();
    let now = Api::<Pod>::namespaced(client.clone(), RELEASE_NS)
        .get(&name)
        .await
        .ok();
    let node = now.as_ref().map(node_of).unwrap_or_default();
    for c in now
        .iter()
        .flat_map(|p| p.status.iter().flat_map(|s| s.conditions.iter().flatten()))
    {
        out.push(format!(
            "pod condition {}={} reason={:?} message={:?} since {:?}",
            c.type_,
            c.status,
            c.reason,
            c.message,
            c.last_transition_time.as_ref().map(|t| t.0)
        ));
    }
    if let Ok(n) = Api::<Node>::all(client.clone()).get(&node).await {
        for c in n
            .status
            .iter()
            .flat_map(|s| s.conditions.iter().flatten())
            .filter(|c| c.type_ == "Ready")
        {
            out.push(format!(
                "node {node} Ready={} reason={:?} since {:?}",
                c.status,
                c.reason,
                c.last_transition_time.as_ref().map(|t| t.0)
            ));
        }
    }
    let events = Api::<Event>::namespaced(client.clone(), RELEASE_NS)
        .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    for e in events {
        out.push(format!(
            "event {} x{}: {}",
            e.reason.unwrap_or_default(),
            e.count.unwrap_or(1),
            e.message.unwrap_or_default()
        ));
    }
    let container = if name.contains("device-plugin") {
        "device-plugin"
    } else {
        "operator"
    };
    if let Ok(log) = pod_log(RELEASE_NS, pod, container) {
        let lines: Vec<&str> = log.lines().collect();
        let tail = &lines[lines.len().saturating_sub(20)..];
        out.push(format!("last log lines:\n{}", tail.join("\n")));
    }
    out.join("\n")
}

/// Creates a pod that holds every GPU of `node` but `leave` (of those no pod holds), so that
/// the node has room for exactly `leave` one-GPU workers; returns its name.
async fn filler_pod(client: &Client, ns: &str, node: &str, leave: u64) -> Result<String> {
    let on_node = Api::<Pod>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await?;
    let held: u64 = on_node
        .items
        .iter()
        .filter(|p| !pod_finished(p))
        .map(gpus_asked)
        .sum();
    let all = allocatable(client, node, GPU)
        .await?
        .with_context(|| format!("{node} advertises no GPUs"))?;
    let asked = u64::try_from(all)?
        .checked_sub(held + leave)
        .with_context(|| format!("{node}: {held} of {all} GPUs held, {leave} to leave"))?;
    let name = &format!("filler-{node}");
    gpu_pod(client, ns, name, node, asked).await?;
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    wait_for(
        &format!("{name} ({asked} GPUs) running on {node}"),
        Duration::from_secs(60),
        || async {
            let p = pods.get(name).await?;
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            Ok((phase == Some("Running")).then_some(()))
        },
    )
    .await?;
    Ok(name.to_owned())
}

/// The elastic scenario's steps: enough to train through the loss, the shrink and node 2's
/// return at 0.5 s a step.
const ELASTIC_STEPS: u32 = 200;

/// An elastic job of four one-GPU workers: two on node 2 (spot, two GPUs), two on node 1,
/// whose other GPUs a filler pod holds. `minWorkers: 2`, replacements waited for 10 s. Its
/// pods are recreated at each restart: the ledger check bounds each attempt by its own pods'
/// timestamps (an elastic gang shrinking in place is a World test and the chaos run's job).
fn elastic_job(name: &str) -> Value {
    let mut job = recreating(torch_job(
        name,
        1,
        ELASTIC_STEPS,
        "0.5",
        json!({"policy": "Prefer"}),
    ));
    job["spec"]["workers"] = json!(4);
    job["spec"]["elastic"] = json!({"minWorkers": 2, "replacementWaitSeconds": 10});
    set_env(&mut job, &LOSS_ENV);
    job
}

/// The same training, never interrupted: the same elastic job on node 1 alone (on-demand),
/// run after the first one, when node 1 has room for all four workers.
fn elastic_twin(name: &str) -> Value {
    let mut job = elastic_job(name);
    job["spec"]["spot"] = json!({"policy": "Never"});
    set_env(&mut job, &[("STEP_SECONDS", "0")]);
    job
}

/// Waits (up to `secs`) until `job` runs attempt `attempt` with `workers` workers; returns its
/// status.
async fn runs_at_size(
    client: &Client,
    ns: &str,
    job: &str,
    (attempt, workers): (u32, u32),
    secs: u64,
) -> Result<Value> {
    wait_for(
        &format!("{job} running attempt {attempt} with {workers} workers"),
        Duration::from_secs(secs),
        || async move {
            let st = job_status(client, ns, job).await?;
            Ok(
                (st["phase"] == "Running"
                    && st["attempt"] == attempt
                    && st["worldSize"] == workers)
                    .then_some(st),
            )
        },
    )
    .await
}

/// Issue 46: node 2 (spot) is lost with two of an elastic job's four workers and no capacity
/// is left for them: after the gang restart and the 10-s wait, the job trains on with the two
/// workers node 1 has room for; node 2 returns, and the job grows back to four from a
/// checkpoint it saved on request. One preemption, no failure; the final weights equal an
/// uninterrupted four-worker twin's bit for bit, and the ledger's running time by size agrees
/// with the pods' timestamps.
#[expect(
    clippy::too_many_lines,
    reason = "a cluster scenario reads as one story, in the order it happens"
)]
#[tokio::test]
#[ignore = "needs the local cluster (make test)"]
async fn an_elastic_gang_trains_on_with_the_survivors_and_grows_back_when_capacity_returns()
-> Result<()> {
    let (_guard, client) = installed().await?;
    let ns = Jobs::new(&client);
    let pods_api = Api::<Pod>::namespaced(client.clone(), &ns.name);
    let res = with_spot_node(&client, || async {
        let (spot, on_demand) = (node2_name(), node_name());
        let name = "elastic";
        let filler = filler_pod(&client, &ns.name, &on_demand, 2).await?;
        let pod_times = PodTimesRecorder::start(&client, &ns.name).await?;
        create_job(&client, &ns.name, elastic_job(name)).await?;
        let pods = running_pods(&client, &ns.name, name, 0, 4).await?;
        let on = |node: &str| pods.iter().filter(|p| node_of(p) == node).count();
        assert_eq!(
            (on(&spot), on(&on_demand)),
            (2, 2),
            "two workers on each node"
        );
        let rank0 = rank_pod(&pods, 0)?.clone();
        let log = |pod: &Pod| pod_log(&ns.name, pod, TRAINER).unwrap_or_default();
        wait_for("a periodic checkpoint", Duration::from_secs(180), || {
            let text = log(&rank0);
            async move { Ok(text.contains("checkpoint saved at step").then_some(())) }
        })
        .await?;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let lost_at = jiff::Timestamp::now();
        node2("lose")?;

        // The gang restarts for the loss; two of its four new workers find no room, and after
        // 10 s it shrinks to the two node 1 holds.
        let st = runs_at_size(&client, &ns.name, name, (2, 2), 240).await?;
        assert_eq!(st["lastRestart"]["reason"], "Shrink", "status: {st}");
        assert_eq!(
            (st["preemptions"].as_u64(), st["failures"].as_u64()),
            (Some(1), Some(0)),
            "status: {st}"
        );
        let shrunk = st["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Shrunk")
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            (&shrunk["status"], &shrunk["reason"]),
            (&json!("True"), &json!("CapacityGone")),
            "{st}"
        );
        let shrinking = job_events(&client, &ns.name, name, "Shrinking").await?;
        assert!(
            shrinking
                .iter()
                .any(|e| e.contains("could not be placed for 10s")),
            "a Shrinking Event: {shrinking:?}"
        );
        let small = running_pods(&client, &ns.name, name, 2, 2).await?;
        assert!(
            small.iter().all(|p| node_of(p) == on_demand),
            "the survivors run on node 1"
        );
        let stages = recovery_stages(&client, &ns.name, (name, 2, &small), lost_at).await?;
        println!("node 2 lost, training again with 2 of 4 workers: {stages}");
        let rank0 = rank_pod(&small, 0)?.clone();
        let said = log(&rank0);
        assert!(
            said.contains("elastic: world size 2 of 4"),
            "rank 0's log: {said}"
        );

        // Node 2 returns with its two GPUs: the gang grows back to four from a checkpoint.
        node2("start")?;
        spot_node_ready_with_gpus(&client, &spot).await?;
        let back_at = jiff::Timestamp::now();
        let st = runs_at_size(&client, &ns.name, name, (3, 4), 240).await?;
        assert_eq!(st["lastRestart"]["reason"], "Grow", "status: {st}");
        let grown = restart_decided_at(&client, &ns.name, name).await?;
        let detail = st["lastRestart"]["detail"].as_str().unwrap_or_default();
        assert!(
            detail.contains("saved a checkpoint at step"),
            "status: {st}"
        );
        assert!(
            !job_events(&client, &ns.name, name, "Growing")
                .await?
                .is_empty()
        );
        let full = running_pods(&client, &ns.name, name, 3, 4).await?;
        let stages = recovery_stages(&client, &ns.name, (name, 3, &full), back_at).await?;
        println!("node 2 back, training again with 4 of 4 workers: {stages}");

        let st = succeeded_after_one_preemption(&client, &ns.name, name).await?;
        assert_eq!(st["progress"]["step"], ELASTIC_STEPS, "status: {st}");
        pods_api.delete(&filler, &Default::default()).await?;
        create_job(&client, &ns.name, elastic_twin("elastic-twin")).await?;
        ends_as_its_baseline(&client, &ns.name, name, 3, "elastic-twin").await?;
        let ledger: GoodputLedger =
            serde_json::from_value(st["ledger"].clone()).context("status.ledger")?;
        let sizes = ledger_check::check_sizes(
            &ledger,
            &pod_times.pods(name),
            &[
                SizedAttempt {
                    attempt: 0,
                    workers: 4,
                    ended: Ended::NodeLost {
                        at: lost_at,
                        heard_before: HEARD_BEFORE_LOSS,
                    },
                },
                SizedAttempt {
                    attempt: 2,
                    workers: 2,
                    ended: Ended::DecidedAt(grown),
                },
                SizedAttempt {
                    attempt: 3,
                    workers: 4,
                    ended: Ended::LastExit,
                },
            ],
        )?;
        println!("ledger by size (wall s): {sizes:?}; {:?}", ledger.elastic);
        Ok(())
    })
    .await;
    // The filler goes whatever happened (deleting it twice is harmless).
    let _ = pods_api
        .delete(&format!("filler-{}", node_name()), &Default::default())
        .await;
    ns.cleanup().await?;
    res
}

/// A namespace user with `create pods` and no right on TrainingJobs copies worker 0, seal and
/// all, under another name with attempt u32::MAX, and posts rank 0's report with a bogus
/// checkpoint from it, with its own valid token for the channel's audience: 403. Status keeps
/// the job's own progress, and after a preemption the next attempt resumes from the real
/// checkpoint.
#[tokio::test]
#[ignore = "needs the local cluster (make test)"]
async fn a_worker_copied_by_a_namespace_user_cannot_report_for_its_rank() -> Result<()> {
    let (_guard, client) = installed().await?;
    let ns = Jobs::new(&client);
    let name = "sealed";
    let user = format!("system:serviceaccount:{}:pod-maker", ns.name);
    let res = async {
        // Recreated pods, so that each one's RESUME_FROM shows in its spec.
        let job = recreating(torch_job(name, 1, 200, "0.3", json!({"policy": "Never"})));
        create_job(&client, &ns.name, job).await?;
        let pods = running_pods(&client, &ns.name, name, 0, 2).await?;
        let worker = rank_pod(&pods, 0)?.clone();
        wait_for("a checkpoint reported", Duration::from_secs(180), || async {
            let st = job_status(&client, &ns.name, name).await?;
            Ok(st["progress"]["checkpointStep"].as_u64().filter(|s| *s > 0))
        })
        .await?;
        let rbac = format!(
            "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: pod-maker, namespace: {ns}}}\n---\n\
             apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: pod-maker, namespace: {ns}}}\n\
             rules: [{{apiGroups: [\"\"], resources: [pods, pods/log], verbs: [create, get, list]}}]\n---\n\
             apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: pod-maker, namespace: {ns}}}\n\
             roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: pod-maker}}\n\
             subjects: [{{kind: ServiceAccount, name: pod-maker, namespace: {ns}}}]\n",
            ns = ns.name
        );
        kubectl(&["apply", "-f", "-"], &rbac)?;
        // `kubectl auth can-i` answers yes or no on stdout (and exits 1 on no).
        let can = |verb: &str, what: &str| -> Result<bool> {
            let out = Command::new("kubectl")
                .args(["auth", "can-i", verb, what, "-n", &ns.name, "--as", &user])
                .output()
                .context("kubectl auth can-i")?;
            Ok(String::from_utf8_lossy(&out.stdout).trim() == "yes")
        };
        ensure!(can("create", "pods")?, "{user} may create pods");
        ensure!(!can("patch", "trainingjobs.trainyard.dev")?, "{user} may not touch jobs");
        let before = job_status(&client, &ns.name, name).await?;

        let copy = serde_json::to_string(&forged_copy(&worker, "sealed-copy", u32::MAX)?)?;
        kubectl(&["create", "-n", &ns.name, "--as", &user, "-f", "-"], &copy)?;
        // Three rounds of reports (its rank's at its attempt and at u32::MAX), all refused.
        let log = wait_for("the copy's answers", Duration::from_secs(120), || async {
            let pod = Api::<Pod>::namespaced(client.clone(), &ns.name)
                .get("sealed-copy")
                .await?;
            let log = pod_log(&ns.name, &pod, "trainer").unwrap_or_default();
            Ok((log.lines().count() >= 3).then_some(log))
        })
        .await?;
        let (accepted, refused, other) = forged::answers(&log);
        ensure!(accepted == 0 && other == 0 && refused >= 6, "the copy's answers: {log}");

        let st = job_status(&client, &ns.name, name).await?;
        let step = st["progress"]["step"].as_u64().unwrap_or_default();
        ensure!(step < forged::FORGED_STEP, "status.progress moved: {st}");
        ensure!(st["progress"]["attempt"] == 0, "status.progress: {st}");
        let resume = st["resumePoint"].to_string();
        ensure!(!resume.contains(forged::FORGED_FILE), "status.resumePoint: {st} (before: {before})");
        ensure!(st["resumePoint"]["attempt"].as_u64() != Some(u64::from(u32::MAX)), "{st}");

        preempt_pod(&client, &ns.name, &worker.name_any(), "TerminationByKubelet").await?;
        let next = running_pods(&client, &ns.name, name, 1, 2).await?;
        for p in &next {
            let resume = env_of(p, RESUME_FROM).unwrap_or_default();
            ensure!(
                !resume.is_empty() && !resume.contains(forged::FORGED_FILE),
                "{}: RESUME_FROM={resume}",
                p.name_any()
            );
        }
        let st = wait_phase(&client, &ns.name, name, "Succeeded", Duration::from_secs(300)).await?;
        ensure!(st["progress"]["resumedFrom"].as_u64().is_some_and(|s| s > 0), "{st}");
        Ok(())
    }
    .await;
    let _ = Api::<Pod>::namespaced(client.clone(), &ns.name)
        .delete("sealed-copy", &Default::default())
        .await;
    ns.cleanup().await?;
    res
}

/// Waits (up to 180 s) until `pod`'s trainer log holds `needle`.
async fn log_says(ns: &str, pod: &Pod, needle: &str) -> Result<()> {
    let what = format!("{} to log {needle:?}", pod.name_any());
    wait_for(&what, Duration::from_secs(180), || async move {
        let log = pod_log(ns, pod, "trainer").unwrap_or_default();
        Ok(log.contains(needle).then_some(()))
    })
    .await
}

/// Node 2's kubelet, stopped with SIGSTOP (its process and containers stay; it renews
/// nothing and reports nothing until [`PausedKubelet::resume`] or drop sends SIGCONT).
struct PausedKubelet {
    pid: String,
    at: std::time::Instant,
}

impl PausedKubelet {
    /// Waits (up to 30 s) for node 2's Lease to be renewed, then pauses its kubelet at once:
    /// its next renewal is due one renew interval (10 s) later.
    async fn right_after_a_renewal(client: &Client) -> Result<Self> {
        let leases = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
            client.clone(),
            "kube-node-lease",
        );
        let node = node2_name();
        let renewed = |l: &k8s_openapi::api::coordination::v1::Lease| {
            l.spec
                .as_ref()
                .and_then(|s| s.renew_time.clone())
                .map(|t| t.0)
        };
        let first = renewed(&leases.get(&node).await?);
        let pid_file = trainyard_e2e::state_dir().join("pids/node2/kubelet.pid");
        let pid = std::fs::read_to_string(&pid_file)
            .with_context(|| format!("reading {}", pid_file.display()))?
            .trim()
            .to_owned();
        let started = std::time::Instant::now();
        while started.elapsed() < Duration::from_secs(30) {
            if renewed(&leases.get(&node).await?) != first {
                let stop = Command::new("kill").args(["-STOP", &pid]).status()?;
                ensure!(stop.success(), "kill -STOP {pid} (node 2's kubelet) failed");
                return Ok(Self {
                    pid,
                    at: std::time::Instant::now(),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("node 2's Lease was not renewed within 30 s")
    }

    fn resume(&self) -> Result<()> {
        let cont = Command::new("kill").args(["-CONT", &self.pid]).status()?;
        ensure!(
            cont.success(),
            "kill -CONT {} (node 2's kubelet) failed",
            self.pid
        );
        Ok(())
    }
}

impl Drop for PausedKubelet {
    fn drop(&mut self) {
        let _ = self.resume();
    }
}

/// Runs `body` with the controller-manager at Kubernetes' default node grace period (40 s:
/// a kubelet silent that long makes its node NotReady) instead of the harness's 15 s, and
/// puts the harness's back afterwards, also on failure.
async fn with_default_node_grace<F, Fut>(body: F) -> Result<()>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    use trainyard_e2e::chaos::faults::{start_process, stop_process};
    const FLAG: &str = "--node-monitor-grace-period";
    let harness = tokio::task::spawn_blocking(|| stop_process("kube-controller-manager")).await??;
    start_process(&harness.clone().without_flag(FLAG))
        .context("starting the controller-manager at the default grace period")?;
    let res = body().await;
    let back = tokio::task::spawn_blocking(move || {
        stop_process("kube-controller-manager")?;
        start_process(&harness)
    })
    .await?
    .context("starting the controller-manager with the harness's grace period again");
    res.and(back.map(drop))
}

/// Fails unless `node` is Ready and has been since before `t`.
async fn ready_since_before(client: &Client, node: &str, t: jiff::Timestamp) -> Result<()> {
    let got = Api::<Node>::all(client.clone()).get(node).await?;
    let ready = got
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .with_context(|| format!("{node} has no Ready condition"))?;
    let since = ready.last_transition_time.as_ref().map(|t| t.0);
    ensure!(
        ready.status == "True" && since.is_some_and(|since| since < t),
        "{node} Ready since before {t}: {ready:?}"
    );
    Ok(())
}

/// Ranks that never reported are no evidence of a lost node, tried as a new user would under
/// production's timers: a plain torchrun DDP trainer that never uses the progress channel
/// (rank 0 on node 1, rank 1 on node 2), node 2's kubelet paused for 18 s right after a
/// renewal (its next renewal about 8 s late, well inside Kubernetes' default 40-s grace, so
/// node 2 is never NotReady), and meanwhile rank 0's training process on node 1 killed
/// (SIGKILL, as the OOM killer would): its torchrun exits 1. One failure, no preemption.
/// (Of the operator's timers the harness changes only `nodeNotReadyTimeoutSeconds`, which
/// starts once a node is NotReady: never here.)
#[tokio::test]
#[ignore = "needs the local cluster (make test)"]
async fn a_paused_kubelet_beside_a_genuine_crash_is_one_failure_under_production_timers()
-> Result<()> {
    let (_guard, client) = installed().await?;
    let ns = Jobs::new(&client);
    let res = with_default_node_grace(|| {
        with_spot_node(&client, || async {
            let (spot, on_demand) = (node2_name(), node_name());
            let name = place_rank_on(&client, &ns.name, ("1", &spot), &on_demand, || {
                let mut job = recreating(torch_job(
                    "quiet",
                    1,
                    400,
                    "0.3",
                    json!({"policy": "Prefer"}),
                ));
                job["spec"]["template"]["spec"]["containers"][0]["command"] = json!([
                    "env",
                    "-u",
                    "TRAINYARD_PROGRESS_URL",
                    "torchrun",
                    "/app/train.py"
                ]);
                job["spec"]["restartPolicy"]["maxFailures"] = json!(1);
                job
            })
            .await?;
            let name = name.as_str();
            let pods = running_pods(&client, &ns.name, name, 0, 2).await?;
            log_says(&ns.name, rank_pod(&pods, 0)?, "checkpoint saved at step").await?;
            let st = job_status(&client, &ns.name, name).await?;
            ensure!(
                st["progress"].is_null(),
                "the trainer reports nothing: {st}"
            );

            let paused = PausedKubelet::right_after_a_renewal(&client).await?;
            let paused_at = jiff::Timestamp::now();
            tokio::time::sleep(Duration::from_secs(2)).await;
            let job = name.to_owned();
            let killed = tokio::task::spawn_blocking(move || {
                trainyard_e2e::chaos::faults::kill_training_process(&job, "0", "0")
            })
            .await??
            .context("no training process of rank 0")?;
            println!("node 2's kubelet paused; rank 0's training process {killed} killed");
            tokio::time::sleep(Duration::from_secs(18).saturating_sub(paused.at.elapsed())).await;
            paused.resume()?;
            println!("node 2's kubelet resumed after {:?}", paused.at.elapsed());
            drop(paused);

            let st = wait_for("the restart decided", Duration::from_secs(180), || async {
                let st = job_status(&client, &ns.name, name).await?;
                Ok((st["attempt"].as_u64() >= Some(1)).then_some(st))
            })
            .await?;
            ensure!(
                st["failures"] == 1 && st["preemptions"] == 0,
                "one failure, no preemption: {st}"
            );
            ensure!(st["lastRestart"]["reason"] == "Failure", "status: {st}");
            // Kubernetes never took node 2 for gone.
            ready_since_before(&client, &spot, paused_at).await?;
            running_pods(&client, &ns.name, name, 1, 2).await?;
            let st = job_status(&client, &ns.name, name).await?;
            ensure!(
                st["failures"] == 1 && st["preemptions"] == 0,
                "status: {st}"
            );
            Ok(())
        })
    })
    .await;
    ns.cleanup().await?;
    res
}

/// Two-worker, one-GPU jobs that start at once on 3 free GPUs, one free on node 2 (spot) and
/// two on node 1 (filler pods hold the rest): whichever job the scheduler gives one GPU only
/// waits half placed. Each job's placement timeout is 15 s and each trains 40 steps of 1 s.
fn contending_job(name: &str, elastic: bool) -> Value {
    let mut extra = json!({
        "spot": {"policy": "Prefer"},
        "scheduling": {"placementTimeoutSeconds": 15},
        "restartPolicy": {"backoffSeconds": 1},
    });
    if elastic {
        extra["elastic"] = json!({"minWorkers": 1, "replacementWaitSeconds": 10});
    }
    job_manifest(name, 2, 1, &counting_trainer(40), extra)
}

/// Starts jobs `{prefix}-a` and `{prefix}-b` at once on 3 free GPUs (see
/// [`contending_job`]), waits for both to succeed, and returns their names and final
/// statuses. Neither spent a budget. The filler pods go whatever happened.
async fn two_jobs_on_three_gpus(
    client: &Client,
    ns: &Jobs,
    prefix: &str,
    elastic: bool,
) -> Result<Vec<(String, Value)>> {
    let (spot, on_demand) = (node2_name(), node_name());
    let mut fillers = vec![filler_pod(client, &ns.name, &on_demand, 2).await?];
    let res = async {
        fillers.push(filler_pod(client, &ns.name, &spot, 1).await?);
        let names = [format!("{prefix}-a"), format!("{prefix}-b")];
        tokio::try_join!(
            create_job(client, &ns.name, contending_job(&names[0], elastic)),
            create_job(client, &ns.name, contending_job(&names[1], elastic))
        )?;
        let limit = Duration::from_secs(420);
        let (a, b) = tokio::try_join!(
            wait_phase(client, &ns.name, &names[0], "Succeeded", limit),
            wait_phase(client, &ns.name, &names[1], "Succeeded", limit)
        )?;
        for st in [&a, &b] {
            assert_eq!(
                (st["preemptions"].as_u64(), st["failures"].as_u64()),
                (Some(0), Some(0)),
                "no restart counted as a preemption or a failure: {st}"
            );
        }
        let [na, nb] = names;
        Ok(vec![(na, a), (nb, b)])
    }
    .await;
    let pods = Api::<Pod>::namespaced(client.clone(), &ns.name);
    for filler in &fillers {
        let _ = pods.delete(filler, &Default::default()).await;
    }
    wait_for("the filler pods gone", Duration::from_secs(60), || async {
        let left = pods.list(&ListParams::default()).await?;
        let any = left.items.iter().any(|p| fillers.contains(&p.name_any()));
        Ok((!any).then_some(()))
    })
    .await?;
    res
}

/// Issue 64: two 2-worker jobs on 3 free GPUs, both started at once. The one that got a
/// single GPU does not hold it for ever: past its 15-s placement timeout it releases its
/// pods (a `Requeue`, against no budget, told in a `Requeued` Event), tries again after its
/// backoff (a `Retrying` Event), and once the other has finished it runs and succeeds too.
#[tokio::test]
#[ignore = "needs the local cluster (make test)"]
async fn two_jobs_on_too_few_gpus_both_finish_one_after_the_other_without_a_counted_restart()
-> Result<()> {
    let (_guard, client) = installed().await?;
    let ns = Jobs::new(&client);
    let res = with_spot_node(&client, || async {
        let statuses = two_jobs_on_three_gpus(&client, &ns, "requeue", false).await?;
        let requeued: Vec<&(String, Value)> = statuses
            .iter()
            .filter(|(_, st)| st["requeues"].as_u64().unwrap_or(0) > 0)
            .collect();
        ensure!(
            !requeued.is_empty(),
            "one job waited half placed past its timeout and was requeued: {statuses:?}"
        );
        for (job, st) in requeued {
            let requeues = st["requeues"].as_u64().unwrap_or(0);
            let attempt = st["attempt"].as_u64().unwrap_or(0);
            assert_eq!(
                attempt, requeues,
                "every restart of {job} was a requeue: {st}"
            );
            let released = job_events(&client, &ns.name, job, "Requeued").await?;
            assert!(
                released
                    .iter()
                    .any(|e| e.contains("could not be placed for 15s")),
                "a Requeued Event for {job}: {released:?}"
            );
            let retried = job_events(&client, &ns.name, job, "Retrying").await?;
            assert!(!retried.is_empty(), "a Retrying Event for {job}");
            println!("requeue: job {job} requeued {requeues} time(s), then succeeded");
        }
        Ok(())
    })
    .await;
    let cleaned = ns.cleanup().await;
    res.and(cleaned)
}

/// The same with elastic jobs (`minWorkers: 1`): the one that got a single GPU shrinks to
/// it after its 10-s wait instead of being requeued, trains, and succeeds.
#[tokio::test]
#[ignore = "needs the local cluster (make test)"]
async fn two_elastic_jobs_on_too_few_gpus_shrink_instead_of_being_requeued() -> Result<()> {
    let (_guard, client) = installed().await?;
    let ns = Jobs::new(&client);
    let res = with_spot_node(&client, || async {
        let statuses = two_jobs_on_three_gpus(&client, &ns, "elastic", true).await?;
        let mut shrinks = Vec::new();
        for (job, st) in &statuses {
            assert_eq!(st["requeues"].as_u64().unwrap_or(0), 0, "{st}");
            shrinks.extend(job_events(&client, &ns.name, job, "Shrinking").await?);
        }
        ensure!(
            shrinks
                .iter()
                .any(|e| e.contains("could not be placed for 10s")),
            "one job shrank to the GPU it got: {statuses:?}"
        );
        println!("elastic: {shrinks:?}");
        Ok(())
    })
    .await;
    let cleaned = ns.cleanup().await;
    res.and(cleaned)
}

/// Issue 64: a job whose pod template names a gang scheduler gets that scheduler's PodGroup,
/// owned by the job (minMember the workers, minResources their GPUs), every worker pod joins
/// it, and it goes with the job. Neither Volcano nor the scheduler-plugins scheduler can be
/// built here, so their PodGroup CRDs are installed from the types trainyard writes and the
/// pods wait for a scheduler that never comes: what is checked is the operator's part.
#[expect(
    clippy::too_many_lines,
    reason = "a cluster scenario reads as one story, in the order it happens"
)]
#[tokio::test]
#[ignore = "needs the local cluster (make test)"]
async fn a_gang_schedulers_pod_group_is_created_joined_and_deleted_with_the_job() -> Result<()> {
    use kube::CustomResourceExt;
    use trainyard_operator::surface::podgroup::{
        COSCHEDULING_GROUP_LABEL, CoschedulingPodGroup, VOLCANO_GROUP_ANNOTATION, VolcanoPodGroup,
    };
    let (_guard, client) = installed().await?;
    ensure_crd(&client, VolcanoPodGroup::crd()).await?;
    ensure_crd(&client, CoschedulingPodGroup::crd()).await?;
    let ns = Jobs::new(&client);
    let job = |name: &str, scheduler: &str| {
        let mut job = job_manifest(name, 2, 1, &counting_trainer(5), json!({}));
        job["spec"]["template"]["spec"]["schedulerName"] = json!(scheduler);
        job
    };
    create_job(&client, &ns.name, job("gang-volcano", "volcano")).await?;
    create_job(
        &client,
        &ns.name,
        job("gang-cosched", "scheduler-plugins-scheduler"),
    )
    .await?;
    let volcano = Api::<VolcanoPodGroup>::namespaced(client.clone(), &ns.name);
    let cosched = Api::<CoschedulingPodGroup>::namespaced(client.clone(), &ns.name);
    let res = async {
        let limit = Duration::from_secs(60);
        let v = wait_for("the Volcano PodGroup", limit, || async {
            Ok(volcano.get_opt("gang-volcano").await?)
        })
        .await?;
        let c = wait_for("the coscheduling PodGroup", limit, || async {
            Ok(cosched.get_opt("gang-cosched").await?)
        })
        .await?;
        for (job, meta) in [("gang-volcano", &v.metadata), ("gang-cosched", &c.metadata)] {
            let uid = tj_api(&client, &ns.name).get(job).await?.metadata.uid;
            let owner = meta.owner_references.iter().flatten().next().cloned();
            let owner = owner.with_context(|| format!("{job}'s PodGroup has no owner"))?;
            assert_eq!(
                (Some(owner.uid), owner.controller),
                (uid, Some(true)),
                "{job}'s PodGroup is owned by the job"
            );
        }
        assert_eq!(v.spec.min_member, 2);
        let gpus = v.spec.min_resources.as_ref().and_then(|r| r.get(GPU));
        assert_eq!(gpus.map(|q| q.0.as_str()), Some("2"));
        assert_eq!(
            (c.spec.min_member, c.spec.schedule_timeout_seconds),
            (2, Some(180))
        );
        let joined = |job: &'static str| {
            let client = client.clone();
            let ns = ns.name.clone();
            async move {
                let pods = job_pods(&client, &ns, job).await?;
                Ok::<_, anyhow::Error>((pods.len() == 2).then_some(pods))
            }
        };
        let pods = wait_for("gang-volcano's 2 pods", limit, || joined("gang-volcano")).await?;
        for p in &pods {
            let said = p.annotations().get(VOLCANO_GROUP_ANNOTATION);
            assert_eq!(
                said.map(String::as_str),
                Some("gang-volcano"),
                "{}",
                p.name_any()
            );
        }
        let pods = wait_for("gang-cosched's 2 pods", limit, || joined("gang-cosched")).await?;
        for p in &pods {
            let said = p.labels().get(COSCHEDULING_GROUP_LABEL);
            assert_eq!(
                said.map(String::as_str),
                Some("gang-cosched"),
                "{}",
                p.name_any()
            );
        }
        Ok::<(), anyhow::Error>(())
    }
    .await;
    ns.cleanup().await?;
    res?;
    // The garbage collector deletes each PodGroup with its job.
    wait_for(
        "both PodGroups gone with their jobs",
        Duration::from_secs(120),
        || async {
            let gone = volcano.get_opt("gang-volcano").await?.is_none()
                && cosched.get_opt("gang-cosched").await?.is_none();
            Ok(gone.then_some(()))
        },
    )
    .await
}

/// Kueue's side of a Workload's life, played by the test through the status subresource as
/// Kueue's scheduler writes it.
mod play_kueue {
    use super::*;
    use trainyard_operator::surface::kueue::Workload;

    fn condition(type_: &str, status: bool, reason: &str) -> Value {
        json!({
            "type": type_, "status": if status { "True" } else { "False" }, "reason": reason,
            "message": format!("{type_} (the test plays Kueue)"),
            "lastTransitionTime": jiff::Timestamp::now().to_string(),
        })
    }

    async fn write(api: &Api<Workload>, name: &str, status: Value) -> Result<()> {
        api.patch_status(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&json!({ "status": status })),
        )
        .await?;
        Ok(())
    }

    /// Admits the Workload to ClusterQueue `cq` with `flavor` for its GPUs.
    pub async fn admit(api: &Api<Workload>, name: &str, flavor: &str) -> Result<()> {
        let status = json!({
            "admission": {"clusterQueue": "cq", "podSetAssignments": [
                {"name": "workers", "flavors": {GPU: flavor}, "count": 2}]},
            "conditions": [
                condition("QuotaReserved", true, "QuotaReserved"),
                condition("Admitted", true, "Admitted"),
                condition("Evicted", false, "Readmitted"),
            ],
        });
        write(api, name, status).await
    }

    /// Evicts it, as a preemption in its ClusterQueue would.
    pub async fn evict(api: &Api<Workload>, name: &str) -> Result<()> {
        let status = json!({"conditions": [
            condition("QuotaReserved", true, "QuotaReserved"),
            condition("Admitted", true, "Admitted"),
            condition("Evicted", true, "Preempted"),
        ]});
        write(api, name, status).await
    }

    pub fn is_true(w: &Workload, type_: &str) -> Option<bool> {
        let status = w.status.as_ref()?;
        let c = status.conditions.iter().find(|c| c.type_ == type_)?;
        Some(c.status == "True")
    }
}

/// Issue 64: a TrainingJob labelled `kueue.x-k8s.io/queue-name`, with the test playing
/// Kueue against the real API server: the operator creates the job's Workload (owned by the
/// job, one pod set of 2 workers) and no pod while it waits; once admitted to a flavor, the
/// workers run with the flavor's node labels and tolerations; an eviction stops them as a
/// preemption and, once they are gone, the operator gives the quota back (admission cleared);
/// admitted again, attempt 1 trains to the end, the Workload is marked `Finished`, and it goes
/// with the job.
#[expect(
    clippy::too_many_lines,
    reason = "a cluster scenario reads as one story, in the order it happens"
)]
#[tokio::test]
#[ignore = "needs the local cluster (make test)"]
async fn kueue_admits_evicts_and_admits_again_a_queued_job_through_its_workload() -> Result<()> {
    use trainyard_operator::surface::kueue::{QUEUE_LABEL, ResourceFlavor, Workload};
    let (_guard, client) = installed().await?;
    let ns = Jobs::new(&client);
    let flavors = Api::<ResourceFlavor>::all(client.clone());
    let flavor: ResourceFlavor = serde_json::from_value(json!({
        "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor",
        "metadata": {"name": "e2e-node-one"},
        "spec": {
            "nodeLabels": {"kubernetes.io/hostname": node_name()},
            "tolerations": [{"key": "trainyard.dev/e2e-flavor", "operator": "Exists",
                             "effect": "NoSchedule"}],
        },
    }))?;
    if flavors.get_opt("e2e-node-one").await?.is_none() {
        flavors.create(&PostParams::default(), &flavor).await?;
    }
    let mut job = job_manifest("queued", 2, 1, &counting_trainer(20), json!({}));
    job["metadata"]["labels"] = json!({ QUEUE_LABEL: "team-a" });
    create_job(&client, &ns.name, job).await?;
    let workloads = Api::<Workload>::namespaced(client.clone(), &ns.name);
    let name = "trainingjob-queued";
    let limit = Duration::from_secs(60);
    let res = async {
        let w = wait_for("the job's Workload", limit, || async {
            Ok(workloads.get_opt(name).await?)
        })
        .await?;
        let uid = tj_api(&client, &ns.name).get("queued").await?.metadata.uid;
        let owner = w.metadata.owner_references.iter().flatten().next().cloned();
        let owner = owner.context("the Workload has no owner")?;
        assert_eq!((Some(owner.uid), owner.controller), (uid, Some(true)));
        assert_eq!(w.spec.queue_name, "team-a");
        assert_eq!(
            (w.spec.pod_sets[0].name.as_str(), w.spec.pod_sets[0].count),
            ("workers", 2)
        );
        // Not admitted: no pod, and the condition says why.
        tokio::time::sleep(Duration::from_secs(5)).await;
        ensure!(
            job_pods(&client, &ns.name, "queued").await?.is_empty(),
            "a pod before admission"
        );
        let st = job_status(&client, &ns.name, "queued").await?;
        let admitted = st["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Admitted")
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            (&admitted["status"], &admitted["reason"]),
            (&json!("False"), &json!("WaitingForAdmission")),
            "{st}"
        );

        // Admitted: the workers run with the flavor's node label and toleration.
        play_kueue::admit(&workloads, name, "e2e-node-one").await?;
        let pods = running_pods(&client, &ns.name, "queued", 0, 2).await?;
        for p in &pods {
            let spec = p.spec.clone().unwrap_or_default();
            let selector = spec.node_selector.unwrap_or_default();
            assert_eq!(
                selector.get("kubernetes.io/hostname"),
                Some(&node_name()),
                "{}",
                p.name_any()
            );
            let tolerated = spec
                .tolerations
                .iter()
                .flatten()
                .any(|t| t.key.as_deref() == Some("trainyard.dev/e2e-flavor"));
            assert!(tolerated, "{} has the flavor's toleration", p.name_any());
        }
        // The 5 s and more it waited for admission are queued time in the ledger.
        let st = job_status(&client, &ns.name, "queued").await?;
        let queued = st["ledger"]["queuedMillis"].as_u64().unwrap_or(0);
        assert!(queued >= 4_000, "queuedMillis {queued}: {st}");
        tokio::time::sleep(Duration::from_secs(4)).await;

        // Evicted: the workers stop as a preemption, then the quota goes back.
        play_kueue::evict(&workloads, name).await?;
        wait_for("the eviction counted as a preemption", limit, || async {
            let st = job_status(&client, &ns.name, "queued").await?;
            Ok((st["preemptions"] == 1 && st["attempt"] == 1).then_some(()))
        })
        .await?;
        wait_for("the evicted workers gone", limit, || async {
            Ok(job_pods(&client, &ns.name, "queued")
                .await?
                .is_empty()
                .then_some(()))
        })
        .await?;
        wait_for("the quota given back", limit, || async {
            let w = workloads.get(name).await?;
            let released = w.status.as_ref().is_some_and(|s| s.admission.is_none())
                && play_kueue::is_true(&w, "QuotaReserved") == Some(false);
            Ok(released.then_some(()))
        })
        .await?;

        // Admitted again: attempt 1 trains to the end; the Workload is marked Finished.
        play_kueue::admit(&workloads, name, "e2e-node-one").await?;
        let st = wait_phase(
            &client,
            &ns.name,
            "queued",
            "Succeeded",
            Duration::from_secs(180),
        )
        .await?;
        assert_eq!(
            (
                st["attempt"].as_u64(),
                st["preemptions"].as_u64(),
                st["failures"].as_u64()
            ),
            (Some(1), Some(1), Some(0)),
            "{st}"
        );
        wait_for("the Workload marked Finished", limit, || async {
            let w = workloads.get(name).await?;
            Ok((play_kueue::is_true(&w, "Finished") == Some(true)).then_some(()))
        })
        .await?;
        Ok::<(), anyhow::Error>(())
    }
    .await;
    ns.cleanup().await?;
    res?;
    wait_for(
        "the Workload gone with its job",
        Duration::from_secs(120),
        || async { Ok(workloads.get_opt(name).await?.is_none().then_some(())) },
    )
    .await?;
    flavors.delete("e2e-node-one", &Default::default()).await?;
    Ok(())
}
