//! The ledger against hand-computed histories. Prices are the default table's: Tesla-T4 costs
//! $0.12 per GPU-hour on spot (120,000 µ$) and $0.36 on demand (× 3: 360,000 µ$).

use super::*;
use crate::model::crd::{GoodputLedger, LedgerStretch, MAX_LEDGER};

const T4: &str = "Tesla-T4";

/// Seconds after the epoch of the histories.
fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(1_767_225_600 + secs).expect("in range")
}

fn placed(spot_gpus: u32, on_demand_gpus: u32, product: &str) -> LedgerStretch {
    LedgerStretch {
        use_: StretchUse::Running,
        since: Time(at(0)),
        attempt: 0,
        spot_gpus,
        on_demand_gpus,
        product: product.to_owned(),
        size: None,
    }
}

fn all(l: &GoodputLedger) -> u64 {
    l.spot.total() + l.on_demand.total()
}

/// 8 spot GPUs: pending 60 s, running from 60 s; step 1000 reached at 1060 s (1 s a step),
/// checkpoint 900 at 960 s; preempted at 1070 s, decided at 1075 s; attempt 1 runs at 1135 s
/// and succeeds at 2135 s.
fn preempted_with_reports(config: &OperatorConfig) -> GoodputLedger {
    let mut l = GoodputLedger::default();
    pending(&mut l, at(0), placed(8, 0, T4));
    running(&mut l, at(60), placed(8, 0, T4), config);
    let progress = Progress {
        start_step: 0,
        step: Some((1000, at(1060))),
        checkpoint: Some((900, at(960))),
    };
    let loss = recompute_loss(at(60), at(1070), &progress);
    assert_eq!(
        loss,
        Loss::Known(110_000),
        "100 steps × 1 s + 10 s since the last"
    );
    let preemption = Ending::Restart(RestartReason::Preemption);
    end(&mut l, preemption, at(1070), at(1075), loss, config);
    pending(&mut l, at(1080), placed(8, 0, T4)); // the Restarting stretch goes on
    running(&mut l, at(1135), placed(8, 0, T4), config);
    end(
        &mut l,
        Ending::Succeeded,
        at(2135),
        at(2135),
        Loss::Known(0),
        config,
    );
    l
}

#[test]
fn a_preemption_with_reports_splits_the_attempt_by_the_measured_step_time() {
    let config = OperatorConfig::default();
    let l = preempted_with_reports(&config);
    let expected = GpuMillis {
        pending: 60_000 * 8,
        useful: (900_000 + 1_000_000) * 8,
        lost_to_recompute: 110_000 * 8,
        lost_to_detection: 5_000 * 8,
        lost_to_restart: 60_000 * 8,
        ..GpuMillis::default()
    };
    assert_eq!(l.spot, expected);
    assert_eq!(l.on_demand, GpuMillis::default());
    assert_eq!(all(&l), 2_135_000 * 8, "wall time × GPUs");
    assert_eq!(l.open, None);
    // Charged per stretch, rounded down: 8,120,000 GPU-ms → 270,666; 480,000 → 16,000;
    // 8,000,000 → 266,666. Useful on demand: 7,200,000 → 720,000; 8,000,000 → 800,000.
    assert_eq!(l.micro_dollars.spent, 553_332);
    assert_eq!(l.micro_dollars.on_demand_equivalent, 1_520_000);
    assert_eq!(l.micro_dollars.saved, 966_668);
    assert_eq!(l.goodput_permille, Some(889));
    assert_eq!((l.goodput.as_str(), l.cost.as_str()), ("88.9%", "$0.55"));
}

#[test]
fn a_preemption_without_reports_leaves_the_attempt_unknown_and_says_so() {
    let config = OperatorConfig::default();
    let mut l = GoodputLedger::default();
    running(&mut l, at(0), placed(4, 0, T4), &config);
    let loss = recompute_loss(at(0), at(600), &Progress::default());
    assert_eq!(loss, Loss::Unknown);
    let preemption = Ending::Restart(RestartReason::Preemption);
    end(&mut l, preemption, at(600), at(610), loss, &config);
    assert_eq!(l.spot.recompute_unknown, 600_000 * 4);
    assert_eq!(l.spot.useful, 0);
    assert_eq!(l.spot.lost_to_detection, 10_000 * 4);
    assert_eq!(l.goodput_permille, Some(0));
    let open = l.open.as_ref().expect("restarting");
    assert_eq!((open.use_, open.since.0), (StretchUse::Restarting, at(610)));
}

