//! Creation, suspend and deletion of a TrainingJob against the local cluster.

mod harness;

use harness::{TestEnv, WAIT, condition, env, fast_config, sample, scrape, wait_for};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Service};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;
use trainyard_api::crd::{DEFAULT_GPU_RESOURCE, LABEL_RANK};
use trainyard_api::env::{
    CHECKPOINT_PATH, MASTER_ADDR, NODE_RANK, PET_NODE_RANK, RESUME_FROM, TRAINYARD_RESTART_REASON,
    WORLD_SIZE,
};
use trainyard_api::gpu_labels::LABEL_GPU_PRODUCT;
use trainyard_api::spot::GKE_SPOT;

#[expect(
    clippy::too_many_lines,
    reason = "a cluster scenario reads as one story, in the order it happens"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local cluster (make test)"]
async fn job_becomes_pods_service_and_pvc_with_env_affinity_and_tolerations() {
    let t = TestEnv::new("ty-create").await;
    t.add_node("a100", &[(LABEL_GPU_PRODUCT, "NVIDIA-A100-SXM4-80GB")], 4)
        .await;
    let op = t.start_operator(fast_config());
    t.create_job(
        "train",
        json!({"workers": 2, "gpusPerWorker": 2,
        "checkpoint": {"size": "1Gi", "accessModes": ["ReadWriteOnce"]}}),
    )
    .await;

    let pods = t.wait_running(0, 2).await;
    let job = t
        .wait_job("train", "phase Running", |j| {
            j.status.as_ref().and_then(|s| s.phase).map(|p| p.as_str()) == Some("Running")
        })
        .await;
    let status = job.status.clone().expect("status");
    assert_eq!(status.attempt, 0);
    assert_eq!(status.workers.len(), 2);
    assert_eq!(
        status.checkpoint_claim.as_deref(),
        Some("train-checkpoints")
    );
    assert_eq!(
        status.selected_gpu.as_ref().map(|g| g.product.as_str()),
        Some("NVIDIA-A100-SXM4-80GB")
    );
    assert_eq!(
        condition(&job, "Running").map(|c| c.status.as_str()),
        Some("True")
    );

    let mut names: Vec<_> = pods
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    names.sort();
    assert_eq!(names, ["train-worker-0", "train-worker-1"]);
    for pod in &pods {
        let rank = pod.metadata.labels.as_ref().expect("labels")[LABEL_RANK].clone();
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(
            spec.hostname.as_deref(),
            Some(format!("train-worker-{rank}").as_str())
        );
        assert_eq!(spec.subdomain.as_deref(), Some("train"));
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        let owner = &pod.metadata.owner_references.as_ref().expect("owner")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("TrainingJob", Some(true))
        );
        assert_eq!(env(pod, NODE_RANK), Some(rank.clone()));
        assert_eq!(env(pod, PET_NODE_RANK), Some(rank));
        assert_eq!(
            env(pod, MASTER_ADDR).as_deref(),
            Some("train-worker-0.train")
        );
        assert_eq!(env(pod, WORLD_SIZE).as_deref(), Some("4"));
        assert_eq!(
            env(pod, CHECKPOINT_PATH).as_deref(),
            Some("/mnt/checkpoints/latest.pt")
        );
        assert_eq!(env(pod, RESUME_FROM), None);
        let trainer = &spec.containers[0];
        let limits = trainer
            .resources
            .as_ref()
            .and_then(|r| r.limits.clone())
            .expect("limits");
        assert_eq!(limits[DEFAULT_GPU_RESOURCE].0, "2");
        assert!(
            trainer
                .volume_mounts
                .iter()
                .flatten()
                .any(|m| m.mount_path == "/mnt/checkpoints")
        );
        let tolerations: Vec<_> = spec
            .tolerations
            .iter()
            .flatten()
            .filter_map(|t| t.key.clone())
            .collect();
        assert!(
            tolerations.contains(&GKE_SPOT.to_owned()),
            "{tolerations:?}"
        );
        let affinity = spec
            .affinity
            .as_ref()
            .and_then(|a| a.node_affinity.as_ref())
            .expect("node affinity");
        let required = affinity
            .required_during_scheduling_ignored_during_execution
            .as_ref()
            .expect("required");
        assert!(
            required.node_selector_terms[0]
                .match_expressions
                .iter()
                .flatten()
                .any(|e| e.key == LABEL_GPU_PRODUCT
                    && e.values == Some(vec!["NVIDIA-A100-SXM4-80GB".to_owned()]))
        );
        assert_eq!(
            affinity
                .preferred_during_scheduling_ignored_during_execution
                .as_ref()
                .map(Vec::len),
            Some(5)
        );
    }

    let svc: Service = Api::namespaced(t.client.clone(), &t.ns)
        .get("train")
        .await
        .expect("Service");
    let spec = svc.spec.expect("spec");
    assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
    assert_eq!(spec.publish_not_ready_addresses, Some(true));
    let pvc: PersistentVolumeClaim = Api::namespaced(t.client.clone(), &t.ns)
        .get("train-checkpoints")
        .await
        .expect("PVC");
    assert_eq!(
        pvc.spec.expect("spec").access_modes,
        Some(vec!["ReadWriteOnce".to_owned()])
    );

    op.stop().await;
    t.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local cluster (make test)"]
