//! A job that names a Kueue LocalQueue, round by round, with the test playing Kueue: its
//! Workload is created, nothing runs before admission, the admitted flavor reaches the pods,
//! an eviction stops the workers as a preemption and gives the quota back, a new admission
//! starts the next attempt, and the end marks the Workload `Finished`.

use super::*;
use crate::model::kueue::{
    self, ADMITTED, Admission, EVICTED, FINISHED, PodSetAssignment, QUOTA_RESERVED,
    ResourceFlavorSpec, Workload, WorkloadStatus,
};
use k8s_openapi::api::core::v1::Toleration;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

fn queued_world() -> World {
    let mut tj = crate::fixtures::job_yaml("workers: 2\ngpusPerWorker: 1\n");
    tj.metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert(kueue::QUEUE_LABEL.into(), "team-a".into());
    let mut w = World::new("workers: 2\ngpusPerWorker: 1\n");
    w.job = validate(&tj).expect("valid");
    let flavor = ResourceFlavorSpec {
        node_labels: [("pool".to_owned(), "a100".to_owned())].into(),
        tolerations: vec![Toleration {
            key: Some("pool".into()),
            operator: Some("Exists".into()),
            effect: Some("NoSchedule".into()),
            ..Toleration::default()
        }],
    };
    w.kueue = Some((None, [("a100".to_owned(), flavor)].into()));
    w
}

fn cond(type_: &str, status: bool, reason: &str) -> Condition {
    Condition {
        type_: type_.into(),
        status: if status { "True" } else { "False" }.into(),
        reason: reason.into(),
        message: String::new(),
        last_transition_time: Time(ts(T0)),
        observed_generation: None,
    }
}

impl World {
    fn workload(&mut self) -> &mut Workload {
        self.kueue
            .as_mut()
            .and_then(|(w, _)| w.as_mut())
            .expect("a Workload")
    }

    /// Kueue admits the Workload to flavor `a100`.
    fn admit(&mut self) {
        self.workload().status = Some(WorkloadStatus {
            admission: Some(Admission {
                cluster_queue: "cq".into(),
                pod_set_assignments: vec![PodSetAssignment {
                    name: kueue::POD_SET.into(),
                    flavors: [("nvidia.com/gpu".to_owned(), "a100".to_owned())].into(),
                    count: Some(2),
                }],
            }),
            conditions: vec![
                cond(QUOTA_RESERVED, true, "QuotaReserved"),
                cond(ADMITTED, true, "Admitted"),
            ],
        });
    }

    /// Kueue evicts it (a preemption in its ClusterQueue).
    fn evict(&mut self) {
        let status = self.workload().status.get_or_insert_with(Default::default);
        status.conditions.push(cond(EVICTED, true, "Preempted"));
    }
}

fn admitted_condition(plan: &Plan) -> (String, String) {
    let c = plan
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == condition::ADMITTED)
        .expect("Admitted");
    (c.status.clone(), c.reason.clone())
}

#[test]
fn a_queued_job_creates_its_workload_and_no_pod_until_kueue_admits_it() {
    let mut w = queued_world();
    let plan = w.step();
    assert_eq!(plan.decided_by, PhaseName::Admission);
    assert!(World::creates(&plan).is_empty());
    assert!(
        plan.actions
            .iter()
            .any(|a| matches!(a, Action::CreateWorkload(_))),
        "{:?}",
        plan.actions
    );
    assert_eq!(
        admitted_condition(&plan),
        ("False".into(), reason::WAITING_FOR_ADMISSION.into())
    );
    assert_eq!(plan.status.waiting_for.as_deref(), Some("Admission"));
    // It waits, creating nothing more.
    w.advance(600);
    let plan = w.step();
    assert!(plan.actions.is_empty(), "{:?}", plan.actions);

    // Admitted: the workers are created with the flavor's node labels and tolerations, and
    // the ledger counts the 600 s of waiting as queued, apart from any GPU time.
    w.admit();
    let plan = w.step();
    let ledger = plan.status.ledger.clone().expect("ledger");
    assert_eq!(ledger.queued_millis, 600_000, "{ledger:?}");
    assert_eq!(
        ledger.open.as_ref().map(|o| o.use_),
        Some(crate::model::crd::StretchUse::Pending)
    );
    let pods = World::creates(&plan);
    assert_eq!(pods.len(), 2);
    for pod in pods {
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(
            spec.node_selector.clone().unwrap_or_default()["pool"],
            "a100"
        );
        let tolerations = spec.tolerations.clone().unwrap_or_default();
        assert!(tolerations.iter().any(|t| t.key.as_deref() == Some("pool")));
    }
    assert_eq!(
        admitted_condition(&plan),
        ("True".into(), reason::ADMITTED.into())
    );
    assert!(plan.events.iter().any(|e| e.reason == reason::ADMITTED));
}

