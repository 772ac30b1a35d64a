//! In-place gang restarts (`restartPolicy.inPlace`), round by round.

use super::*;
use crate::config::ProgressChannel;
use crate::model::supervision::{Directive, SupervisedState, SupervisorSeen};
use trainyard_api::env::{PET_RDZV_ID, TRAINYARD_FENCE_TOKEN};

const IN_PLACE: &str = "workers: 2\nrestartPolicy: {inPlace: true}\n";

pub(super) fn channel() -> ProgressChannel {
    ProgressChannel {
        url: "http://trainyard-progress.trainyard:8082/v1/progress".into(),
        audience: "trainyard.dev/progress".into(),
        seal: crate::model::seal::SealKey::default(),
    }
}

/// A running two-worker job with in-place restarts, whose supervisors poll.
pub(super) fn supervised_world(yaml: &str) -> World {
    let mut w = World::new(yaml);
    w.config.progress_channel = Some(channel());
    w.step();
    w.run_all();
    w.step();
    assert_eq!(w.status.phase, Some(Phase::Running));
    for rank in 0..2 {
        w.supervisor(rank, 0, SupervisedState::Running);
    }
    w
}

impl World {
    /// The supervisors of ranks 0 and 1 say the same.
    fn supervisors_0_and_1(&mut self, attempt: u32, state: SupervisedState) {
        self.supervisor(0, attempt, state);
        self.supervisor(1, attempt, state);
    }

    fn uid(&self, rank: u32) -> String {
        let name = self.job.pod_name(rank);
        self.pods
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(&name))
            .and_then(|p| p.metadata.uid.clone())
            .expect("pod")
    }

    /// The supervisor of rank `rank`'s pod says it runs (or ran) `attempt` as `state`, now;
    /// as the board does, `since` stays when neither changed.
    fn supervisor(&mut self, rank: u32, attempt: u32, state: SupervisedState) {
        self.supervisor_of(&self.job.pod_name(rank), attempt, state);
    }

    /// The supervisor of pod `name` says it runs (or ran) `attempt` as `state`, now; as the
    /// board does, `since` stays when neither changed.
    pub(super) fn supervisor_of(&mut self, name: &str, attempt: u32, state: SupervisedState) {
        let pod = self
            .pods
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(name))
            .expect("pod");
        let uid = pod.metadata.uid.clone().expect("uid");
        let rank = crate::build::pods::label_u32(pod.as_ref(), crate::model::crd::LABEL_RANK)
            .expect("rank");
        let since = self
            .supervisors
            .iter()
            .find(|s| s.pod_uid == uid && s.attempt == attempt && s.state == state)
            .map_or(self.now, |s| s.since);
        self.supervisors.retain(|s| s.pod_uid != uid);
        self.supervisors.push(SupervisorSeen {
            pod_uid: uid,
            rank,
            attempt,
            state,
            seen_at: self.now,
            since,
            warming: false,
        });
    }
}

fn directive(plan: &Plan) -> &Directive {
    &plan.supervise.as_ref().expect("supervised").directive
}

fn relabels(plan: &Plan) -> Vec<(&str, u32)> {
    plan.actions
        .iter()
        .filter_map(|a| match a {
            Action::RelabelPod { name, attempt, .. } => Some((name.as_str(), *attempt)),
            _ => None,
        })
        .collect()
}

fn env_of(vars: &[(String, String)], key: &str) -> Option<String> {
    vars.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
}