#[test]
fn without_a_step_time_the_loss_runs_from_the_last_checkpoint_known() {
    // The status keeps the checkpoint's step and time, not when a step was reached.
    let progress = Progress {
        start_step: 100,
        step: None,
        checkpoint: Some((300, at(400))),
    };
    assert_eq!(
        recompute_loss(at(0), at(1000), &progress),
        Loss::Known(600_000)
    );
    // A checkpoint older than the attempt (the one it resumed from) bounds nothing.
    let older = Progress {
        checkpoint: Some((100, at(-50))),
        ..progress
    };
    assert_eq!(
        recompute_loss(at(0), at(1000), &older),
        Loss::Known(1_000_000)
    );
}

#[test]
fn the_measured_loss_counts_steps_since_the_resume_and_never_exceeds_the_running_time() {
    // Resumed from 500; step 700 at 200 s: 1 s a step; no checkpoint since: 200 steps lost.
    let resumed = Progress {
        start_step: 500,
        step: Some((700, at(200))),
        checkpoint: None,
    };
    assert_eq!(
        recompute_loss(at(0), at(200), &resumed),
        Loss::Known(200_000)
    );
    let odd = Progress {
        start_step: 0,
        step: Some((10, at(10))),
        checkpoint: Some((0, at(0))),
    };
    assert_eq!(recompute_loss(at(0), at(5), &odd), Loss::Known(5_000));
}

#[test]
fn a_hang_loses_the_steps_past_the_checkpoint_and_the_time_stuck() {
    let config = OperatorConfig::default();
    let mut l = GoodputLedger::default();
    running(&mut l, at(60), placed(2, 0, T4), &config);
    // Step 500 at 560 s (1 s a step), checkpoint 400 at 460 s, stuck until the decision at
    // 1160 s (progressTimeoutSeconds 600): the hang is decided when it is seen.
    let progress = Progress {
        start_step: 0,
        step: Some((500, at(560))),
        checkpoint: Some((400, at(460))),
    };
    let loss = recompute_loss(at(60), at(1160), &progress);
    assert_eq!(loss, Loss::Known(100_000 + 600_000));
    let hang = Ending::Restart(RestartReason::Hang);
    end(&mut l, hang, at(1160), at(1160), loss, &config);
    assert_eq!(l.spot.hangs, 700_000 * 2);
    assert_eq!(l.spot.useful, 400_000 * 2);
    assert_eq!(l.spot.lost_to_detection, 0);
    assert_eq!(all(&l), 1_100_000 * 2);
}

#[test]
fn a_failure_counts_its_lost_work_as_failed_attempts_and_a_final_failure_closes_the_ledger() {
    let config = OperatorConfig::default();
    let mut l = GoodputLedger::default();
    running(&mut l, at(0), placed(0, 1, T4), &config);
    let failure = Ending::Restart(RestartReason::Failure);
    end(
        &mut l,
        failure,
        at(100),
        at(103),
        Loss::Known(40_000),
        &config,
    );
    // 30 s of backoff and start-up, then attempt 1 fails for good after 50 s, nothing saved.
    running(&mut l, at(133), placed(0, 1, T4), &config);
    end(
        &mut l,
        Ending::Failed,
        at(183),
        at(184),
        Loss::Known(50_000),
        &config,
    );
    let expected = GpuMillis {
        useful: 60_000,
        failed_attempts: 40_000 + 50_000,
        lost_to_detection: 3_000 + 1_000,
        lost_to_restart: 30_000,
        ..GpuMillis::default()
    };
    assert_eq!(l.on_demand, expected);
    assert_eq!(all(&l), 184_000);
    assert_eq!(l.open, None);
    // On demand, useful work costs what its on-demand equivalent does: the losses are the
    // difference. 184,000 GPU-ms at 360,000 µ$/h, by stretch: 10,300 + 3,000 + 5,100.
    assert_eq!(l.micro_dollars.spent, 18_400);
    assert_eq!(l.micro_dollars.on_demand_equivalent, 6_000);
    assert_eq!(l.micro_dollars.saved, -12_400);
}

#[test]
fn suspend_and_resume_count_the_lost_work_then_wait_as_pending_again() {
    let config = OperatorConfig::default();
    let mut l = GoodputLedger::default();
    pending(&mut l, at(0), placed(2, 0, T4));
    running(&mut l, at(10), placed(2, 0, T4), &config);
    let loss = recompute_loss(
        at(10),
        at(310),
        &Progress {
            checkpoint: Some((5, at(250))),
            ..Progress::default()
        },
    );
    end(&mut l, Ending::Suspended, at(310), at(310), loss, &config);
    assert_eq!(l.open, None, "nothing runs while suspended");
    // Resumed at 1000 s: the new attempt's pods wait 20 s, run 100 s and succeed.
    pending(&mut l, at(1000), placed(2, 0, T4));
    running(&mut l, at(1020), placed(2, 0, T4), &config);
    end(
        &mut l,
        Ending::Succeeded,
        at(1120),
        at(1120),
        Loss::Known(0),
        &config,
    );
    let expected = GpuMillis {
        pending: (10_000 + 20_000) * 2,
        useful: (240_000 + 100_000) * 2,
        lost_to_recompute: 60_000 * 2,
        ..GpuMillis::default()
    };
    assert_eq!(l.spot, expected);
    // 430 s of wall time with pods: the 690 s suspended count nowhere.
    assert_eq!(all(&l), 430_000 * 2);
}

