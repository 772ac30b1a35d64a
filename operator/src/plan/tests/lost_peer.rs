//! The lost-peer rule: whether a failure beside a node that may be gone is a preemption.

use super::*;

/// The fast path is for trainers that report: rank 1 reported until n-2 vanished.
#[test]
fn a_rank_that_fails_because_its_peers_node_vanished_counts_one_preemption() {
    let mut w =
        World::running_world("workers: 2\nrestartPolicy: {maxFailures: 0}\n").with_worker_1_on_n2();
    w.watched_a_quiet_minute(&["n-1", "n-2"]);
    w.heartbeat("n-1");
    w.heartbeat("n-2");
    let channel = Channel::new();
    channel.report(&mut w, 0, 10, None);
    channel.report(&mut w, 1, 10, None);
    w.advance(1);
    // n-2 vanishes: rank 0's collective breaks at once, long before n-2 is marked NotReady.
    w.exit("train-worker-0", 1);
    let held = w.step();
    assert_eq!(held.decided_by, PhaseName::Running);
    assert_eq!(held.restart, None, "no verdict while n-2 may be lost");
    assert_eq!((held.status.failures, held.status.preemptions), (0, 0));
    assert_eq!(
        held.requeue_at,
        Some(ts("2026-01-01T00:00:03Z")),
        "looks again soon"
    );
    // n-2's Lease was renewed 1 s before the failure and never again: past an interval and
    // the margin (13 s on this quiet cluster), with n-1's kubelet renewing its own after n-2
    // was due, the node counts as lost.
    w.advance(9);
    w.heartbeat("n-1");
    assert_eq!(w.step().restart, None, "n-2 not due yet");
    w.advance(10);
    w.heartbeat("n-1");
    let plan = w.step();
    assert_eq!(plan.restart, Some(RestartReason::Preemption));
    assert_eq!((plan.status.failures, plan.status.preemptions), (0, 1));
    let detail = &plan.status.last_restart.as_ref().expect("restart").detail;
    assert!(
        detail.contains("worker 1 lost with its node: node n-2's Lease not renewed")
            && detail.contains("worker 0 failed with it"),
        "{detail}"
    );
}

/// A trainer that does not report, its node's kubelet paused for 18 s right after a renewal
/// (a renewal 8 s late, well inside Kubernetes' grace), and a genuine crash on the other node:
/// one failure, no preemption. Without reports a late Lease proves nothing.
#[test]
fn a_paused_kubelet_under_a_trainer_that_never_reported_turns_no_crash_into_a_preemption() {
    let mut w =
        World::running_world("workers: 2\nrestartPolicy: {maxFailures: 1}\n").with_worker_1_on_n2();
    w.watched_a_quiet_minute(&["n-1", "n-2"]);
    w.heartbeat("n-1");
    w.heartbeat("n-2");
    // n-2's kubelet pauses now; rank 0 crashes a second later.
    w.advance(1);
    w.exit("train-worker-0", 1);
    // n-1 renews on time meanwhile (at 5 s and 15 s): n-2, due at 13 s, is silent by the
    // liveness rule from 15 s.
    for _ in 0..17 {
        w.advance(1);
        if w.now.duration_since(ts(T0)).as_secs() % 10 == 5 {
            w.heartbeat("n-1");
        }
        let plan = w.step();
        assert_eq!(
            plan.restart, None,
            "held at {}: {:?}",
            w.now, plan.status.last_restart
        );
    }
    assert!(
        w.observed().liveness.silent.contains_key("n-2"),
        "n-2 is silent by the Lease rule"
    );
    // The kubelet comes back 18 s after its last renewal and renews every 10 s again. Back
    // from an absence that spans the failure, its Lease proves nothing either way: the verdict
    // waits for the pods or the window, and ends a failure.
    w.advance(1);
    let mut decided = None;
    for _ in 0..50 {
        if w.now.duration_since(ts(T0)).as_secs() % 10 == 8 {
            w.heartbeat("n-1");
            w.heartbeat("n-2");
        }
        let plan = w.step();
        if let Some(reason) = plan.restart {
            decided = Some((reason, plan.status.failures, plan.status.preemptions, w.now));
            break;
        }
        w.advance(1);
    }
    let (reason, failures, preemptions, at) = decided.expect("a verdict within the window");
    assert_eq!(
        (reason, failures, preemptions),
        (RestartReason::Failure, 1, 0)
    );
    assert!(at <= ts("2026-01-01T00:01:01Z"), "decided at {at}");
}

