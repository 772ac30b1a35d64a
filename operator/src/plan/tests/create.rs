//! The first attempt: creating the workers, completing a half-created attempt, running.

use super::*;

#[test]
fn new_job_creates_service_pvc_and_every_worker() {
    let mut w = World::new("workers: 2\ngpusPerWorker: 4\n");
    let plan = w.step();
    assert!(
        plan.actions
            .iter()
            .any(|a| matches!(a, Action::CreateService(_)))
    );
    assert!(
        plan.actions
            .iter()
            .any(|a| matches!(a, Action::CreatePvc(_)))
    );
    let created: Vec<_> = World::creates(&plan)
        .iter()
        .map(|p| p.metadata.name.clone().unwrap_or_default())
        .collect();
    assert_eq!(created, ["train-worker-0", "train-worker-1"]);
    assert_eq!(plan.status.phase, Some(Phase::Pending));
    assert_eq!(plan.status.start_time, Some(Time(ts(T0))));
    assert_eq!(
        plan.status
            .selected_gpu
            .as_ref()
            .map(|s| s.product.as_str()),
        Some("Tesla-T4")
    );
    assert_eq!(plan.creates_attempt, Some(0));
    assert!(
        plan.status.workers.is_empty(),
        "pods the cache has not shown are not recorded"
    );
    assert_eq!(w.decided, [PhaseName::Running]);
}

#[test]
fn pods_not_yet_in_the_cache_are_created_again_not_counted_as_preempted() {
    let w = World::new("workers: 2\n");
    let first = w.decide();
    let mut lagging = World::new("workers: 2\n");
    lagging.status = first.status.clone();
    lagging.claim = Some(ObservedClaim::default());
    lagging.service_exists = true;
    let replay = lagging.decide();
    assert_eq!(replay.status, first.status, "replay changes nothing");
    assert_eq!(
        World::creates(&replay).len(),
        2,
        "creates are repeated (AlreadyExists is harmless)"
    );
    assert_eq!(replay.restart, None);
    assert_eq!(
        (first.decided_by, replay.decided_by),
        (PhaseName::Running, PhaseName::Running)
    );
}

#[test]
fn all_workers_running_makes_the_job_running_once() {
    let mut w = World::new("workers: 2\n");
    w.step();
    w.run_all();
    let plan = w.step();
    assert_eq!(plan.status.phase, Some(Phase::Running));
    assert!(condition_is_true(
        &plan.status.conditions,
        condition::RUNNING
    ));
    assert_eq!(plan.status.workers.len(), 2);
    assert_eq!(plan.status.workers[1].node.as_deref(), Some("n-1"));
    assert!(plan.events.iter().any(|e| e.reason == "Running"));
    let again = w.step();
    assert_eq!(again.status, plan.status);
    assert!(again.events.is_empty() && again.actions.is_empty());
    assert_eq!(
        w.decided,
        [PhaseName::Running, PhaseName::Running, PhaseName::Running]
    );
}

#[test]
fn a_half_created_attempt_is_completed_with_the_first_pods_placement() {
    let mut w = World::new("workers: 2\ngpusPerWorker: 1\n");
    let plan = w.decide();
    w.status = plan.status.clone();
    // Only rank 0 made it before a crash.
    let first = World::creates(&plan)[0].clone();
    w.pods.push(Arc::new(first.clone()));
    // Meanwhile a cheaper product appeared; the gang must still land on one product.
    w.nodes
        .push(Arc::new(node("n-2").gpus(8).product("NVIDIA-L4").build()));
    w.nodes[0] = Arc::new(node("n-1").gpus(8).product("NVIDIA-H100-80GB-HBM3").build());
    let plan = w.decide();
    assert_eq!(plan.decided_by, PhaseName::Running);
    let created = World::creates(&plan);
    assert_eq!(created.len(), 1);
    assert_eq!(created[0].metadata.name.as_deref(), Some("train-worker-1"));
    assert_eq!(
        created[0].spec.as_ref().and_then(|s| s.affinity.clone()),
        first.spec.as_ref().and_then(|s| s.affinity.clone())
    );
}

/// A pod template that names a gang scheduler: the job's PodGroup goes with each attempt's
/// first pods, and every pod joins it.
#[test]
fn a_gang_schedulers_pod_group_comes_with_each_attempts_first_pods() {
    use crate::model::podgroup::{PodGroup, VOLCANO_GROUP_ANNOTATION};
    let groups = |plan: &Plan| -> Vec<PodGroup> {
        plan.actions
            .iter()
            .filter_map(|a| match a {
                Action::CreatePodGroup(g) => Some((**g).clone()),
                _ => None,
            })
            .collect()
    };
    let mut w = World::new("workers: 2\ngpusPerWorker: 1\n");
    if let Some(spec) = w.job.spec.template.spec.as_mut() {
        spec.scheduler_name = Some("volcano".into());
    }
    let plan = w.step();
    let created = groups(&plan);
    assert!(
        matches!(created.as_slice(), [PodGroup::Volcano(g)] if g.spec.min_member == 2),
        "{created:?}"
    );
    for pod in World::creates(&plan) {
        let annotations = pod.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(
            annotations
                .get(VOLCANO_GROUP_ANNOTATION)
                .map(String::as_str),
            Some("train")
        );
    }
    // A rank created again within the attempt: no new PodGroup.
    w.pods
        .retain(|p| p.metadata.name.as_deref() != Some("train-worker-1"));
    let plan = w.step();
    assert_eq!(World::creates(&plan).len(), 1);
    assert!(groups(&plan).is_empty());
    // The default scheduler: none.
    let mut plain = World::new("workers: 2\ngpusPerWorker: 1\n");
    assert!(groups(&plain.step()).is_empty());
}
