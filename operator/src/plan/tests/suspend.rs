//! `spec.suspend`: deleting the workers, and resuming as a new attempt.

use super::*;

#[test]
fn resuming_at_the_last_attempt_number_fails_instead_of_wrapping() {
    let mut w = World::running_world("workers: 1\n");
    w.job.spec.suspend = true;
    w.step();
    w.kubelet_removes_deleted();
    w.status.attempt = u32::MAX;
    w.job.spec.suspend = false;
    let plan = w.step();
    assert_eq!(plan.status.attempt, u32::MAX);
    assert_eq!(plan.status.phase, Some(Phase::Failed));
    assert!(World::creates(&plan).is_empty());
    assert!(
        plan.status
            .conditions
            .iter()
            .any(|c| c.type_ == condition::FAILED && c.reason == "AttemptLimitReached")
    );
    assert_eq!(
        w.decided,
        [
            PhaseName::Running,
            PhaseName::Running,
            PhaseName::Suspend,
            PhaseName::Resume,
        ]
    );
}

#[test]
fn suspend_deletes_the_workers_and_resume_recreates_them() {
    let mut w = World::running_world("workers: 2\n");
    w.job.spec.suspend = true;
    let plan = w.step();
    assert_eq!(plan.status.phase, Some(Phase::Suspended));
    assert_eq!(World::deletes(&plan), 2);
    assert!(plan.status.workers.is_empty());
    w.kubelet_removes_deleted();
    assert!(w.step().actions.is_empty());
    w.job.spec.suspend = false;
    let plan = w.step();
    assert!(plan.events.iter().any(|e| e.reason == "Resumed"));
    assert_eq!(World::creates(&plan).len(), 2);
    assert_eq!(plan.restart, Some(RestartReason::Resume));
    assert_eq!(plan.status.preemptions, 0);
    assert_eq!(
        w.decided,
        [
            PhaseName::Running,
            PhaseName::Running,
            PhaseName::Suspend,
            PhaseName::Suspend,
            PhaseName::Running,
        ]
    );
}

#[test]
fn a_job_suspended_in_its_first_attempt_resumes_from_the_checkpoint() {
    let mut w = World::running_world("workers: 2\n");
    w.job.spec.suspend = true;
    w.step();
    w.kubelet_removes_deleted();
    w.step();
    w.job.spec.suspend = false;
    let plan = w.step();
    let created = World::creates(&plan);
    assert_eq!(created.len(), 2);
    for pod in &created {
        assert_eq!(
            env(pod, RESUME_FROM).as_deref(),
            Some("/mnt/checkpoints/latest.pt"),
            "a resumed gang must not start over and overwrite latest.pt"
        );
        assert_eq!(env(pod, TRAINYARD_ATTEMPT).as_deref(), Some("1"));
        assert_eq!(
            env(pod, TRAINYARD_RESTART_REASON).as_deref(),
            Some("Resume")
        );
    }
    assert_eq!(plan.creates_attempt, Some(1));
    let st = &plan.status;
    assert_eq!(
        (st.attempt, st.preemptions, st.failures),
        (1, 0, 0),
        "a resume is a new attempt, never a preemption or a failure"
    );
    assert_eq!(
        st.last_restart.as_ref().map(|l| l.reason),
        Some(RestartReason::Resume)
    );
    assert_eq!(plan.restart, Some(RestartReason::Resume));
    assert_eq!(
        w.decided,
        [
            PhaseName::Running,
            PhaseName::Running,
            PhaseName::Suspend,
            PhaseName::Suspend,
            PhaseName::Running,
        ]
    );
}

#[test]
fn resuming_before_the_suspended_workers_are_gone_waits_for_them_and_counts_nothing() {
    let mut w = World::running_world("workers: 2\n");
    w.job.spec.suspend = true;
    w.step();
    // Resumed while the old pods still write their checkpoint in their grace period.
    w.job.spec.suspend = false;
    let plan = w.step();
    assert_eq!((plan.status.preemptions, plan.status.failures), (0, 0));
    assert_eq!(plan.status.attempt, 1);
    assert!(
        World::creates(&plan).is_empty(),
        "no new rank may meet an old one at rendezvous"
    );
    w.kubelet_removes_deleted();
    let plan = w.step();
    assert_eq!(World::creates(&plan).len(), 2);
    assert_eq!((plan.status.preemptions, plan.status.failures), (0, 0));
    assert_eq!(
        w.decided,
        [
            PhaseName::Running,
            PhaseName::Running,
            PhaseName::Suspend,
            PhaseName::DrainOldAttempt,
            PhaseName::Running,
        ]
    );
}

#[test]
fn a_job_created_suspended_starts_as_attempt_0_without_resume_from() {
    let mut w = World::new("workers: 2\nsuspend: true\n");
    let plan = w.step();
    assert_eq!(plan.status.phase, Some(Phase::Suspended));
    assert!(World::creates(&plan).is_empty());
    assert_eq!(plan.status.start_time, None);
    w.job.spec.suspend = false;
    let plan = w.step();
    let created = World::creates(&plan);
    assert_eq!(created.len(), 2);
    assert_eq!(env(created[0], RESUME_FROM), None, "nothing ran yet");
    assert_eq!(env(created[0], TRAINYARD_ATTEMPT).as_deref(), Some("0"));
    assert_eq!(plan.status.last_restart, None);
    assert_eq!(w.decided, [PhaseName::Suspend, PhaseName::Running]);
}

#[test]
fn time_spent_suspended_does_not_count_toward_the_deadline() {
    let mut w = World::running_world("workers: 1\nactiveDeadlineSeconds: 60\n");
    w.advance(30);
    w.job.spec.suspend = true;
    let plan = w.step();
    assert_eq!(plan.status.phase, Some(Phase::Suspended));
    assert_eq!(plan.requeue_at, None, "no deadline timer while suspended");
    w.kubelet_removes_deleted();
    w.advance(3600);
    let plan = w.step();
    assert_eq!(plan.status.phase, Some(Phase::Suspended));
    // Like a Kubernetes Job: resuming restarts the timer.
    w.job.spec.suspend = false;
    let plan = w.step();
    assert_eq!(plan.status.start_time, Some(Time(w.now)));
    assert_eq!(World::creates(&plan).len(), 1);
    let resumed_at = w.now;
    w.run_all();
    w.advance(59);
    let plan = w.step();
    assert_eq!(plan.status.phase, Some(Phase::Running));
    assert_eq!(
        plan.requeue_at,
        resumed_at
            .saturating_add(SignedDuration::from_secs(60))
            .ok()
    );
    w.advance(1);
    let plan = w.step();
    assert_eq!(plan.status.phase, Some(Phase::Failed));
    assert_eq!(
        w.decided,
        [
            PhaseName::Running,
            PhaseName::Running,
            PhaseName::Suspend,
            PhaseName::Suspend,
            PhaseName::Running,
            PhaseName::Running,
            PhaseName::Deadline,
        ]
    );
}