#[test]
fn a_leader_change_mid_attempt_continues_from_the_status_alone() {
    let config = OperatorConfig::default();
    let mut before = GoodputLedger::default();
    pending(&mut before, at(0), placed(8, 0, T4));
    running(&mut before, at(60), placed(8, 0, T4), &config);
    // The new leader reads the status back and has no reports in memory, only the status's
    // checkpoint: the loss runs from it.
    let text = serde_json::to_string(&before).expect("serialize");
    let mut after: GoodputLedger = serde_json::from_str(&text).expect("parse");
    assert_eq!(after, before);
    let loss = recompute_loss(
        after.open.as_ref().expect("open").since.0,
        at(1070),
        &Progress {
            checkpoint: Some((900, at(960))),
            ..Progress::default()
        },
    );
    assert_eq!(loss, Loss::Known(110_000));
    let preemption = Ending::Restart(RestartReason::Preemption);
    end(&mut after, preemption, at(1070), at(1075), loss, &config);
    assert_eq!(after.spot.useful, 900_000 * 8);
    assert_eq!(after.spot.lost_to_recompute, 110_000 * 8);
    assert_eq!(after.spot.pending, 60_000 * 8);
    assert_eq!(all(&after), 1_075_000 * 8);
}

#[test]
fn spot_that_loses_most_of_its_work_costs_more_than_on_demand() {
    let config = OperatorConfig::default();
    let mut l = GoodputLedger::default();
    // Four attempts of 1000 s on spot, each losing 900 s; then 1000 s that succeed.
    for attempt in 0..4 {
        running(&mut l, at(attempt * 1000), placed(1, 0, T4), &config);
        let preemption = Ending::Restart(RestartReason::Preemption);
        let t = at(attempt * 1000 + 1000);
        end(&mut l, preemption, t, t, Loss::Known(900_000), &config);
    }
    running(&mut l, at(4000), placed(1, 0, T4), &config);
    end(
        &mut l,
        Ending::Succeeded,
        at(5000),
        at(5000),
        Loss::Known(0),
        &config,
    );
    // Spent: 5,000,000 GPU-ms at 120,000 µ$/h = 166,665 (five stretches, each rounded down);
    // useful: 1,400,000 GPU-ms at 360,000 µ$/h = 140,000.
    assert_eq!(l.micro_dollars.spent, 166_665);
    assert_eq!(l.micro_dollars.on_demand_equivalent, 140_000);
    assert_eq!(l.micro_dollars.saved, -26_665);
    assert_eq!(l.goodput, "28.0%");
}

#[test]
fn gpus_on_both_capacity_types_and_unpriced_products_are_counted_apart() {
    let config = OperatorConfig::default();
    let mut l = GoodputLedger::default();
    running(&mut l, at(0), placed(2, 6, T4), &config);
    end(
        &mut l,
        Ending::Succeeded,
        at(3600),
        at(3600),
        Loss::Known(0),
        &config,
    );
    assert_eq!(l.spot.useful, 3_600_000 * 2);
    assert_eq!(l.on_demand.useful, 3_600_000 * 6);
    // 2 spot GPU-hours at $0.12 and 6 on demand at $0.36.
    assert_eq!(l.micro_dollars.spent, 240_000 + 2_160_000);
    let mut unknown = GoodputLedger::default();
    running(&mut unknown, at(0), placed(1, 0, "Mystery-GPU"), &config);
    end(
        &mut unknown,
        Ending::Succeeded,
        at(60),
        at(60),
        Loss::Known(0),
        &config,
    );
    assert_eq!(unknown.unpriced_gpu_millis, 60_000);
    assert_eq!(unknown.micro_dollars.spent, 0);
    assert_eq!(unknown.cost, "$0.00");
}

#[test]
fn counts_stop_at_the_schemas_bound_instead_of_overflowing() {
    let config = OperatorConfig::default();
    let mut l = GoodputLedger::default();
    l.spot.useful = MAX_LEDGER - 1;
    l.micro_dollars.spent = MAX_LEDGER - 1;
    running(&mut l, at(0), placed(u32::MAX, 0, T4), &config);
    end(
        &mut l,
        Ending::Succeeded,
        at(i64::from(i32::MAX)),
        at(i64::from(i32::MAX)),
        Loss::Known(0),
        &config,
    );
    assert_eq!(l.spot.useful, MAX_LEDGER);
    assert_eq!(l.micro_dollars.spent, MAX_LEDGER);
    let saved = l.micro_dollars.saved.unsigned_abs();
    assert!(saved <= MAX_LEDGER, "{saved}");
}

