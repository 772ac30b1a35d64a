//! Every preemption signal leads to a gang restart with the attempt incremented, RESUME_FROM
//! set and only the preemption counter moving.

mod harness;

use harness::{TestEnv, env, fast_config};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::DeleteParams;
use serde_json::json;
use trainyard_api::crd::LABEL_RANK;
use trainyard_api::env::{RESUME_FROM, TRAINYARD_ATTEMPT, TRAINYARD_RESTART_REASON};
use trainyard_api::spot::KARPENTER_DISRUPTED;
use trainyard_operator::surface::{Phase, TrainingJob};

fn counters(j: &TrainingJob) -> (u32, u32, u32) {
    let s = j.status.clone().unwrap_or_default();
    (s.attempt, s.preemptions, s.failures)
}

/// Waits for the restart that `signal` caused and checks the new attempt's pods.
async fn expect_gang_restart(t: &TestEnv, attempt: u32, detail: &str) -> Vec<Pod> {
    let job = t
        .wait_job("train", &format!("attempt {attempt} after {detail}"), |j| {
            counters(j).0 == attempt
        })
        .await;
    assert_eq!(
        counters(&job),
        (attempt, attempt, 0),
        "only preemptions count"
    );
    let last = job
        .status
        .as_ref()
        .and_then(|s| s.last_restart.clone())
        .expect("lastRestart");
    assert_eq!(last.reason.as_str(), "Preemption");
    assert!(
        last.detail.contains(detail),
        "{:?} lacks {detail:?}",
        last.detail
    );
    let pods = t.wait_running(attempt, 2).await;
    // The next signal hits a job that runs: one whose workers the operator has recorded. A pod
    // that runs and vanishes before any round saw it is created again, not counted (the gang
    // has not trained: every rank waits in the rendezvous until all run), and a pod's start is
    // a routine change the job records within the settle delay.
    t.wait_job(
        "train",
        &format!("attempt {attempt} recorded running"),
        |j| {
            j.status
                .as_ref()
                .is_some_and(|s| s.attempt == attempt && s.phase == Some(Phase::Running))
        },
    )
    .await;
    for p in &pods {
        assert_eq!(
            env(p, RESUME_FROM).as_deref(),
            Some("/mnt/checkpoints/latest.pt")
        );
        assert_eq!(env(p, TRAINYARD_ATTEMPT), Some(attempt.to_string()));
        assert_eq!(
            env(p, TRAINYARD_RESTART_REASON).as_deref(),
            Some("Preemption")
        );
    }
    assert_eq!(
        t.pods().await.len(),
        2,
        "old pods are gone, new ones are the only ones"
    );
    pods
}

fn on_node(pods: &[Pod], rank: &str) -> (String, String) {
    let p = pods
        .iter()
        .find(|p| p.labels().get(LABEL_RANK).map(String::as_str) == Some(rank))
        .expect("rank");
    (
        p.name_any(),
        p.spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .expect("scheduled"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local cluster (make test)"]
async fn each_preemption_signal_restarts_the_gang_from_the_checkpoint() {
    let t = TestEnv::new("ty-preempt").await;
    let mut nodes = vec![t.add_node("a", &[], 4).await, t.add_node("b", &[], 4).await];
    let op = t.start_operator(fast_config());
    t.create_job(
        "train",
        json!({"workers": 2, "gpusPerWorker": 1, "gpu": {"selection": "Any"},
        "restartPolicy": {"maxFailures": 0},
        "checkpoint": {"size": "1Gi", "accessModes": ["ReadWriteOnce"]}}),
    )
    .await;
    let mut pods = t.wait_running(0, 2).await;

    // 1. DisruptionTarget (newer kubelets and the eviction API).
    let (name, node) = on_node(&pods, "1");
    t.set_pod_status(&name, json!({"conditions": [
        {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet", "message": "node shutdown"}]}))
        .await;
    pods = expect_gang_restart(
        &t,
        1,
        &format!("worker 1: DisruptionTarget/TerminationByKubelet on node {node}"),
    )
    .await;

    // 2. A 1.20-era eviction: phase Failed, status.reason Evicted.
    let (name, _) = on_node(&pods, "0");
    t.set_pod_status(&name, json!({"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."}))
        .await;
    pods = expect_gang_restart(&t, 2, "Evicted").await;

    // 3. The pod disappears without the operator deleting it.
    let (name, _) = on_node(&pods, "1");
    t.pods_api()
        .delete(
            &name,
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            },
        )
        .await
        .expect("delete pod");
    pods = expect_gang_restart(&t, 3, "worker 1").await;

    // 4. The node goes NotReady for longer than the timeout (2s in this test's config).
    let (_, node) = on_node(&pods, "0");
    t.node_not_ready(&node, 4).await;
    let _ = pods;
    nodes.retain(|n| *n != node);
    nodes.push(t.add_node("c", &[], 4).await);
    pods = expect_gang_restart(&t, 4, "NotReady").await;
    t.delete_node(&node).await;

    // 5. A termination taint, then the pod ends.
    let (name, node) = on_node(&pods, "1");
    t.taint_node(&node, KARPENTER_DISRUPTED).await;
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    t.exit_pod(&name, 143).await;
    pods = expect_gang_restart(&t, 5, KARPENTER_DISRUPTED).await;
    nodes.retain(|n| *n != node);
    t.delete_node(&node).await;
    nodes.push(t.add_node("d", &[], 4).await);

    // 6. The node object is deleted.
    let (_, node) = on_node(&pods, "0");
    t.delete_node(&node).await;
    nodes.retain(|n| *n != node);
    nodes.push(t.add_node("e", &[], 4).await);
    pods = expect_gang_restart(&t, 6, "is gone").await;

    // 7. The trainer was lost with its node's container runtime: containerd, restarted after
    // its shims were killed, reports it exited 255 with reason Unknown (found by make chaos).
    let (name, _) = on_node(&pods, "1");
    t.end_pod(&name, 255, "Unknown").await;
    expect_gang_restart(&t, 7, "lost with its node's container runtime").await;

    // The phase follows the pods in the next reconcile.
    let job = t
        .wait_job("train", "phase Running on attempt 7", |j| {
            j.status.as_ref().and_then(|s| s.phase).map(|p| p.as_str()) == Some("Running")
        })
        .await;
    assert_eq!(counters(&job), (7, 7, 0));
    op.stop().await;
    t.cleanup().await;
}
