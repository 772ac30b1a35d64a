//! Hangs: progress that stops advancing, told apart from a silent channel.

use super::*;

#[test]
fn a_gang_whose_progress_stops_advancing_is_restarted_as_a_hang_naming_the_first_ranks() {
    let mut w = World::running_world(
        "workers: 2\nrestartPolicy: {progressTimeoutSeconds: 60, maxHangs: 1}\n",
    );
    let t0 = w.now;
    let mut p = reports(0, &[(0, 20), (1, 19)], t0);
    p.ranks[0].advanced_at = t0.saturating_add(SignedDuration::from_secs(5)).expect("t");
    w.progress = Some(p);
    let plan = w.step();
    assert_eq!(plan.decided_by, PhaseName::Running);
    let due = t0.saturating_add(SignedDuration::from_secs(65)).expect("t");
    assert!(
        plan.requeue_at.is_some_and(|at| at <= due),
        "looked at again by the time the timeout runs out: {:?}",
        plan.requeue_at
    );
    // The trainers keep reporting the same steps.
    w.advance(64);
    still_reporting(&mut w);
    assert_eq!(w.step().restart, None, "not yet");
    w.advance(1);
    still_reporting(&mut w);
    let plan = w.step();
    assert_eq!(plan.decided_by, PhaseName::Hang);
    assert_eq!(plan.restart, Some(RestartReason::Hang));
    assert_eq!(
        (
            plan.status.hangs,
            plan.status.preemptions,
            plan.status.failures
        ),
        (1, 0, 0)
    );
    let hang = plan
        .events
        .iter()
        .find(|e| e.reason == "Hang")
        .expect("a Hang Event");
    assert!(
        hang.note.contains("ranks that stopped advancing first")
            && hang.note.contains("1 (step 19)"),
        "{}",
        hang.note
    );
    assert!(!hang.note.contains("0 (step 20)"), "{}", hang.note);
    assert_eq!(World::deletes(&plan), 2, "the whole gang restarts");

    // The next hang exceeds maxHangs=1.
    w.kubelet_removes_deleted();
    w.step();
    w.run_all();
    w.step();
    w.progress = Some(reports(1, &[(0, 21), (1, 21)], w.now));
    w.step();
    w.advance(61);
    still_reporting(&mut w);
    let plan = w.step();
    assert_eq!(plan.status.phase, Some(Phase::Failed));
    assert_eq!(plan.status.hangs, 2);
    assert!(
        plan.status
            .conditions
            .iter()
            .any(|c| c.type_ == condition::FAILED && c.reason == "HangBudgetExceeded")
    );
}

#[test]
fn a_hang_is_only_judged_while_every_worker_runs() {
    let mut w = World::running_world("workers: 2\nrestartPolicy: {progressTimeoutSeconds: 30}\n");
    w.progress = Some(reports(0, &[(0, 5), (1, 5)], w.now));
    w.exit("train-worker-0", 0);
    w.advance(100);
    let plan = w.step();
    assert_ne!(plan.restart, Some(RestartReason::Hang));
    assert_eq!(plan.status.hangs, 0);
}

#[test]
fn reports_that_stop_coming_are_a_channel_fault_not_a_hang() {
    let mut w = World::running_world(
        "workers: 2\nrestartPolicy: {progressTimeoutSeconds: 60, maxHangs: 1}\n",
    );
    // One report from each rank, then the token reviewer answers Unavailable: no report
    // reaches the store any more, for far longer than the timeout.
    w.progress = Some(reports(0, &[(0, 20), (1, 20)], w.now));
    let mut events = w.step().events;
    for _ in 0..10 {
        w.advance(61);
        let plan = w.step();
        assert_eq!(plan.restart, None, "silence is no hang");
        events.extend(plan.events);
    }
    assert_eq!(w.status.hangs, 0);
    assert_eq!(w.status.phase, Some(Phase::Running));
    let channel = condition_of(&w.status, condition::PROGRESS_CHANNEL).expect("condition");
    assert_eq!(
        (channel.status.as_str(), channel.reason.as_str()),
        ("False", "ReportsStopped")
    );
    let stopped: Vec<_> = events
        .iter()
        .filter(|e| e.reason == "ProgressReportsStopped")
        .collect();
    assert_eq!(stopped.len(), 1, "one Event: {events:?}");

    // Reports arrive again, the trainers further on: the channel is back, and a step that
    // then stops advancing for the timeout while they arrive is a hang.
    w.progress = Some(reports(0, &[(0, 90), (1, 90)], w.now));
    let plan = w.step();
    let channel = condition_of(&plan.status, condition::PROGRESS_CHANNEL).expect("condition");
    assert_eq!(
        (channel.status.as_str(), channel.reason.as_str()),
        ("True", "ReportsArriving")
    );
    assert_eq!(plan.restart, None);
    w.advance(60);
    still_reporting(&mut w);
    assert_eq!(w.step().restart, Some(RestartReason::Hang));
}

#[test]
fn an_operator_restart_that_empties_the_store_is_not_a_hang() {
    let mut w = World::running_world("workers: 2\nrestartPolicy: {progressTimeoutSeconds: 60}\n");
    w.progress = Some(reports(0, &[(0, 20), (1, 20)], w.now));
    w.step();
    assert!(w.status.progress.is_some());
    // A new leader starts with an empty store; the trainers' reports do not reach it yet.
    w.progress = None;
    w.advance(600);
    let plan = w.step();
    assert_eq!((plan.restart, plan.status.hangs), (None, 0));
    // Their first reports to it start the clock again: no hang until the timeout passes.
    w.progress = Some(reports(0, &[(0, 20), (1, 20)], w.now));
    w.advance(1);
    still_reporting(&mut w);
    assert_eq!(w.step().restart, None);
}

#[test]
fn a_requested_save_longer_than_the_progress_timeout_is_not_a_hang() {
    let mut w = World::running_world("workers: 2\nrestartPolicy: {progressTimeoutSeconds: 60}\n")
        .with_worker_1_on_n2();
    w.progress = Some(reports(0, &[(0, 42), (1, 42)], w.now));
    w.step();
    notice_on_n2(&mut w, true);
    assert_eq!(w.step().checkpoint_request, Some(0));
    w.progress.as_mut().expect("progress").checkpoint_requested = Some(42);
    // The trainers save for 90 s: the step stays at 42 while their reports keep coming.
    for _ in 0..9 {
        w.advance(10);
        still_reporting(&mut w);
        let plan = w.step();
        assert_eq!(plan.restart, None, "a save asked for is no hang");
    }
    let p = w.progress.as_mut().expect("progress");
    p.checkpoint_requested = None;
    p.checkpoint = Some((42, w.now));
    p.checkpoint_saved_on_request = Some(42);
    let plan = w.step();
    assert_eq!(plan.restart, Some(RestartReason::Preemption));
    assert_eq!((plan.status.hangs, plan.status.preemptions), (0, 1));
}