async fn suspend_removes_the_pods_and_resume_brings_them_back() {
    let t = TestEnv::new("ty-suspend").await;
    t.add_node("n", &[], 4).await;
    let op = t.start_operator(fast_config());
    t.create_job("train", json!({"workers": 2, "gpusPerWorker": 1, "gpu": {"selection": "Any"}, "checkpoint": {"size": "1Gi", "accessModes": ["ReadWriteOnce"]}})).await;
    t.wait_running(0, 2).await;

    t.jobs()
        .patch(
            "train",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"suspend": true}})),
        )
        .await
        .expect("suspend");
    t.wait_job("train", "phase Suspended", |j| {
        j.status.as_ref().and_then(|s| s.phase).map(|p| p.as_str()) == Some("Suspended")
    })
    .await;
    let pods = t.pods_api();
    wait_for("no pods while suspended", WAIT, || {
        let pods = pods.clone();
        async move {
            pods.list(&Default::default())
                .await
                .ok()
                .filter(|l| l.items.is_empty())
                .map(|_| ())
        }
    })
    .await;

    t.jobs()
        .patch(
            "train",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"suspend": false}})),
        )
        .await
        .expect("resume");
    // A resume is a new attempt that continues from the checkpoint (progress is kept).
    let resumed = t.wait_running(1, 2).await;
    for pod in &resumed {
        assert_eq!(
            env(pod, RESUME_FROM).as_deref(),
            Some("/mnt/checkpoints/latest.pt")
        );
        assert_eq!(
            env(pod, TRAINYARD_RESTART_REASON).as_deref(),
            Some("Resume")
        );
    }
    let job = t
        .wait_job("train", "Running again", |j| {
            j.status.as_ref().and_then(|s| s.phase).map(|p| p.as_str()) == Some("Running")
        })
        .await;
    let status = job.status.expect("status");
    assert_eq!(status.preemptions, 0, "suspend is not a preemption");
    assert_eq!(status.failures, 0, "suspend is not a failure");

    op.stop().await;
    t.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local cluster (make test)"]
async fn deleting_the_job_removes_pods_and_service_and_follows_retain_on_delete() {
    let t = TestEnv::new("ty-delete").await;
    t.add_node("n", &[], 4).await;
    let op = t.start_operator(fast_config());
    let ckpt = |retain: bool| json!({"size": "1Gi", "accessModes": ["ReadWriteOnce"], "retainOnDelete": retain});
    t.create_job("keep", json!({"workers": 1, "gpusPerWorker": 1, "gpu": {"selection": "Any"}, "checkpoint": ckpt(true)})).await;
    t.create_job("drop", json!({"workers": 1, "gpusPerWorker": 1, "gpu": {"selection": "Any"}, "checkpoint": ckpt(false)})).await;
    t.wait_running(0, 2).await;

    for name in ["keep", "drop"] {
        t.jobs()
            .delete(name, &DeleteParams::background())
            .await
            .expect("delete job");
    }
    let client = t.client.clone();
    let ns = t.ns.clone();
    wait_for(
        "pods, Services and the unretained PVC to be garbage-collected",
        WAIT,
        || {
            let (client, ns) = (client.clone(), ns.clone());
            async move {
                let pods: Api<k8s_openapi::api::core::v1::Pod> =
                    Api::namespaced(client.clone(), &ns);
                let svcs: Api<Service> = Api::namespaced(client.clone(), &ns);
                let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client, &ns);
                let pods_gone = pods.list(&Default::default()).await.ok()?.items.is_empty();
                let svcs_gone = svcs.list(&Default::default()).await.ok()?.items.is_empty();
                let dropped = pvcs
                    .get_opt("drop-checkpoints")
                    .await
                    .ok()?
                    .is_none_or(|p| p.metadata.deletion_timestamp.is_some());
                (pods_gone && svcs_gone && dropped).then_some(())
            }
        },
    )
    .await;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(t.client.clone(), &t.ns);
    let kept = pvcs
        .get("keep-checkpoints")
        .await
        .expect("retained PVC still there");
    assert!(kept.metadata.deletion_timestamp.is_none());

    op.stop().await;
    t.cleanup().await;
}