#[test]
fn a_preemption_keeps_the_survivors_pod_and_recreates_only_the_preempted_one() {
    let mut w = supervised_world(IN_PLACE);
    let kept_uid = w.uid(0);
    w.preempt("train-worker-1");
    let plan = w.step();
    assert_eq!(plan.restart, Some(RestartReason::Preemption));
    let last = plan.status.last_restart.clone().expect("restart");
    assert_eq!(last.in_place_ranks, "0");
    assert_eq!(World::deleted(&plan, false), ["train-worker-1"]);
    let said = event(&plan, reason::RESTARTING_IN_PLACE)
        .expect("event")
        .note
        .clone();
    assert!(said.contains("worker(s) 0 keep their pods"), "{said}");
    assert!(said.contains("worker 1: it was preempted"), "{said}");
    // The survivor is told to stop attempt 0; nobody may start attempt 1 yet.
    assert_eq!(directive(&plan).attempt, 1);
    assert!(directive(&plan).start.is_empty());

    // The preempted pod is gone, but the survivor still runs attempt 0: nothing starts.
    w.kubelet_removes_deleted();
    let plan = w.step();
    assert!(World::creates(&plan).is_empty(), "{:?}", plan.actions);
    assert!(relabels(&plan).is_empty());
    assert!(directive(&plan).start.is_empty());

    // Its supervisor stopped attempt 0: the kept pod moves to attempt 1, rank 1 is created,
    // and the supervisor may start attempt 1 with the environment of attempt 1.
    w.supervisor(0, 0, SupervisedState::Stopped);
    let plan = w.step();
    assert_eq!(relabels(&plan), [("train-worker-0", 1)]);
    let created: Vec<_> = World::creates(&plan)
        .iter()
        .map(|p| p.metadata.name.clone().unwrap_or_default())
        .collect();
    assert_eq!(created, ["train-worker-1"]);
    let start = directive(&plan)
        .start
        .get(&kept_uid)
        .expect("told to start");
    assert_eq!(env_of(start, TRAINYARD_ATTEMPT).as_deref(), Some("1"));
    assert_eq!(
        env_of(start, TRAINYARD_RESTART_REASON).as_deref(),
        Some("Preemption")
    );
    assert!(env_of(start, RESUME_FROM).is_some());
    assert!(env_of(start, TRAINYARD_FENCE_TOKEN).is_some_and(|t| t.contains(":1:")));
    assert!(env_of(start, PET_RDZV_ID).is_some_and(|t| t.ends_with("-1")));
    let created_env = env(World::creates(&plan)[0], TRAINYARD_ATTEMPT);
    assert_eq!(created_env.as_deref(), Some("1"));

    // Both pods run; the job is Running once the kept supervisor runs attempt 1.
    w.run_all();
    let plan = w.step();
    assert_eq!(plan.status.phase, Some(Phase::Restarting));
    w.supervisor(0, 1, SupervisedState::Running);
    let plan = w.step();
    assert_eq!(plan.status.phase, Some(Phase::Running));
    assert_eq!(plan.status.attempt, 1);
    assert_eq!(w.uid(0), kept_uid, "the survivor's pod was never replaced");
}

#[test]
fn a_failure_its_supervisor_reports_restarts_the_whole_gang_in_place_without_a_pod_written() {
    let mut w = supervised_world(IN_PLACE);
    let uids = (w.uid(0), w.uid(1));
    // Rank 1's trainer exits 1; its supervisor holds the container and says so.
    w.supervisor(1, 0, SupervisedState::Exited(1));
    let plan = w.step();
    assert_eq!(plan.restart, Some(RestartReason::Failure));
    assert_eq!(plan.status.failures, 1);
    let last = plan.status.last_restart.clone().expect("restart");
    assert_eq!(last.in_place_ranks, "0-1", "{last:?}");
    assert!(plan.actions.is_empty(), "{:?}", plan.actions);
    // Rank 0 still runs attempt 0: told to stop. Rank 1 has nothing left to stop.
    w.supervisor(0, 0, SupervisedState::Stopped);
    // The backoff (10 s) holds the start.
    let plan = w.step();
    assert!(relabels(&plan).is_empty());
    assert!(directive(&plan).start.is_empty());
    w.advance(11);
    w.supervisor(0, 0, SupervisedState::Stopped);
    w.supervisor(1, 0, SupervisedState::Exited(1));
    let plan = w.step();
    assert_eq!(
        relabels(&plan),
        [("train-worker-0", 1), ("train-worker-1", 1)]
    );
    assert!(World::creates(&plan).is_empty());
    assert_eq!(directive(&plan).start.len(), 2);
    w.supervisor(0, 1, SupervisedState::Running);
    w.supervisor(1, 1, SupervisedState::Running);
    let plan = w.step();
    assert_eq!(plan.status.phase, Some(Phase::Running));
    assert_eq!((w.uid(0), w.uid(1)), uids, "no pod was replaced");
}