/// A pseudo-random history: stretches of random length and GPUs, ended in every way.
#[test]
fn the_buckets_always_sum_to_the_wall_time_times_the_gpus_of_every_stretch() {
    let config = OperatorConfig::default();
    let mut seed: u64 = 0x5eed;
    let mut next = |n: u64| {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        (seed >> 33) % n
    };
    for _ in 0..200 {
        let (mut l, mut t, mut expected) = (GoodputLedger::default(), 0i64, 0u64);
        let (spot, on_demand) = (next(5) as u32, 1 + next(4) as u32);
        let gpus = u64::from(spot + on_demand);
        pending(&mut l, at(t), placed(spot, on_demand, T4));
        for attempt in 0..1 + next(5) {
            let wait = 1 + next(100) as i64;
            expected += wait as u64 * 1000 * gpus;
            t += wait;
            running(&mut l, at(t), placed(spot, on_demand, T4), &config);
            let ran = 1 + next(1000) as i64;
            let detected = next(30) as i64;
            expected += (ran + detected) as u64 * 1000 * gpus;
            let ending = match next(5) {
                0 => Ending::Restart(RestartReason::Failure),
                1 => Ending::Restart(RestartReason::Hang),
                2 if attempt > 2 => Ending::Succeeded,
                _ => Ending::Restart(RestartReason::Preemption),
            };
            let loss = match next(3) {
                0 => Loss::Unknown,
                _ => Loss::Known(next(2_000_000)),
            };
            end(
                &mut l,
                ending,
                at(t + ran),
                at(t + ran + detected),
                loss,
                &config,
            );
            t += ran + detected;
            if ending == Ending::Succeeded {
                break;
            }
        }
        if l.open.is_some() {
            end(
                &mut l,
                Ending::Failed,
                at(t + 7),
                at(t + 7),
                Loss::Unknown,
                &config,
            );
            expected += 7_000 * gpus;
        }
        assert_eq!(all(&l), expected, "{l:?}");
    }
}

/// Found by the DDP spot-loss e2e check against the pods' timestamps: a spot `Prefer` job
/// planned on spot whose rank 1 landed on an on-demand node counted the whole wait on spot.
#[test]
fn the_first_wait_counts_on_the_nodes_the_pods_landed_on_and_a_restart_on_the_lost_attempts() {
    let config = OperatorConfig::default();
    let mut l = GoodputLedger::default();
    pending(&mut l, at(0), placed(4, 0, T4));
    running(&mut l, at(8), placed(2, 2, T4), &config);
    assert_eq!((l.spot.pending, l.on_demand.pending), (16_000, 16_000));
    let preemption = Ending::Restart(RestartReason::Preemption);
    end(&mut l, preemption, at(20), at(20), Loss::Known(0), &config);
    // Attempt 1 runs on on-demand nodes only: the wait for it was lost by attempt 0's GPUs.
    running(&mut l, at(30), placed(0, 4, T4), &config);
    assert_eq!(
        (l.spot.lost_to_restart, l.on_demand.lost_to_restart),
        (20_000, 20_000)
    );
}

/// An elastic job that ran at more gang sizes than `byWorkers` may list (its schema's bound):
/// the list stays at [`MAX_LEDGER_SIZES`] and a new size is counted under the nearest listed
/// one, so the status is never refused for its length.
#[test]
fn by_workers_lists_at_most_its_bound_and_counts_a_new_size_under_the_nearest() {
    let config = OperatorConfig::default();
    let mut ledger = GoodputLedger::default();
    let of = 1000;
    let sized = |workers: u32| LedgerStretch {
        size: Some(crate::model::crd::GangSize { workers, of }),
        ..placed(1, 0, T4)
    };
    for workers in 1..=70 {
        let stretch = sized(workers * 10);
        count_size(&mut ledger, &stretch, 1_000, &config);
    }
    let sizes = &ledger.elastic.as_ref().expect("elastic").by_workers;
    assert_eq!(sizes.len(), MAX_LEDGER_SIZES);
    assert_eq!(sizes.iter().map(|s| s.wall_millis).sum::<u64>(), 70_000);
    // Sizes 650 to 700 came after the list was full: each went to the largest listed (640).
    let last = sizes.last().expect("entry");
    assert_eq!((last.workers, last.wall_millis), (640, 7_000));
    // A size between two listed ones goes to the nearer.
    count_size(&mut ledger, &sized(104), 1_000, &config);
    let sizes = &ledger.elastic.as_ref().expect("elastic").by_workers;
    let at = |w: u32| {
        sizes
            .iter()
            .find(|s| s.workers == w)
            .expect("size")
            .wall_millis
    };
    assert_eq!((at(100), at(110)), (2_000, 1_000));
}