#[test]
fn an_eviction_stops_the_workers_as_a_preemption_gives_the_quota_back_and_waits() {
    let mut w = queued_world();
    w.step();
    w.admit();
    w.step();
    w.run_all();
    assert_eq!(w.step().status.phase, Some(Phase::Running));

    w.evict();
    let plan = w.step();
    assert_eq!(plan.restart, Some(RestartReason::Preemption));
    assert_eq!((plan.status.attempt, plan.status.preemptions), (1, 1));
    assert_eq!(World::deletes(&plan), 2, "both workers stop");
    assert!(
        plan.status.last_restart.as_ref().is_some_and(|l| l
            .detail
            .contains("Kueue evicted Workload trainingjob-train")),
        "{:?}",
        plan.status.last_restart
    );
    // While they stop: no quota given back yet, nothing created.
    let plan = w.step();
    assert!(World::creates(&plan).is_empty());
    assert!(
        !plan
            .actions
            .iter()
            .any(|a| matches!(a, Action::WriteWorkloadStatus { .. }))
    );
    // Gone: the quota goes back (admission cleared, QuotaReserved False), once.
    w.kubelet_removes_deleted();
    let plan = w.step();
    let released = plan.actions.iter().any(|a| {
        matches!(a, Action::WriteWorkloadStatus { release: true, conditions, .. }
            if conditions.iter().any(|c| c.type_ == QUOTA_RESERVED && c.status == "False"))
    });
    assert!(released, "{:?}", plan.actions);
    assert_eq!(admitted_condition(&plan).1, reason::EVICTED);
    assert!(
        w.workload()
            .status
            .as_ref()
            .is_some_and(|s| s.admission.is_none())
    );
    // Kueue clears the eviction and admits it again: attempt 1 starts.
    let status = w.workload().status.get_or_insert_with(Default::default);
    status.conditions.retain(|c| c.type_ != EVICTED);
    w.admit();
    let plan = w.step();
    let pods = World::creates(&plan);
    assert_eq!(pods.len(), 2);
    assert_eq!(plan.status.attempt, 1);
}

#[test]
fn the_end_of_the_job_marks_its_workload_finished_once() {
    let mut w = queued_world();
    w.step();
    w.admit();
    w.step();
    w.run_all();
    w.step();
    w.exit("train-worker-0", 0);
    w.exit("train-worker-1", 0);
    let plan = w.step();
    assert_eq!(plan.status.phase, Some(Phase::Succeeded));
    let finished = plan.actions.iter().any(|a| {
        matches!(a, Action::WriteWorkloadStatus { release: false, conditions, .. }
            if conditions.iter().any(|c| c.type_ == FINISHED && c.status == "True"))
    });
    assert!(finished, "{:?}", plan.actions);
    let plan = w.step();
    assert!(
        !plan
            .actions
            .iter()
            .any(|a| matches!(a, Action::WriteWorkloadStatus { .. })),
        "once: {:?}",
        plan.actions
    );
}

#[test]
fn a_job_that_names_a_queue_where_no_kueue_is_installed_waits_and_says_so() {
    let mut w = queued_world();
    w.kueue = None;
    let plan = w.step();
    assert!(World::creates(&plan).is_empty());
    assert!(plan.actions.is_empty());
    assert_eq!(
        admitted_condition(&plan),
        ("False".into(), reason::KUEUE_NOT_INSTALLED.into())
    );
}

#[test]
fn a_job_without_the_label_never_waits_for_kueue() {
    let mut w = World::new("workers: 2\ngpusPerWorker: 1\n");
    w.kueue = Some((None, Default::default()));
    let plan = w.step();
    assert_eq!(World::creates(&plan).len(), 2);
    assert!(
        !plan
            .status
            .conditions
            .iter()
            .any(|c| c.type_ == condition::ADMITTED)
    );
}

