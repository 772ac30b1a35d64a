//! Workers no node can take yet: pending pods and the `Unschedulable` condition.

use super::*;

/// A GPU pool scaled to zero (or to smaller nodes) is not an invalid spec: with a cluster
/// autoscaler the node that fits appears only once pods are Pending.
#[test]
fn more_gpus_per_worker_than_any_node_has_creates_pending_pods_until_a_node_fits() {
    let mut w = World::new("workers: 2\ngpusPerWorker: 16\n");
    let plan = w.step();
    assert_eq!(
        World::creates(&plan).len(),
        2,
        "pods for an autoscaler to see"
    );
    assert!(!condition_is_true(
        &plan.status.conditions,
        condition::INVALID_SPEC
    ));
    let unschedulable = |plan: &Plan| {
        plan.status
            .conditions
            .iter()
            .find(|c| c.type_ == condition::UNSCHEDULABLE)
            .cloned()
            .expect("Unschedulable")
    };
    let c = unschedulable(&plan);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "NoMatchingNode")
    );
    assert!(
        c.message.contains("16 x nvidia.com/gpu per worker"),
        "names what the job wants: {}",
        c.message
    );
    assert!(
        c.message
            .contains("at most 8 allocatable nvidia.com/gpu per node"),
        "names what the cluster has: {}",
        c.message
    );
    assert!(plan.events.iter().any(|e| e.reason == "Unschedulable"));
    assert_eq!(plan.status.phase, Some(Phase::Pending));
    // The scheduler cannot bind them either: they stay Pending, and the condition stays.
    for p in w.pods.clone() {
        w.modify(p.metadata.name.as_deref().expect("name"), |p| {
            p.spec.as_mut().expect("spec").node_name = None;
        });
    }
    w.advance(60);
    let plan = w.step();
    assert!(World::creates(&plan).is_empty());
    assert_eq!(unschedulable(&plan).status, "True");
    assert!(
        plan.events.is_empty(),
        "no repeated Event: {:?}",
        plan.events
    );

    // The autoscaler adds a node that fits: the condition clears, the same pods run there.
    w.nodes
        .push(Arc::new(node("big").gpus(16).product("Tesla-T4").build()));
    let plan = w.step();
    assert_eq!(unschedulable(&plan).status, "False");
    assert!(World::creates(&plan).is_empty() && World::deletes(&plan) == 0);
    for p in w.pods.clone() {
        w.modify(p.metadata.name.as_deref().expect("name"), |p| {
            p.spec.as_mut().expect("spec").node_name = Some("big".into());
        });
    }
    w.run_all();
    let plan = w.step();
    assert_eq!(plan.status.phase, Some(Phase::Running));
    assert_eq!(unschedulable(&plan).status, "False");
    assert_eq!(
        w.decided,
        [
            PhaseName::Running,
            PhaseName::Running,
            PhaseName::Running,
            PhaseName::Running,
        ]
    );
}

#[test]
fn a_gpu_pool_with_no_nodes_at_all_gets_pending_pods_and_the_condition() {
    let mut w = World::new("gpusPerWorker: 8\ngpu: {minMemoryGiB: 80}\n");
    w.nodes = vec![Arc::new(node("cpu-1").build())];
    let plan = w.step();
    assert_eq!(World::creates(&plan).len(), 1);
    assert!(condition_is_true(
        &plan.status.conditions,
        condition::UNSCHEDULABLE
    ));
    assert!(!condition_is_true(
        &plan.status.conditions,
        condition::INVALID_SPEC
    ));
    assert_eq!(w.decided, [PhaseName::Running]);
}

#[test]
fn unsatisfiable_cuda_is_unschedulable_but_pods_wait_for_an_autoscaler() {
    let mut w = World::new("gpusPerWorker: 1\ngpu: {minCudaVersion: \"12.4\"}\n");
    w.nodes = vec![Arc::new(node("n-1").gpus(8).cuda(12, 2).build())];
    let plan = w.step();
    let c = plan
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == condition::UNSCHEDULABLE)
        .expect("Unschedulable");
    assert_eq!(c.status, "True");
    assert!(c.message.contains("CUDA versions: 12.2"), "{}", c.message);
    assert_eq!(World::creates(&plan).len(), 1);
    w.nodes = vec![Arc::new(node("n-1").gpus(8).cuda(12, 4).build())];
    let plan = w.step();
    let c = plan
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == condition::UNSCHEDULABLE)
        .expect("Unschedulable");
    assert_eq!(c.status, "False");
    assert_eq!(w.decided, [PhaseName::Running, PhaseName::Running]);
}
