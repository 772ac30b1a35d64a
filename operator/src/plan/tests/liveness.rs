//! Silent kubelets and ranks: when a node is lost, and when it stopped working.

use super::*;

/// A partitioned (or vanished) node under rank 1 while rank 0 keeps running: nobody exits,
/// torchrun's agent waits. The kubelet's Lease stops renewing and rank 1's reports stop: the
/// gang restarts as a preemption without waiting for NotReady, the pod stuck terminating
/// there is removed at once, and the next attempt stays off the silent node.
#[test]
fn a_node_whose_kubelet_and_ranks_fall_silent_is_lost_without_waiting_for_not_ready() {
    let mut w = World::running_world("workers: 2\ngpusPerWorker: 1\n").with_worker_1_on_n2();
    w.watched_a_quiet_minute(&["n-1", "n-2"]);
    let channel = Channel::new();
    w.heartbeat("n-1");
    w.heartbeat("n-2");
    channel.report(&mut w, 0, 40, None);
    channel.report(&mut w, 1, 40, None);
    let plan = channel.step(&mut w);
    assert_eq!(plan.restart, None);
    // n-2 goes silent; n-1 and rank 0 go on. 13 s is one renewal interval and the margin.
    for _ in 0..13 {
        w.advance(1);
        channel.report(&mut w, 0, 40, None);
        if w.now.as_second() % 10 == 0 {
            w.heartbeat("n-1");
        }
        let plan = channel.step(&mut w);
        assert_eq!(
            plan.restart, None,
            "not yet: {:?}",
            plan.status.last_restart
        );
    }
    w.advance(1);
    w.heartbeat("n-1");
    channel.report(&mut w, 0, 40, None);
    let plan = channel.step(&mut w);
    assert_eq!(plan.restart, Some(RestartReason::Preemption));
    let detail = &plan.status.last_restart.as_ref().expect("restart").detail;
    assert!(
        detail.contains("node n-2 lost") && detail.contains("Lease not renewed"),
        "{detail}"
    );
    assert_eq!(plan.status.preemptions, 1);
    assert_eq!(World::deletes(&plan), 2);
    // The ledger dates the loss at n-2's last heartbeat, 14 s before the decision: that time
    // was lost to detection, not spent training.
    assert_eq!(detection(&plan), 2 * 14_000, "2 GPUs for 14 s");

    // Terminating: the pod on the silent node is removed at once, rank 0's waits for its kubelet.
    let plan = channel.step(&mut w);
    assert_eq!(World::deleted(&plan, true), vec!["train-worker-1"]);
    w.kubelet_removes_deleted();
    let plan = channel.step(&mut w);
    let created = World::creates(&plan);
    assert_eq!(created.len(), 2, "{:?}", plan.decided_by);
    for p in created {
        assert_eq!(CachedPod::from(p).avoided_nodes(), vec!["n-2"]);
    }
}

/// A kubelet that restarts alone misses renewals while its trainers go on reporting: nothing
/// is lost, nothing is force-deleted.
#[test]
fn a_late_lease_alone_loses_nothing_while_the_ranks_there_report() {
    let mut w = World::running_world("workers: 2\n").with_worker_1_on_n2();
    w.watched_a_quiet_minute(&["n-1", "n-2"]);
    let channel = Channel::new();
    w.heartbeat("n-1");
    w.heartbeat("n-2");
    for _ in 0..30 {
        w.advance(1);
        channel.report(&mut w, 0, 40, None);
        channel.report(&mut w, 1, 40, None);
        if w.now.as_second() % 10 == 0 {
            w.heartbeat("n-1");
        }
        let plan = channel.step(&mut w);
        assert_eq!(plan.restart, None);
        assert!(plan.actions.is_empty(), "{:?}", plan.actions);
    }
}

/// Both ranks report every second for `seconds`, and nothing restarts.
fn both_ranks_report_for(w: &mut World, channel: &Channel, seconds: u32) {
    for _ in 0..seconds {
        w.advance(1);
        channel.report(w, 0, 40, None);
        channel.report(w, 1, 40, None);
        assert_eq!(channel.step(w).restart, None);
    }
}

/// The node lifecycle controller marks n-2 NotReady now.
fn n2_marked_not_ready_now(w: &mut World) {
    let now = w.now.to_string();
    w.replace_node(
        node("n-2")
            .gpus(8)
            .product("Tesla-T4")
            .not_ready_since(&now)
            .build(),
    );
}

/// Found by CI in the elastic scenario: n-2 vanishes, rank 0's collective breaks 4 s later,
/// and the node lifecycle controller marks n-2 NotReady before the operator judges its Lease
/// silent (a node back from a restart has a whole interval of margin). The lost-peer rule
/// decides on NotReady; the ledger still dates the loss at n-2's last sign of life (rank 1's
/// last report), not at rank 0's exit: those 4 s were lost to detection, not trained.
#[test]
fn a_node_marked_not_ready_before_it_is_silent_stopped_working_at_its_last_sign_of_life() {
    let (mut w, channel) = reporting_on_two_nodes("workers: 2\ngpusPerWorker: 1\n");
    both_ranks_report_for(&mut w, &channel, 2);
    // n-2 goes at 2 s; rank 0's trainer exits at 6 s.
    w.advance(4);
    w.exit("train-worker-0", 1);
    assert_eq!(
        channel.step(&mut w).restart,
        None,
        "held until n-2 is known lost"
    );
    w.advance(3);
    n2_marked_not_ready_now(&mut w);
    assert!(
        !w.observed().liveness.silent.contains_key("n-2"),
        "n-2's Lease is not judged silent yet"
    );
    let plan = channel.step(&mut w);
    assert_eq!(plan.restart, Some(RestartReason::Preemption));
    let detail = &plan.status.last_restart.as_ref().expect("restart").detail;
    assert!(detail.contains("node n-2 is NotReady"), "{detail}");
    assert_eq!(
        detection(&plan),
        2 * 7_000,
        "2 GPUs for 7 s, from rank 1's last report"
    );
}

