//! Two replicas with leader election: only the Lease holder reconciles, and a standby takes
//! over as soon as the leader shuts down. A leader that loses the Lease stops reconciling,
//! stays up and campaigns again.

mod harness;

use harness::{TestEnv, WAIT, wait_for};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Event;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use trainyard_operator::surface::{TrainingJobStatus, apply_status};

async fn holder(leases: &Api<Lease>) -> Option<String> {
    leases
        .get_opt("trainyard-operator")
        .await
        .ok()??
        .spec?
        .holder_identity
}

/// A job of one worker with one GPU.
fn one_gpu() -> serde_json::Value {
    json!({"workers": 1, "gpusPerWorker": 1, "gpu": {"selection": "Any"},
        "checkpoint": {"size": "1Gi", "accessModes": ["ReadWriteOnce"]}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local cluster (make test)"]
async fn only_the_lease_holder_reconciles_and_a_standby_takes_over() {
    let t = TestEnv::new("ty-leader").await;
    t.add_node("n", &[], 4).await;
    let leases: Api<Lease> = Api::namespaced(t.client.clone(), &t.ns);

    let first = t.start_replica("replica-a");
    wait_for("replica-a to hold the Lease", WAIT, || async {
        (holder(&leases).await.as_deref() == Some("replica-a")).then_some(())
    })
    .await;
    let second = t.start_replica("replica-b");

    t.create_job("one", one_gpu()).await;
    t.wait_running(0, 1).await;
    assert_eq!(
        holder(&leases).await.as_deref(),
        Some("replica-a"),
        "the standby did not take the Lease"
    );

    first.stop().await;
    wait_for("replica-b to take the Lease", WAIT, || async {
        (holder(&leases).await.as_deref() == Some("replica-b")).then_some(())
    })
    .await;
    t.create_job("two", one_gpu()).await;
    t.wait_running(0, 2).await;

    second.stop().await;
    t.cleanup().await;
}

/// Found by the chaos run (seed 3): an API server restart that outlasted the Lease made the
/// leader exit, and the kubelet restarted it (its back-off grows with every restart). A
/// leader that loses the Lease now stops reconciling and campaigns again in the same process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local cluster (make test)"]
async fn a_leader_that_loses_the_lease_stays_up_and_leads_again_once_it_is_free() {
    let t = TestEnv::new("ty-relead").await;
    t.add_node("n", &[], 4).await;
    let leases: Api<Lease> = Api::namespaced(t.client.clone(), &t.ns);
    let replica = t.start_replica("replica-a");
    wait_for("replica-a to hold the Lease", WAIT, || async {
        (holder(&leases).await.as_deref() == Some("replica-a")).then_some(())
    })
    .await;

    // Another holder takes the Lease (as one would while this replica could not renew) and
    // never renews it: it lapses after its 6 s.
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string();
    leases
        .patch(
            "trainyard-operator",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {
                "holderIdentity": "usurper", "acquireTime": now, "renewTime": now,
                "leaseDurationSeconds": 6,
            }})),
        )
        .await
        .expect("taking the Lease");
    wait_for("replica-a to take the Lease back", WAIT, || async {
        (holder(&leases).await.as_deref() == Some("replica-a")).then_some(())
    })
    .await;
    assert!(
        replica.is_running(),
        "replica-a exited when it lost the Lease"
    );

    // And it reconciles again.
    t.create_job("after", one_gpu()).await;
    t.wait_running(0, 1).await;
    replica.stop().await;
    t.cleanup().await;
}

