//! The goodput ledger, stretch by stretch through restarts, suspends and leader changes.

use super::*;

/// The goodput ledger of a job preempted once, round by round: 2 workers × 4 GPUs on a spot
/// Tesla-T4 node; created at 0 s, running at 60 s; step 1000 reached at 1060 s (1 s a step),
/// checkpoint 900 at 960 s; worker 1 disrupted at 1070 s, seen at 1075 s; attempt 1 runs at
/// 1135 s.
#[test]
fn a_preempted_jobs_ledger_counts_every_stretch_through_its_restart() {
    let mut w = World::new("workers: 2\ngpusPerWorker: 4\n");
    w.replace_node(node("n-1").gpus(8).product("Tesla-T4").spot().build());
    let created = w.step();
    let open = |st: &TrainingJobStatus| st.ledger.as_ref().and_then(|l| l.open.clone());
    let pending = open(&created.status).expect("a Pending stretch");
    assert_eq!((pending.use_, pending.spot_gpus), (StretchUse::Pending, 8));
    w.advance(60);
    start_all_now(&mut w);
    w.step();
    w.advance(1000);
    let mut p = reports(0, &[(0, 1000), (1, 999)], w.now);
    p.checkpoint = Some((900, t(960)));
    w.progress = Some(p);
    let ran = w.status.ledger.clone();
    let reported = w.step();
    assert_eq!(reported.status.ledger, ran, "no transition, no change");

    w.advance(15);
    // Disrupted at 1070 s; its trainer exits on SIGTERM at 1073 s.
    w.exit("train-worker-1", 143);
    w.modify("train-worker-1", |p| {
        let s = p.status.as_mut().expect("status");
        s.conditions = serde_json::from_value(json!([{"type": "DisruptionTarget",
            "status": "True", "reason": "TerminationByKubelet",
            "lastTransitionTime": t(1070).to_string()}]))
        .ok();
        let trainer = s
            .container_statuses
            .iter_mut()
            .flatten()
            .next()
            .expect("trainer");
        let ended = trainer.state.as_mut().and_then(|st| st.terminated.as_mut());
        ended.expect("terminated").finished_at = Some(Time(t(1073)));
    });
    let (before, seen) = (w.status.clone(), w.observed());
    let restart = w.step();
    assert_eq!(restart.restart, Some(RestartReason::Preemption));
    let ledger = restart.status.ledger.clone().expect("ledger");
    let expected = crate::model::crd::GpuMillis {
        pending: 60_000 * 8,
        useful: 900_000 * 8,
        lost_to_recompute: 110_000 * 8,
        lost_to_detection: 5_000 * 8,
        ..Default::default()
    };
    assert_eq!(ledger.spot, expected);
    let restarting = ledger.open.clone().expect("a Restarting stretch");
    assert_eq!(
        (restarting.use_, restarting.since.0),
        (StretchUse::Restarting, t(1075))
    );
    // A restart decided again (its status write lost, so nothing was deleted: the write
    // order) counts the same; the round after it counts nothing more.
    let replay = decide(&w.job, &seen, &before, &w.config);
    assert_eq!(replay.status.ledger, restart.status.ledger);
    assert_eq!(w.step().status.ledger, restart.status.ledger);

    w.kubelet_removes_deleted();
    w.step();
    w.advance(60);
    start_all_now(&mut w);
    let running = w.step();
    assert_eq!(running.status.phase, Some(Phase::Running));
    let ledger = running.status.ledger.expect("ledger");
    assert_eq!(ledger.spot.lost_to_restart, 60_000 * 8);
    assert_eq!(ledger.spot.total(), 1_135_000 * 8, "wall time × GPUs");
    let now_running = ledger.open.expect("a Running stretch");
    assert_eq!(
        (now_running.use_, now_running.attempt, now_running.since.0),
        (StretchUse::Running, 1, t(1135))
    );
    // 8,120,000 GPU-ms at $0.12 per GPU-hour, then 480,000: rounded down per stretch.
    assert_eq!(ledger.micro_dollars.spent, 270_666 + 16_000);
    assert_eq!(ledger.cost, "$0.29");
}

