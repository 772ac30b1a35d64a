//! The operator's per-job memory follows the jobs: once they are deleted, every map it keeps
//! (`trainyard_operator_state_entries`) is empty again. The 1,000-job version of this runs
//! without a cluster in `job_memory`'s unit tests; this one checks the wiring to the watch.

mod harness;

use harness::{TestEnv, WAIT, condition, fast_config, sample, scrape, wait_for};
use kube::Api;
use kube::ResourceExt;
use kube::api::{ApiResource, DeleteParams, DynamicObject, PostParams};
use serde_json::json;
use trainyard_operator::surface::{Phase, TrainingJob};

const MAPS: [&str; 6] = [
    "written",
    "deferred",
    "detected",
    "error_counts",
    "reported_malformed",
    "expectations",
];

fn entries(metrics: &str, map: &str) -> Option<f64> {
    sample(
        metrics,
        &format!("trainyard_operator_state_entries{{map=\"{map}\"}}"),
    )
}

#[expect(
    clippy::too_many_lines,
    reason = "a cluster scenario reads as one story, in the order it happens"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local cluster (make test)"]
async fn deleted_jobs_leave_nothing_in_the_operators_memory() {
    let t = TestEnv::new("ty-memory").await;
    t.add_node("n", &[], 4).await;
    let (op, addr) = t.start_operator_serving_metrics(fast_config());
    let checkpoint = json!({"size": "1Gi", "accessModes": ["ReadWriteOnce"]});
    let good: Vec<String> = (0..8).map(|i| format!("good-{i}")).collect();
    for name in &good {
        t.create_job(
            name,
            json!({"workers": 1, "gpusPerWorker": 0, "checkpoint": checkpoint}),
        )
        .await;
    }
    // A failure restart waiting out its backoff: the operator remembers when it was decided.
    t.create_job(
        "failing",
        json!({"workers": 1, "gpusPerWorker": 1, "gpu": {"selection": "Any"},
        "restartPolicy": {"backoffSeconds": 600}, "checkpoint": checkpoint}),
    )
    .await;
    // An object that does not parse: the operator remembers that it reported it.
    let dynamic: Api<DynamicObject> = Api::namespaced_with(
        t.client.clone(),
        &t.ns,
        &ApiResource::erase::<TrainingJob>(&()),
    );
    let malformed: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "trainyard.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": "malformed", "namespace": t.ns},
        "spec": {"workers": 1, "template": {"spec": {"containers": "not-a-list"}}},
    }))
    .expect("object");
    dynamic
        .create(&PostParams::default(), &malformed)
        .await
        .expect("create malformed");

    let running = t.wait_running(0, good.len() + 1).await;
    let failing = running
        .iter()
        .find(|p| p.name_any() == "failing-worker-0")
        .expect("failing-worker-0");
    t.exit_pod(&failing.name_any(), 1).await;
    t.wait_job("failing", "the failure restart", |j| {
        j.status
            .as_ref()
            .is_some_and(|s| s.attempt == 1 && s.phase == Some(Phase::Restarting))
    })
    .await;
    harness::wait_for("the malformed object reported", WAIT, || {
        let dynamic = dynamic.clone();
        async move {
            let o = dynamic.get("malformed").await.ok()?;
            let conditions = o.data.get("status")?.get("conditions")?.as_array()?.clone();
            conditions
                .into_iter()
                .any(|c| c["reason"] == "MalformedObject")
                .then_some(())
        }
    })
    .await;
    // The memory this test relies on is there.
    wait_for(
        "entries for the restart and the report",
        WAIT,
        || async move {
            let m = scrape(addr).await;
            (entries(&m, "detected")? >= 1.0 && entries(&m, "reported_malformed")? >= 1.0)
                .then_some(())
        },
    )
    .await;
    let jobs = t.jobs();
    // A pod's start is a routine change: the job records it within the
    // settle delay, not in the same instant the pod runs.
    t.wait_job("good-0", "the Running condition", |j| {
        condition(j, "Running").is_some_and(|c| c.status == "True")
    })
    .await;

    for name in good.iter().map(String::as_str).chain(["failing"]) {
        jobs.delete(name, &DeleteParams::default())
            .await
            .expect("delete job");
    }
    dynamic
        .delete("malformed", &DeleteParams::default())
        .await
        .expect("delete malformed");

    // Read until every map is empty; on timeout, say which are not.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let m = scrape(addr).await;
        let sizes: Vec<(&str, Option<f64>)> =
            MAPS.iter().map(|map| (*map, entries(&m, map))).collect();
        if sizes.iter().all(|(_, n)| *n == Some(0.0)) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "entries left {WAIT:?} after every job was deleted: {sizes:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    op.stop().await;
    t.cleanup().await;
}
