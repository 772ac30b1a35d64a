//! `spot.fallback: Cost` against the API server, the scheduler and fake nodes: two real
//! preemptions, counted by the goodput ledger the API server keeps, make spot lose where
//! its price is close to on-demand and the replacement capacity comes slowly; where spot is
//! cheap, the same two preemptions leave the job on spot.
//!
//! No assertion is on a duration. The hold on the fake kubelet makes the restart cost spot
//! GPU time many times what the price gap allows, and the attempts run for a few seconds,
//! so the verdicts keep a wide margin on a loaded machine.

mod harness;

use std::sync::atomic::Ordering;
use std::time::Duration;

use harness::{TestEnv, WAIT, condition, fast_config, run_for_whole_seconds, wait_for};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use serde_json::json;
use trainyard_api::crd::{LABEL_ATTEMPT, StretchUse, TrainingJob};
use trainyard_api::gpu_labels::LABEL_GPU_PRODUCT;
use trainyard_api::spot::KARPENTER_CAPACITY_TYPE;
use trainyard_operator::{OperatorConfig, PriceEntry};

/// How long the fake kubelet holds the start of the attempt after the first preemption:
/// spot capacity that comes back slowly, each second of it charged as spot restart time.
const SLOW_SPOT_CAPACITY: Duration = Duration::from_secs(8);

/// A spot node and an on-demand node of one T4 product unique to the test.
struct Nodes {
    product: String,
    spot: String,
    on_demand: String,
}

async fn nodes(t: &TestEnv) -> Nodes {
    // "T4" is a token of the name, so the price table's T4 row prices it.
    let product = format!("Tesla-T4-{}", t.ns);
    let spot = t
        .add_node(
            "spot",
            &[
                (LABEL_GPU_PRODUCT, &product),
                (KARPENTER_CAPACITY_TYPE, "spot"),
            ],
            4,
        )
        .await;
    let on_demand = t
        .add_node(
            "ondemand",
            &[
                (LABEL_GPU_PRODUCT, &product),
                (KARPENTER_CAPACITY_TYPE, "on-demand"),
            ],
            4,
        )
        .await;
    Nodes {
        product,
        spot,
        on_demand,
    }
}

/// One worker × 1 GPU of `product`, on spot only until the cost rule says otherwise.
fn cost_job(product: &str) -> serde_json::Value {
    json!({"workers": 1, "gpusPerWorker": 1, "gpu": {"products": [product]},
        "spot": {"policy": "Require", "fallback": "Cost"},
        "checkpoint": {"size": "1Gi", "accessModes": ["ReadWriteOnce"]}})
}

/// The test config with a T4 priced at `spot` and `on_demand` dollars per GPU-hour.
fn priced(spot: f64, on_demand: f64) -> OperatorConfig {
    OperatorConfig {
        prices: vec![PriceEntry {
            match_: "T4".to_owned(),
            spot,
            on_demand: Some(on_demand),
        }],
        ..fast_config()
    }
}

fn open_use(j: &TrainingJob) -> Option<(StretchUse, u32)> {
    let open = j.status.as_ref()?.ledger.as_ref()?.open.as_ref()?;
    Some((open.use_, open.attempt))
}

fn node_of(pod: &Pod) -> Option<String> {
    pod.spec.as_ref()?.node_name.clone()
}

/// The `SpotFallback` condition's status, reason and message, once the rule has judged the
/// job with `preemptions` counted.
async fn judged_after(t: &TestEnv, preemptions: u32) -> (String, String, String) {
    let over = format!("over {preemptions} preemption(s)");
    let job = t
        .wait_job("train", &format!("SpotFallback judged {over}"), |j| {
            condition(j, "SpotFallback").is_some_and(|c| c.message.contains(&over))
        })
        .await;
    let c = condition(&job, "SpotFallback").expect("condition");
    (c.status.clone(), c.reason.clone(), c.message.clone())
}

/// Lets the running attempt `attempt` cross at least two whole-second boundaries of its
/// Running stretch (the ledger counts whole seconds), then preempts its worker; returns the
/// node it ran on. With `hold_next`, the fake kubelet starts no pod from then on.
async fn run_then_preempt(t: &TestEnv, attempt: u32, hold_next: bool) -> String {
    let pods = t.wait_running(attempt, 1).await;
    t.wait_job(
        "train",
        &format!("a Running stretch of attempt {attempt}"),
        |j| open_use(j) == Some((StretchUse::Running, attempt)),
    )
    .await;
    run_for_whole_seconds().await;
    if hold_next {
        t.kubelet_starts.store(false, Ordering::Relaxed);
    }
    t.set_pod_status(
        &pods[0].name_any(),
        json!({"conditions": [
        {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
         "message": "spot capacity reclaimed"}]}),
    )
    .await;
    node_of(&pods[0]).expect("scheduled")
}