#[test]
fn a_job_without_gpus_keeps_no_ledger() {
    let mut w = World::running_world("workers: 2\n");
    w.preempt("train-worker-1");
    let plan = w.step();
    assert_eq!(plan.restart, Some(RestartReason::Preemption));
    assert_eq!(plan.status.ledger, None);
}

/// One worker × 2 GPUs on the on-demand Tesla-T4 node, no progress reports: it fails at
/// 100 s (seen at 102 s), waits out a 10 s backoff, runs again and succeeds 1000 s later.
#[test]
fn a_failed_attempt_without_reports_is_unknown_and_the_success_after_it_useful() {
    let mut w =
        World::running_world("workers: 1\ngpusPerWorker: 2\nrestartPolicy: {backoffSeconds: 10}\n");
    w.advance(100);
    w.exit("train-worker-0", 1);
    w.advance(2);
    let failed = w.step();
    assert_eq!(failed.restart, Some(RestartReason::Failure));
    let waiting = w.step();
    assert_eq!(waiting.decided_by, PhaseName::Backoff);
    w.advance(10);
    assert_eq!(World::creates(&w.step()).len(), 1);
    start_all_now(&mut w);
    w.step();
    w.advance(1000);
    w.exit("train-worker-0", 0);
    let done = w.step();
    assert_eq!(done.status.phase, Some(Phase::Succeeded));
    let ledger = done.status.ledger.expect("ledger");
    let expected = crate::model::crd::GpuMillis {
        recompute_unknown: 100_000 * 2,
        lost_to_detection: 2_000 * 2,
        lost_to_restart: 10_000 * 2,
        useful: 1_000_000 * 2,
        ..Default::default()
    };
    assert_eq!(ledger.on_demand, expected);
    assert_eq!(ledger.spot.total(), 0);
    assert_eq!(ledger.on_demand.total(), 1_112_000 * 2, "wall time × GPUs");
    assert_eq!(ledger.open, None);
    // At $0.36 per GPU-hour: 204,000 GPU-ms → 20,400 µ$, 20,000 → 2,000, 2,000,000 →
    // 200,000; the useful work alone would have cost 200,000.
    let cost = &ledger.micro_dollars;
    assert_eq!(
        (cost.spent, cost.on_demand_equivalent, cost.saved),
        (222_400, 200_000, -22_400)
    );
    assert_eq!(
        (ledger.goodput.as_str(), ledger.cost.as_str()),
        ("89.9%", "$0.22")
    );
}

/// Suspended after 300 s of running (the checkpoint at 240 s in the status), resumed 1000 s
/// later: the time suspended counts nowhere, the wait for the new pods is pending again.
#[test]
fn suspend_and_resume_close_the_attempt_and_count_nothing_while_suspended() {
    let mut w = World::running_world("workers: 1\ngpusPerWorker: 1\n");
    w.status.progress = Some(crate::model::crd::ProgressStatus {
        attempt: 0,
        step: 50,
        checkpoint_step: Some(40),
        checkpoint_time: Some(Time(t(240))),
        ..Default::default()
    });
    w.advance(300);
    w.job.spec.suspend = true;
    let suspended = w.step();
    assert_eq!(suspended.status.phase, Some(Phase::Suspended));
    let ledger = suspended.status.ledger.clone().expect("ledger");
    assert_eq!(
        (ledger.on_demand.useful, ledger.on_demand.lost_to_recompute),
        (240_000, 60_000)
    );
    assert_eq!(ledger.open, None);
    w.kubelet_removes_deleted();
    w.advance(1000);
    assert_eq!(w.step().status.ledger, suspended.status.ledger);
    w.job.spec.suspend = false;
    let resumed = w.step();
    assert_eq!(resumed.restart, Some(RestartReason::Resume));
    w.advance(20);
    start_all_now(&mut w);
    let running = w.step();
    let ledger = running.status.ledger.expect("ledger");
    assert_eq!(ledger.on_demand.pending, 20_000);
    assert_eq!(ledger.on_demand.total(), 320_000);
    let open = ledger.open.expect("running");
    assert_eq!(
        (open.use_, open.attempt, open.since.0),
        (StretchUse::Running, 1, t(1320))
    );
}