/// Two reconciles in flight, so one routine slot: when the jobs' pods go Running together,
/// status-only rounds find it taken and park their job. Every parked job must be woken and
/// record Running with its worker's detail: a lost wake would leave it until the 300 s
/// resync, far past the wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local cluster (make test)"]
async fn with_one_routine_slot_parked_status_rounds_are_woken_and_every_job_records_running() {
    const JOBS: usize = 16;
    let t = TestEnv::new("ty-narrow").await;
    t.add_node("n", &[], JOBS as u32).await;
    let (op, addr) = t.start_operator_with_reconciles(fast_config(), 2);
    for i in 0..JOBS {
        t.create_job(
            &format!("j{i}"),
            json!({"workers": 1, "gpusPerWorker": 1, "gpu": {"selection": "Any"}}),
        )
        .await;
    }
    t.wait_running(0, JOBS).await;
    for i in 0..JOBS {
        t.wait_job(
            &format!("j{i}"),
            "phase Running with its worker's detail",
            |j| {
                j.status.as_ref().is_some_and(|s| {
                    s.phase.map(|p| p.as_str()) == Some("Running") && s.workers.len() == 1
                })
            },
        )
        .await;
    }
    let parked = sample(
        &scrape(addr).await,
        "trainyard_operator_status_rounds_parked_total",
    );
    eprintln!("status-only rounds parked: {parked:?}");
    // Without a parked round the test would prove nothing about waking; four to eleven of
    // the sixteen jobs parked in quiet runs.
    assert!(
        parked.is_some_and(|n| n >= 1.0),
        "no status-only round parked ({parked:?}): the test did not exercise the wake"
    );
    op.stop().await;
    t.cleanup().await;
}

/// `retainOnDelete` edited after the claim exists decides what the delete keeps, and a job
/// applied again over the claim its namesake kept starts attempt 0 resuming from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local cluster (make test)"]
async fn edited_retain_on_delete_decides_what_the_delete_keeps_and_a_job_applied_again_resumes() {
    let t = TestEnv::new("ty-retain").await;
    t.add_node("n", &[], 4).await;
    let op = t.start_operator(fast_config());
    let job = |retain: bool| {
        json!({"workers": 1, "gpusPerWorker": 1, "gpu": {"selection": "Any"},
               "checkpoint": {"size": "1Gi", "accessModes": ["ReadWriteOnce"], "retainOnDelete": retain}})
    };
    t.create_job("flip", job(true)).await;
    t.create_job("flop", job(false)).await;
    t.wait_running(0, 2).await;
    for pod in t.pods().await {
        assert_eq!(
            env(&pod, RESUME_FROM),
            None,
            "fresh claims: nothing to resume"
        );
    }
    // The user changes their mind on both.
    for (name, retain) in [("flip", false), ("flop", true)] {
        let edit = json!({"spec": {"checkpoint": {"retainOnDelete": retain}}});
        t.jobs()
            .patch(name, &PatchParams::default(), &Patch::Merge(&edit))
            .await
            .expect("edit retainOnDelete");
    }
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(t.client.clone(), &t.ns);
    let flip_uid = t.job("flip").await.metadata.uid.expect("uid");
    wait_for("the claims' owners to follow the edits", WAIT, || {
        let (pvcs, flip_uid) = (pvcs.clone(), flip_uid.clone());
        async move {
            let owners = |p: PersistentVolumeClaim| p.metadata.owner_references.unwrap_or_default();
            let flip = owners(pvcs.get("flip-checkpoints").await.ok()?);
            let flop = owners(pvcs.get("flop-checkpoints").await.ok()?);
            (flip.len() == 1 && flip[0].uid == flip_uid && flop.is_empty()).then_some(())
        }
    })
    .await;
    for name in ["flip", "flop"] {
        t.jobs()
            .delete(name, &DeleteParams::background())
            .await
            .expect("delete job");
    }
    wait_for(
        "the pods and the claim no longer retained to be garbage-collected",
        WAIT,
        || {
            let pvcs = pvcs.clone();
            let pods = t.pods_api();
            async move {
                let pods_gone = pods.list(&Default::default()).await.ok()?.items.is_empty();
                let flip_gone = pvcs
                    .get_opt("flip-checkpoints")
                    .await
                    .ok()?
                    .is_none_or(|p| p.metadata.deletion_timestamp.is_some());
                (pods_gone && flip_gone).then_some(())
            }
        },
    )
    .await;
    let kept = pvcs
        .get("flop-checkpoints")
        .await
        .expect("the claim retainOnDelete now keeps is still there");
    assert!(kept.metadata.deletion_timestamp.is_none());

    // Applied again from Git: attempt 0 continues from the kept claim.
    t.create_job("flop", job(true)).await;
    let pods = t.wait_running(0, 1).await;
    assert_eq!(
        env(&pods[0], RESUME_FROM).as_deref(),
        Some("/mnt/checkpoints/latest.pt")
    );
    assert_eq!(
        env(&pods[0], TRAINYARD_RESTART_REASON).as_deref(),
        Some("ExistingClaim")
    );

    op.stop().await;
    t.cleanup().await;
}