/// The first pod of `attempt` once the scheduler has bound it, running or not.
async fn scheduled(t: &TestEnv, attempt: u32) -> Pod {
    let api = t.pods_api();
    wait_for(
        &format!("a scheduled pod of attempt {attempt}"),
        WAIT,
        || {
            let api = api.clone();
            async move {
                let pods = api.list(&ListParams::default()).await.ok()?.items;
                pods.into_iter().find(|p| {
                    p.labels().get(LABEL_ATTEMPT) == Some(&attempt.to_string())
                        && p.metadata.deletion_timestamp.is_none()
                        && node_of(p).is_some()
                })
            }
        },
    )
    .await
}

/// The notes of the Events on job `train` with `reason`.
async fn event_notes(t: &TestEnv, reason: &str) -> Vec<String> {
    let api: Api<Event> = Api::namespaced(t.client.clone(), &t.ns);
    api.list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("train"))
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.note)
        .collect()
}

/// T4 spot at $0.24 against $0.36 on demand: spot pays while its charged GPU time is at
/// most 1.5 × the useful one. Attempt 0 runs and is preempted: its running time (of unknown
/// loss: no progress reports) is all it charged, so spot pays and attempt 1 goes to spot.
/// That attempt waits 8 s for the slow capacity, charged to spot, runs and is preempted:
/// now spot no longer pays, and attempt 2, two preemptions in (the count rule's default
/// is 3), runs on the on-demand node, with the Event saying the numbers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local cluster (make test)"]
async fn two_preemptions_and_slow_spot_capacity_make_spot_lose_and_the_job_moves_on_demand() {
    let t = TestEnv::new("ty-costfb").await;
    let n = nodes(&t).await;
    let op = t.start_operator(priced(0.24, 0.36));
    t.create_job("train", cost_job(&n.product)).await;

    // The fake kubelet starts nothing after this preemption until the slow capacity comes.
    assert_eq!(run_then_preempt(&t, 0, true).await, n.spot);
    let (status, reason, message) = judged_after(&t, 1).await;
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "SpotPays"),
        "{message}"
    );
    assert!(message.contains("<= on-demand $0.36"), "{message}");
    let waiting = scheduled(&t, 1).await;
    assert_eq!(node_of(&waiting), Some(n.spot.clone()), "spot still pays");
    tokio::time::sleep(SLOW_SPOT_CAPACITY).await;
    t.kubelet_starts.store(true, Ordering::Relaxed);

    assert_eq!(run_then_preempt(&t, 1, false).await, n.spot);
    let (status, reason, message) = judged_after(&t, 2).await;
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "SpotNoLongerPays"),
        "{message}"
    );
    assert!(
        message.starts_with("spot cost $") && message.contains("> on-demand $0.36"),
        "{message}"
    );
    let pods = t.wait_running(2, 1).await;
    assert_eq!(node_of(&pods[0]), Some(n.on_demand.clone()));
    let notes = wait_for("a SpotNoLongerPays Event", WAIT, || async {
        Some(event_notes(&t, "SpotNoLongerPays").await).filter(|n| !n.is_empty())
    })
    .await;
    assert_eq!(notes, [message]);
    let status = t.job("train").await.status.expect("status");
    assert_eq!(status.preemptions, 2);
    let gpu = status.selected_gpu.expect("selectedGpu");
    assert!(!gpu.spot, "{gpu:?}");
    assert!(gpu.reason.contains("spot no longer pays"), "{}", gpu.reason);
    let ledger = status.ledger.expect("ledger");
    assert!(
        ledger.spot.lost_to_restart > ledger.spot.recompute_unknown / 2,
        "the slow capacity outweighs half the running time: {ledger:?}"
    );
    op.stop().await;
    t.cleanup().await;
}

/// T4 spot at $0.12 against $0.36 on demand (the default table): spot pays until its
/// charged GPU time is 3 × the useful one. The same two preemptions, with the capacity
/// back at once, leave the third attempt on spot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local cluster (make test)"]
async fn cheap_spot_keeps_paying_through_two_preemptions_and_the_job_stays_on_spot() {
    let t = TestEnv::new("ty-costok").await;
    let n = nodes(&t).await;
    let op = t.start_operator(priced(0.12, 0.36));
    t.create_job("train", cost_job(&n.product)).await;

    assert_eq!(run_then_preempt(&t, 0, false).await, n.spot);
    let (status, reason, message) = judged_after(&t, 1).await;
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "SpotPays"),
        "{message}"
    );
    assert_eq!(run_then_preempt(&t, 1, false).await, n.spot);
    let pods = t.wait_running(2, 1).await;
    assert_eq!(node_of(&pods[0]), Some(n.spot.clone()));
    let (status, reason, message) = judged_after(&t, 2).await;
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "SpotPays"),
        "{message}"
    );
    assert!(message.contains("<= on-demand $0.36"), "{message}");
    assert!(event_notes(&t, "SpotNoLongerPays").await.is_empty());
    let status = t.job("train").await.status.expect("status");
    assert_eq!(status.preemptions, 2);
    assert!(status.selected_gpu.expect("selectedGpu").spot);
    op.stop().await;
    t.cleanup().await;
}
