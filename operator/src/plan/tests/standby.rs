//! Make before break on a termination notice (standbys), round by round.

use super::in_place::supervised_world;
use super::*;
use crate::model::crd::{LABEL_RANK, LABEL_STANDBY};
use crate::model::supervision::SupervisedState;
use trainyard_api::env::TRAINYARD_STANDBY;

impl World {
    fn uid_of(&self, name: &str) -> String {
        self.pods
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(name))
            .and_then(|p| p.metadata.uid.clone())
            .expect("pod")
    }
}

/// The ledger's `heldForNotice` after `plan`, per GPU of a worker.
fn held_for_notice(w: &World, plan: &Plan) -> u64 {
    let ledger = plan.status.ledger.as_ref().expect("ledger");
    let held = ledger.spot.held_for_notice + ledger.on_demand.held_for_notice;
    held / u64::from(w.job.spec.gpus_per_worker)
}

/// A two-worker job restarting in place, rank 1 on n-2, both supervisors polling and both
/// ranks reporting; then a termination notice on n-2: returns the round that saw it.
fn noticed_world() -> (World, Plan) {
    noticed_world_with_api_clock(0)
}

/// [`noticed_world`] with the API server's clock `ahead` seconds ahead of the operator's.
fn noticed_world_with_api_clock(ahead: i64) -> (World, Plan) {
    let mut w = supervised_world("workers: 2\ngpusPerWorker: 2\n").with_worker_1_on_n2();
    w.api_clock_ahead = jiff::SignedDuration::from_secs(ahead);
    w.progress = Some(reports(0, &[(0, 42), (1, 42)], w.now));
    w.step();
    notice_on_n2(&mut w, true);
    let plan = w.step();
    (w, plan)
}

#[test]
fn a_notice_creates_the_noticed_workers_replacement_beside_it_before_asking_for_the_checkpoint() {
    let (w, plan) = noticed_world();
    let created = World::creates(&plan);
    assert_eq!(created.len(), 1, "{:?}", plan.actions);
    let standby = created[0];
    assert_eq!(standby.metadata.name.as_deref(), Some("train-worker-1-b"));
    let labels = standby.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        (
            labels[LABEL_RANK].as_str(),
            labels[LABEL_ATTEMPT].as_str(),
            labels[LABEL_STANDBY].as_str()
        ),
        ("1", "1", "true")
    );
    let spec = standby.spec.as_ref().expect("spec");
    assert_eq!(spec.hostname.as_deref(), Some("train-worker-1"));
    assert_eq!(env(standby, TRAINYARD_STANDBY).as_deref(), Some("1"));
    assert!(event(&plan, reason::STANDBY_CREATED).is_some());
    assert_eq!(plan.checkpoint_request, None, "the replacement first");
    assert_eq!(plan.restart, None);
    assert!(World::deleted(&plan, false).is_empty());

    // It waits on n-1 (scheduled, its supervisor polls with nothing running): the
    // checkpoint is asked for.
    let (w, plan) = ready(w);
    assert!(
        event(&plan, reason::STANDBY_READY).is_some(),
        "{:?}",
        plan.events
    );
    assert_eq!(plan.checkpoint_request, Some(0));
    assert!(World::creates(&plan).is_empty());

    let (mut w, standby_uid) = switch(w);

    // Rank 0 stops attempt 0; the noticed pod is gone: rank 0 is relabelled, nothing is
    // created, and both supervisors are told to start attempt 1.
    w.supervisor_of("train-worker-0", 0, SupervisedState::Stopped);
    w.supervisor_of("train-worker-1-b", 0, SupervisedState::Stopped);
    w.kubelet_removes_deleted();
    let plan = w.step();
    assert!(World::creates(&plan).is_empty(), "{:?}", plan.actions);
    let start = &plan.supervise.as_ref().expect("supervised").directive.start;
    assert!(start.contains_key(&standby_uid), "{start:?}");
    assert!(start.contains_key(&w.uid_of("train-worker-0")), "{start:?}");
    assert_eq!(plan.status.phase, Some(Phase::Restarting));

    // Both run attempt 1: the job runs, with 1 preemption and nothing else counted.
    w.supervisor_of("train-worker-0", 1, SupervisedState::Running);
    w.supervisor_of("train-worker-1-b", 1, SupervisedState::Running);
    w.advance(2);
    let plan = w.step();
    assert_eq!(plan.status.phase, Some(Phase::Running));
    let last = plan.status.last_restart.as_ref().expect("restart");
    assert_eq!(last.running_after_millis, Some(2000));
    assert_eq!((plan.status.preemptions, plan.status.failures), (1, 0));
    let workers: Vec<&str> = plan.status.workers.iter().map(|x| x.pod.as_str()).collect();
    assert_eq!(workers, ["train-worker-0", "train-worker-1-b"]);
}

/// The standby runs on n-1, its supervisor waiting: returns the round that sees it.
fn ready(mut w: World) -> (World, Plan) {
    w.run_all();
    w.supervisor_of("train-worker-1-b", 0, SupervisedState::Stopped);
    w.advance(3);
    let plan = w.step();
    (w, plan)
}

