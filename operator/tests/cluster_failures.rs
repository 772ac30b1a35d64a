//! Failures restart the gang after a backoff, against their own budget, then fail the job.

mod harness;

use harness::{TestEnv, condition, env, fast_config};
use kube::ResourceExt;
use serde_json::json;
use trainyard_api::env::TRAINYARD_RESTART_REASON;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local cluster (make test)"]
async fn failures_back_off_then_fail_the_job_once_the_budget_is_spent() {
    let t = TestEnv::new("ty-fail").await;
    t.add_node("n", &[], 4).await;
    let op = t.start_operator(fast_config());
    t.create_job(
        "train",
        json!({"workers": 2, "gpusPerWorker": 1, "gpu": {"selection": "Any"},
        "restartPolicy": {"maxFailures": 1, "backoffSeconds": 3},
        "checkpoint": {"size": "1Gi", "accessModes": ["ReadWriteOnce"]}}),
    )
    .await;
    let pods = t.wait_running(0, 2).await;

    t.exit_pod(&pods[0].name_any(), 1).await;
    let job = t
        .wait_job("train", "first failure restart", |j| {
            j.status.as_ref().is_some_and(|s| s.attempt == 1)
        })
        .await;
    let status = job.status.clone().expect("status");
    assert_eq!((status.failures, status.preemptions), (1, 0));
    let last = status.last_restart.expect("lastRestart");
    assert_eq!(last.reason.as_str(), "Failure");
    assert!(
        last.detail.contains("exited with code 1"),
        "{}",
        last.detail
    );

    let pods = t.wait_running(1, 2).await;
    for p in &pods {
        assert_eq!(env(p, TRAINYARD_RESTART_REASON).as_deref(), Some("Failure"));
        let created = p.metadata.creation_timestamp.as_ref().expect("created").0;
        let waited = created.duration_since(last.time.0).as_secs();
        // Status times have second precision; the backoff is 3s.
        assert!(
            waited >= 2,
            "new pods {waited}s after the failure: backoff not applied"
        );
    }

    t.exit_pod(&pods[1].name_any(), 137).await;
    let job = t
        .wait_job("train", "phase Failed", |j| {
            j.status.as_ref().and_then(|s| s.phase).map(|p| p.as_str()) == Some("Failed")
        })
        .await;
    let failed = condition(&job, "Failed").expect("Failed condition");
    assert_eq!(failed.reason, "FailureBudgetExceeded");
    let status = job.status.expect("status");
    assert_eq!(
        (status.attempt, status.failures, status.preemptions),
        (1, 2, 0)
    );
    assert!(status.completion_time.is_some());

    op.stop().await;
    t.cleanup().await;
}
