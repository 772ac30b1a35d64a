//! What a run sets up in the cluster and removes at the end: the client to the API server, the
//! CRD and the checks before the first phase, the namespaces and their checkpoint volumes.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, Config};
use serde_json::json;
use trainyard_operator::surface::{self};

use super::Created;
use super::objects::CHECKPOINT_CLAIM;
use super::results::OperatorBenchReport;
use crate::error::{Error, Result};
use crate::fake_nodes::LABEL_RUN;

/// A client for the cluster under test whose requests are not retried behind the caller's
/// back (the counting proxy forwards with it, so that the operator sees every 429 itself).
pub async fn upstream_client() -> Result<Client> {
    let kubeconfig = match std::env::var_os("KUBECONFIG") {
        Some(k) => PathBuf::from(k),
        None => trainyard_e2e::state_dir().join("kubeconfig"),
    };
    let kc = kube::config::Kubeconfig::read_from(&kubeconfig).map_err(|e| {
        Error::Cluster(format!(
            "reading kubeconfig {}: {e} (is the local cluster up? `make cluster-up`)",
            kubeconfig.display()
        ))
    })?;
    let mut config = Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .map_err(|e| Error::Cluster(format!("loading kubeconfig {}: {e}", kubeconfig.display())))?;
    config.default_retry = false;
    Client::try_from(config).map_err(Error::kube("building the Kubernetes client"))
}

pub(super) async fn preflight(client: &Client, report: &mut OperatorBenchReport) -> Result<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    // Install or update the CRD the operator under test was built with (a fresh
    // cluster has none), under the operator's field manager as its own tests do.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = surface::CRD_NAME;
    crds.patch(
        name,
        &kube::api::PatchParams::apply(surface::FIELD_MANAGER).force(),
        &kube::api::Patch::Apply(surface::crd()),
    )
    .await
    .map_err(Error::kube("applying the TrainingJob CRD"))?;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let established = crds
            .get_opt(name)
            .await
            .map_err(Error::kube("looking up the TrainingJob CRD"))?
            .and_then(|c| c.status)
            .and_then(|s| s.conditions)
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            });
        if established {
            break;
        }
        if std::time::Instant::now() > deadline {
            return Err(Error::Cluster(
                "the TrainingJob CRD was not Established within 60 s".to_owned(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    report.load_before = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse().ok());
    // Another operator watching every namespace would reconcile our jobs too.
    let others = other_operators();
    if !others.is_empty() {
        report.warnings.push(format!(
            "other trainyard-operator processes were running on the machine (pids {}) and shared its CPUs; a further warning says so if one of them also reconciled these jobs",
            others.join(", ")
        ));
    }
    Ok(())
}

/// PIDs of trainyard-operator processes on this machine (the kernel truncates comm to 15
/// bytes). Checked before ours starts.
fn other_operators() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter(|e| {
            std::fs::read_to_string(e.path().join("comm"))
                .is_ok_and(|c| c.trim() == "trainyard-opera")
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

pub(super) async fn create_namespace(client: &Client, name: &str, run: &str) -> Result<()> {
    let ns: Namespace = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "labels": {LABEL_RUN: run}},
    }))
    .map_err(|e| Error::Build {
        what: format!("Namespace {name}"),
        message: e.to_string(),
    })?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .map_err(Error::kube(format!("creating namespace {name}")))?;
    Ok(())
}

/// A PersistentVolume pre-bound to the namespace's checkpoint claim, and that claim; waits
/// until it is Bound (the scheduler refuses pods with unbound claims).
pub(super) async fn checkpoint_volume(
    client: &Client,
    ns: &str,
    pv_name: &str,
    run: &str,
) -> Result<()> {
    let build = |what: &str, v: serde_json::Value| {
        let what = what.to_owned();
        move |e: serde_json::Error| Error::Build {
            what,
            message: format!("{e}: {v}"),
        }
    };
    let pv_json = json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": pv_name, "labels": {LABEL_RUN: run}},
        "spec": {
            "capacity": {"storage": "50Gi"},
            "accessModes": ["ReadWriteMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            // Never mounted: no kubelet runs the benchmark's pods.
            "hostPath": {"path": "/tmp/trainyard-bench-unused"},
            "claimRef": {"namespace": ns, "name": CHECKPOINT_CLAIM},
        },
    });
    let pv: PersistentVolume =
        serde_json::from_value(pv_json.clone()).map_err(build("the PersistentVolume", pv_json))?;
    Api::<PersistentVolume>::all(client.clone())
        .create(&PostParams::default(), &pv)
        .await
        .map_err(Error::kube(format!("creating PersistentVolume {pv_name}")))?;
    let pvc_json = json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": CHECKPOINT_CLAIM, "namespace": ns, "labels": {LABEL_RUN: run}},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "volumeName": pv_name,
            "resources": {"requests": {"storage": "50Gi"}},
        },
    });
    let pvc: PersistentVolumeClaim =
        serde_json::from_value(pvc_json.clone()).map_err(build("the claim", pvc_json))?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    claims
        .create(&PostParams::default(), &pvc)
        .await
        .map_err(Error::kube(format!(
            "creating PersistentVolumeClaim {ns}/{CHECKPOINT_CLAIM}"
        )))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let phase = claims
            .get(CHECKPOINT_CLAIM)
            .await
            .map_err(Error::kube(format!(
                "reading PersistentVolumeClaim {ns}/{CHECKPOINT_CLAIM}"
            )))?
            .status
            .and_then(|s| s.phase);
        if phase.as_deref() == Some("Bound") {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::Timeout {
                what: format!("PersistentVolumeClaim {ns}/{CHECKPOINT_CLAIM} to be Bound"),
                after: Duration::from_secs(60),
                progress: format!("phase {phase:?}"),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub(super) async fn clean_up(
    client: &Client,
    mut created: Created,
    report: &mut OperatorBenchReport,
) {
    if let Some(op) = created.operator.take() {
        match op.stop().await {
            Ok(last) => {
                if let Some(u) = report.usage.as_mut() {
                    u.last = last;
                }
            }
            Err(e) => report.warnings.push(format!("stopping the operator: {e}")),
        }
    }
    let force = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    for ns in &created.namespaces {
        // The pods first, with grace period 0: deleted gracefully (as the namespace controller
        // would), they would wait forever for the kubelet the fake nodes lack. The operator is
        // stopped, so nothing recreates them.
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let _ = pods.delete_collection(&force, &ListParams::default()).await;
            match pods.list_metadata(&ListParams::default().limit(1)).await {
                Ok(l) if l.items.is_empty() => break,
                _ if Instant::now() > deadline => {
                    report
                        .warnings
                        .push(format!("pods were left in namespace {ns} after 120 s"));
                    break;
                }
                _ => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
        if let Err(e) = Api::<Namespace>::all(client.clone())
            .delete(ns, &DeleteParams::background())
            .await
        {
            report
                .warnings
                .push(format!("deleting namespace {ns}: {e}"));
        }
    }
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    for pv in &created.volumes {
        if let Err(e) = pvs.delete(pv, &DeleteParams::default()).await {
            report
                .warnings
                .push(format!("deleting PersistentVolume {pv}: {e}"));
        }
    }
    if let Some(nodes) = created.nodes.take() {
        nodes.delete().await;
    }
}
