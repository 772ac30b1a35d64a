//! Removing pods: force-deleting those stuck on lost nodes or already stopped.

use super::*;

#[test]
fn pods_stuck_terminating_on_a_lost_node_are_force_deleted_after_the_timeout() {
    let mut w = World::running_world("workers: 1\n");
    w.nodes = vec![Arc::new(node("n-1").not_ready_since(T0).build())];
    w.advance(30);
    let plan = w.step();
    assert_eq!(plan.restart, None, "NotReady within the timeout");
    assert_eq!(plan.requeue_at, Some(ts("2026-01-01T00:01:00Z")));
    w.advance(30);
    let plan = w.step();
    assert_eq!(plan.restart, Some(RestartReason::Preemption));
    // The graceful delete's echo wakes no round: the round that deletes asks for the time the
    // deletion may be forced (now: the node has been NotReady for the timeout).
    assert_eq!(plan.requeue_at, Some(w.now));
    assert!(
        plan.status
            .last_restart
            .expect("last")
            .detail
            .contains("NotReady for 60s")
    );
    // Deleted gracefully, but no kubelet will confirm it.
    let plan = w.step();
    assert!(
        plan.actions
            .iter()
            .any(|a| matches!(a, Action::ForceDeletePod { .. })),
        "{:?}",
        plan.actions
    );
    assert_eq!(
        w.decided,
        [
            PhaseName::Running,
            PhaseName::Running,
            PhaseName::Running,
            PhaseName::GangRestart,
            PhaseName::DrainOldAttempt,
        ]
    );
}

#[test]
fn pods_on_a_deleted_node_are_force_deleted_at_once() {
    let mut w = World::running_world("workers: 1\n");
    w.nodes.clear();
    let plan = w.step();
    assert!(
        plan.status
            .last_restart
            .expect("last")
            .detail
            .contains("node n-1 is gone")
    );
    let plan = w.step();
    assert!(
        plan.actions
            .iter()
            .any(|a| matches!(a, Action::ForceDeletePod { .. }))
    );
    let plan = w.step();
    assert_eq!(
        World::creates(&plan).len(),
        1,
        "the next attempt starts once the pod is gone"
    );
    assert_eq!(
        w.decided,
        [
            PhaseName::Running,
            PhaseName::Running,
            PhaseName::GangRestart,
            PhaseName::DrainOldAttempt,
            PhaseName::Running,
        ]
    );
}

#[test]
fn old_pods_whose_containers_all_stopped_are_force_removed_so_the_next_attempt_starts() {
    // A kubelet may keep a stopped pod's object for seconds to tens of seconds after its
    // containers exit (volume teardown, a failed kill it retries); the pod's name blocks the
    // next attempt all that time while its GPUs are already free.
    let mut w = World::running_world("workers: 2\ngpusPerWorker: 1\n");
    w.preempt("train-worker-1");
    let plan = w.step();
    assert_eq!(plan.restart, Some(RestartReason::Preemption));
    // Both are being deleted; worker 0 still runs (its grace period), worker 1 has exited.
    w.exit("train-worker-1", 143);
    w.modify("train-worker-1", |p| {
        p.metadata.deletion_timestamp = Some(Time(ts(T0)));
    });
    let plan = w.step();
    let forced: Vec<&str> = plan
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::ForceDeletePod { name, uid } => {
                assert!(uid.is_some(), "uid-safe: {a:?}");
                Some(name.as_str())
            }
            _ => None,
        })
        .collect();
    assert_eq!(forced, ["train-worker-1"], "{:?}", plan.actions);
    assert!(
        plan.events.iter().all(|e| e.reason != "ForceDeleted"),
        "not a lost node: no warning"
    );
    assert!(World::creates(&plan).is_empty(), "worker 0 still runs");
    // Worker 0 stops too: it is removed at once and the next attempt is created.
    w.exit("train-worker-0", 143);
    let plan = w.step();
    assert!(
        plan.actions
            .iter()
            .any(|a| matches!(a, Action::ForceDeletePod { name, .. } if name == "train-worker-0")),
        "{:?}",
        plan.actions
    );
    let plan = w.step();
    assert_eq!(World::creates(&plan).len(), 2);
    assert_eq!(plan.status.attempt, 1);
    assert_eq!(
        w.decided,
        [
            PhaseName::Running,
            PhaseName::Running,
            PhaseName::GangRestart,
            PhaseName::DrainOldAttempt,
            PhaseName::DrainOldAttempt,
            PhaseName::Running,
        ]
    );
}
