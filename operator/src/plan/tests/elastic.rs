//! Elastic gangs (`spec.elastic`): shrinking to the workers that can be placed, growing back
//! when there is room, round by round.

use super::*;
use trainyard_api::env::{NNODES, TRAINYARD_FULL_WORLD_SIZE, WORLD_SIZE};

/// Four workers of four GPUs, two on each of two eight-GPU nodes; at least two to train.
const ELASTIC: &str =
    "workers: 4\ngpusPerWorker: 4\nelastic: {minWorkers: 2, replacementWaitSeconds: 60}\n";

fn names(pods: &[&Pod]) -> Vec<String> {
    let mut names: Vec<String> = pods
        .iter()
        .map(|p| p.metadata.name.clone().unwrap_or_default())
        .collect();
    names.sort();
    names
}

impl World {
    /// A second eight-GPU node `n-2`, and ranks 2 and 3 on it.
    pub(super) fn with_ranks_2_and_3_on_n2(mut self) -> Self {
        self.nodes
            .push(Arc::new(node("n-2").gpus(8).product("Tesla-T4").build()));
        for rank in [2, 3] {
            self.modify(&format!("train-worker-{rank}"), |p| {
                p.spec.as_mut().expect("spec").node_name = Some("n-2".into());
            });
        }
        self
    }