#[test]
fn a_kept_pod_whose_supervisor_does_not_stop_in_time_is_replaced_with_an_event() {
    let mut w = supervised_world(IN_PLACE);
    w.preempt("train-worker-1");
    w.step();
    w.kubelet_removes_deleted();
    // The supervisor keeps polling but never stops its trainer: past the grace period (60 s)
    // and the margin, the pod is replaced.
    w.advance(30);
    w.supervisor(0, 0, SupervisedState::Running);
    let plan = w.step();
    assert!(event(&plan, reason::IN_PLACE_FALLBACK).is_none());
    w.advance(45);
    w.supervisor(0, 0, SupervisedState::Running);
    let plan = w.step();
    let said = event(&plan, reason::IN_PLACE_FALLBACK)
        .expect("fallback")
        .note
        .clone();
    assert!(said.contains("did not stop attempt 0"), "{said}");
    assert_eq!(World::deleted(&plan, false), ["train-worker-0"]);
    assert!(
        plan.status
            .last_restart
            .expect("restart")
            .in_place_ranks
            .is_empty()
    );
    // From here it is an ordinary restart: once the pod is gone both ranks are created.
    w.kubelet_removes_deleted();
    let plan = w.step();
    assert_eq!(World::creates(&plan).len(), 2);
}

#[test]
fn a_pod_whose_supervisor_went_quiet_or_never_polled_is_not_kept() {
    let mut w = supervised_world(IN_PLACE);
    // Rank 1's supervisor last polled 20 s ago; rank 0's is current.
    w.advance(20);
    w.supervisor(0, 0, SupervisedState::Running);
    w.preempt("train-worker-1");
    let plan = w.step();
    assert_eq!(kept_ranks(&plan), "0");

    // A job whose pods run no supervisor restarts as without inPlace.
    let mut w = supervised_world(IN_PLACE);
    w.supervisors.clear();
    w.preempt("train-worker-1");
    let plan = w.step();
    assert!(
        plan.status
            .last_restart
            .clone()
            .expect("restart")
            .in_place_ranks
            .is_empty()
    );
    assert_eq!(
        World::deleted(&plan, false),
        ["train-worker-0", "train-worker-1"]
    );
    assert!(event(&plan, reason::RESTARTING_IN_PLACE).is_none());
    // ... and says so, naming why each worker was not kept.
    let fallback = event(&plan, reason::IN_PLACE_FALLBACK).expect("InPlaceFallback");
    assert!(
        fallback
            .note
            .contains("no worker restarts in place, every pod is created again")
            && fallback
                .note
                .contains("worker 0: no supervisor polled for this attempt")
            && fallback.note.contains("worker 1: it was preempted"),
        "{}",
        fallback.note
    );
}

#[test]
fn with_in_place_off_supervisors_change_nothing_and_are_told_nothing() {
    let mut w = supervised_world("workers: 2\nrestartPolicy: {inPlace: false}\n");
    w.preempt("train-worker-1");
    let plan = w.step();
    assert!(plan.supervise.is_none());
    assert!(
        plan.status
            .last_restart
            .clone()
            .expect("restart")
            .in_place_ranks
            .is_empty()
    );
    assert_eq!(
        World::deleted(&plan, false),
        ["train-worker-0", "train-worker-1"]
    );
    assert!(
        event(&plan, reason::IN_PLACE_FALLBACK).is_none()
            && event(&plan, reason::RESTARTING_IN_PLACE).is_none(),
        "a job that did not ask for in-place restarts hears nothing of them"
    );
}

