//! The condition `InvalidSpec`: specs that cannot run, and objects that do not parse.

use super::*;

#[test]
fn missing_existing_claim_is_invalid_spec_without_pods_until_it_exists() {
    let mut w = World::new("checkpoint: {existingClaim: shared}\n");
    let plan = w.step();
    assert!(World::creates(&plan).is_empty());
    let c = plan
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == condition::INVALID_SPEC)
        .expect("InvalidSpec");
    assert_eq!(c.status, "True");
    assert!(
        c.message.contains("\"shared\" does not exist"),
        "{}",
        c.message
    );
    assert!(plan.events.iter().any(|e| e.reason == "InvalidSpec"));
    let again = w.step();
    assert!(
        again.events.is_empty(),
        "the InvalidSpec event is not repeated"
    );
    assert_eq!(again.status, plan.status);
    w.claim = Some(ObservedClaim {
        inherited: true,
        ..ObservedClaim::default()
    });
    let plan = w.step();
    assert_eq!(World::creates(&plan).len(), 1);
    assert!(!condition_is_true(
        &plan.status.conditions,
        condition::INVALID_SPEC
    ));
    assert_eq!(
        w.decided,
        [
            PhaseName::ClusterPrerequisites,
            PhaseName::ClusterPrerequisites,
            PhaseName::Running,
        ]
    );
}

#[test]
fn more_gpus_per_worker_than_the_crd_allows_stays_invalid_spec() {
    let err = validate(&job_yaml("gpusPerWorker: 65\n")).expect_err("invalid");
    assert_eq!(err.field, "spec.gpusPerWorker");
    let (status, events) = invalid_status(&TrainingJobStatus::default(), &err, Some(1), ts(T0));
    assert!(condition_is_true(
        &status.conditions,
        condition::INVALID_SPEC
    ));
    assert_eq!(events.len(), 1);
}

#[test]
fn a_job_edited_into_an_invalid_spec_keeps_its_pods_managed_and_says_why() {
    let mut w = World::new("workers: 2\n");
    w.step();
    w.run_all();
    w.step();
    // The user edits the spec into one that does not validate; the job runs on as last valid.
    let edit = InvalidSpec {
        field: "spec.template.spec.containers".to_owned(),
        message: "must not be empty".to_owned(),
    };
    w.job = w.job.clone().with_rejected_edit(edit, Some(2));
    let plan = w.step();
    assert_eq!(plan.decided_by, PhaseName::Running);
    assert_eq!(plan.status.phase, Some(Phase::Running), "the pods run on");
    assert!(plan.actions.is_empty(), "{:?}", plan.actions);
    let invalid = plan
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == condition::INVALID_SPEC)
        .expect("InvalidSpec");
    assert_eq!(invalid.status, "True");
    assert!(invalid.message.contains("must not be empty"), "{invalid:?}");
    assert_eq!(plan.status.observed_generation, Some(2));
    assert_eq!(
        plan.events
            .iter()
            .filter(|e| e.reason == "InvalidSpec")
            .count(),
        1
    );
    // A preemption meanwhile is still counted, and the gang restarts on the last valid spec.
    w.preempt("train-worker-1");
    let restart = w.step();
    assert_eq!(restart.decided_by, PhaseName::GangRestart);
    assert_eq!(
        (restart.status.preemptions, restart.status.failures),
        (1, 0)
    );
    assert!(condition_is_true(
        &restart.status.conditions,
        condition::INVALID_SPEC
    ));
    assert!(
        !restart.events.iter().any(|e| e.reason == "InvalidSpec"),
        "the InvalidSpec Event is not repeated"
    );
    // Fixed: the condition clears.
    w.job.rejected_edit = None;
    let fixed = w.step();
    assert!(!condition_is_true(
        &fixed.status.conditions,
        condition::INVALID_SPEC
    ));
}

#[test]
fn a_malformed_object_is_reported_through_the_invalid_spec_condition() {
    let (c, event) = malformed_report("spec.workers: invalid type: string", Some(4), ts(T0));
    assert_eq!(
        (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
        (condition::INVALID_SPEC, "True", "MalformedObject")
    );
    assert_eq!(c.observed_generation, Some(4));
    assert_eq!(c.last_transition_time, Some(Time(ts(T0))));
    assert!(c.message.ends_with("spec.workers: invalid type: string"));
    assert_eq!(
        (event.kind, event.reason.as_str(), event.note.as_str()),
        (EventKind::Warning, "InvalidSpec", c.message.as_str())
    );
}
