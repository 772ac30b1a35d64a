//! The operator killed in the middle of a gang restart and started again: no duplicate,
//! no lost pod, no double-counted preemption.

mod harness;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use harness::{TestEnv, fast_config};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use std::sync::atomic::Ordering;
use trainyard_api::crd::LABEL_ATTEMPT;

#[expect(
    clippy::too_many_lines,
    reason = "a cluster scenario reads as one story, in the order it happens"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local cluster (make test)"]
async fn operator_killed_mid_restart_and_started_again_creates_no_duplicate_pods() {
    let t = TestEnv::new("ty-crash").await;
    t.add_node("n", &[], 8).await;

    // Every pod incarnation ever created in the namespace, by uid.
    let created: Arc<Mutex<BTreeMap<String, (String, String)>>> = Arc::default();
    let recorder = {
        let created = created.clone();
        let stream = watcher(t.pods_api(), watcher::Config::default()).applied_objects();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(Ok(p)) = stream.next().await {
                let p: Pod = p;
                let attempt = p.labels().get(LABEL_ATTEMPT).cloned().unwrap_or_default();
                created
                    .lock()
                    .expect("lock")
                    .insert(p.uid().unwrap_or_default(), (p.name_any(), attempt));
            }
        })
    };

    let op = t.start_operator(fast_config());
    t.create_job(
        "train",
        json!({"workers": 3, "gpusPerWorker": 1, "gpu": {"selection": "Any"},
        "checkpoint": {"size": "1Gi", "accessModes": ["ReadWriteOnce"]}}),
    )
    .await;
    let pods = t.wait_running(0, 3).await;

    // Hold the old pods in Terminating so the restart is caught in the middle.
    t.kubelet_deletes.store(false, Ordering::Relaxed);
    t.set_pod_status(
        &pods[2].name_any(),
        json!({"conditions": [
        {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"}]}),
    )
    .await;
    t.wait_job("train", "the restart to be recorded", |j| {
        j.status.as_ref().is_some_and(|s| s.attempt == 1)
    })
    .await;
    let api = t.pods_api();
    harness::wait_for("all old pods terminating", harness::WAIT, || {
        let api = api.clone();
        async move {
            let pods = api.list(&Default::default()).await.ok()?.items;
            (pods.len() == 3 && pods.iter().all(|p| p.metadata.deletion_timestamp.is_some()))
                .then_some(())
        }
    })
    .await;
    op.kill();

    // While no operator runs, the kubelet finishes the old pods.
    t.kubelet_deletes.store(true, Ordering::Relaxed);
    harness::wait_for("old pods gone", harness::WAIT, || {
        let api = api.clone();
        async move {
            api.list(&Default::default())
                .await
                .ok()?
                .items
                .is_empty()
                .then_some(())
        }
    })
    .await;

    // A fresh operator (empty caches) picks up where the old one stopped.
    let op = t.start_operator(fast_config());
    t.wait_running(1, 3).await;
    let job = t
        .wait_job("train", "Running on attempt 1", |j| {
            j.status
                .as_ref()
                .is_some_and(|s| s.attempt == 1 && s.phase.map(|p| p.as_str()) == Some("Running"))
        })
        .await;
    let status = job.status.expect("status");
    assert_eq!(
        (status.attempt, status.preemptions, status.failures),
        (1, 1, 0)
    );
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;

    let created = created.lock().expect("lock").clone();
    let mut per_attempt: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, attempt) in created.values() {
        per_attempt
            .entry(attempt.clone())
            .or_default()
            .push(name.clone());
    }
    for names in per_attempt.values_mut() {
        names.sort();
    }
    let expected: Vec<String> = (0..3).map(|r| format!("train-worker-{r}")).collect();
    assert_eq!(
        per_attempt.get("0"),
        Some(&expected),
        "attempt 0 pods: {per_attempt:?}"
    );
    assert_eq!(
        per_attempt.get("1"),
        Some(&expected),
        "one pod per rank in attempt 1: {per_attempt:?}"
    );
    assert_eq!(per_attempt.len(), 2, "no other attempt: {per_attempt:?}");
    assert_eq!(t.pods().await.len(), 3);

    recorder.abort();
    op.stop().await;
    t.cleanup().await;
}