#[test]
fn pods_of_in_place_jobs_point_their_supervisor_at_the_channel() {
    let mut w = World::new(IN_PLACE);
    w.config.progress_channel = Some(channel());
    let plan = w.step();
    let pod = World::creates(&plan)[0];
    assert_eq!(
        env(pod, trainyard_api::env::TRAINYARD_SUPERVISOR_URL).as_deref(),
        Some("http://trainyard-progress.trainyard:8082/v1/supervisor")
    );
    assert_eq!(
        env(pod, trainyard_api::env::TRAINYARD_STOP_GRACE_SECONDS).as_deref(),
        Some("60"),
        "the pod's grace period"
    );
    // Unset, inPlace is on; set to false, the supervisor is not pointed anywhere.
    for (yaml, url) in [
        ("workers: 2\n", true),
        ("workers: 2\nrestartPolicy: {inPlace: false}\n", false),
    ] {
        let mut w = World::new(yaml);
        w.config.progress_channel = Some(channel());
        let plan = w.step();
        let set = env(
            World::creates(&plan)[0],
            trainyard_api::env::TRAINYARD_SUPERVISOR_URL,
        );
        assert_eq!(set.is_some(), url, "{yaml}");
    }
}

fn kept_ranks(plan: &Plan) -> String {
    plan.status
        .last_restart
        .clone()
        .expect("restart")
        .in_place_ranks
}

#[test]
fn a_job_that_leaves_in_place_unset_restarts_in_place_where_supervisors_poll() {
    let mut w = supervised_world("workers: 2\n");
    w.preempt("train-worker-1");
    let plan = w.step();
    assert_eq!(kept_ranks(&plan), "0");
    assert!(event(&plan, reason::RESTARTING_IN_PLACE).is_some());
}

/// The round in which worker 1 of a running two-worker job of `yaml` whose pods run no
/// supervisor is preempted.
fn preempted_without_a_supervisor(yaml: &str) -> Plan {
    let mut w = World::new(yaml);
    w.config.progress_channel = Some(channel());
    w.step();
    w.run_all();
    w.step();
    w.preempt("train-worker-1");
    w.step()
}

#[test]
fn a_job_that_leaves_in_place_unset_without_a_supervisor_recreates_its_pods_without_a_warning() {
    let plan = preempted_without_a_supervisor("workers: 2\n");
    assert_eq!(
        World::deleted(&plan, false),
        ["train-worker-0", "train-worker-1"]
    );
    assert!(
        event(&plan, reason::IN_PLACE_FALLBACK).is_none(),
        "{:?}",
        plan.events
    );
    // Asked for explicitly, the same restart warns that it could not keep a pod.
    let plan = preempted_without_a_supervisor(IN_PLACE);
    assert!(event(&plan, reason::IN_PLACE_FALLBACK).is_some());
}

#[test]
fn a_finished_job_tells_its_supervisors_to_exit() {
    let mut w = supervised_world("workers: 2\nrestartPolicy: {inPlace: true, maxFailures: 0}\n");
    w.supervisor(1, 0, SupervisedState::Exited(3));
    let plan = w.step();
    assert_eq!(plan.status.phase, Some(Phase::Failed));
    assert!(directive(&plan).exit);
}

/// An exit its supervisor reports is judged by the lost-peer rule from when the operator heard
/// of it: the pod, kept running, shows no end of its own, and its start (long past) would close
/// the window at once and count a lost peer's broken collective as a failure.
#[test]
fn a_reported_exit_holds_the_lost_peer_verdict_from_when_it_was_heard() {
    let mut w = supervised_world("workers: 2\nrestartPolicy: {inPlace: true, maxFailures: 3}\n")
        .with_worker_1_on_n2();
    w.config.lost_peer_window_seconds = 30;
    w.advance(120);
    let poll = |w: &mut World| {
        w.supervisor(1, 0, SupervisedState::Running);
        w.supervisor(0, 0, SupervisedState::Exited(1));
    };
    poll(&mut w);
    let held = w.step();
    assert_eq!(held.restart, None, "held: worker 1's node may be lost");
    w.advance(29);
    poll(&mut w);
    assert_eq!(w.step().restart, None, "still within the window");
    w.advance(1);
    poll(&mut w);
    let plan = w.step();
    assert_eq!(plan.restart, Some(RestartReason::Failure));
    assert_eq!((plan.status.failures, plan.status.preemptions), (1, 0));
}