/// A leader change mid-attempt: the new leader's progress store is empty, so the restart it
/// decides measures the loss from the checkpoint the status records (at 960 s), and the
/// attempt's start from the ledger's open stretch (at 60 s).
#[test]
fn a_new_leader_folds_the_attempt_from_the_status_alone() {
    let mut w = World::new("workers: 1\ngpusPerWorker: 1\n");
    w.step();
    w.advance(60);
    start_all_now(&mut w);
    w.step();
    w.advance(1000);
    let mut p = reports(0, &[(0, 1000)], w.now);
    p.checkpoint = Some((900, t(960)));
    w.progress = Some(p);
    w.step();
    w.progress = None;
    w.advance(15);
    w.preempt("train-worker-0");
    let restart = w.step();
    assert_eq!(restart.restart, Some(RestartReason::Preemption));
    let ledger = restart.status.ledger.expect("ledger");
    let expected = crate::model::crd::GpuMillis {
        pending: 60_000,
        useful: 900_000,
        lost_to_recompute: 115_000,
        ..Default::default()
    };
    assert_eq!(ledger.on_demand, expected);
}

/// The trainers start at 30 s and exit at 500 s; the operator sees each 2 or 3 s later.
#[test]
fn the_ledger_times_an_attempt_by_its_trainers_not_by_when_the_operator_looked() {
    let mut w = World::new("workers: 2\ngpusPerWorker: 1\n");
    w.step();
    w.advance(30);
    start_all_now(&mut w);
    w.advance(2);
    let running = w.step();
    let open = running.status.ledger.and_then(|l| l.open).expect("open");
    assert_eq!((open.use_, open.since.0), (StretchUse::Running, t(30)));
    w.advance(468);
    w.exit("train-worker-0", 0);
    w.exit("train-worker-1", 0);
    w.advance(3);
    let done = w.step();
    assert_eq!(done.status.phase, Some(Phase::Succeeded));
    let ledger = done.status.ledger.expect("ledger");
    assert_eq!(
        (ledger.on_demand.pending, ledger.on_demand.useful),
        (30_000 * 2, 470_000 * 2)
    );
    assert_eq!(ledger.on_demand.total(), 500_000 * 2);
    assert_eq!(ledger.goodput, "94.0%");
}

/// One worker × 1 GPU runs from 0 s at 1 s a step: step 100 at 100 s, checkpoint 80 at 80 s;
/// then no step advances while reports keep coming, and the hang is decided at 160 s.
#[test]
fn a_hang_restart_counts_the_work_past_the_checkpoint_and_the_time_stuck_as_hangs() {
    let mut w = World::running_world(
        "workers: 1\ngpusPerWorker: 1\nrestartPolicy: {progressTimeoutSeconds: 60}\n",
    );
    w.advance(100);
    let mut p = reports(0, &[(0, 100)], w.now);
    p.checkpoint = Some((80, t(80)));
    w.progress = Some(p);
    w.step();
    w.advance(60);
    still_reporting(&mut w);
    let plan = w.step();
    assert_eq!(plan.restart, Some(RestartReason::Hang));
    let ledger = plan.status.ledger.expect("ledger");
    let expected = crate::model::crd::GpuMillis {
        useful: 80_000,
        hangs: 20_000 + 60_000,
        ..Default::default()
    };
    assert_eq!(ledger.on_demand, expected);
}

/// The status keeps times to the second: a restart seen at 100.6 s draws its boundary at
/// 100 s, so the ledger reads back from the API server exactly as it was counted.
#[test]
fn the_ledger_draws_its_boundaries_at_whole_seconds_so_they_survive_the_status() {
    let mut w = World::running_world("workers: 1\ngpusPerWorker: 1\n");
    w.advance(100);
    w.now = w
        .now
        .saturating_add(SignedDuration::from_millis(600))
        .expect("time");
    w.preempt("train-worker-0");
    let restart = w.step();
    let ledger = restart.status.ledger.expect("ledger");
    assert_eq!(ledger.on_demand.recompute_unknown, 100_000);
    assert_eq!(ledger.open.as_ref().map(|o| o.since.0), Some(t(100)));
    let written = serde_json::to_value(&ledger).expect("serialize");
    let read_back: crate::model::crd::GoodputLedger =
        serde_json::from_value(written).expect("parse");
    assert_eq!(read_back, ledger);
}
