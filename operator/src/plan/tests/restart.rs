//! Gang restarts after a preemption or failure, and the budgets that end them.

use super::*;

#[test]
fn a_gang_restart_is_one_event_that_names_the_next_attempt() {
    let mut w = World::running_world("workers: 2\ngpusPerWorker: 1\n");
    w.preempt("train-worker-1");
    let mut events = Vec::new();
    let restart = w.step();
    events.extend(restart.events.clone());
    let waiting = w.step();
    events.extend(waiting.events.clone());
    w.kubelet_removes_deleted();
    let creating = w.step();
    assert_eq!(World::creates(&creating).len(), 2, "attempt 1 is created");
    assert_eq!(creating.creates_attempt, Some(1));
    events.extend(creating.events.clone());
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].reason, "Preempted");
    assert!(
        events[0].note.contains("gang restart as attempt 1"),
        "{events:?}"
    );
}

#[test]
fn preemption_restarts_the_whole_gang_with_resume_from() {
    let mut w = World::running_world("workers: 2\ngpusPerWorker: 1\n");
    w.preempt("train-worker-1");
    let plan = w.step();
    assert_eq!(plan.restart, Some(RestartReason::Preemption));
    assert_eq!(
        (
            plan.status.attempt,
            plan.status.preemptions,
            plan.status.failures
        ),
        (1, 1, 0)
    );
    assert_eq!(plan.status.phase, Some(Phase::Restarting));
    let last = plan.status.last_restart.clone().expect("lastRestart");
    assert_eq!(
        last.detail,
        "worker 1: DisruptionTarget/TerminationByKubelet on node n-1"
    );
    assert_eq!(
        World::deletes(&plan),
        2,
        "both ranks are stopped gracefully"
    );
    assert!(
        World::creates(&plan).is_empty(),
        "no new pod before the old ones are gone"
    );

    // The old pods are terminating: wait.
    let waiting = w.step();
    assert_eq!(waiting.decided_by, PhaseName::DrainOldAttempt);
    assert!(World::creates(&waiting).is_empty());
    assert_eq!(waiting.status.preemptions, 1);

    w.kubelet_removes_deleted();
    let plan = w.step();
    let created = World::creates(&plan);
    assert_eq!(created.len(), 2);
    assert_eq!(
        env(created[0], RESUME_FROM).as_deref(),
        Some("/mnt/checkpoints/latest.pt")
    );
    assert_eq!(env(created[0], TRAINYARD_ATTEMPT).as_deref(), Some("1"));
    assert_eq!(
        env(created[0], TRAINYARD_RESTART_REASON).as_deref(),
        Some("Preemption")
    );
    assert_eq!(
        created[0].metadata.labels.as_ref().expect("labels")[LABEL_ATTEMPT],
        "1"
    );
    assert_eq!(plan.creates_attempt, Some(1));

    w.run_all();
    let plan = w.step();
    assert_eq!(plan.status.phase, Some(Phase::Running));
    assert!(!condition_is_true(
        &plan.status.conditions,
        condition::RESTARTING
    ));
    assert_eq!(
        w.decided,
        [
            PhaseName::Running,
            PhaseName::Running,
            PhaseName::GangRestart,
            PhaseName::DrainOldAttempt,
            PhaseName::Running,
            PhaseName::Running,
        ]
    );
}

#[test]
fn replaying_a_restart_decision_never_counts_twice() {
    let mut w = World::running_world("workers: 2\n");
    w.preempt("train-worker-0");
    let first = w.decide();
    // The controller crashed after writing the status but before deleting anything.
    w.status = first.status.clone();
    for _ in 0..3 {
        let replay = w.decide();
        assert_eq!(replay.status.preemptions, 1);
        assert_eq!(replay.status.attempt, 1);
        assert_eq!(replay.restart, None);
        assert_eq!(
            World::deletes(&replay),
            2,
            "the deletes are repeated instead"
        );
        assert!(World::creates(&replay).is_empty());
    }
    assert_eq!(w.decided, [PhaseName::Running, PhaseName::Running]);
}

#[test]
fn a_recorded_worker_that_disappears_was_preempted() {
    let mut w = World::running_world("workers: 2\n");
    w.pods
        .retain(|p| p.metadata.name.as_deref() != Some("train-worker-1"));
    let plan = w.step();
    assert_eq!(plan.restart, Some(RestartReason::Preemption));
    assert!(
        plan.status
            .last_restart
            .expect("last")
            .detail
            .contains("disappeared")
    );
    assert_eq!(
        w.decided,
        [
            PhaseName::Running,
            PhaseName::Running,
            PhaseName::GangRestart
        ]
    );
}

#[test]
fn failure_backs_off_then_restarts_against_the_failure_budget() {
    let mut w =
        World::running_world("workers: 2\nrestartPolicy: {backoffSeconds: 10, maxFailures: 3}\n");
    w.exit("train-worker-0", 1);
    let plan = w.step();
    assert_eq!(plan.restart, Some(RestartReason::Failure));
    assert_eq!(
        (
            plan.status.failures,
            plan.status.preemptions,
            plan.status.attempt
        ),
        (1, 0, 1)
    );
    w.kubelet_removes_deleted();
    w.pods.clear();
    w.advance(5);
    let waiting = w.step();
    assert_eq!(waiting.decided_by, PhaseName::Backoff);
    assert!(World::creates(&waiting).is_empty(), "still in backoff");
    assert_eq!(waiting.requeue_at, Some(ts("2026-01-01T00:00:10Z")));
    w.advance(5);
    let plan = w.step();
    assert_eq!(World::creates(&plan).len(), 2);
    assert_eq!(
        env(World::creates(&plan)[0], TRAINYARD_RESTART_REASON).as_deref(),
        Some("Failure")
    );
}