    /// The scheduler cannot place `name`: no node has room.
    pub(super) fn unplaceable(&mut self, name: &str) {
        self.modify(name, |p| {
            p.spec.as_mut().expect("spec").node_name = None;
            p.status = serde_json::from_value(json!({"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "message": "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) were unschedulable."}]}))
            .ok();
        });
    }

    /// Node `n-2` is lost with ranks 2 and 3; the gang restarts, and its new ranks 2 and 3
    /// find no room: returns the time the restart was decided.
    fn lose_n2_without_room(&mut self) -> Timestamp {
        self.preempt("train-worker-2");
        self.preempt("train-worker-3");
        let plan = self.step();
        assert_eq!(plan.restart, Some(RestartReason::Preemption));
        let decided = self.now;
        self.nodes
            .retain(|n| n.metadata.name.as_deref() != Some("n-2"));
        self.kubelet_removes_deleted();
        let plan = self.step();
        assert_eq!(
            World::creates(&plan).len(),
            4,
            "the restart asks for every worker"
        );
        self.run_all();
        self.unplaceable("train-worker-2");
        self.unplaceable("train-worker-3");
        decided
    }
}

fn running_elastic_world(yaml: &str) -> World {
    let mut w = World::new(yaml);
    w.step();
    let mut w = w.with_ranks_2_and_3_on_n2();
    w.run_all();
    w.step();
    assert_eq!(w.status.phase, Some(Phase::Running));
    assert_eq!(w.status.world_size, Some(4));
    w
}

#[test]
fn workers_that_cannot_be_placed_for_the_wait_shrink_the_gang_to_the_placed_ones() {
    let mut w = running_elastic_world(ELASTIC);
    let decided = w.lose_n2_without_room();

    // Within the wait nothing shrinks; the round looks again when it ends.
    w.advance(30);
    let plan = w.step();
    assert_eq!(plan.restart, None);
    let due = decided + SignedDuration::from_secs(60);
    assert!(
        plan.requeue_at.is_some_and(|at| at <= due),
        "{:?}",
        plan.requeue_at
    );

    w.advance(31);
    let plan = w.step();
    assert_eq!(plan.decided_by, PhaseName::Shrink);
    assert_eq!(plan.restart, Some(RestartReason::Shrink));
    assert_eq!(plan.status.world_size, Some(2));
    assert_eq!(
        (
            plan.status.attempt,
            plan.status.preemptions,
            plan.status.failures
        ),
        (2, 1, 0),
        "a shrink counts against no budget"
    );
    let event = plan
        .events
        .iter()
        .find(|e| e.reason == reason::SHRINKING)
        .expect("Shrinking");
    assert!(
        event
            .note
            .contains("worker(s) 2-3 could not be placed for 60s")
            && event.note.contains("Insufficient nvidia.com/gpu")
            && event.note.contains("training continues with 2"),
        "{}",
        event.note
    );
    let shrunk = condition_of(&plan.status, condition::SHRUNK).expect("Shrunk");
    assert_eq!(
        (shrunk.status.as_str(), shrunk.reason.as_str()),
        ("True", "CapacityGone")
    );
    assert!(
        shrunk.message.contains("runs 2 of 4 workers"),
        "{}",
        shrunk.message
    );

    // The next attempt has two workers, told their world and the job's.
    w.kubelet_removes_deleted();
    let plan = w.step();
    let created = World::creates(&plan);
    assert_eq!(names(&created), ["train-worker-0", "train-worker-1"]);
    for pod in &created {
        assert_eq!(env(pod, NNODES).as_deref(), Some("2"));
        assert_eq!(env(pod, WORLD_SIZE).as_deref(), Some("8"));
        assert_eq!(env(pod, TRAINYARD_FULL_WORLD_SIZE).as_deref(), Some("16"));
        assert_eq!(
            env(pod, TRAINYARD_RESTART_REASON).as_deref(),
            Some("Shrink")
        );
        assert!(env(pod, RESUME_FROM).is_some());
    }
    w.run_all();
    let plan = w.step();
    assert_eq!(plan.status.phase, Some(Phase::Running));
    let running = condition_of(&plan.status, condition::RUNNING).expect("Running");
    assert!(
        running.message.contains("2/2 workers"),
        "{}",
        running.message
    );
}

/// Fewer placed than `minWorkers`: no shrink; the half-placed gang waits out
/// `scheduling.placementTimeoutSeconds` (180 s by default), then lets go of its pods.
#[test]
fn fewer_placed_workers_than_min_workers_wait_instead_of_shrinking_then_are_requeued() {
    let mut w = running_elastic_world(
        "workers: 4\ngpusPerWorker: 4\nelastic: {minWorkers: 3, replacementWaitSeconds: 60}\n",
    );
    w.lose_n2_without_room();
    w.advance(170);
    let plan = w.step();
    assert_eq!(plan.restart, None);
    assert_eq!(plan.status.world_size, Some(4));
    assert!(condition_is_true(
        &plan.status.conditions,
        condition::UNSCHEDULABLE
    ));
    w.advance(11);
    let plan = w.step();
    assert_eq!(plan.restart, Some(RestartReason::Requeue));
    assert_eq!(plan.status.world_size, Some(4), "the next try asks for all");
}

#[test]
fn a_job_without_elastic_waits_for_every_worker_until_the_placement_timeout() {
    let mut w = running_elastic_world(ELASTIC);
    w.job.spec.elastic = None;
    w.lose_n2_without_room();
    w.advance(170);
    let plan = w.step();
    assert_eq!(plan.restart, None);
    assert_eq!(plan.status.attempt, 1);
    for pod in w
        .pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
    {
        assert_eq!(env(pod, TRAINYARD_FULL_WORLD_SIZE), None);
        assert_eq!(env(pod, NNODES).as_deref(), Some("4"));
    }
    w.advance(11);
    let plan = w.step();
    assert_eq!(plan.restart, Some(RestartReason::Requeue));
    assert_eq!(
        (plan.status.attempt, plan.status.preemptions),
        (2, 1),
        "the preemption counted once, the requeue not at all"
    );
}

/// A gang shrunk to two workers on `n-1`, running.
fn shrunk_world() -> World {
    let mut w = running_elastic_world(ELASTIC);
    w.lose_n2_without_room();
    w.advance(61);
    assert_eq!(w.step().restart, Some(RestartReason::Shrink));
    w.kubelet_removes_deleted();
    w.step();
    w.run_all();
    w.step();
    assert_eq!(
        (w.status.phase, w.status.world_size),
        (Some(Phase::Running), Some(2))
    );
    w
}

#[test]
fn a_shrunk_gang_grows_back_once_the_nodes_that_fit_have_room() {
    let mut w = shrunk_world();
    // n-1 is full (its eight GPUs hold the two workers): no room, looked at again later.
    w.gpus_in_use = Some([("n-1".to_owned(), 8)].into());
    let plan = w.step();
    assert_eq!(plan.restart, None);
    assert!(plan.requeue_at.is_some());

    // n-2 returns, empty, 100 s later. The trainers report no progress: the gang grows at
    // once.
    w.advance(100);
    w.nodes
        .push(Arc::new(node("n-2").gpus(8).product("Tesla-T4").build()));
    w.gpus_in_use = Some([("n-1".to_owned(), 8), ("n-2".to_owned(), 0)].into());
    let plan = w.step();
    assert_eq!(plan.decided_by, PhaseName::Grow);
    assert_eq!(plan.restart, Some(RestartReason::Grow));
    assert_eq!(plan.status.world_size, Some(4));
    assert_eq!((plan.status.preemptions, plan.status.failures), (1, 0));
    let event = plan
        .events
        .iter()
        .find(|e| e.reason == reason::GROWING)
        .expect("Growing");
    assert!(
        event
            .note
            .contains("room for 2 more worker(s) on n-2 (8 free)"),
        "{}",
        event.note
    );
    let shrunk = condition_of(&plan.status, condition::SHRUNK).expect("Shrunk");
    assert_eq!(
        (shrunk.status.as_str(), shrunk.reason.as_str()),
        ("False", "FullSize")
    );

    w.kubelet_removes_deleted();
    let plan = w.step();
    let created = World::creates(&plan);
    assert_eq!(created.len(), 4);
    assert!(
        created
            .iter()
            .all(|p| env(p, NNODES).as_deref() == Some("4"))
    );
    assert!(
        created
            .iter()
            .all(|p| env(p, TRAINYARD_RESTART_REASON).as_deref() == Some("Grow"))
    );
}

#[test]
fn room_for_one_more_worker_grows_the_gang_by_one() {
    let mut w = shrunk_world();
    w.nodes
        .push(Arc::new(node("n-2").gpus(8).product("Tesla-T4").build()));
    w.gpus_in_use = Some([("n-1".to_owned(), 8), ("n-2".to_owned(), 4)].into());
    let plan = w.step();
    assert_eq!(plan.restart, Some(RestartReason::Grow));
    assert_eq!(plan.status.world_size, Some(3));
    let shrunk = condition_of(&plan.status, condition::SHRUNK).expect("Shrunk");
    assert!(
        shrunk.message.contains("runs 3 of 4 workers"),
        "{}",
        shrunk.message
    );
}

#[test]
fn trainers_that_report_save_a_checkpoint_before_the_gang_grows() {
    let mut w = shrunk_world();
    let attempt = w.status.attempt;
    w.progress = Some(reports(attempt, &[(0, 120), (1, 120)], w.now));
    w.nodes
        .push(Arc::new(node("n-2").gpus(8).product("Tesla-T4").build()));
    w.gpus_in_use = Some([("n-1".to_owned(), 8), ("n-2".to_owned(), 0)].into());
    let plan = w.step();
    assert_eq!(plan.restart, None, "the trainers save first");
    assert_eq!(plan.checkpoint_request, Some(attempt));
    let asked = plan
        .events
        .iter()
        .find(|e| e.reason == reason::CHECKPOINT_REQUESTED)
        .expect("CheckpointRequested");
    assert!(
        asked.note.contains("step 120") && asked.note.contains("growing to 4 of 4"),
        "{}",
        asked.note
    );

    // Still saving: asked again, told once.
    w.progress.as_mut().expect("progress").checkpoint_requested = Some(120);
    w.advance(1);
    let plan = w.step();
    assert_eq!(
        (plan.restart, plan.checkpoint_request),
        (None, Some(attempt))
    );
    assert!(
        plan.events
            .iter()
            .all(|e| e.reason != reason::CHECKPOINT_REQUESTED)
    );

    // Saved at step 121: the gang grows from it.
    let p = w.progress.as_mut().expect("progress");
    p.checkpoint_requested = None;
    p.checkpoint = Some((121, w.now));
    p.checkpoint_saved_on_request = Some(121);
    let plan = w.step();
    assert_eq!(plan.restart, Some(RestartReason::Grow));
    let detail = &plan.status.last_restart.as_ref().expect("restart").detail;
    assert!(detail.contains("checkpoint at step 121"), "{detail}");
}

#[test]
fn the_controller_weighs_the_nodes_that_fit_only_for_a_shrunk_gang_that_runs() {
    let w = running_elastic_world(ELASTIC);
    let refs: Vec<&Node> = w.nodes.iter().map(AsRef::as_ref).collect();
    let weigh =
        |w: &World, silent: &[String]| nodes_to_weigh(&w.job, &w.status, &refs, silent, &w.config);
    assert!(
        weigh(&w, &[]).is_empty(),
        "a gang at full size weighs nothing"
    );
    let mut shrunk = w.status.clone();
    shrunk.world_size = Some(2);
    let w2 = World {
        status: shrunk,
        ..World::new(ELASTIC)
    };
    let weigh2 = |silent: &[String]| nodes_to_weigh(&w2.job, &w2.status, &refs, silent, &w2.config);
    assert_eq!(weigh2(&[]), ["n-1", "n-2"]);
    assert_eq!(weigh2(&["n-2".to_owned()]), ["n-1"], "never a silent node");
}

#[test]
fn elastic_needs_gpus_and_a_minimum_within_the_workers() {
    for (yaml, field) in [
        (
            "workers: 2\ngpusPerWorker: 1\nelastic: {minWorkers: 3}\n",
            "spec.elastic.minWorkers",
        ),
        (
            "workers: 2\ngpusPerWorker: 1\nelastic: {minWorkers: 0}\n",
            "spec.elastic.minWorkers",
        ),
        ("workers: 2\nelastic: {minWorkers: 1}\n", "spec.elastic"),
    ] {
        let err = validate(&job_yaml(yaml)).expect_err(yaml);
        assert_eq!(err.field, field, "{yaml}: {err}");
    }
    let ok = validate(&job_yaml(ELASTIC)).expect("valid");
    assert_eq!(
        ok.spec.elastic.as_ref().map(|e| e.replacement_wait_seconds),
        Some(60)
    );
}

#[test]
fn a_shrunk_gang_that_loses_a_worker_asks_for_every_worker_again() {
    let mut w = shrunk_world();
    w.preempt("train-worker-1");
    let plan = w.step();
    assert_eq!(plan.restart, Some(RestartReason::Preemption));
    assert_eq!(plan.status.world_size, Some(4));
    assert_eq!(plan.status.preemptions, 2);
    let shrunk = condition_of(&plan.status, condition::SHRUNK).expect("Shrunk");
    assert_eq!(shrunk.status, "False");
    w.kubelet_removes_deleted();
    let plan = w.step();
    assert_eq!(World::creates(&plan).len(), 4);
}

/// The example manifests users start from are valid jobs.
#[test]
fn the_example_manifests_are_valid() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    for file in ["trainingjob.yaml", "trainingjob-elastic.yaml"] {
        let text = std::fs::read_to_string(root.join(file)).expect(file);
        let mut job: serde_json::Value = serde_saphyr::from_str(&text).expect(file);
        job["metadata"]["namespace"] = json!("default");
        job["metadata"]["uid"] = json!("uid-1");
        let job: crate::model::crd::TrainingJob = serde_json::from_value(job).expect(file);
        validate(&job).unwrap_or_else(|e| panic!("{file}: {e}"));
    }
}

#[test]
fn a_grow_that_does_not_fit_shrinks_again_and_the_next_grow_waits_longer() {
    let mut w = shrunk_world();
    w.nodes
        .push(Arc::new(node("n-2").gpus(8).product("Tesla-T4").build()));
    // n-2 looks empty, but its GPUs are held by pods the operator cannot see.
    w.gpus_in_use = Some([("n-1".to_owned(), 8), ("n-2".to_owned(), 0)].into());
    assert_eq!(w.step().restart, Some(RestartReason::Grow));
    w.kubelet_removes_deleted();
    w.step();
    w.run_all();
    w.unplaceable("train-worker-2");
    w.unplaceable("train-worker-3");
    w.step();
    w.advance(61);
    let plan = w.step();
    assert_eq!(plan.restart, Some(RestartReason::Shrink));
    assert_eq!(plan.status.failed_grows, Some(1));
    let detail = &plan.status.last_restart.as_ref().expect("restart").detail;
    assert!(
        detail.contains("the grow did not fit (1 in a row): the next grow waits 120s"),
        "{detail}"
    );
    let shrunk_at = w.now;
    w.kubelet_removes_deleted();
    w.step();
    w.run_all();
    w.step();
    assert_eq!(w.status.phase, Some(Phase::Running));

    // The same room is seen again: no grow before twice the wait.
    w.advance(60);
    let plan = w.step();
    assert_eq!(plan.restart, None);
    let due = shrunk_at + SignedDuration::from_secs(120);
    assert!(
        plan.requeue_at.is_some_and(|at| at <= due),
        "{:?}",
        plan.requeue_at
    );
    w.advance(61);
    assert_eq!(w.step().restart, Some(RestartReason::Grow));
    // This one fits: every worker runs, and the count is back to none.
    w.kubelet_removes_deleted();
    w.step();
    w.run_all();
    let plan = w.step();
    assert_eq!(
        (plan.status.phase, plan.status.failed_grows),
        (Some(Phase::Running), None)
    );
    assert_eq!(plan.status.world_size, Some(4));
}

/// Free GPUs the job's pods could never use are no room to grow into: a node its template's
/// selector excludes, or tainted against it, is not weighed (a grow there would be created
/// unschedulable, shrink again, and cycle).
#[test]
fn nodes_the_template_cannot_use_are_no_room_to_grow() {
    let selected = format!(
        "{ELASTIC}template:\n  spec:\n    nodeSelector: {{pool: a}}\n    containers: [{{name: trainer, image: x}}]\n"
    );
    let a = node("n-a")
        .gpus(8)
        .product("Tesla-T4")
        .label("pool", "a")
        .build();
    let b = node("n-b")
        .gpus(8)
        .product("Tesla-T4")
        .label("pool", "b")
        .build();
    let tainted = node("n-t")
        .gpus(8)
        .product("Tesla-T4")
        .label("pool", "a")
        .taint("team")
        .build();
    let refs = [&a, &b, &tainted];
    let mut w = World::new(&selected);
    w.status.phase = Some(Phase::Running);
    w.status.world_size = Some(2);
    assert_eq!(
        nodes_to_weigh(&w.job, &w.status, &refs, &[], &w.config),
        ["n-a"]
    );
}
