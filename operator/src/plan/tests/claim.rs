//! The checkpoint claim: resuming from a kept one, and `retainOnDelete`.

use super::*;

/// The claim an earlier job of the same name (uid `uid-0`) created and `retainOnDelete` kept.
fn retained_claim(w: &World) -> ObservedClaim {
    let meta: ObjectMeta = serde_json::from_value(json!({
        "name": "train-checkpoints",
        "labels": {crate::model::crd::LABEL_JOB: "train", LABEL_JOB_UID: "uid-0"},
        "resourceVersion": "7",
    }))
    .expect("meta");
    ObservedClaim::of(&meta, &w.job)
}

#[test]
fn a_job_applied_again_over_its_retained_claim_resumes_from_it() {
    let mut w = World::new("workers: 2\n");
    w.claim = Some(retained_claim(&w));
    let plan = w.step();
    let created = World::creates(&plan);
    assert_eq!(created.len(), 2);
    for pod in created {
        assert_eq!(
            env(pod, RESUME_FROM).as_deref(),
            Some("/mnt/checkpoints/latest.pt"),
            "attempt 0 continues from what the claim holds"
        );
        assert_eq!(env(pod, TRAINYARD_ATTEMPT).as_deref(), Some("0"));
        assert_eq!(
            env(pod, TRAINYARD_RESTART_REASON).as_deref(),
            Some("ExistingClaim")
        );
    }
    assert!(
        !plan
            .actions
            .iter()
            .any(|a| matches!(a, Action::CreatePvc(_))),
        "the claim is there"
    );
    assert!(
        announcement(&plan).is_some_and(|e| e.note.contains("resuming from its checkpoint")),
        "{:?}",
        plan.events
    );
}

#[test]
fn a_job_on_the_claim_it_created_itself_never_resumes_in_attempt_0() {
    let mut w = World::new("workers: 2\n");
    let first = w.step();
    for pod in World::creates(&first) {
        assert_eq!(env(pod, RESUME_FROM), None);
    }
    let claim = w.claim.clone().expect("created");
    assert!(!claim.inherited, "its own uid is on it");
    // A rank of attempt 0 created again later (its pod vanished before running) starts the
    // same way as its siblings did.
    w.pods
        .retain(|p| p.metadata.name.as_deref() != Some("train-worker-1"));
    w.status.workers.clear();
    let again = w.step();
    let created = World::creates(&again);
    assert_eq!(created.len(), 1, "{:?}", again.actions);
    assert_eq!(env(created[0], RESUME_FROM), None);
}

#[test]
fn an_existing_claim_is_resumed_from_in_attempt_0() {
    let mut w = World::new("workers: 1\ncheckpoint: {existingClaim: shared}\n");
    let meta: ObjectMeta = serde_json::from_value(json!({"name": "shared"})).expect("meta");
    w.claim = Some(ObservedClaim::of(&meta, &w.job));
    let plan = w.step();
    let created = World::creates(&plan);
    assert_eq!(
        env(created[0], RESUME_FROM).as_deref(),
        Some("/mnt/checkpoints/latest.pt")
    );
    assert!(
        !plan
            .actions
            .iter()
            .any(|a| matches!(a, Action::SetClaimOwners { .. })),
        "the user's claim is never given an owner"
    );
}

fn claim_owner_change(plan: &Plan) -> Option<&Vec<OwnerReference>> {
    plan.actions.iter().find_map(|a| match a {
        Action::SetClaimOwners { owners, .. } => Some(owners),
        _ => None,
    })
}

#[test]
fn retain_on_delete_edited_later_moves_the_claims_owner_reference() {
    let mut w = World::new("workers: 1\ncheckpoint: {retainOnDelete: true}\n");
    let first = w.step();
    assert_eq!(claim_owner_change(&first), None);
    assert!(w.claim.as_ref().is_some_and(|c| c.owners.is_empty()));
    // Edited to false: the claim gets the job's owner reference, once.
    w.job = validate(&job_yaml(
        "workers: 1\ncheckpoint: {retainOnDelete: false}\n",
    ))
    .expect("valid");
    let plan = w.step();
    let owners = claim_owner_change(&plan).expect("owner set");
    assert_eq!(owners.len(), 1);
    assert_eq!(owners[0].uid, "uid-1");
    assert_eq!(
        claim_owner_change(&w.step()),
        None,
        "nothing left to change"
    );
    // Finished jobs too: their delete is what keeps or removes the claim.
    w.status.phase = Some(Phase::Succeeded);
    w.job = validate(&job_yaml(
        "workers: 1\ncheckpoint: {retainOnDelete: true}\n",
    ))
    .expect("valid");
    let plan = w.step();
    assert_eq!(plan.decided_by, PhaseName::Terminal);
    assert_eq!(
        claim_owner_change(&plan),
        Some(&Vec::new()),
        "owner removed"
    );
}

#[test]
fn a_job_that_does_not_retain_adopts_the_claim_an_earlier_job_kept() {
    let mut w = World::new("workers: 1\ncheckpoint: {retainOnDelete: false}\n");
    w.claim = Some(retained_claim(&w));
    let plan = w.step();
    let owners = claim_owner_change(&plan).expect("adopted");
    assert_eq!(
        owners.iter().map(|o| o.uid.as_str()).collect::<Vec<_>>(),
        ["uid-1"]
    );
    assert!(matches!(
        plan.actions.iter().find(|a| matches!(a, Action::SetClaimOwners { .. })),
        Some(Action::SetClaimOwners { resource_version: Some(rv), .. }) if rv == "7"
    ));
}