/// A job restarting in place with rank 1 on n-2, five minutes into its attempt (so the pods'
/// start is long past any lost-peer window), both ranks reporting, both supervisors polling,
/// both kubelets renewing on time for the last minute.
fn supervised_on_two_nodes() -> (World, Channel) {
    let mut w =
        World::running_world("workers: 2\nrestartPolicy: {inPlace: true, maxFailures: 3}\n")
            .with_worker_1_on_n2();
    w.config.progress_channel = Some(channel());
    w.advance(300);
    w.watched_a_quiet_minute(&["n-1", "n-2"]);
    let reports = Channel::new();
    w.heartbeat("n-1");
    w.heartbeat("n-2");
    reports.report(&mut w, 0, 40, None);
    reports.report(&mut w, 1, 40, None);
    for rank in 0..2 {
        w.supervisor(rank, 0, SupervisedState::Running);
    }
    reports.step(&mut w);
    (w, reports)
}

/// The chaos run's case: n-2 vanishes, rank 0's collective breaks and its trainer exits under
/// its supervisor, which keeps the container running. When n-2 falls silent the lost-peer rule
/// makes it one preemption (not a failure), and rank 0 keeps its pod.
#[test]
fn a_reported_exit_beside_a_node_that_falls_silent_is_a_preemption() {
    let (mut w, reports) = supervised_on_two_nodes();
    w.advance(1);
    w.supervisor(0, 0, SupervisedState::Exited(1));
    assert_eq!(
        reports.step(&mut w).restart,
        None,
        "held until n-2 is known lost"
    );
    w.advance(9);
    w.heartbeat("n-1");
    w.supervisor(0, 0, SupervisedState::Exited(1));
    assert_eq!(reports.step(&mut w).restart, None, "n-2 is due now");
    w.advance(4);
    w.heartbeat("n-1");
    w.supervisor(0, 0, SupervisedState::Exited(1));
    let plan = reports.step(&mut w);
    assert_eq!(plan.restart, Some(RestartReason::Preemption));
    assert_eq!((plan.status.failures, plan.status.preemptions), (0, 1));
    let last = plan.status.last_restart.as_ref().expect("restart");
    assert!(
        last.detail.contains("worker 1 lost with its node")
            && last.detail.contains("worker 0 failed"),
        "{}",
        last.detail
    );
    assert_eq!(last.in_place_ranks, "0");
}

/// Noise beside a genuine failure: rank 0's trainer exits under its supervisor while n-2's
/// renewal, due at 10 s, comes 2.5 s late. The verdict waits for the renewal, never takes n-2
/// for lost, and the failure spends the failure budget.
#[test]
fn a_reported_exit_beside_a_late_lease_is_a_failure() {
    let (mut w, reports) = supervised_on_two_nodes();
    let start = w.now;
    let at = |tenths: i64| {
        start
            .saturating_add(SignedDuration::from_millis(tenths * 100))
            .expect("time")
    };
    w.now = at(20);
    w.supervisor(0, 0, SupervisedState::Exited(1));
    for tenth in 21..125 {
        w.now = at(tenth);
        if tenth == 100 {
            w.heartbeat("n-1");
        }
        w.supervisor(0, 0, SupervisedState::Exited(1));
        let plan = reports.step(&mut w);
        assert_eq!(
            plan.restart, None,
            "at {tenth}: {:?}",
            plan.status.last_restart
        );
        assert!(!World::deleted(&plan, true).contains(&"train-worker-1"));
    }
    w.now = at(125);
    w.heartbeat("n-2");
    w.supervisor(0, 0, SupervisedState::Exited(1));
    let plan = reports.step(&mut w);
    assert_eq!(
        plan.restart,
        Some(RestartReason::Failure),
        "{:?}",
        plan.status.last_restart
    );
    assert_eq!((plan.status.failures, plan.status.preemptions), (1, 0));
}

