//! Specs the schema cannot catch, and objects that do not even parse, get InvalidSpec and no
//! pods, without stopping the operator from reconciling other jobs.

mod harness;

use harness::{TestEnv, condition, fast_config};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, PostParams};
use serde_json::json;
use trainyard_operator::surface::TrainingJob;

fn invalid(j: &TrainingJob) -> bool {
    condition(j, "InvalidSpec").is_some_and(|c| c.status == "True")
}

#[expect(
    clippy::too_many_lines,
    reason = "a cluster scenario reads as one story, in the order it happens"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local cluster (make test)"]
async fn invalid_specs_get_a_condition_and_no_pods_while_valid_jobs_run() {
    let t = TestEnv::new("ty-invalid").await;
    t.add_node("n", &[], 4).await;
    let op = t.start_operator(fast_config());

    // No containers.
    let mut no_containers = t.template();
    no_containers["spec"]["containers"] = json!([]);
    t.create_job("empty", json!({"workers": 1, "template": no_containers}))
        .await;
    // A claim that does not exist.
    t.create_job(
        "claimless",
        json!({"workers": 1, "gpu": {"selection": "Any"}, "checkpoint": {"existingClaim": "nope"}}),
    )
    .await;
    // A template the API server keeps (preserve-unknown-fields) but no pod could use.
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
    // And one good job that must run regardless.
    t.create_job(
        "good",
        json!({"workers": 1, "gpusPerWorker": 1, "gpu": {"selection": "Any"},
        "checkpoint": {"size": "1Gi", "accessModes": ["ReadWriteOnce"]}}),
    )
    .await;

    let empty = t.wait_job("empty", "InvalidSpec on empty", invalid).await;
    assert!(
        condition(&empty, "InvalidSpec")
            .expect("c")
            .message
            .contains("spec.template.spec.containers")
    );
    let claimless = t
        .wait_job("claimless", "InvalidSpec on claimless", invalid)
        .await;
    assert!(
        condition(&claimless, "InvalidSpec")
            .expect("c")
            .message
            .contains("\"nope\" does not exist")
    );
    let bad = harness::wait_for("InvalidSpec on the malformed object", harness::WAIT, || {
        let dynamic = dynamic.clone();
        async move {
            let o = dynamic.get("malformed").await.ok()?;
            let conditions = o.data.get("status")?.get("conditions")?.as_array()?.clone();
            conditions
                .into_iter()
                .find(|c| c["type"] == "InvalidSpec" && c["status"] == "True")
        }
    })
    .await;
    assert_eq!(bad["reason"], "MalformedObject");

    // Reported once, not on every status change the report itself causes.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(t.client.clone(), &t.ns);
    let reports = events
        .list(&Default::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("malformed"))
        // Repeats of one Event are folded into its series.
        .map(|e| e.series.map_or(1, |s| s.count))
        .sum::<i32>();
    assert_eq!(reports, 1, "the malformed object is reported once");

    let running = t.wait_running(0, 1).await;
    assert_eq!(running[0].metadata.name.as_deref(), Some("good-worker-0"));
    assert_eq!(t.pods().await.len(), 1, "no pods for invalid jobs");

    // Creating the missing claim lets that job start.
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(t.client.clone(), &t.ns);
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({"metadata": {"name": "nope"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}))
    .expect("pvc");
    pvcs.create(&PostParams::default(), &claim)
        .await
        .expect("create claim");
    t.wait_running(0, 2).await;
    let claimless = t.job("claimless").await;
    assert_eq!(
        condition(&claimless, "InvalidSpec").map(|c| c.status.as_str()),
        Some("False")
    );

    op.stop().await;
    t.cleanup().await;
}
