//! What the trainers report: progress, steps lost, and the checkpoint to resume from.

use super::*;

/// Found by the chaos run (seed 6): six seconds after the leader was killed, the new leader's
/// first report of the attempt named an older checkpoint (262) than the status held (280).
#[test]
fn the_recorded_checkpoint_never_goes_back_within_an_attempt() {
    let mut w = World::running_world("workers: 2\n");
    let mut p = reports(0, &[(0, 285), (1, 285)], w.now);
    p.checkpoint = Some((280, w.now));
    w.progress = Some(p);
    w.step();
    let mut p = reports(0, &[(0, 286), (1, 286)], w.now);
    p.checkpoint = Some((262, w.now));
    w.progress = Some(p);
    let st = w.step().status.progress.expect("progress");
    assert_eq!((st.step, st.checkpoint_step), (286, Some(280)));
    // A newer one moves it on.
    let mut p = reports(0, &[(0, 291), (1, 291)], w.now);
    p.checkpoint = Some((290, w.now));
    w.progress = Some(p);
    let st = w.step().status.progress.expect("progress");
    assert_eq!(st.checkpoint_step, Some(290));
}

#[test]
fn a_job_whose_trainers_never_report_is_decided_as_without_the_channel() {
    let mut w = World::running_world("workers: 2\nrestartPolicy: {progressTimeoutSeconds: 30}\n");
    w.advance(3600);
    let plan = w.step();
    assert_eq!(plan.decided_by, PhaseName::Running);
    assert_eq!(plan.status.progress, None);
    assert_eq!((plan.restart, plan.checkpoint_request), (None, None));
    assert!(plan.actions.is_empty());
}

#[test]
fn reported_progress_is_recorded_with_the_steps_the_preemption_before_it_lost() {
    let mut w = World::running_world("workers: 2\n");
    let mut p = reports(0, &[(0, 40), (1, 39)], w.now);
    p.checkpoint = Some((30, w.now));
    w.progress = Some(p);
    let plan = w.step();
    let st = plan.status.progress.clone().expect("progress");
    assert_eq!((st.attempt, st.step, st.checkpoint_step), (0, 40, Some(30)));
    assert_eq!(plan.steps_lost, None);
    assert!(plan.requeue_at.is_some(), "status.progress is refreshed");

    // Preempted; the next attempt resumes from the checkpoint at 30: 10 steps lost.
    w.preempt("train-worker-1");
    w.step();
    w.kubelet_removes_deleted();
    w.step();
    w.run_all();
    let mut p = reports(1, &[(0, 31), (1, 31)], w.now);
    p.resumed_from = Some(30);
    p.previous_attempt_step = Some(40);
    w.progress = Some(p);
    let plan = w.step();
    let st = plan.status.progress.clone().expect("progress");
    assert_eq!(
        (st.attempt, st.resumed_from, st.steps_lost),
        (1, Some(30), Some(10))
    );
    assert_eq!(
        plan.steps_lost,
        Some(10),
        "observed once, for the histogram"
    );
    let again = w.step();
    assert_eq!(again.steps_lost, None);
    assert_eq!(again.status.progress, plan.status.progress);
}

/// A step-addressed checkpoint the trainers reported is what the next attempt resumes from,
/// whatever a stale writer does to `latest.pt`; a later attempt's checkpoint moves the point
/// on, and a report without a file leaves it where it is.
#[test]
fn the_next_attempt_resumes_from_the_newest_reported_checkpoint_file() {
    let mut w = World::running_world("workers: 2\n");
    let saved = |w: &mut World, step: u64, file: Option<&str>| {
        let mut p = reports(w.status.attempt, &[(0, step), (1, step)], w.now);
        p.checkpoint = Some((step, w.now));
        p.checkpoint_file = file.map(str::to_owned);
        w.progress = Some(p);
        w.step()
    };
    let plan = saved(&mut w, 120, Some("step-000000120-a0.pt"));
    let point = plan.status.resume_point.clone().expect("resume point");
    assert_eq!((point.attempt, point.step), (0, 120));
    assert_eq!(
        plan.status
            .progress
            .and_then(|p| p.checkpoint_file)
            .as_deref(),
        Some("step-000000120-a0.pt")
    );
    w.preempt("train-worker-1");
    assert_eq!(w.step().restart, Some(RestartReason::Preemption));
    w.kubelet_removes_deleted();
    let created = created_pods(&w.step());
    assert_eq!(created.len(), 2);
    for pod in &created {
        assert_eq!(
            env(pod, "RESUME_FROM").as_deref(),
            Some("/mnt/checkpoints/step-000000120-a0.pt")
        );
    }
    // Attempt 1 reports the step it resumed from (no file): the point stays.
    let plan = saved(&mut w, 120, None);
    assert_eq!(plan.status.resume_point.map(|p| p.attempt), Some(0));
    // Its own checkpoint moves it on.
    let plan = saved(&mut w, 130, Some("step-000000130-a1.pt"));
    let point = plan.status.resume_point.expect("resume point");
    assert_eq!(
        (point.attempt, point.step, point.file.as_str()),
        (1, 130, "step-000000130-a1.pt")
    );
}

/// A trainer that saves on SIGTERM reports that checkpoint after the restart was decided: the
/// next attempt still resumes from it, since its pods are created after the old ones are gone.
#[test]
fn a_checkpoint_saved_on_sigterm_after_the_restart_decision_is_where_the_next_attempt_resumes() {
    let mut w = World::running_world("workers: 2\n");
    let mut p = reports(0, &[(0, 40), (1, 40)], w.now);
    p.checkpoint = Some((30, w.now));
    p.checkpoint_file = Some("ckpt-30.pt".to_owned());
    w.progress = Some(p);
    w.step();
    w.preempt("train-worker-1");
    assert_eq!(w.step().restart, Some(RestartReason::Preemption));
    // Rank 0 saved step 43 on SIGTERM and reported it from its terminating pod.
    let mut p = reports(0, &[(0, 43), (1, 40)], w.now);
    p.checkpoint = Some((43, w.now));
    p.checkpoint_file = Some("ckpt-43.pt".to_owned());
    w.progress = Some(p);
    w.kubelet_removes_deleted();
    let plan = w.step();
    let created = created_pods(&plan);
    assert_eq!(created.len(), 2, "{:?}", plan.decided_by);
    for pod in &created {
        assert_eq!(
            env(pod, "RESUME_FROM").as_deref(),
            Some("/mnt/checkpoints/ckpt-43.pt")
        );
    }
    assert_eq!(
        plan.status.resume_point.map(|r| (r.attempt, r.step)),
        Some((0, 43))
    );
}