/// Trainers that report progress checkpoint first, as on a termination notice: the eviction
/// asks for a checkpoint, and the gang restarts from it once it is saved.
#[test]
fn an_eviction_of_reporting_trainers_asks_for_a_checkpoint_and_restarts_from_it() {
    let mut w = queued_world();
    w.step();
    w.admit();
    w.step();
    w.run_all();
    w.step();
    w.progress = Some(reports(0, &[(0, 42), (1, 42)], w.now));
    w.step();

    w.evict();
    let plan = w.step();
    assert_eq!(plan.restart, None, "the trainers save first");
    assert_eq!(plan.checkpoint_request, Some(0));
    assert_eq!(World::deletes(&plan), 0);
    let asked = plan
        .events
        .iter()
        .find(|e| e.reason == "CheckpointRequested")
        .expect("CheckpointRequested");
    assert!(
        asked
            .note
            .contains("Kueue evicted Workload trainingjob-train")
            && asked.note.contains("step 42"),
        "{}",
        asked.note
    );
    assert_eq!(admitted_condition(&plan).1, reason::EVICTED);
    let requested = plan
        .status
        .progress
        .as_ref()
        .and_then(|p| p.checkpoint_requested_time.clone())
        .expect("requested time");

    let p = w.progress.as_mut().expect("progress");
    p.checkpoint = Some((43, requested.0));
    p.checkpoint_saved_on_request = Some(43);
    w.advance(2);
    let plan = w.step();
    assert_eq!(plan.restart, Some(RestartReason::Preemption));
    assert_eq!(plan.status.preemptions, 1);
    let detail = &plan.status.last_restart.as_ref().expect("restart").detail;
    assert!(
        detail.contains("Kueue evicted") && detail.contains("checkpoint at step 43"),
        "{detail}"
    );
}

/// Trainers that do not answer within the bound are stopped all the same: Kueue waits for
/// the quota.
#[test]
fn an_eviction_stops_reporting_trainers_that_do_not_checkpoint_within_the_bound() {
    let mut w = queued_world();
    w.step();
    w.admit();
    w.step();
    w.run_all();
    w.step();
    w.progress = Some(reports(0, &[(0, 42), (1, 42)], w.now));
    w.step();
    w.evict();
    assert_eq!(w.step().restart, None);
    w.advance(59);
    assert_eq!(w.step().restart, None);
    w.advance(2);
    let plan = w.step();
    assert_eq!(plan.restart, Some(RestartReason::Preemption));
    assert_eq!(World::deletes(&plan), 2);
}

#[test]
fn a_partial_admission_starts_an_elastic_job_with_the_admitted_workers_and_no_grow_past_them() {
    let yaml =
        "workers: 4\ngpusPerWorker: 4\nelastic: {minWorkers: 2, replacementWaitSeconds: 60}\n";
    let mut tj = crate::fixtures::job_yaml(yaml);
    tj.metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert(kueue::QUEUE_LABEL.into(), "team-a".into());
    let mut w = World::new(yaml);
    w.job = validate(&tj).expect("valid");
    w.kueue = Some((
        None,
        [("a100".to_owned(), ResourceFlavorSpec::default())].into(),
    ));
    w.step();
    let set = &w.workload().spec.pod_sets[0];
    assert_eq!((set.count, set.min_count), (4, Some(2)), "{set:?}");

    // Kueue admits two of the four.
    w.admit();
    if let Some(a) = w
        .workload()
        .status
        .as_mut()
        .and_then(|s| s.admission.as_mut())
    {
        a.pod_set_assignments[0].count = Some(2);
    }
    let plan = w.step();
    assert!(World::creates(&plan).is_empty(), "{:?}", plan.actions);
    assert_eq!(plan.status.world_size, Some(2));
    assert_eq!(plan.restart, None, "no restart is counted");
    let event = plan
        .events
        .iter()
        .find(|e| e.reason == reason::ADMITTED)
        .expect("Admitted");
    assert!(event.note.contains("2 of 4 worker(s)"), "{}", event.note);
    let plan = w.step();
    let created = World::creates(&plan);
    assert_eq!(created.len(), 2, "{:?}", plan.actions);
    assert!(
        created
            .iter()
            .all(|p| env(p, trainyard_api::env::NNODES).as_deref() == Some("2"))
    );

    // Running with room for the other two on a second node: Kueue reserved quota for two,
    // so the gang does not grow.
    w.run_all();
    w.step();
    w.nodes
        .push(Arc::new(node("n-2").gpus(8).product("Tesla-T4").build()));
    w.gpus_in_use = Some([("n-1".to_owned(), 8), ("n-2".to_owned(), 0)].into());
    w.advance(100);
    let plan = w.step();
    assert_eq!(plan.restart, None, "{:?}", plan.events);
    assert_eq!(plan.status.world_size, Some(2));
    assert_eq!((plan.status.preemptions, plan.status.failures), (0, 0));
}