/// The Events of the job with this uid that start an attempt, with their repetitions.
async fn attempt_events(t: &TestEnv, uid: &str) -> Vec<(String, String)> {
    let events: Api<Event> = Api::namespaced(t.client.clone(), &t.ns);
    events
        .list(&Default::default())
        .await
        .expect("listing Events")
        .items
        .into_iter()
        .filter(|e| e.involved_object.uid.as_deref() == Some(uid))
        .filter(|e| {
            ["Preempted", "WorkerFailed", "Hang", "Resumed"]
                .contains(&e.reason.as_deref().unwrap_or(""))
        })
        .flat_map(|e| {
            let seen = usize::try_from(e.count.unwrap_or(1).max(1)).unwrap_or(1);
            let told = (
                e.metadata.name.unwrap_or_default(),
                e.reason.unwrap_or_default(),
            );
            std::iter::repeat_n(told, seen)
        })
        .collect()
}

/// Found by the chaos run (seed 4): a leader wrote a restart and was killed before it
/// published the restart's Event; the next leader carried the restart on from the status
/// (rightly, without deciding it again), and no replica ever told it. Now the next leader tells
/// the attempt, and a third tells it no second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local cluster (make test)"]
async fn a_restart_its_leader_never_told_is_told_once_by_the_next() {
    let t = TestEnv::new("ty-told").await;
    t.add_node("n", &[], 4).await;
    let first = t.start_replica("replica-a");
    t.create_job("one", one_gpu()).await;
    t.wait_running(0, 1).await;
    first.stop().await;

    // The restart as the killed leader wrote it, with no Event.
    let now = jiff::Timestamp::now();
    t.jobs()
        .patch_status(
            "one",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "attempt": 1, "phase": "Restarting", "preemptions": 1, "workers": [],
                "lastRestart": {"time": now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
                    "reason": "Preemption", "detail": "a termination notice on n"},
            }})),
        )
        .await
        .expect("writing the restart");
    let uid = t.job("one").await.metadata.uid.expect("uid");
    assert_eq!(attempt_events(&t, &uid).await.len(), 0);

    let second = t.start_replica("replica-b");
    t.wait_running(1, 1).await;
    let told = wait_for("the attempt's Event", WAIT, || async {
        let told = attempt_events(&t, &uid).await;
        (!told.is_empty()).then_some(told)
    })
    .await;
    assert_eq!(told.len(), 1, "{told:?}");
    assert_eq!(told[0].1, "Preempted");
    assert!(told[0].0.ends_with(".attempt-1"), "{told:?}");
    second.stop().await;

    // A third leader reconciles the job (its first round of it) and tells nothing again.
    let third = t.start_replica("replica-c");
    t.create_job("two", one_gpu()).await;
    t.wait_running(0, 1).await;
    assert_eq!(attempt_events(&t, &uid).await, told);
    third.stop().await;
    t.cleanup().await;
}

/// A deposed leader's status write, delayed until after its successor wrote, is refused by
/// the API server: the operator's status write ([`apply_status`]) is conditioned on the
/// resourceVersion its round decided on, so the successor's status stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local cluster (make test)"]
async fn a_status_write_by_a_deposed_leader_does_not_land() {
    let t = TestEnv::new("ty-deposed").await;
    t.create_job("fenced", one_gpu()).await;
    // Both leaders decided on the job as it was created.
    let seen = t.jobs().get("fenced").await.expect("job");
    let at = |attempt: u32| TrainingJobStatus {
        attempt,
        ..TrainingJobStatus::default()
    };
    // The successor writes first (attempt 2); the deposed leader's write (attempt 1) arrives
    // after it.
    let successor = apply_status(&t.client, &seen, seen.resource_version(), &at(2))
        .await
        .expect("the successor's write");
    let late = apply_status(&t.client, &seen, seen.resource_version(), &at(1)).await;
    match late {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 409, "{s:?}"),
        other => panic!("the deposed leader's write was not refused: {other:?}"),
    }
    let now = t.jobs().get("fenced").await.expect("job");
    assert_eq!(now.status.as_ref().map(|s| s.attempt), Some(2));
    assert_eq!(now.resource_version(), successor.resource_version());
    // A leader that decided on the current job writes.
    apply_status(&t.client, &now, now.resource_version(), &at(3))
        .await
        .expect("a write on the current version");
    t.cleanup().await;
}