#[test]
fn a_peer_node_marked_not_ready_decides_the_preemption_at_once() {
    let mut w =
        World::running_world("workers: 2\nrestartPolicy: {maxFailures: 0}\n").with_worker_1_on_n2();
    w.exit("train-worker-0", 1);
    let held = w.step();
    assert_eq!(held.restart, None);
    assert_eq!(held.decided_by, PhaseName::Running, "the verdict is held");
    w.advance(5);
    w.replace_node(
        node("n-2")
            .gpus(8)
            .product("Tesla-T4")
            .not_ready_since("2026-01-01T00:00:04Z")
            .build(),
    );
    let plan = w.step();
    assert_eq!(plan.restart, Some(RestartReason::Preemption));
    assert_eq!((plan.status.failures, plan.status.preemptions), (0, 1));
    assert_eq!(plan.decided_by, PhaseName::GangRestart);
}

#[test]
fn a_peer_node_that_renews_its_lease_after_the_failure_makes_it_a_failure() {
    let mut w =
        World::running_world("workers: 2\nrestartPolicy: {maxFailures: 3}\n").with_worker_1_on_n2();
    w.exit("train-worker-0", 1);
    assert_eq!(w.step().restart, None);
    w.advance(8);
    w.heartbeat("n-2");
    let plan = w.step();
    assert_eq!(plan.restart, Some(RestartReason::Failure));
    assert_eq!((plan.status.failures, plan.status.preemptions), (1, 0));
    assert_eq!(plan.decided_by, PhaseName::GangRestart);
}

#[test]
fn without_leases_the_window_bounds_the_hold() {
    let mut w =
        World::running_world("workers: 2\nrestartPolicy: {maxFailures: 3}\n").with_worker_1_on_n2();
    w.config.lost_peer_window_seconds = 30;
    w.exit("train-worker-0", 1);
    w.advance(29);
    let held = w.step();
    assert_eq!(held.restart, None);
    assert_eq!(held.decided_by, PhaseName::Running, "the verdict is held");
    w.advance(1);
    let plan = w.step();
    assert_eq!(plan.restart, Some(RestartReason::Failure));
    assert_eq!((plan.status.failures, plan.status.preemptions), (1, 0));
    assert_eq!(plan.decided_by, PhaseName::GangRestart);
}

#[test]
fn a_failure_while_every_lease_looks_equally_stale_stays_a_failure() {
    let mut w =
        World::running_world("workers: 2\nrestartPolicy: {maxFailures: 3}\n").with_worker_1_on_n2();
    // Both kubelets renew at T0; then the operator's Lease watch lags and shows nothing newer.
    w.heartbeat("n-1");
    w.heartbeat("n-2");
    w.advance(1);
    w.exit("train-worker-0", 1);
    // 26 s on the operator's clock: on it every Lease has missed two renewals.
    w.advance(25);
    let held = w.step();
    assert_eq!(
        held.restart, None,
        "held: no node renewed while another did not"
    );
    assert_eq!((held.status.failures, held.status.preemptions), (0, 0));
    // The window runs out: a failure of the job's own, with its backoff and budget.
    w.advance(60);
    let plan = w.step();
    assert_eq!(plan.restart, Some(RestartReason::Failure));
    assert_eq!((plan.status.failures, plan.status.preemptions), (1, 0));
}