#[test]
fn an_elastic_gang_shrinks_in_place_keeping_the_placed_workers_pods() {
    let mut w = World::new(
        "workers: 4\ngpusPerWorker: 4\nelastic: {minWorkers: 2, replacementWaitSeconds: 60}\n\
         restartPolicy: {inPlace: true}\n",
    );
    w.config.progress_channel = Some(channel());
    w.step();
    let mut w = w.with_ranks_2_and_3_on_n2();
    w.run_all();
    w.step();
    for rank in 0..4 {
        w.supervisor(rank, 0, SupervisedState::Running);
    }
    let uids = (w.uid(0), w.uid(1));
    // n-2 goes with ranks 2 and 3: 0 and 1 restart in place, 2 and 3 are created again.
    w.preempt("train-worker-2");
    w.preempt("train-worker-3");
    let plan = w.step();
    assert_eq!(
        plan.status.last_restart.expect("restart").in_place_ranks,
        "0-1"
    );
    w.nodes
        .retain(|n| n.metadata.name.as_deref() != Some("n-2"));
    w.kubelet_removes_deleted();
    w.supervisors_0_and_1(0, SupervisedState::Stopped);
    let plan = w.step();
    assert_eq!(World::creates(&plan).len(), 2);
    w.unplaceable("train-worker-2");
    w.unplaceable("train-worker-3");
    w.supervisors_0_and_1(1, SupervisedState::Running);
    w.step();

    // No room for 2 and 3: after the wait the gang shrinks to 0 and 1, which keep their pods.
    w.advance(61);
    w.supervisors_0_and_1(1, SupervisedState::Running);
    let plan = w.step();
    assert_eq!(plan.restart, Some(RestartReason::Shrink));
    assert_eq!(
        plan.status
            .last_restart
            .clone()
            .expect("restart")
            .in_place_ranks,
        "0-1"
    );
    let mut deleted = World::deleted(&plan, false);
    deleted.sort_unstable();
    assert_eq!(deleted, ["train-worker-2", "train-worker-3"]);
    w.kubelet_removes_deleted();
    w.supervisors_0_and_1(1, SupervisedState::Stopped);
    let plan = w.step();
    assert_eq!(
        relabels(&plan),
        [("train-worker-0", 2), ("train-worker-1", 2)]
    );
    assert!(World::creates(&plan).is_empty(), "{:?}", plan.actions);
    let start = directive(&plan).start.get(&uids.0).expect("told to start");
    assert_eq!(
        env_of(start, trainyard_api::env::NNODES).as_deref(),
        Some("2")
    );
    assert_eq!(
        env_of(start, trainyard_api::env::WORLD_SIZE).as_deref(),
        Some("8")
    );
    assert_eq!(
        env_of(start, TRAINYARD_RESTART_REASON).as_deref(),
        Some("Shrink")
    );
    w.supervisors_0_and_1(2, SupervisedState::Running);
    let plan = w.step();
    assert_eq!(
        (plan.status.phase, plan.status.world_size),
        (Some(Phase::Running), Some(2))
    );
    assert_eq!(
        (w.uid(0), w.uid(1)),
        uids,
        "the survivors kept their pods throughout"
    );
}