/// The round after the noticed pod's checkpoint (its standby waiting): the restart deletes
/// the noticed pod alone; rank 0 keeps its pod, the replacement is attempt 1's rank 1, and
/// nothing starts yet. Returns the world and the standby's uid.
fn switch(mut w: World) -> (World, String) {
    let p = w.progress.as_mut().expect("progress");
    p.checkpoint = Some((43, w.now));
    p.checkpoint_saved_on_request = Some(43);
    w.supervisor_of("train-worker-0", 0, SupervisedState::Running);
    w.supervisor_of("train-worker-1-b", 0, SupervisedState::Stopped);
    let plan = w.step();
    assert_eq!(plan.restart, Some(RestartReason::Preemption));
    assert_eq!(World::deleted(&plan, false), ["train-worker-1"]);
    let last = plan.status.last_restart.clone().expect("restart");
    assert_eq!(last.in_place_ranks, "0");
    assert_eq!(last.replaced_ahead_ranks, "1");
    // Created in the notice's round, 3 s before the standby waited and the checkpoint.
    assert_eq!(last.ahead_millis, Some(3000));
    assert_eq!(last.running_after_millis, None);
    // Its GPUs were held for the notice from its scheduling to the switch (3 s).
    assert_eq!(held_for_notice(&w, &plan), 3000);
    let standby_uid = w.uid_of("train-worker-1-b");
    let started = plan.supervise.as_ref().expect("supervised");
    assert!(
        started.directive.start.is_empty(),
        "nothing starts while the old attempt runs"
    );

    (w, standby_uid)
}

#[test]
fn the_next_attempt_starts_once_the_noticed_workers_supervisor_says_it_stopped_not_once_its_pod_is_gone()
 {
    let (w, _) = noticed_world();
    let (mut w, standby_uid) = switch(ready(w).0);
    w.supervisor_of("train-worker-0", 0, SupervisedState::Stopped);

    // The noticed pod is being deleted and its trainer still runs: nothing starts.
    let plan = w.step();
    let start = &plan.supervise.as_ref().expect("supervised").directive.start;
    assert!(start.is_empty(), "{start:?}");

    // Its supervisor says nothing of attempt 0 runs there: attempt 1 starts in the kept pod
    // and the replacement while the noticed pod's teardown goes on.
    w.supervisor_of("train-worker-1", 0, SupervisedState::Stopped);
    let plan = w.step();
    assert!(
        w.pods
            .iter()
            .any(|p| p.metadata.name.as_deref() == Some("train-worker-1")),
        "the noticed pod is still there"
    );
    assert!(World::creates(&plan).is_empty(), "{:?}", plan.actions);
    let start = &plan.supervise.as_ref().expect("supervised").directive.start;
    assert!(start.contains_key(&standby_uid), "{start:?}");
    assert!(start.contains_key(&w.uid_of("train-worker-0")), "{start:?}");
}

#[test]
fn a_noticed_rank_0_is_gone_before_the_next_attempt_starts_whatever_its_supervisor_says() {
    // Rank 0 on n-2 this time: the master's hostname must lead to the new pod alone.
    let mut w = supervised_world("workers: 2\n");
    w.modify("train-worker-0", |p| {
        p.spec.as_mut().expect("spec").node_name = Some("n-2".into());
    });
    w.nodes
        .push(Arc::new(node("n-2").gpus(8).product("Tesla-T4").build()));
    w.progress = Some(reports(0, &[(0, 42), (1, 42)], w.now));
    w.step();
    notice_on_n2(&mut w, true);
    let plan = w.step();
    let created = World::creates(&plan);
    assert_eq!(
        created
            .iter()
            .map(|p| p.metadata.name.as_deref())
            .collect::<Vec<_>>(),
        [Some("train-worker-0-b")]
    );
    w.run_all();
    w.supervisor_of("train-worker-0-b", 0, SupervisedState::Stopped);
    w.advance(3);
    assert_eq!(w.step().checkpoint_request, Some(0));
    let p = w.progress.as_mut().expect("progress");
    p.checkpoint = Some((43, w.now));
    p.checkpoint_saved_on_request = Some(43);
    w.supervisor_of("train-worker-1", 0, SupervisedState::Running);
    let plan = w.step();
    assert_eq!(World::deleted(&plan, false), ["train-worker-0"]);
    w.supervisor_of("train-worker-1", 0, SupervisedState::Stopped);
    w.supervisor_of("train-worker-0", 0, SupervisedState::Stopped);
    let plan = w.step();
    let start = &plan.supervise.as_ref().expect("supervised").directive.start;
    assert!(start.is_empty(), "{start:?}");
    w.kubelet_removes_deleted();
    let plan = w.step();
    let start = &plan.supervise.as_ref().expect("supervised").directive.start;
    assert!(
        start.contains_key(&w.uid_of("train-worker-0-b")),
        "{start:?}"
    );
}