/// The spot node under rank 1 vanishes and rank 0's collective breaks at once: rank 0 fails,
/// and when node n-2 falls silent the lost-peer rule names both in one preemption.
#[test]
fn a_failure_beside_a_silent_node_is_judged_by_the_lost_peer_rule() {
    let (mut w, channel) = reporting_on_two_nodes("workers: 2\ngpusPerWorker: 1\n");
    w.advance(1);
    let plan = rank_0_fails_as_n2_falls_silent(&mut w, &channel, 1);
    let detail = &plan.status.last_restart.as_ref().expect("restart").detail;
    assert!(
        detail.contains("worker 1 lost with its node") && detail.contains("worker 0 failed"),
        "{detail}"
    );
    // The work stopped when n-2 did (its last renewal and rank 1's last report, 14 s before
    // the decision), not when rank 0's collective noticed a second later.
    assert_eq!(detection(&plan), 2 * 14_000, "2 GPUs for 14 s");
}

/// Found by the chaos run in CI: node n-2 vanishes (every process of it killed) as a new
/// leader starts, and comes back 15 s later, before it could be judged silent; rank 0's
/// collective breaks at once. The kubelet's first renewal back ends a span with no renewal
/// across the failure: no proof that rank 1 lived through it. The verdict holds until n-2's
/// kubelet reports rank 1's container lost with the node (exit 255, `Unknown`): one
/// preemption, no failure spent.
#[test]
fn a_failure_beside_a_node_lost_and_back_before_it_was_silent_is_a_preemption() {
    let (mut w, channel) = reporting_on_two_nodes("workers: 2\ngpusPerWorker: 1\n");
    let renewed = w.now;
    for _ in 0..9 {
        w.advance(1);
        channel.report(&mut w, 0, 40, None);
        channel.report(&mut w, 1, 40, None);
        assert_eq!(channel.step(&mut w).restart, None);
    }
    // n-2 vanishes at 9.5. At 10 a new leader lists both Leases (renewed at 0), n-1 renews
    // and rank 0 fails.
    w.advance(1);
    w.beats = Heartbeats::default();
    w.beats.interrupted();
    w.heartbeat_seen("n-1", renewed, w.now);
    w.heartbeat_seen("n-2", renewed, w.now);
    w.beats.resumed(w.now);
    w.heartbeat("n-1");
    w.exit("train-worker-0", 1);
    assert_eq!(channel.step(&mut w).restart, None, "n-2 is only due");
    // n-2's kubelet is back at 15 and renews, 15 s after its last renewal.
    w.advance(5);
    w.heartbeat("n-2");
    assert_eq!(channel.step(&mut w).restart, None, "held: n-2 was away");
    // Its kubelet finds rank 1's container gone with the runtime.
    w.advance(2);
    w.set_status(
        "train-worker-1",
        json!({"phase": "Failed", "startTime": T0, "containerStatuses": [
        {"name": "trainer", "ready": false, "restartCount": 0, "image": "x", "imageID": "",
         "state": {"terminated": {"exitCode": 255, "reason": "Unknown",
                                  "finishedAt": w.now.to_string()}}}]}),
    );
    let plan = channel.step(&mut w);
    assert_eq!(plan.restart, Some(RestartReason::Preemption));
    assert_eq!((plan.status.preemptions, plan.status.failures), (1, 0));
}

/// n-2's kubelet cannot reach the API server (its Lease falls silent) while rank 1 trains on and
/// reports; rank 0 crashes on its own. Rank 1's report after the failure (and the margin) proves
/// n-2 alive: a failure, spent from the budget, decided then, not a preemption 13 s later.
#[test]
fn a_failure_beside_a_silent_kubelet_whose_rank_reports_is_a_failure() {
    let (mut w, channel) = reporting_on_two_nodes("workers: 2\ngpusPerWorker: 1\n");
    w.advance(1);
    w.exit("train-worker-0", 1);
    assert_eq!(channel.step(&mut w).restart, None);
    let mut decided = None;
    for t in 2..=14 {
        w.advance(1);
        channel.report(&mut w, 1, 40, None);
        if t % 10 == 0 || t == 14 {
            w.heartbeat("n-1");
        }
        let plan = channel.step(&mut w);
        if plan.restart.is_some() {
            decided = Some((t, plan));
            break;
        }
    }
    let (t, plan) = decided.expect("decided");
    assert_eq!(plan.restart, Some(RestartReason::Failure));
    assert_eq!((plan.status.preemptions, plan.status.failures), (0, 1));
    assert_eq!(
        t, 5,
        "rank 1's first report past the failure and the 3-s margin"
    );
}

