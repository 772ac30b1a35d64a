//! Early warnings (a rebalance recommendation): a replacement waits elsewhere, and the gang
//! moves to it at the trainers' next checkpoint, not at once.

use super::in_place::supervised_world;
use super::*;
use crate::model::supervision::SupervisedState;
use trainyard_api::spot::EARLY_WARNING_TAINTS;

/// Node n-2 with the early warning on (or off), or with a termination notice beside it.
fn warning_on_n2(w: &mut World, warned: bool, noticed: bool) {
    let mut n2 = node("n-2").gpus(8).product("Tesla-T4");
    if warned {
        n2 = n2.taint(EARLY_WARNING_TAINTS[0]);
    }
    if noticed {
        n2 = n2.taint(trainyard_api::spot::KARPENTER_DISRUPTED);
    }
    w.replace_node(n2.build());
}

/// A two-worker job restarting in place, rank 1 on n-2, both ranks reporting and a checkpoint
/// at step 40 saved before; then an early warning on n-2: returns the round that saw it.
fn warned_world() -> (World, Plan) {
    warned_world_with_api_clock(0)
}

/// [`warned_world`] with the API server's clock `ahead` seconds ahead of the operator's.
fn warned_world_with_api_clock(ahead: i64) -> (World, Plan) {
    let mut w = supervised_world("workers: 2\ngpusPerWorker: 2\n").with_worker_1_on_n2();
    w.api_clock_ahead = jiff::SignedDuration::from_secs(ahead);
    let mut p = reports(0, &[(0, 42), (1, 42)], w.now);
    p.checkpoint = Some((40, w.now));
    w.progress = Some(p);
    w.step();
    w.advance(1);
    warning_on_n2(&mut w, true, false);
    let plan = w.step();
    (w, plan)
}

/// The standby created for the warning runs on n-1, its supervisor waiting.
fn standby_waits(w: &mut World) -> Plan {
    w.run_all();
    w.supervisor_of("train-worker-1-b", 0, SupervisedState::Stopped);
    w.advance(2);
    w.step()
}

#[test]
fn an_early_warning_moves_the_worker_to_its_replacement_at_the_next_checkpoint_not_at_once() {
    let (mut w, plan) = warned_world();
    let created = World::creates(&plan);
    assert_eq!(
        created
            .iter()
            .map(|p| p.metadata.name.as_deref())
            .collect::<Vec<_>>(),
        [Some("train-worker-1-b")]
    );
    let told = event(&plan, reason::STANDBY_CREATED).expect("StandbyCreated");
    assert!(told.note.contains("early warning"), "{}", told.note);
    assert_eq!(plan.checkpoint_request, None);

    // It waits, warm: no checkpoint is asked for, nothing restarts, and the checkpoint saved
    // before the warning does not count.
    let plan = standby_waits(&mut w);
    assert_eq!(plan.checkpoint_request, None, "the node is not going yet");
    assert_eq!(plan.restart, None);
    assert!(event(&plan, reason::STANDBY_READY).is_none());
    w.advance(30);
    w.supervisors.iter_mut().for_each(|s| s.seen_at = w.now);
    let plan = w.step();
    assert_eq!((plan.restart, plan.checkpoint_request), (None, None));
    assert!(
        World::deleted(&plan, false).is_empty(),
        "{:?}",
        plan.actions
    );

    // The trainers' next periodic checkpoint: the gang moves, rank 1 to its replacement,
    // rank 0 in place.
    w.progress.as_mut().expect("progress").checkpoint = Some((45, w.now));
    let plan = w.step();
    assert_eq!(plan.restart, Some(RestartReason::Preemption));
    assert_eq!(World::deleted(&plan, false), ["train-worker-1"]);
    let last = plan.status.last_restart.clone().expect("restart");
    assert_eq!(last.in_place_ranks, "0");
    assert_eq!(last.replaced_ahead_ranks, "1");
    assert!(
        last.detail.contains("early warning")
            && last
                .detail
                .contains("moved at the trainers' checkpoint at step 45"),
        "{}",
        last.detail
    );
    assert_eq!(plan.checkpoint_request, None, "no checkpoint asked for");
}

