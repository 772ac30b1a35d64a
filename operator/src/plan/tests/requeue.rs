//! A gang half placed for `scheduling.placementTimeoutSeconds` lets go of every pod and
//! tries again after a jittered backoff (restart reason `Requeue`), round by round.

use super::*;
use crate::model::reason;
use crate::plan::outcome::{MAX_BACKOFF, MIN_REQUEUE_BACKOFF_SECONDS, requeue_backoff};
use jiff::Timestamp;

const TWO: &str = "workers: 2\ngpusPerWorker: 1\nscheduling: {placementTimeoutSeconds: 60}\n";

/// Rank 0 runs on n-1; rank 1 waits for a node the scheduler cannot give it.
fn half_placed(yaml: &str) -> World {
    let mut w = World::new(yaml);
    assert_eq!(World::creates(&w.step()).len(), 2);
    w.run_all();
    w.unplaceable("train-worker-1");
    w
}

#[test]
fn a_half_placed_gang_releases_every_pod_after_the_placement_timeout() {
    let mut w = half_placed(TWO);
    let created = w.now;

    // Within the timeout it waits, and looks again when the timeout ends.
    w.advance(30);
    let plan = w.step();
    assert_eq!(plan.restart, None);
    assert_eq!(World::deletes(&plan), 0);
    assert_eq!(plan.status.waiting_for.as_deref(), Some("Capacity"));
    let due = created + SignedDuration::from_secs(60);
    assert!(
        plan.requeue_at.is_some_and(|at| at <= due),
        "{:?}",
        plan.requeue_at
    );

    // Past it: every pod goes, the running one too, and no budget is spent.
    w.advance(31);
    let plan = w.step();
    assert_eq!(plan.decided_by, PhaseName::Requeue);
    assert_eq!(plan.restart, Some(RestartReason::Requeue));
    let mut deleted = World::deleted(&plan, false);
    deleted.sort_unstable();
    assert_eq!(deleted, ["train-worker-0", "train-worker-1"]);
    let st = &plan.status;
    assert_eq!(
        (
            st.attempt,
            st.requeues,
            st.preemptions,
            st.failures,
            st.hangs
        ),
        (1, 1, 0, 0, 0),
        "a requeue counts against no budget"
    );
    let last = st.last_restart.as_ref().expect("lastRestart");
    assert_eq!(last.reason, RestartReason::Requeue);
    assert_eq!(last.in_place_ranks, "", "a requeue keeps no pod");
    assert!(
        last.detail
            .contains("worker(s) 1 could not be placed for 60s")
            && last.detail.contains("worker(s) 0 held their nodes"),
        "{}",
        last.detail
    );
    let event = plan
        .events
        .iter()
        .find(|e| e.reason == reason::REQUEUED)
        .expect("a Requeued Event");
    let backoff = requeue_backoff(10, 1, &w.job.uid);
    assert!(
        event
            .note
            .contains(&format!("after a {}s backoff", backoff.as_secs())),
        "{}",
        event.note
    );
    // The ledger counts the wait for the next try as waiting for nodes.
    let open = st
        .ledger
        .as_ref()
        .and_then(|l| l.open.as_ref())
        .expect("open");
    assert_eq!(open.use_, crate::model::crd::StretchUse::Pending);
}

#[test]
fn a_released_gang_waits_out_its_backoff_then_is_created_again_and_runs() {
    let mut w = half_placed(TWO);
    w.advance(61);
    assert_eq!(w.step().restart, Some(RestartReason::Requeue));
    let backoff = requeue_backoff(10, 1, &w.job.uid);

    // The pods gone, the backoff holds the next try back.
    w.kubelet_removes_deleted();
    let plan = w.step();
    assert_eq!(plan.decided_by, PhaseName::Backoff);
    assert!(World::creates(&plan).is_empty());
    assert_eq!(plan.status.waiting_for.as_deref(), Some("Requeue"));
    let ready = w.now + backoff;
    assert_eq!(plan.requeue_at, Some(ready));

    // Then both ranks are created again, and an Event says it is the retry.
    w.now = ready;
    let plan = w.step();
    assert_eq!(World::creates(&plan).len(), 2);
    assert!(
        plan.events
            .iter()
            .any(|e| e.reason == reason::RETRYING && e.note.contains("attempt 1 (requeue 1)")),
        "{:?}",
        plan.events
    );

    // This time both are placed: the job runs, still without a budget spent.
    w.run_all();
    let plan = w.step();
    assert_eq!(plan.status.phase, Some(Phase::Running));
    assert_eq!(plan.status.waiting_for, None);
    assert_eq!((plan.status.preemptions, plan.status.failures), (0, 0));
    let ledger = plan.status.ledger.as_ref().expect("ledger");
    assert!(ledger.on_demand.pending > 0 || ledger.spot.pending > 0);
    assert_eq!(
        (
            ledger.on_demand.lost_to_restart,
            ledger.spot.lost_to_restart
        ),
        (0, 0),
        "no restart lost anything: {ledger:?}"
    );
}