/// The review's repro on the local cluster: a trainer crashed with exit 1 while the other
/// node's kubelet renewal was a few seconds late. A genuine failure is a Failure: the verdict
/// waits for the late renewal, never takes the node for lost, and spends the failure budget.
#[test]
fn a_genuine_failure_beside_a_lease_twelve_and_a_half_seconds_old_is_a_failure() {
    let (mut w, channel) = reporting_on_two_nodes("workers: 2\nrestartPolicy: {maxFailures: 3}\n");
    // Rank 0 crashes 2 s later; rank 1 blocks in its collective and reports no more.
    w.advance(2);
    w.exit("train-worker-0", 1);
    // n-1 renews on time; n-2's renewal, due at 10 s, comes at 12.5 s.
    for tenth in 21..125 {
        w.now = ts(T0)
            .saturating_add(SignedDuration::from_millis(tenth * 100))
            .expect("time");
        if tenth == 100 {
            w.heartbeat("n-1");
        }
        let plan = channel.step(&mut w);
        assert_eq!(
            plan.restart, None,
            "at {tenth}: {:?}",
            plan.status.last_restart
        );
        assert!(!World::deleted(&plan, true).contains(&"train-worker-1"));
    }
    w.now = ts("2026-01-01T00:00:12.5Z");
    w.heartbeat("n-2");
    let mut plan = channel.step(&mut w);
    for _ in 0..20 {
        if plan.restart.is_some() {
            break;
        }
        w.advance(1);
        if w.now.as_second() % 10 == 0 {
            w.heartbeat("n-1");
        }
        if w.now.as_second() % 10 == 2 {
            w.heartbeat("n-2");
        }
        plan = channel.step(&mut w);
    }
    assert_eq!(
        plan.restart,
        Some(RestartReason::Failure),
        "{:?}",
        plan.status.last_restart
    );
    assert_eq!((plan.status.failures, plan.status.preemptions), (1, 0));
    assert_eq!(
        World::deleted(&plan, false),
        ["train-worker-1"],
        "graceful: the trainer on n-2 saves"
    );
}

