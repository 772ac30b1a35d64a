//! The ledger metrics are the ledger in the job's status: the replica that reconciles a job
//! exposes its totals, a fresh operator (a new leader) exposes the same ones from the status
//! alone, and they go with the job.

mod harness;

use harness::{TestEnv, WAIT, fast_config, run_for_whole_seconds, scrape, wait_for};
use kube::ResourceExt;
use kube::api::DeleteParams;
use serde_json::json;
use trainyard_api::crd::{GoodputLedger, StretchUse, TrainingJob};
use trainyard_api::gpu_labels::LABEL_GPU_PRODUCT;
use trainyard_api::spot::KARPENTER_CAPACITY_TYPE;

/// The job's ledger totals as `/metrics` shows them: GPU-milliseconds of every series of
/// `trainyard_operator_gpu_seconds_total`, their count, and micro-dollars spent.
fn exposed(metrics: &str, ns: &str, job: &str) -> (u64, usize, u64) {
    let of_job = format!("namespace=\"{ns}\",job=\"{job}\"");
    let value = |line: &str| -> f64 {
        line.rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    let gpu: Vec<f64> = metrics
        .lines()
        .filter(|l| l.starts_with("trainyard_operator_gpu_seconds_total{") && l.contains(&of_job))
        .map(value)
        .collect();
    let spent = metrics
        .lines()
        .find(|l| l.starts_with("trainyard_operator_cost_dollars_total{") && l.contains(&of_job))
        .map_or(0.0, value);
    let ms: f64 = gpu.iter().map(|s| s * 1000.0).sum();
    (ms.round() as u64, gpu.len(), (spent * 1e6).round() as u64)
}

/// Waits until `/metrics` at `addr` shows `ledger`'s totals for the job.
async fn wait_exposed(addr: std::net::SocketAddr, ns: &str, job: &str, ledger: &GoodputLedger) {
    let want = (
        ledger.spot.total() + ledger.on_demand.total(),
        16,
        ledger.micro_dollars.spent,
    );
    wait_for(
        &format!("the ledger {want:?} on /metrics"),
        WAIT,
        || async move { (exposed(&scrape(addr).await, ns, job) == want).then_some(()) },
    )
    .await;
}

fn open_use(j: &TrainingJob) -> Option<StretchUse> {
    Some(j.status.as_ref()?.ledger.as_ref()?.open.as_ref()?.use_)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local cluster (make test)"]
async fn ledger_metrics_show_the_status_after_an_operator_restart_and_go_with_the_job() {
    let t = TestEnv::new("ty-ledgermetrics").await;
    let spot_t4 = [
        (LABEL_GPU_PRODUCT, "Tesla-T4"),
        (KARPENTER_CAPACITY_TYPE, "spot"),
    ];
    t.add_node("a", &spot_t4, 4).await;
    let (op, addr) = t.start_operator_serving_metrics(fast_config());
    t.create_job(
        "train",
        json!({"workers": 1, "gpusPerWorker": 2,
        "checkpoint": {"size": "1Gi", "accessModes": ["ReadWriteOnce"]}}),
    )
    .await;
    let pods = t.wait_running(0, 1).await;
    t.wait_job("train", "a Running stretch", |j| {
        open_use(j) == Some(StretchUse::Running)
    })
    .await;
    run_for_whole_seconds().await;
    for p in &pods {
        t.exit_pod(&p.name_any(), 0).await;
    }
    let job = t.wait_succeeded("train").await;
    let ledger = job.status.and_then(|s| s.ledger).expect("status.ledger");
    assert!(ledger.spot.useful > 0, "{ledger:?}");
    assert!(ledger.micro_dollars.spent > 0, "T4 has a price: {ledger:?}");
    wait_exposed(addr, &t.ns, "train", &ledger).await;
    op.stop().await;

    // Another replica, with nothing of the first in memory: the status alone.
    let (op, addr) = t.start_operator_serving_metrics(fast_config());
    wait_exposed(addr, &t.ns, "train", &ledger).await;

    t.jobs()
        .delete("train", &DeleteParams::default())
        .await
        .expect("delete the job");
    let ns = t.ns.as_str();
    wait_for("the job's ledger series to go", WAIT, || async move {
        let metrics = scrape(addr).await;
        let gone = metrics.contains("trainyard_operator_reconciles_total")
            && exposed(&metrics, ns, "train").1 == 0
            && !metrics.contains("job=\"train\"");
        gone.then_some(())
    })
    .await;
    op.stop().await;
    t.cleanup().await;
}
