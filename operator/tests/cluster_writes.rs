//! Writes the operator must not make, and writes the API server refuses: an object of the name
//! a job needs that belongs to someone else is never taken over or deleted with the job, and a
//! write the API server rejects is shown on the job, not only in the operator's log.

mod harness;

use harness::{TestEnv, WAIT, condition, fast_config, wait_for};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Service};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use trainyard_operator::surface::TrainingJob;

fn condition_true(j: &TrainingJob, type_: &str) -> bool {
    condition(j, type_).is_some_and(|c| c.status == "True")
}

/// The Events on job `job` with `reason`, counting the repeats folded into a series.
async fn events(t: &TestEnv, job: &str, reason: &str) -> (i32, Vec<Event>) {
    let api: Api<Event> = Api::namespaced(t.client.clone(), &t.ns);
    let found: Vec<Event> = api
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(job))
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect();
    let count = found
        .iter()
        .map(|e| e.series.as_ref().map_or(1, |s| s.count))
        .sum();
    (count, found)
}

async fn wait_event(t: &TestEnv, job: &str, reason: &str) -> Event {
    wait_for(&format!("a {reason} Event on {job}"), WAIT, || async {
        events(t, job, reason).await.1.into_iter().next()
    })
    .await
}

/// Who wrote an object: the managers in its managedFields.
fn managers(meta: &ObjectMeta) -> Vec<String> {
    meta.managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local cluster (make test)"]
async fn a_pod_the_api_server_rejects_sets_write_rejected_with_its_message_until_the_spec_is_fixed()
{
    let t = TestEnv::new("ty-reject").await;
    t.add_node("n", &[], 4).await;
    let op = t.start_operator(fast_config());

    // The template is stored as-is; pod validation refuses the env var name (1.20 rules).
    let mut template = t.template();
    template["spec"]["containers"][0]["env"] = json!([{"name": "1BAD", "value": "x"}]);
    t.create_job(
        "rejected",
        json!({"workers": 1, "gpusPerWorker": 1, "gpu": {"selection": "Any"},
        "checkpoint": {"size": "1Gi", "accessModes": ["ReadWriteOnce"]}, "template": template}),
    )
    .await;

    let job = t
        .wait_job("rejected", "WriteRejected on the job", |j| {
            condition_true(j, "WriteRejected")
        })
        .await;
    let c = condition(&job, "WriteRejected").expect("condition");
    assert_eq!(c.reason, "Invalid", "{c:?}");
    // The server's own message, naming the object and the field.
    assert!(c.message.contains("rejected-worker-0"), "{}", c.message);
    assert!(
        c.message.contains("spec.containers[0].env[0].name") && c.message.contains("1BAD"),
        "{}",
        c.message
    );
    let event = wait_event(&t, "rejected", "WriteRejected").await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert!(
        event.note.as_deref().unwrap_or_default().contains("1BAD"),
        "{event:?}"
    );
    assert!(t.pods().await.is_empty(), "nothing was created");

    // Retried with backoff, reported once: the same rejection is not a new Event.
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    assert_eq!(events(&t, "rejected", "WriteRejected").await.0, 1);
    assert!(condition_true(&t.job("rejected").await, "WriteRejected"));

    // Fixing the spec lets the write through and clears the condition.
    let mut fixed = t.template();
    fixed["spec"]["containers"][0]["env"] = json!([{"name": "GOOD", "value": "x"}]);
    t.jobs()
        .patch(
            "rejected",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": fixed}})),
        )
        .await
        .expect("fix the template");
    t.wait_running(0, 1).await;
    let job = t
        .wait_job("rejected", "WriteRejected cleared", |j| {
            condition(j, "WriteRejected").is_some_and(|c| c.status == "False")
        })
        .await;
    assert_eq!(
        condition(&job, "WriteRejected").map(|c| c.reason.as_str()),
        Some("Accepted")
    );

    op.stop().await;
    t.cleanup().await;
}

#[expect(
    clippy::too_many_lines,
    reason = "a cluster scenario reads as one story, in the order it happens"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local cluster (make test)"]
async fn a_service_and_pvc_of_the_jobs_names_that_are_not_its_own_are_never_taken_over_or_deleted()
{
    let t = TestEnv::new("ty-foreign").await;
    t.add_node("n", &[], 4).await;
    let services: Api<Service> = Api::namespaced(t.client.clone(), &t.ns);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(t.client.clone(), &t.ns);

    // Someone else's objects with the names the job would use. The Service is headless, like
    // the operator's, so a forced apply could take it over without an immutable-field error.
    let theirs: Service = serde_json::from_value(json!({
        "metadata": {"name": "taken", "labels": {"app": "theirs"}},
        "spec": {"clusterIP": "None", "selector": {"app": "theirs"},
                 "ports": [{"name": "web", "port": 80, "protocol": "TCP"}]},
    }))
    .expect("service");
    let theirs = services
        .create(&PostParams::default(), &theirs)
        .await
        .expect("create their Service");
    let their_claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "taken-checkpoints", "labels": {"app": "theirs"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }))
    .expect("pvc");
    let their_claim = claims
        .create(&PostParams::default(), &their_claim)
        .await
        .expect("create their PVC");

    let op = t.start_operator(fast_config());
    // retainOnDelete: false would give the operator's own PVC an owner reference, and so the
    // garbage collector a way to delete a PVC it took over.
    t.create_job(
        "taken",
        json!({"workers": 1, "gpusPerWorker": 1, "gpu": {"selection": "Any"},
        "checkpoint": {"size": "1Gi", "accessModes": ["ReadWriteOnce"], "retainOnDelete": false}}),
    )
    .await;

    let job = t
        .wait_job("taken", "NameConflict naming both objects", |j| {
            condition(j, "NameConflict").is_some_and(|c| {
                c.status == "True"
                    && c.message.contains("Service taken")
                    && c.message
                        .contains("PersistentVolumeClaim taken-checkpoints")
            })
        })
        .await;
    let c = condition(&job, "NameConflict").expect("condition");
    assert_eq!(c.reason, "NameTaken", "{c:?}");
    let event = wait_event(&t, "taken", "NameConflict").await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert!(
        t.pods().await.is_empty(),
        "no pods depend on objects that are not the job's"
    );

    let unchanged = |svc: &Service, claim: &PersistentVolumeClaim| {
        assert_eq!(svc.metadata.labels, theirs.metadata.labels);
        assert_eq!(svc.spec, theirs.spec);
        assert_eq!(svc.metadata.owner_references, None);
        assert_eq!(
            svc.metadata.resource_version,
            theirs.metadata.resource_version
        );
        assert!(
            !managers(&svc.metadata).contains(&"trainyard-operator".to_owned()),
            "{:?}",
            svc.metadata.managed_fields
        );
        assert_eq!(claim.metadata.labels, their_claim.metadata.labels);
        assert_eq!(claim.metadata.owner_references, None);
        let requests = |c: &PersistentVolumeClaim| {
            c.spec
                .as_ref()
                .and_then(|s| s.resources.as_ref())
                .and_then(|r| r.requests.clone())
        };
        assert_eq!(requests(claim), requests(&their_claim));
        assert!(
            !managers(&claim.metadata).contains(&"trainyard-operator".to_owned()),
            "{:?}",
            claim.metadata.managed_fields
        );
        assert!(svc.metadata.deletion_timestamp.is_none());
        assert!(claim.metadata.deletion_timestamp.is_none());
    };
    unchanged(
        &services.get("taken").await.expect("their Service"),
        &claims.get("taken-checkpoints").await.expect("their PVC"),
    );

    // Deleting the job must leave them alone. A witness the job does own shows that the
    // garbage collector has dealt with the job's dependents.
    let job = t.job("taken").await;
    let witness: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "witness", "ownerReferences": [{
            "apiVersion": "trainyard.dev/v1alpha1", "kind": "TrainingJob",
            "name": "taken", "uid": job.uid().expect("uid")}]},
    }))
    .expect("configmap");
    let config_maps: Api<ConfigMap> = Api::namespaced(t.client.clone(), &t.ns);
    config_maps
        .create(&PostParams::default(), &witness)
        .await
        .expect("create the witness");
    t.jobs()
        .delete("taken", &DeleteParams::background())
        .await
        .expect("delete the job");
    wait_for("the job's dependents to be collected", WAIT, || {
        let config_maps = config_maps.clone();
        async move {
            config_maps
                .get_opt("witness")
                .await
                .ok()?
                .is_none()
                .then_some(())
        }
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    unchanged(
        &services.get("taken").await.expect("their Service survives"),
        &claims
            .get("taken-checkpoints")
            .await
            .expect("their PVC survives"),
    );

    op.stop().await;
    t.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local cluster (make test)"]
async fn a_pvc_retained_from_an_earlier_job_of_the_same_name_is_mounted_by_the_new_one() {
    let t = TestEnv::new("ty-retained").await;
    t.add_node("n", &[], 4).await;
    let op = t.start_operator(fast_config());
    let spec = json!({"workers": 1, "gpusPerWorker": 1, "gpu": {"selection": "Any"},
        "checkpoint": {"size": "1Gi", "accessModes": ["ReadWriteOnce"], "retainOnDelete": true}});
    t.create_job("again", spec.clone()).await;
    t.wait_running(0, 1).await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(t.client.clone(), &t.ns);
    let kept = claims.get("again-checkpoints").await.expect("PVC");

    t.jobs()
        .delete("again", &DeleteParams::background())
        .await
        .expect("delete the job");
    let (pods, services) = (
        t.pods_api(),
        Api::<Service>::namespaced(t.client.clone(), &t.ns),
    );
    wait_for("the first job's pods and Service to go", WAIT, || {
        let (pods, services) = (pods.clone(), services.clone());
        async move {
            let no_pods = pods
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .is_empty();
            let no_service = services.get_opt("again").await.ok()?.is_none();
            (no_pods && no_service).then_some(())
        }
    })
    .await;

    // The same name again: the claim it left is its own, not a conflict.
    t.create_job("again", spec).await;
    t.wait_running(0, 1).await;
    let job = t.job("again").await;
    assert!(!condition_true(&job, "NameConflict"), "{:?}", job.status);
    let reused = claims.get("again-checkpoints").await.expect("PVC");
    assert_eq!(reused.metadata.uid, kept.metadata.uid, "the same claim");

    op.stop().await;
    t.cleanup().await;
}