/// One thing the simulated cluster delivers to the operator, at the time it is seen.
enum Delivery {
    /// A kubelet's renewal, stamped on its node's skewed clock.
    Renewal { node: &'static str, stamped: f64 },
    /// A rank's progress report.
    Report { rank: u32 },
}

/// A noisy two-node history for the World: both kubelets renew every 10 s with the 4 %
/// jitter, stamped on clocks up to ±5 s off and seen after up to `max_delay` seconds (API
/// latency and watch lag); both ranks report every 1 to 5 s, seen up to 1 s late. Node 2 is
/// lost at `lost_at` (its renewals and rank 1's reports stop); after `silent_ranks_at`, both
/// ranks stop reporting (a genuine failure broke the collective). Sorted by when seen.
fn noisy_history(
    rng: &mut fastrand::Rng,
    max_delay: f64,
    lost_at: Option<f64>,
    silent_ranks_at: Option<f64>,
) -> Vec<(f64, Delivery)> {
    let mut out = Vec::new();
    for node in ["n-1", "n-2"] {
        let skew = rng.f64() * 10.0 - 5.0;
        let mut t = rng.f64() * 10.0;
        while t < 200.0 {
            if node == "n-2" && lost_at.is_some_and(|l| t >= l) {
                break;
            }
            let stamped = t + skew;
            out.push((
                t + rng.f64() * max_delay,
                Delivery::Renewal { node, stamped },
            ));
            t += 10.0 * (1.0 + 0.04 * rng.f64());
        }
    }
    for rank in [0_u32, 1] {
        let cadence = 1.0 + rng.f64() * 4.0;
        let mut t = rng.f64() * cadence;
        while t < 200.0 {
            let lost = rank == 1 && lost_at.is_some_and(|l| t >= l);
            if lost || silent_ranks_at.is_some_and(|s| t >= s) {
                break;
            }
            out.push((t + rng.f64(), Delivery::Report { rank }));
            t += cadence;
        }
    }
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

/// Plays `history` into a World running a two-worker job (rank 1 on n-2) every 0.5 s until
/// `until`, calling `check` with each round's plan and the time; rank 0 exits 1 at
/// `failure_at`. Stops at the first restart and returns it, with its time.
fn play_noisy(
    history: &[(f64, Delivery)],
    failure_at: Option<f64>,
    until: f64,
    check: &mut dyn FnMut(&Plan, f64),
) -> Option<(RestartReason, f64)> {
    let (mut w, channel) = reporting_on_two_nodes("workers: 2\nrestartPolicy: {maxFailures: 3}\n");
    let start = w.now;
    let at = |s: f64| {
        start
            .saturating_add(SignedDuration::from_secs_f64(s))
            .expect("time")
    };
    let mut next = 0;
    let mut tick = 0.5;
    while tick <= until {
        while next < history.len() && history[next].0 <= tick {
            let (seen, delivery) = &history[next];
            w.now = at(*seen);
            match delivery {
                Delivery::Renewal { node, stamped } => {
                    w.heartbeat_seen(node, at(*stamped), at(*seen))
                }
                Delivery::Report { rank } => channel.report(&mut w, *rank, 40, None),
            }
            next += 1;
        }
        w.now = at(tick);
        if failure_at.is_some_and(|f| tick >= f && tick < f + 0.5) {
            w.exit("train-worker-0", 1);
        }
        let plan = channel.step(&mut w);
        check(&plan, tick);
        if let Some(reason) = plan.restart {
            return Some((reason, tick));
        }
        tick += 0.5;
    }
    None
}

/// The World property of the liveness rule, over seeded noisy histories (up to 5 s of API
/// latency and watch lag, ±5 s of skew on each node, report cadences of 1 to 5 s): a genuine
/// failure (rank 0 exits 1, both ranks stop reporting) is a Failure and never force-deletes
/// the healthy node's running pod; a healthy job is never restarted; a node really lost is a
/// preemption within two renewal intervals and three report gaps of the loss.
#[test]
fn property_noisy_clusters_never_take_a_healthy_node_for_lost_and_still_find_a_lost_one() {
    for seed in 0..60_u64 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let max_delay = rng.f64() * 5.0;
        // A healthy job: nothing restarts.
        let history = noisy_history(&mut rng, max_delay, None, None);
        let quiet = play_noisy(&history, None, 150.0, &mut |_, _| {});
        assert_eq!(quiet, None, "seed {seed}: a healthy job restarted");
        // A genuine failure: a Failure, the healthy node's pod deleted gracefully.
        let failure_at = 40.0 + rng.f64() * 60.0;
        let history = noisy_history(&mut rng, max_delay, None, Some(failure_at));
        let mut forced = Vec::new();
        let verdict = play_noisy(&history, Some(failure_at), 190.0, &mut |plan, t| {
            if World::deleted(plan, true).contains(&"train-worker-1") {
                forced.push(t);
            }
        });
        assert!(
            matches!(verdict, Some((RestartReason::Failure, _))),
            "seed {seed}: failure at {failure_at:.1} judged {verdict:?}"
        );
        assert!(
            forced.is_empty(),
            "seed {seed}: worker 1 force-deleted at {forced:?}"
        );
        // A lost node: a preemption, in time.
        let lost_at = 40.0 + rng.f64() * 60.0;
        let history = noisy_history(&mut rng, max_delay, Some(lost_at), None);
        let verdict = play_noisy(&history, None, 190.0, &mut |_, _| {});
        let Some((reason, decided)) = verdict else {
            panic!("seed {seed}: node 2 lost at {lost_at:.1} never found");
        };
        assert_eq!(reason, RestartReason::Preemption, "seed {seed}");
        assert!(
            decided - lost_at <= 2.0 * 10.4 + 15.0 + max_delay + 1.0,
            "seed {seed}: lost at {lost_at:.1}, decided at {decided}"
        );
    }
}