/// Found by the chaos run (seed 20294459): a new leader, whose supervisor board starts empty,
/// replaced a kept pod mid-restart because its supervisor had "stopped polling": it had never
/// heard it. Here the worst case of it: the leader relabels the kept pods one write each and
/// was killed after worker 0's went out but before worker 1's, and its successor takes over
/// past the stop deadline of the decision.
#[test]
fn a_new_leader_waits_for_kept_supervisors_it_has_not_heard_instead_of_replacing_them() {
    let mut w = supervised_world(IN_PLACE);
    let uids = (w.uid(0), w.uid(1));
    w.supervisor(1, 0, SupervisedState::Exited(1));
    w.step();
    w.advance(11);
    w.supervisor(0, 0, SupervisedState::Stopped);
    w.supervisor(1, 0, SupervisedState::Exited(1));
    let plan = w.step();
    assert_eq!(relabels(&plan).len(), 2);
    // Only worker 0's relabel went out.
    w.modify("train-worker-1", |p| {
        p.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(LABEL_ATTEMPT.to_owned(), "0".to_owned());
    });
    // The successor takes over two minutes after the decision, past its stop deadline
    // (grace 60 s plus the margin), with an empty board.
    w.advance(120);
    w.supervisors.clear();
    w.supervisors_since = Some(w.now);
    let plan = w.step();
    assert!(
        event(&plan, reason::IN_PLACE_FALLBACK).is_none(),
        "{plan:?}"
    );
    assert!(plan.actions.is_empty(), "{:?}", plan.actions);
    // Worker 0 carries attempt 1's label, but does not start it before worker 1's supervisor
    // says attempt 0 stopped there.
    assert!(directive(&plan).start.is_empty(), "{:?}", directive(&plan));
    let kept = |plan: &Plan| {
        plan.status
            .last_restart
            .clone()
            .expect("restart")
            .in_place_ranks
    };
    assert_eq!(kept(&plan), "0-1");
    // The supervisors find the new leader: worker 1 says its trainer is gone, and starts.
    w.advance(3);
    w.supervisor(0, 0, SupervisedState::Stopped);
    w.supervisor(1, 0, SupervisedState::Exited(1));
    let plan = w.step();
    assert_eq!(relabels(&plan), [("train-worker-1", 1)]);
    assert_eq!(directive(&plan).start.len(), 2);
    assert_eq!(kept(&plan), "0-1");
    w.supervisor(0, 1, SupervisedState::Running);
    w.supervisor(1, 1, SupervisedState::Running);
    let plan = w.step();
    assert_eq!(plan.status.phase, Some(Phase::Running));
    assert_eq!((w.uid(0), w.uid(1)), uids, "no pod was replaced");
}

/// A kept supervisor the new leader never hears is replaced once the stop deadline, timed
/// from the takeover, has passed; one it heard and that then went quiet, at once.
#[test]
fn a_new_leader_replaces_a_kept_pod_whose_supervisor_never_reaches_it_by_the_deadline() {
    let mut w = supervised_world(IN_PLACE);
    w.supervisor(1, 0, SupervisedState::Exited(1));
    w.step();
    w.advance(120);
    w.supervisors.clear();
    w.supervisors_since = Some(w.now);
    w.supervisor(0, 0, SupervisedState::Running);
    let plan = w.step();
    assert!(
        event(&plan, reason::IN_PLACE_FALLBACK).is_none(),
        "{plan:?}"
    );
    // Rank 0 polls, then goes quiet; rank 1 never polls.
    w.advance(6);
    let plan = w.step();
    let said = event(&plan, reason::IN_PLACE_FALLBACK)
        .expect("fallback")
        .note
        .clone();
    assert!(
        said.contains("worker 0") && said.contains("stopped polling"),
        "{said}"
    );
    assert_eq!(World::deleted(&plan, false), ["train-worker-0"]);
    w.advance(65);
    let plan = w.step();
    let said = event(&plan, reason::IN_PLACE_FALLBACK)
        .expect("fallback")
        .note
        .clone();
    assert!(
        said.contains("worker 1") && said.contains("never polled this operator"),
        "{said}"
    );
    assert!(
        plan.status
            .last_restart
            .expect("restart")
            .in_place_ranks
            .is_empty()
    );
}