/// The wait is timed on the operator's clock, whatever the API server's says (the standby's
/// `creationTimestamp`): a minute behind, the deadline would pass at once; a minute ahead, a
/// minute late, while the notice runs out.
#[test]
fn the_checkpoint_waits_for_a_warming_replacement_until_it_is_warm_or_the_deadline() {
    let cases = [true, false]
        .into_iter()
        .flat_map(|warm| [0, -60, 60].map(|ahead| (warm, ahead)));
    for (warm_in_time, ahead) in cases {
        let (mut w, _) = noticed_world_with_api_clock(ahead);
        w.run_all();
        w.supervisor_of("train-worker-1-b", 0, SupervisedState::Stopped);
        let standby = w.uid_of("train-worker-1-b");
        w.supervisors
            .iter_mut()
            .for_each(|s| s.warming = s.pod_uid == standby);
        w.advance(3);
        let plan = w.step();
        assert_eq!(
            plan.checkpoint_request, None,
            "it still warms (API server {ahead}s ahead)"
        );
        assert!(event(&plan, reason::STANDBY_READY).is_none());
        if warm_in_time {
            w.supervisor_of("train-worker-1-b", 0, SupervisedState::Stopped);
            w.advance(1);
        } else {
            w.advance(13);
            w.supervisors.iter_mut().for_each(|s| s.seen_at = w.now);
        }
        let plan = w.step();
        let ready = event(&plan, reason::STANDBY_READY)
            .unwrap_or_else(|| panic!("StandbyReady (API server {ahead}s ahead)"));
        assert_eq!(
            ready.note.contains("still warming"),
            !warm_in_time,
            "{}",
            ready.note
        );
        assert_eq!(plan.checkpoint_request, Some(0));
        assert!(
            World::deleted(&plan, false).is_empty(),
            "a warming one joins"
        );
    }
}

#[test]
fn a_replacement_with_no_room_is_given_up_and_the_notice_goes_on_as_without_it() {
    let (mut w, _) = noticed_world();
    w.unplaceable("train-worker-1-b");
    w.advance(5);
    let plan = w.step();
    assert_eq!(
        plan.checkpoint_request, None,
        "waited for until the deadline"
    );
    w.advance(11);
    let plan = w.step();
    let given_up = event(&plan, reason::STANDBY_GIVEN_UP).expect("StandbyGivenUp");
    assert!(
        given_up.note.contains("worker 1: not scheduled (no room)"),
        "{}",
        given_up.note
    );
    assert_eq!(World::deleted(&plan, false), ["train-worker-1-b"]);
    assert_eq!(
        plan.status
            .ledger
            .as_ref()
            .map_or(0, |l| l.spot.held_for_notice + l.on_demand.held_for_notice),
        0,
        "never scheduled, it held nothing"
    );
    assert_eq!(plan.checkpoint_request, Some(0));
    // Not created again while the notice goes on.
    w.kubelet_removes_deleted();
    w.advance(1);
    let plan = w.step();
    assert!(World::creates(&plan).is_empty(), "{:?}", plan.actions);
}

#[test]
fn a_withdrawn_notice_deletes_the_waiting_replacement_and_changes_nothing_else() {
    let (mut w, _) = noticed_world();
    w.run_all();
    w.supervisor_of("train-worker-1-b", 0, SupervisedState::Stopped);
    notice_on_n2(&mut w, false);
    w.advance(2);
    let plan = w.step();
    assert!(
        event(&plan, reason::STANDBY_WITHDRAWN).is_some(),
        "{:?}",
        plan.events
    );
    assert_eq!(World::deleted(&plan, false), ["train-worker-1-b"]);
    assert_eq!(
        held_for_notice(&w, &plan),
        2000,
        "held from its creation to now"
    );
    assert_eq!(plan.checkpoint_request, None);
    assert_eq!(plan.restart, None);
    assert_eq!(plan.status.phase, Some(Phase::Running));
    assert_eq!(plan.status.attempt, 0);

    // Noticed again while that standby is still going: both of rank 1's names are taken, so
    // it restarts as without one, the checkpoint asked for at once.
    notice_on_n2(&mut w, true);
    w.advance(1);
    let plan = w.step();
    assert!(World::creates(&plan).is_empty(), "{:?}", plan.actions);
    assert_eq!(plan.checkpoint_request, Some(0));
}

#[test]
fn without_in_place_restarts_or_with_replace_ahead_off_a_notice_creates_no_replacement_ahead() {
    for policy in ["{inPlace: false}", "{replaceAheadOnNotice: false}"] {
        let spec = format!("workers: 2\nrestartPolicy: {policy}\n");
        let mut w = supervised_world(&spec).with_worker_1_on_n2();
        w.progress = Some(reports(0, &[(0, 42), (1, 42)], w.now));
        w.step();
        notice_on_n2(&mut w, true);
        let plan = w.step();
        assert!(World::creates(&plan).is_empty(), "{policy}");
        assert_eq!(plan.checkpoint_request, Some(0), "{policy}");
    }
}