/// The timeout of an attempt after a requeue runs from the end of its backoff, not from the
/// requeue: the pods did not exist before.
#[test]
fn the_next_try_gets_the_whole_timeout_after_its_backoff() {
    let mut w = half_placed(TWO);
    w.advance(61);
    assert_eq!(w.step().restart, Some(RestartReason::Requeue));
    w.kubelet_removes_deleted();
    let ready = restart_ready(&w);
    w.now = ready;
    assert_eq!(World::creates(&w.step()).len(), 2);
    w.run_all();
    w.unplaceable("train-worker-1");
    w.advance(59);
    assert_eq!(w.step().restart, None, "59 s of the 60 after the backoff");
    w.advance(2);
    let plan = w.step();
    assert_eq!(plan.restart, Some(RestartReason::Requeue));
    assert_eq!(plan.status.requeues, 2);
    // The second backoff is the doubled base, with its own jitter.
    let second = requeue_backoff(10, 2, &w.job.uid);
    assert!(second >= SignedDuration::from_secs(20) && second < SignedDuration::from_secs(40));
}

fn restart_ready(w: &World) -> Timestamp {
    let last = w.status.last_restart.as_ref().expect("lastRestart");
    last.time.0 + requeue_backoff(10, w.status.requeues, &w.job.uid)
}

/// Nothing placed holds nothing: pods that all wait are told in the Unschedulable condition
/// and left for an autoscaler, however long.
#[test]
fn a_gang_with_nothing_placed_is_never_requeued() {
    let mut w = World::new(TWO);
    w.step();
    w.unplaceable("train-worker-0");
    w.unplaceable("train-worker-1");
    w.advance(3600);
    let plan = w.step();
    assert_eq!(plan.restart, None);
    assert_eq!(World::deletes(&plan), 0);
    assert!(condition_is_true(
        &plan.status.conditions,
        condition::UNSCHEDULABLE
    ));
}

/// An elastic job that can train with the placed workers shrinks to them when its own wait
/// ends; the placement timeout does not release it first.
#[test]
fn an_elastic_job_that_can_shrink_shrinks_instead_of_being_requeued() {
    let yaml = "workers: 2\ngpusPerWorker: 1\nscheduling: {placementTimeoutSeconds: 60}\n\
                elastic: {minWorkers: 1, replacementWaitSeconds: 120}\n";
    let mut w = half_placed(yaml);
    w.advance(90);
    let plan = w.step();
    assert_eq!(plan.restart, None, "past the timeout, within the wait");
    w.advance(31);
    let plan = w.step();
    assert_eq!(plan.restart, Some(RestartReason::Shrink));
    assert_eq!(plan.status.requeues, 0);
}

/// One below `minWorkers` placed cannot shrink: the half-placed gang is released.
#[test]
fn an_elastic_job_below_its_minimum_is_requeued() {
    let yaml = "workers: 2\ngpusPerWorker: 1\nscheduling: {placementTimeoutSeconds: 60}\n\
                elastic: {minWorkers: 2, replacementWaitSeconds: 30}\n";
    let mut w = half_placed(yaml);
    w.advance(61);
    let plan = w.step();
    assert_eq!(plan.restart, Some(RestartReason::Requeue));
}

#[test]
fn the_requeue_backoff_doubles_with_a_jitter_the_job_decides() {
    let base = SignedDuration::from_secs(i64::from(MIN_REQUEUE_BACKOFF_SECONDS));
    let uids: Vec<String> = (0..50).map(|i| format!("uid-{i}")).collect();
    let first: Vec<SignedDuration> = uids.iter().map(|u| requeue_backoff(0, 1, u)).collect();
    assert!(
        first.iter().all(|b| *b >= base && *b < base * 2),
        "{first:?}"
    );
    let distinct: std::collections::BTreeSet<_> = first.iter().collect();
    assert!(
        distinct.len() > 25,
        "jitter spreads jobs apart: {distinct:?}"
    );
    // The same job and count: the same delay, whichever replica computes it.
    assert_eq!(
        requeue_backoff(0, 1, "uid-7"),
        requeue_backoff(0, 1, "uid-7")
    );
    // A larger base is kept; the count doubles it, up to the cap (plus its jitter).
    let b = requeue_backoff(30, 3, "uid-1");
    assert!(b >= SignedDuration::from_secs(120) && b < SignedDuration::from_secs(240));
    let capped = requeue_backoff(30, 40, "uid-1");
    assert!(
        capped >= MAX_BACKOFF && capped < MAX_BACKOFF * 2,
        "{capped:?}"
    );
}
