//! Objects of the job's names that are not its own (`NameConflict`).

use super::*;

fn foreign(kind: crate::model::ownership::ObjectKind, name: &str) -> Foreign {
    Foreign {
        kind,
        name: name.to_owned(),
        holder: "it has no owner reference".to_owned(),
    }
}

fn decide_with_foreign(w: &World, objects: Vec<Foreign>) -> Plan {
    let observed = Observed {
        foreign: objects,
        ..w.observed()
    };
    decide(&w.job, &observed, &w.status, &w.config)
}

fn name_conflict(plan: &Plan) -> Option<&JobCondition> {
    plan.status
        .conditions
        .iter()
        .find(|c| c.type_ == condition::NAME_CONFLICT)
}

#[test]
fn objects_of_the_jobs_names_that_are_not_its_own_block_new_workers_with_one_warning() {
    use crate::model::ownership::ObjectKind;
    let mut w = World::new("workers: 2\n");
    let objects = vec![
        foreign(ObjectKind::Service, "train"),
        foreign(ObjectKind::Claim, "train-checkpoints"),
    ];
    let plan = decide_with_foreign(&w, objects.clone());
    assert!(
        plan.actions.is_empty(),
        "nothing is created, nothing is written to their objects: {:?}",
        plan.actions
    );
    let c = name_conflict(&plan).expect("NameConflict");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "NameTaken")
    );
    assert!(
        c.message.contains(
            "not its own: Service train (it has no owner reference), \
             PersistentVolumeClaim train-checkpoints (it has no owner reference); "
        ),
        "{}",
        c.message
    );
    let warnings: Vec<_> = plan
        .events
        .iter()
        .filter(|e| e.reason == "NameConflict")
        .collect();
    assert_eq!(warnings.len(), 1);
    assert_eq!(warnings[0].kind, EventKind::Warning);
    assert_eq!(announcement(&plan), None);
    assert_eq!(plan.status.start_time, None, "the job has not started");
    assert!(plan.requeue_at.is_some(), "looked at again");

    // The next round, same objects: the same status, no second Event.
    w.status = plan.status.clone();
    let again = decide_with_foreign(&w, objects);
    assert_eq!(again.status, plan.status);
    assert!(again.events.is_empty(), "{:?}", again.events);

    // Gone: the condition clears and the job starts.
    let free = w.step();
    let c = name_conflict(&free).expect("NameConflict");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "NamesFree")
    );
    assert!(
        free.actions
            .iter()
            .any(|a| matches!(a, Action::CreateService(_)))
    );
    assert!(
        free.actions
            .iter()
            .any(|a| matches!(a, Action::CreatePvc(_)))
    );
    assert_eq!(World::creates(&free).len(), 2);
    assert_eq!(w.decided, [PhaseName::Running]);
}

#[test]
fn a_pod_of_a_workers_name_that_is_not_the_jobs_is_a_name_conflict() {
    use crate::model::ownership::ObjectKind;
    let w = World::new("workers: 2\n");
    let plan = decide_with_foreign(&w, vec![foreign(ObjectKind::Pod, "train-worker-1")]);
    assert_eq!(plan.decided_by, PhaseName::ForeignObjects);
    assert!(World::creates(&plan).is_empty());
    let c = name_conflict(&plan).expect("NameConflict");
    assert!(
        c.message
            .contains(": Pod train-worker-1 (it has no owner reference);"),
        "{}",
        c.message
    );
    assert!(
        !condition_is_true(&plan.status.conditions, condition::UNSCHEDULABLE),
        "a taken name is not a scheduling problem"
    );
}

#[test]
fn running_workers_keep_running_beside_a_foreign_object_which_is_reported() {
    use crate::model::ownership::ObjectKind;
    let mut w = World::new("workers: 2\n");
    w.step();
    w.run_all();
    w.step();
    let plan = decide_with_foreign(&w, vec![foreign(ObjectKind::Service, "train")]);
    assert!(plan.actions.is_empty(), "{:?}", plan.actions);
    assert_eq!(plan.status.phase, Some(Phase::Running));
    assert!(condition_is_true(
        &plan.status.conditions,
        condition::NAME_CONFLICT
    ));
    assert_eq!(w.decided, [PhaseName::Running, PhaseName::Running]);
}
