//! The goodput ledger as the API server keeps it: written by server-side apply through the
//! generated schema, read back, and accounting for every GPU-second of a preempted job.

mod harness;

use harness::{TestEnv, fast_config, run_for_whole_seconds};
use kube::ResourceExt;
use serde_json::json;
use trainyard_api::crd::{LABEL_RANK, StretchUse, TrainingJob};
use trainyard_api::gpu_labels::LABEL_GPU_PRODUCT;
use trainyard_api::spot::KARPENTER_CAPACITY_TYPE;

fn open_use(j: &TrainingJob) -> Option<(StretchUse, u32)> {
    let open = j.status.as_ref()?.ledger.as_ref()?.open.as_ref()?;
    Some((open.use_, open.attempt))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local cluster (make test)"]
async fn a_preempted_jobs_ledger_is_kept_by_the_api_server_and_counts_every_gpu_second() {
    let t = TestEnv::new("ty-ledger").await;
    let spot_t4 = [
        (LABEL_GPU_PRODUCT, "Tesla-T4"),
        (KARPENTER_CAPACITY_TYPE, "spot"),
    ];
    t.add_node("a", &spot_t4, 4).await;
    t.add_node("b", &spot_t4, 4).await;
    let op = t.start_operator(fast_config());
    t.create_job(
        "train",
        json!({"workers": 2, "gpusPerWorker": 1,
        "checkpoint": {"size": "1Gi", "accessModes": ["ReadWriteOnce"]}}),
    )
    .await;
    t.wait_running(0, 2).await;
    t.wait_job("train", "a Running stretch of attempt 0", |j| {
        open_use(j) == Some((StretchUse::Running, 0))
    })
    .await;
    // The ledger counts whole seconds: each attempt runs for more than one, so that its
    // useful time cannot round to nothing on a fast machine.
    run_for_whole_seconds().await;

    let pods = t.pods().await;
    let rank_1 = pods
        .iter()
        .find(|p| p.labels().get(LABEL_RANK).map(String::as_str) == Some("1"))
        .expect("rank 1");
    t.set_pod_status(
        &rank_1.name_any(),
        json!({"conditions": [
        {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet",
         "message": "node shutdown"}]}),
    )
    .await;
    let pods = t.wait_running(1, 2).await;
    t.wait_job("train", "a Running stretch of attempt 1", |j| {
        open_use(j) == Some((StretchUse::Running, 1))
    })
    .await;
    run_for_whole_seconds().await;
    for p in &pods {
        t.exit_pod(&p.name_any(), 0).await;
    }
    let job = t.wait_succeeded("train").await;

    let status = job.status.expect("status");
    let ledger = status.ledger.expect("the ledger was written and read back");
    assert_eq!(ledger.open, None);
    assert_eq!(ledger.on_demand.total(), 0, "both nodes are spot");
    assert!(ledger.spot.useful > 0, "{ledger:?}");
    assert!(
        ledger.spot.recompute_unknown > 0,
        "no progress reports: attempt 0's split is unknown: {ledger:?}"
    );
    // The stretches run without a gap or an overlap from the first pods' creation round
    // (startTime) to the success round (completionTime): both are whole seconds, as are the
    // ledger's boundaries (the fake kubelet's trainers report no finishedAt).
    let start = status.start_time.expect("startTime").0;
    let end = status.completion_time.expect("completionTime").0;
    let wall_ms = u64::try_from(end.duration_since(start).as_millis()).expect("positive");
    assert_eq!(ledger.spot.total(), wall_ms * 2, "{ledger:?}");
    assert!(ledger.micro_dollars.spent > 0, "{ledger:?}");
    assert!(
        ledger.cost.starts_with('$') && ledger.goodput.ends_with('%'),
        "{ledger:?}"
    );
    op.stop().await;
    t.cleanup().await;
}