/// As above, with noise on n-2's Lease: its clock runs 30 s behind the operator's, its last
/// renewal arrives 3 s late, and its rank reports nothing. The ledger dates the loss at that
/// renewal on the operator's clock (the node's offset and the fastest delivery seen), not when
/// it arrived, not at its raw `renewTime` and not at rank 0's genuine exit beside it.
#[test]
fn a_not_ready_nodes_last_renewal_is_dated_on_the_operators_clock_despite_skew_and_lag() {
    let mut w = World::running_world("workers: 2\ngpusPerWorker: 1\n").with_worker_1_on_n2();
    let behind = SignedDuration::from_secs(30);
    let before = |t: Timestamp, d: SignedDuration| t.checked_sub(d).expect("time");
    for back in (1..=6).rev() {
        let t = before(w.now, SignedDuration::from_secs(10 * back));
        w.heartbeat_seen("n-1", t, t);
        w.heartbeat_seen("n-2", before(t, behind), t);
    }
    let renewed = w.now;
    w.heartbeat("n-1");
    w.advance(3);
    let seen = w.now;
    w.heartbeat_seen("n-2", before(renewed, behind), seen);
    // n-2 went right after that renewal; rank 0's trainer exits 4 s after it.
    w.advance(1);
    w.exit("train-worker-0", 1);
    assert_eq!(w.step().restart, None, "held until n-2 is known lost");
    w.advance(2);
    n2_marked_not_ready_now(&mut w);
    assert!(!w.observed().liveness.silent.contains_key("n-2"));
    let plan = w.step();
    assert_eq!(plan.restart, Some(RestartReason::Preemption));
    assert_eq!(
        detection(&plan),
        2 * 6_000,
        "2 GPUs for 6 s, from the renewal as n-2 made it"
    );
}

/// A kubelet renews its Lease every 10 s, so a node's last renewal may come long before it
/// goes: here n-2 renews, its rank reports for 6 s more, then the node vanishes and rank 0's
/// collective breaks. The ledger dates the loss at the rank's last report (the last sign of
/// the node's life), not at the renewal 6 s earlier, nor at rank 0's exit a second later.
#[test]
fn a_lost_node_stopped_working_at_its_ranks_last_report_not_its_kubelets_last_renewal() {
    let (mut w, channel) = reporting_on_two_nodes("workers: 2\ngpusPerWorker: 1\n");
    both_ranks_report_for(&mut w, &channel, 6);
    w.advance(1);
    let plan = rank_0_fails_as_n2_falls_silent(&mut w, &channel, 7);
    assert_eq!(detection(&plan), 2 * 8_000, "2 GPUs for 8 s");
}

/// n-2's kubelet falls silent (cut off from the API server) while rank 1 trains on there and
/// reports every second; 14 s later rank 0 is preempted on n-1. The work stopped then: n-2's
/// last sign of life is rank 1's report of a moment ago, not its kubelet's renewal 14 s old,
/// so the ledger counts no detection loss.
#[test]
fn a_preemption_beside_a_silent_kubelet_whose_rank_reports_is_dated_at_the_preemption() {
    let (mut w, channel) = reporting_on_two_nodes("workers: 2\ngpusPerWorker: 1\n");
    for t in 1..=14 {
        w.advance(1);
        channel.report(&mut w, 0, 40, None);
        channel.report(&mut w, 1, 40, None);
        if t % 10 == 0 || t == 14 {
            w.heartbeat("n-1");
        }
        assert_eq!(
            channel.step(&mut w).restart,
            None,
            "n-2's ranks report: not lost"
        );
    }
    assert!(
        w.observed().liveness.silent.contains_key("n-2"),
        "n-2's kubelet is silent"
    );
    // Its kubelet ends it for a node shutdown: exit 143 and the DisruptionTarget condition.
    w.exit("train-worker-0", 143);
    w.preempt("train-worker-0");
    let plan = channel.step(&mut w);
    assert_eq!(plan.restart, Some(RestartReason::Preemption));
    assert_eq!(
        detection(&plan),
        0,
        "dated at the preemption, not at n-2's renewal"
    );
}

/// A gang restart while one node's kubelet is late (silent) but its trainer still reports:
/// the pod terminating there is deleted gracefully, never force-deleted, so its SIGTERM save
/// runs.
#[test]
fn a_pod_on_a_late_node_whose_ranks_report_is_never_force_deleted() {
    let (mut w, channel) = reporting_on_two_nodes("workers: 2\n");
    // n-2's kubelet is late for 16 s (silent), its trainer reports on; rank 0 is preempted.
    for _ in 0..16 {
        w.advance(1);
        channel.report(&mut w, 0, 41, None);
        channel.report(&mut w, 1, 41, None);
        if w.now.as_second() % 10 == 0 {
            w.heartbeat("n-1");
        }
    }
    w.preempt("train-worker-0");
    let plan = channel.step(&mut w);
    assert_eq!(plan.restart, Some(RestartReason::Preemption));
    assert!(World::deleted(&plan, true).is_empty());
    for _ in 0..5 {
        w.advance(1);
        channel.report(&mut w, 1, 41, None);
        let plan = channel.step(&mut w);
        assert!(
            World::deleted(&plan, true).is_empty(),
            "forced on a node whose trainer reports: {:?}",
            plan.actions
        );
    }
}