#[test]
fn a_recorded_rank_beyond_the_spec_is_ignored() {
    let mut w = World::running_world("workers: 2\n");
    for (rank, phase) in [
        (u32::MAX, "Succeeded"),
        (u32::MAX - 1, "Running"),
        (2, "Succeeded"),
    ] {
        w.status.workers.push(WorkerStatus {
            rank,
            pod: format!("train-worker-{rank}"),
            node: Some("n-1".into()),
            phase: phase.into(),
            reason: None,
        });
    }
    let plan = w.step();
    assert_eq!(
        plan.restart, None,
        "a rank the spec does not have cannot vanish"
    );
    assert_eq!(
        plan.status
            .workers
            .iter()
            .map(|w| w.rank)
            .collect::<Vec<_>>(),
        [0, 1]
    );
    assert_eq!(plan.status.phase, Some(Phase::Running));
    assert_eq!(
        w.decided,
        [PhaseName::Running, PhaseName::Running, PhaseName::Running]
    );
}

#[test]
fn counters_at_their_limit_neither_wrap_nor_panic() {
    let mut w = World::running_world("workers: 1\nrestartPolicy: {maxFailures: 3}\n");
    w.status.failures = u32::MAX;
    w.exit("train-worker-0", 1);
    let plan = w.step();
    assert_eq!(plan.status.failures, u32::MAX);
    assert_eq!(plan.status.phase, Some(Phase::Failed));
    assert_eq!(plan.decided_by, PhaseName::GangRestart);

    // The last attempt a uint32 can number: the next restart fails the job instead of
    // wrapping to attempt 0 (whose pods would look current again).
    let mut w = World::new("workers: 1\n");
    w.status.attempt = u32::MAX;
    w.status.preemptions = u32::MAX - 1;
    w.job.spec.restart_policy.max_preemptions = u32::MAX;
    w.step();
    w.run_all();
    assert_eq!(w.step().status.phase, Some(Phase::Running));
    w.preempt("train-worker-0");
    let plan = w.step();
    assert_eq!(plan.status.attempt, u32::MAX);
    assert_eq!(plan.status.preemptions, u32::MAX);
    assert_eq!(plan.status.phase, Some(Phase::Failed));
    let failed = plan
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == condition::FAILED)
        .expect("Failed");
    assert_eq!(failed.reason, "AttemptLimitReached");
    assert_eq!(World::deletes(&plan), 1, "the worker is stopped");
    assert_eq!(plan.restart, None);
    assert_eq!(plan.decided_by, PhaseName::GangRestart);
}

#[test]
fn backoff_doubles_from_the_base_and_caps_at_ten_minutes() {
    let secs: Vec<_> = (1..=8).map(|f| failure_backoff(10, f).as_secs()).collect();
    assert_eq!(secs, [10, 20, 40, 80, 160, 320, 600, 600]);
    assert_eq!(failure_backoff(0, 5), SignedDuration::ZERO);
    assert_eq!(failure_backoff(10, 100).as_secs(), 600);
}

#[test]
fn failures_past_the_budget_fail_the_job_and_stop_the_rest() {
    let mut w = World::running_world("workers: 2\nrestartPolicy: {maxFailures: 0}\n");
    w.exit("train-worker-0", 137);
    let plan = w.step();
    assert_eq!(plan.status.phase, Some(Phase::Failed));
    assert_eq!(plan.status.failures, 1);
    assert!(plan.status.completion_time.is_some());
    let failed = plan
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == condition::FAILED)
        .expect("Failed");
    assert_eq!(failed.reason, "FailureBudgetExceeded");
    assert_eq!(
        World::deletes(&plan),
        1,
        "the still-running worker is stopped"
    );
    assert_eq!(plan.restart, None);
    let again = w.step();
    assert_eq!(again.status.phase, Some(Phase::Failed));
    assert_eq!(again.status.failures, 1);
    assert_eq!(
        w.decided,
        [
            PhaseName::Running,
            PhaseName::Running,
            PhaseName::GangRestart,
            PhaseName::Terminal,
        ]
    );
}

#[test]
fn preemptions_past_the_budget_fail_the_job() {
    let mut w = World::running_world("workers: 1\nrestartPolicy: {maxPreemptions: 0}\n");
    w.preempt("train-worker-0");
    let plan = w.step();
    assert_eq!(plan.status.phase, Some(Phase::Failed));
    let failed = plan
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == condition::FAILED)
        .expect("Failed");
    assert_eq!(failed.reason, "PreemptionBudgetExceeded");
    assert_eq!(
        w.decided,
        [
            PhaseName::Running,
            PhaseName::Running,
            PhaseName::GangRestart
        ]
    );
}

#[test]
fn a_preemption_with_collateral_failures_counts_only_as_a_preemption() {
    let mut w = World::running_world("workers: 3\nrestartPolicy: {maxFailures: 0}\n");
    w.preempt("train-worker-2");
    w.exit("train-worker-0", 1);
    let plan = w.step();
    assert_eq!(plan.restart, Some(RestartReason::Preemption));
    assert_eq!((plan.status.preemptions, plan.status.failures), (1, 0));
    assert!(
        plan.status
            .last_restart
            .expect("last")
            .detail
            .starts_with("worker 2:")
    );
    assert_eq!(
        w.decided,
        [
            PhaseName::Running,
            PhaseName::Running,
            PhaseName::GangRestart
        ]
    );
}