/// Found by the chaos run (seed 20294459): rank 0's trainer failed while rank 1 trained on,
/// and the leader changed before the verdict. The new leader heard of the exit from the next
/// poll only; had it dated the failure then, rank 1's node, renewing since the failure but
/// lost seconds after the takeover, would have made the failure that node's preemption: no
/// budget spent, no backoff. The supervisor says how long ago its trainer exited, so every
/// leader judges the failure at its time, and counts it once.
#[test]
fn a_failure_heard_late_by_a_new_leader_is_counted_once_though_a_peers_node_is_lost_after() {
    use crate::progress::supervisors::{Poll, SupervisorBoard};
    let mut w = supervised_world(IN_PLACE).with_worker_1_on_n2();
    let poll = |w: &World, board: &SupervisorBoard, rank: u32, state, ago: i64| {
        let poll = Poll {
            pod_uid: w.uid(rank),
            rank,
            attempt: 0,
            state,
            exited_ago: std::time::Duration::from_secs(ago.unsigned_abs()),
            warming: false,
        };
        board.poll("ns", "train", "uid", poll, w.now);
    };
    // Rank 0's trainer exits 1 at t0; the leader that hears it dies before it decides.
    let failed = w.now;
    // Twenty seconds later its successor leads: an empty board, and the Leases as first listed.
    w.advance(20);
    let board = SupervisorBoard::default();
    board.listen(w.now);
    w.beats = Heartbeats::default();
    w.beats.interrupted();
    for node in ["n-1", "n-2"] {
        let renewed = w
            .now
            .checked_sub(SignedDuration::from_secs(4))
            .expect("time");
        w.heartbeat_seen(node, renewed, w.now);
    }
    w.beats.resumed(w.now);
    poll(&w, &board, 0, SupervisedState::Exited(1), 20);
    poll(&w, &board, 1, SupervisedState::Running, 0);
    w.supervisors = board.snapshot("ns", "train", "uid");
    w.supervisors_since = Some(w.now);
    let since = w
        .supervisors
        .iter()
        .find(|s| s.rank == 0)
        .expect("rank 0")
        .since;
    assert_eq!(since, failed, "the exit is dated when the trainer exited");
    w.step();
    // n-2's kubelet renews once more (6 s after its last), then n-2 is lost for good.
    w.advance(2);
    w.heartbeat("n-2");
    w.heartbeat("n-1");
    for _ in 0..6 {
        w.advance(5);
        w.heartbeat("n-1");
        poll(&w, &board, 0, SupervisedState::Exited(1), 20);
        poll(&w, &board, 1, SupervisedState::Running, 0);
        w.supervisors = board.snapshot("ns", "train", "uid");
        w.step();
    }
    assert_eq!(
        (w.status.attempt, w.status.failures, w.status.preemptions),
        (1, 1, 0),
        "one failure, no preemption: {:?}",
        w.status.last_restart
    );
    assert_eq!(
        w.status.last_restart.as_ref().expect("restart").reason,
        RestartReason::Failure
    );
}

/// Nine kept supervisors go quiet mid-restart: the round replaces all nine and says so in one
/// Event naming the ranks, not one Event each (a gang of thousands would flood the API server).
#[test]
fn ranks_that_fall_back_in_one_round_are_named_in_one_event() {
    let mut w = World::new("workers: 10\nrestartPolicy: {inPlace: true}\n");
    w.config.progress_channel = Some(channel());
    w.step();
    w.run_all();
    w.step();
    for rank in 0..10 {
        w.supervisor(rank, 0, SupervisedState::Running);
    }
    w.supervisor(3, 0, SupervisedState::Exited(1));
    let plan = w.step();
    assert_eq!(plan.restart, Some(RestartReason::Failure), "{plan:?}");
    // Every supervisor heard so far, then none polls again.
    w.advance(6);
    let plan = w.step();
    let fallbacks: Vec<_> = plan
        .events
        .iter()
        .filter(|e| e.reason == reason::IN_PLACE_FALLBACK)
        .collect();
    assert_eq!(fallbacks.len(), 1, "{fallbacks:?}");
    let note = &fallbacks[0].note;
    // Rank 3's supervisor had said its trainer exited: nothing of it runs, it waits.
    assert!(note.starts_with("worker(s) 0-2,4-9 replaced"), "{note}");
    assert!(note.contains("and 1 more"), "{note}");
    assert_eq!(World::deleted(&plan, false).len(), 9);
}

/// The operator tells kept supervisors how long to wait for their start from its own waits:
/// a third failure's 80-s backoff is longer than a supervisor's 30-s default, so without being
/// told it would give up, exit, and turn a restart in place into a failure that did not happen.
#[test]
fn kept_supervisors_are_told_to_hold_as_long_as_the_operator_may_wait() {
    let mut w = supervised_world(
        "workers: 2\nrestartPolicy: {inPlace: true, maxFailures: 5, backoffSeconds: 20}\n",
    );
    let told = |w: &mut World| directive(&w.step()).hold_seconds;
    // Before any failure: the lost-peer hold (60 s) is the longest wait, and a margin.
    assert_eq!(told(&mut w), 90);
    w.status.failures = 2;
    // The next failure would be the third: 20 s × 4 of backoff.
    assert_eq!(told(&mut w), 110);
}
