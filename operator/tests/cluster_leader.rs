//! Two replicas with leader election: only the Lease holder reconciles, and a standby takes
//! over as soon as the leader shuts down. A leader that loses the Lease stops reconciling,
//! stays up and campaigns again.

mod harness;

use harness::{TestEnv, WAIT, wait_for};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

async fn holder(leases: &Api<Lease>) -> Option<String> {
    leases
        .get_opt("trainyard-operator")
        .await
        .ok()??
        .spec?
        .holder_identity
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

    let spec = |_: ()| {
        json!({"workers": 1, "gpusPerWorker": 1, "gpu": {"selection": "Any"},
        "checkpoint": {"size": "1Gi", "accessModes": ["ReadWriteOnce"]}})
    };
    t.create_job("one", spec(())).await;
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
    t.create_job("two", spec(())).await;
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
    t.create_job(
        "after",
        json!({"workers": 1, "gpusPerWorker": 1, "gpu": {"selection": "Any"},
        "checkpoint": {"size": "1Gi", "accessModes": ["ReadWriteOnce"]}}),
    )
    .await;
    t.wait_running(0, 1).await;
    replica.stop().await;
    t.cleanup().await;
}