/// The checkpoint that moves the gang is the first after the replacement was created on the
/// operator's clock, whatever the API server's says (the replacement's `creationTimestamp`):
/// a minute behind, the checkpoint saved before the warning would look later and move the
/// gang at once, losing the steps since; a minute ahead, the next checkpoint would look
/// earlier and the move would wait for one a minute on.
#[test]
fn an_early_warning_moves_at_the_next_checkpoint_whatever_the_api_servers_clock() {
    for ahead in [-60, 60] {
        let (mut w, _) = warned_world_with_api_clock(ahead);
        let plan = standby_waits(&mut w);
        assert_eq!(plan.restart, None, "API server {ahead}s ahead: {plan:?}");
        w.advance(5);
        w.supervisors.iter_mut().for_each(|s| s.seen_at = w.now);
        let plan = w.step();
        assert_eq!(plan.restart, None, "API server {ahead}s ahead");

        w.progress.as_mut().expect("progress").checkpoint = Some((45, w.now));
        let plan = w.step();
        assert_eq!(
            plan.restart,
            Some(RestartReason::Preemption),
            "API server {ahead}s ahead"
        );
        assert_eq!(World::deleted(&plan, false), ["train-worker-1"]);
    }
}

#[test]
fn a_withdrawn_early_warning_deletes_the_replacement_and_the_gang_trains_on() {
    let (mut w, _) = warned_world();
    standby_waits(&mut w);
    warning_on_n2(&mut w, false, false);
    w.advance(1);
    let plan = w.step();
    assert!(
        event(&plan, reason::STANDBY_WITHDRAWN).is_some(),
        "{:?}",
        plan.events
    );
    assert_eq!(World::deleted(&plan, false), ["train-worker-1-b"]);
    assert_eq!((plan.restart, plan.checkpoint_request), (None, None));
    assert_eq!(plan.status.attempt, 0);
}

#[test]
fn an_early_warning_that_becomes_a_notice_asks_for_the_checkpoint_at_once_with_its_replacement() {
    let (mut w, _) = warned_world();
    standby_waits(&mut w);
    warning_on_n2(&mut w, true, true);
    w.advance(1);
    let plan = w.step();
    assert!(World::creates(&plan).is_empty(), "{:?}", plan.actions);
    assert_eq!(plan.checkpoint_request, Some(0));
    assert!(
        World::deleted(&plan, false).is_empty(),
        "{:?}",
        plan.actions
    );
}

#[test]
fn an_early_warning_with_no_room_keeps_the_replacement_pending_and_moves_nothing() {
    let (mut w, _) = warned_world();
    w.unplaceable("train-worker-1-b");
    w.advance(60);
    w.progress.as_mut().expect("progress").checkpoint = Some((45, w.now));
    let plan = w.step();
    // No deadline: the node is not going yet, and a pending pod holds no GPU.
    assert!(
        event(&plan, reason::STANDBY_GIVEN_UP).is_none(),
        "{:?}",
        plan.events
    );
    assert!(plan.actions.is_empty(), "{:?}", plan.actions);
    assert_eq!((plan.restart, plan.checkpoint_request), (None, None));
    assert_eq!(plan.status.attempt, 0);
    // The notice comes: the replacement is given up at once, and the checkpoint asked for.
    warning_on_n2(&mut w, true, true);
    w.advance(1);
    let plan = w.step();
    assert!(
        event(&plan, reason::STANDBY_GIVEN_UP).is_some(),
        "{:?}",
        plan.events
    );
    assert_eq!(World::deleted(&plan, false), ["train-worker-1-b"]);
    assert_eq!(plan.checkpoint_request, Some(0));
}

#[test]
fn with_replace_ahead_off_an_early_warning_creates_nothing_and_restarts_nothing() {
    // Make before break off: no replacement, and the warned worker trains on where it is.
    let mut w = supervised_world("workers: 2\nrestartPolicy: {replaceAheadOnNotice: false}\n")
        .with_worker_1_on_n2();
    w.progress = Some(reports(0, &[(0, 42), (1, 42)], w.now));
    w.step();
    warning_on_n2(&mut w, true, false);
    let plan = w.step();
    assert!(World::creates(&plan).is_empty(), "{:?}", plan.actions);
    assert_eq!((plan.restart, plan.checkpoint_request), (None, None));
}
