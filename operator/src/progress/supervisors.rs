//! The supervisors of in-place restarts (`spec.restartPolicy.inPlace`): what each worker's
//! supervisor last said, and what the plan tells them. Pure, no I/O.
//!
//! A supervisor is the first process in a worker's container (`examples/trainyard_launch.py`).
//! It polls `POST /v1/supervisor` ([`super::server`]) with the attempt it runs or last ran and
//! its state: `running`, `exited` (its trainer exited on its own, non-zero, and every process
//! of it is gone) or `stopped` (stopped on the operator's order, every process gone). The
//! answer is an [`Order`], read from the job's [`Directive`], which each reconcile publishes:
//! - a supervisor behind the directive's attempt that still runs is told to **stop**;
//! - one that has stopped (or whose trainer exited) is told to **start** the directive's
//!   attempt with the environment the directive holds for its pod, once the plan says so (its
//!   pod is kept for that attempt and every pod of the old attempt that is not is gone);
//! - a job that ended tells every supervisor to **exit**;
//! - anything else is **continue**.
//!
//! A supervisor may ask the server to hold its poll for a while (`waitSeconds`, at most
//! [`MAX_HOLD`]): a continue is then answered only once the job's directive changes
//! ([`SupervisorBoard::changes`]) or the time is up, so a stop (or, to a stopped one, the start)
//! reaches it as soon as the plan decides, with one poll every few seconds instead of several.
//!
//! The plan reads [`SupervisorBoard::snapshot`]: a supervisor that polled lately can restart in
//! place; one that reports its trainer's exit makes the worker count as failed with that code,
//! as its container's end would without a supervisor.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use tokio::sync::Notify;

use crate::model::supervision::{Directive, SupervisedState, SupervisorSeen};
use crate::state::job_memory::{JobKey, LiveJobs, PerJob};

/// The longest a poll is held for a change of its job's directive: below the plan's
/// [`crate::plan::in_place::SUPERVISOR_FRESH`], so that a supervisor whose poll is held is
/// never taken for one that went quiet (it polls again at once after each answer).
pub const MAX_HOLD: Duration = Duration::from_secs(3);

/// One poll, as the server checked it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Poll {
    /// The pod's uid (from its token).
    pub pod_uid: String,
    /// Its rank.
    pub rank: u32,
    /// The attempt the supervisor runs or last ran.
    pub attempt: u32,
    /// How it stands.
    pub state: SupervisedState,
    /// For an exit: how long before this poll the trainer exited, by the supervisor's own
    /// clock (at most [`MAX_EXIT_AGE`]), so that every replica dates it alike.
    pub exited_ago: Duration,
    /// A standby still warming what its start needs (`"warming": true`).
    pub warming: bool,
}

/// The oldest exit a poll may date: a supervisor holds an exit no longer than this.
pub const MAX_EXIT_AGE: Duration = Duration::from_secs(600);

/// The answer to a poll.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Order {
    /// Nothing to do.
    Continue,
    /// Stop the trainer: `attempt` was decided.
    Stop {
        /// The attempt decided.
        attempt: u32,
    },
    /// Start `attempt` with this environment.
    Start {
        /// The attempt to start.
        attempt: u32,
        /// The trainer's environment for it.
        env: Vec<(String, String)>,
    },
    /// Exit with the trainer's code.
    Exit,
}

impl Order {
    /// The answer's JSON body.
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Self::Continue => serde_json::json!({ "action": "continue" }),
            Self::Stop { attempt } => serde_json::json!({ "action": "stop", "attempt": attempt }),
            Self::Start { attempt, env } => {
                let env: serde_json::Map<String, serde_json::Value> = env
                    .iter()
                    .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                    .collect();
                serde_json::json!({ "action": "start", "attempt": attempt, "env": env })
            }
            Self::Exit => serde_json::json!({ "action": "exit" }),
        }
    }
}

/// The order for `poll` under `directive`.
pub fn order(directive: Option<&Directive>, poll: &Poll) -> Order {
    let Some(d) = directive else {
        return Order::Continue;
    };
    if d.exit {
        return Order::Exit;
    }
    if poll.attempt >= d.attempt {
        return Order::Continue;
    }
    match (poll.state.is_done(), d.start.get(&poll.pod_uid)) {
        (false, _) => Order::Stop { attempt: d.attempt },
        (true, Some(env)) => Order::Start {
            attempt: d.attempt,
            env: env.clone(),
        },
        (true, None) => Order::Continue,
    }
}

#[derive(Debug)]
struct JobBoard {
    job_uid: String,
    seen: BTreeMap<String, SupervisorSeen>,
    directive: Option<Directive>,
    /// Wakes the polls held for a change of `directive`.
    changed: Arc<Notify>,
}

impl JobBoard {
    fn new(job_uid: &str) -> Self {
        Self {
            job_uid: job_uid.to_owned(),
            seen: BTreeMap::new(),
            directive: None,
            changed: Arc::new(Notify::new()),
        }
    }
}

/// Every job's supervisors and directive, keyed by namespace and name; an entry belongs to one
/// job uid (a job applied again under the same name starts over).
#[derive(Debug, Default)]
pub struct SupervisorBoard {
    jobs: Mutex<HashMap<(String, String), JobBoard>>,
    /// When this replica began serving the channel ([`Self::listen`]).
    listening: Mutex<Option<Timestamp>>,
}

/// What a poll came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answered {
    /// The answer.
    pub order: Order,
    /// Reconcile the job now: the supervisor is new, or its attempt or state changed.
    pub wake: bool,
}

impl SupervisorBoard {
    /// This replica serves the channel from `now` on (it leads): the supervisors reach it
    /// from now, each on its next poll once the channel's Endpoints point here.
    pub fn listen(&self, now: Timestamp) {
        *self.listening.lock().unwrap_or_else(|e| e.into_inner()) = Some(now);
    }

    /// When this replica began serving the channel: a supervisor it has not heard since is
    /// unknown to it, not quiet (a new leader's board starts empty).
    pub fn listening_since(&self) -> Option<Timestamp> {
        *self.listening.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn jobs(&self) -> MutexGuard<'_, HashMap<(String, String), JobBoard>> {
        // Every update leaves the map whole: a panic elsewhere cannot tear it.
        self.jobs.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn entry<'a>(
        jobs: &'a mut HashMap<(String, String), JobBoard>,
        namespace: &str,
        job: &str,
        job_uid: &str,
    ) -> &'a mut JobBoard {
        let key = (namespace.to_owned(), job.to_owned());
        let board = jobs.entry(key).or_insert_with(|| JobBoard::new(job_uid));
        if board.job_uid != job_uid {
            // The polls held for the job of that name before answer now.
            board.changed.notify_waiters();
            *board = JobBoard::new(job_uid);
        }
        board
    }

    /// Records a checked poll of a worker of `namespace/job` (uid `job_uid`) at `now`, and
    /// answers it.
    pub fn poll(
        &self,
        namespace: &str,
        job: &str,
        job_uid: &str,
        poll: Poll,
        now: Timestamp,
    ) -> Answered {
        let mut jobs = self.jobs();
        let board = Self::entry(&mut jobs, namespace, job, job_uid);
        let order = order(board.directive.as_ref(), &poll);
        let unchanged = board
            .seen
            .get(&poll.pod_uid)
            .filter(|s| s.attempt == poll.attempt && s.state == poll.state);
        let wake = unchanged.is_none_or(|s| s.warming != poll.warming);
        let heard = match poll.state {
            SupervisedState::Exited(_) => SignedDuration::try_from(poll.exited_ago)
                .ok()
                .and_then(|ago| now.checked_sub(ago).ok())
                .unwrap_or(now),
            _ => now,
        };
        let since = unchanged.map_or(heard, |s| s.since.min(heard));
        board.seen.insert(
            poll.pod_uid.clone(),
            SupervisorSeen {
                pod_uid: poll.pod_uid,
                rank: poll.rank,
                attempt: poll.attempt,
                state: poll.state,
                seen_at: now,
                since,
                warming: poll.warming,
            },
        );
        Answered { order, wake }
    }

    /// Answers a poll that was held ([`MAX_HOLD`]) from the job's directive now. Its
    /// supervisor counts as heard now unless it has said something newer meanwhile (a later
    /// poll with another attempt or state, which the held one must not undo).
    pub fn answer_held(
        &self,
        namespace: &str,
        job: &str,
        job_uid: &str,
        poll: &Poll,
        now: Timestamp,
    ) -> Order {
        let mut jobs = self.jobs();
        // A job forgotten meanwhile (deleted, or applied again under its name) keeps no
        // entry: the held poll is answered from no directive.
        let Some(board) = jobs
            .get_mut(&(namespace.to_owned(), job.to_owned()))
            .filter(|b| b.job_uid == job_uid)
        else {
            return order(None, poll);
        };
        if let Some(seen) = board
            .seen
            .get_mut(&poll.pod_uid)
            .filter(|s| s.attempt == poll.attempt && s.state == poll.state)
        {
            seen.seen_at = seen.seen_at.max(now);
        }
        order(board.directive.as_ref(), poll)
    }

    /// How long the job's directive tells a stopped supervisor to wait for its start (0: it
    /// says nothing, the supervisor keeps its own setting).
    pub fn hold_seconds(&self, namespace: &str, job: &str, job_uid: &str) -> u32 {
        self.jobs()
            .get(&(namespace.to_owned(), job.to_owned()))
            .filter(|b| b.job_uid == job_uid)
            .and_then(|b| b.directive.as_ref())
            .map_or(0, |d| d.hold_seconds)
    }

    /// Sets what the job's supervisors are told (`None`: nothing); pods of `job_uid` not in
    /// `pods` are forgotten.
    pub fn publish(
        &self,
        namespace: &str,
        job: &str,
        job_uid: &str,
        directive: Option<Directive>,
        pods: &[&str],
    ) {
        let mut jobs = self.jobs();
        let key = (namespace.to_owned(), job.to_owned());
        if directive.is_none() && !jobs.contains_key(&key) {
            return;
        }
        let board = Self::entry(&mut jobs, namespace, job, job_uid);
        if board.directive != directive {
            board.directive = directive;
            board.changed.notify_waiters();
        }
        board.seen.retain(|uid, _| pods.contains(&uid.as_str()));
    }

    /// What a poll of a worker of `namespace/job` (uid `job_uid`) that is held waits on: it is
    /// notified when the job's directive changes. A poll registers (`Notified::enable`) before
    /// it is recorded and answered, so that no change between the answer and the wait is
    /// missed.
    pub fn changes(&self, namespace: &str, job: &str, job_uid: &str) -> Arc<Notify> {
        let mut jobs = self.jobs();
        Self::entry(&mut jobs, namespace, job, job_uid)
            .changed
            .clone()
    }

    /// The job's supervisors, for the plan.
    pub fn snapshot(&self, namespace: &str, job: &str, job_uid: &str) -> Vec<SupervisorSeen> {
        self.jobs()
            .get(&(namespace.to_owned(), job.to_owned()))
            .filter(|b| b.job_uid == job_uid)
            .map(|b| b.seen.values().cloned().collect())
            .unwrap_or_default()
    }

    /// How many jobs have an entry.
    pub fn len(&self) -> usize {
        self.jobs().len()
    }

    /// Whether no job has an entry.
    pub fn is_empty(&self) -> bool {
        self.jobs().is_empty()
    }
}

/// Each job's board, by namespace and name; the polls held on a forgotten board answer now.
impl PerJob for SupervisorBoard {
    fn forget(&self, job: &JobKey<'_>) {
        let key = (job.namespace.to_owned(), job.name.to_owned());
        if let Some(board) = self.jobs().remove(&key) {
            board.changed.notify_waiters();
        }
    }

    fn retain(&self, live: &LiveJobs) {
        self.jobs().retain(|(ns, job), board| {
            let kept = live.has(ns, job);
            if !kept {
                board.changed.notify_waiters();
            }
            kept
        });
    }

    fn largest(&self) -> usize {
        self.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The job `namespace/name`.
    fn job<'a>(namespace: &'a str, name: &'a str) -> JobKey<'a> {
        JobKey {
            uid: "uid",
            namespace,
            name,
        }
    }

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + s).expect("time")
    }

    fn poll(uid: &str, attempt: u32, state: SupervisedState) -> Poll {
        Poll {
            pod_uid: uid.to_owned(),
            rank: 0,
            attempt,
            state,
            exited_ago: Duration::ZERO,
            warming: false,
        }
    }

    fn directive(attempt: u32, start: &[&str]) -> Directive {
        Directive {
            attempt,
            start: start
                .iter()
                .map(|u| {
                    (
                        (*u).to_owned(),
                        vec![("TRAINYARD_ATTEMPT".into(), attempt.to_string())],
                    )
                })
                .collect(),
            exit: false,
            hold_seconds: 0,
        }
    }

    #[test]
    fn a_held_poll_wakes_on_a_new_directive_only_and_never_undoes_a_newer_state() {
        use futures::FutureExt;
        let board = SupervisorBoard::default();
        let changes = board.changes("ml", "j", "uid");
        let mut changed = Box::pin(changes.notified());
        changed.as_mut().enable();
        board.publish("ml", "j", "uid", None, &["a"]);
        assert!(
            changed.as_mut().now_or_never().is_none(),
            "the same directive"
        );
        board.publish("ml", "j", "uid", Some(directive(2, &[])), &["a"]);
        assert!(changed.now_or_never().is_some(), "a new one");

        // Held while running; meanwhile the trainer exited and said so on another poll.
        let running = poll("a", 1, SupervisedState::Running);
        board.poll("ml", "j", "uid", running.clone(), at(0));
        board.poll(
            "ml",
            "j",
            "uid",
            poll("a", 1, SupervisedState::Exited(3)),
            at(1),
        );
        assert_eq!(
            board.answer_held("ml", "j", "uid", &running, at(3)),
            Order::Stop { attempt: 2 }
        );
        let seen = board.snapshot("ml", "j", "uid");
        assert_eq!(
            (seen[0].state, seen[0].seen_at),
            (SupervisedState::Exited(3), at(1))
        );
        // Unchanged since: heard again at the answer.
        let exited = poll("a", 1, SupervisedState::Exited(3));
        board.answer_held("ml", "j", "uid", &exited, at(4));
        assert_eq!(board.snapshot("ml", "j", "uid")[0].seen_at, at(4));
        // The job forgotten while a poll was held: answered, and no entry made again.
        board.forget(&job("ml", "j"));
        assert_eq!(
            board.answer_held("ml", "j", "uid", &exited, at(5)),
            Order::Continue
        );
        assert!(board.is_empty());
    }

    #[test]
    fn a_stopped_supervisors_held_poll_is_answered_with_the_start_once_it_is_published() {
        use futures::FutureExt;
        let board = SupervisorBoard::default();
        board.publish("ml", "j", "uid", Some(directive(2, &[])), &["a"]);
        let stopped = poll("a", 1, SupervisedState::Stopped);
        board.poll("ml", "j", "uid", stopped.clone(), at(0));
        let changes = board.changes("ml", "j", "uid");
        let mut changed = Box::pin(changes.notified());
        changed.as_mut().enable();
        // Every old pod gone: the plan lets the kept pod start attempt 2.
        board.publish("ml", "j", "uid", Some(directive(2, &["a"])), &["a"]);
        assert!(
            changed.now_or_never().is_some(),
            "the start wakes the held poll"
        );
        assert!(matches!(
            board.answer_held("ml", "j", "uid", &stopped, at(1)),
            Order::Start { attempt: 2, .. }
        ));
    }

    #[test]
    fn without_a_directive_every_supervisor_carries_on() {
        assert_eq!(
            order(None, &poll("a", 0, SupervisedState::Running)),
            Order::Continue
        );
        assert_eq!(
            order(None, &poll("a", 0, SupervisedState::Exited(1))),
            Order::Continue
        );
    }

    #[test]
    fn a_running_supervisor_of_an_older_attempt_stops_and_starts_only_when_told() {
        let d = directive(3, &[]);
        assert_eq!(
            order(Some(&d), &poll("a", 2, SupervisedState::Running)),
            Order::Stop { attempt: 3 }
        );
        // Stopped, but its pod may not start yet: the old attempt is not gone everywhere.
        assert_eq!(
            order(Some(&d), &poll("a", 2, SupervisedState::Stopped)),
            Order::Continue
        );
        let d = directive(3, &["a"]);
        assert_eq!(
            order(Some(&d), &poll("a", 2, SupervisedState::Stopped)),
            Order::Start {
                attempt: 3,
                env: vec![("TRAINYARD_ATTEMPT".into(), "3".into())]
            }
        );
        // A trainer that exited by itself starts as well; another pod does not.
        assert!(matches!(
            order(Some(&d), &poll("a", 2, SupervisedState::Exited(1))),
            Order::Start { attempt: 3, .. }
        ));
        assert_eq!(
            order(Some(&d), &poll("b", 2, SupervisedState::Exited(1))),
            Order::Continue
        );
        // The attempt it runs is the directive's: nothing to do.
        assert_eq!(
            order(Some(&d), &poll("a", 3, SupervisedState::Running)),
            Order::Continue
        );
    }

    #[test]
    fn a_job_that_ended_tells_every_supervisor_to_exit() {
        let d = Directive {
            exit: true,
            ..Directive::default()
        };
        assert_eq!(
            order(Some(&d), &poll("a", 5, SupervisedState::Exited(2))),
            Order::Exit
        );
    }

    #[test]
    fn polls_wake_the_job_only_when_a_supervisor_is_new_or_changed() {
        let board = SupervisorBoard::default();
        let p = poll("a", 0, SupervisedState::Running);
        assert!(board.poll("ns", "j", "u1", p.clone(), at(0)).wake);
        assert!(!board.poll("ns", "j", "u1", p.clone(), at(1)).wake);
        let exited = poll("a", 0, SupervisedState::Exited(1));
        assert!(board.poll("ns", "j", "u1", exited, at(2)).wake);
        let seen = board.snapshot("ns", "j", "u1");
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].state, SupervisedState::Exited(1));
        assert_eq!(seen[0].seen_at, at(2));
        // The same exit polled again: seen later, heard of first at 2.
        let exited = poll("a", 0, SupervisedState::Exited(1));
        assert!(!board.poll("ns", "j", "u1", exited, at(3)).wake);
        let seen = board.snapshot("ns", "j", "u1");
        assert_eq!((seen[0].seen_at, seen[0].since), (at(3), at(2)));
        // Another job of the same name sees none of it.
        assert!(board.snapshot("ns", "j", "u2").is_empty());
        // A standby that is warm at last wakes the job (the switch waits for it).
        let warming = Poll {
            warming: true,
            ..poll("b", 0, SupervisedState::Stopped)
        };
        assert!(board.poll("ns", "j", "u1", warming.clone(), at(4)).wake);
        assert!(!board.poll("ns", "j", "u1", warming, at(5)).wake);
        let warm = poll("b", 0, SupervisedState::Stopped);
        assert!(board.poll("ns", "j", "u1", warm, at(6)).wake);
        let seen = board.snapshot("ns", "j", "u1");
        assert!(seen.iter().all(|s| !s.warming), "{seen:?}");
    }

    #[test]
    fn a_published_directive_answers_the_next_poll_and_forgets_pods_gone() {
        let board = SupervisorBoard::default();
        board.poll(
            "ns",
            "j",
            "u1",
            poll("a", 0, SupervisedState::Running),
            at(0),
        );
        board.poll(
            "ns",
            "j",
            "u1",
            poll("b", 0, SupervisedState::Running),
            at(0),
        );
        board.publish("ns", "j", "u1", Some(directive(1, &[])), &["a"]);
        let answered = board.poll(
            "ns",
            "j",
            "u1",
            poll("a", 0, SupervisedState::Running),
            at(1),
        );
        assert_eq!(answered.order, Order::Stop { attempt: 1 });
        let uids: Vec<String> = board
            .snapshot("ns", "j", "u1")
            .into_iter()
            .map(|s| s.pod_uid)
            .collect();
        assert_eq!(uids, ["a"]);
        board.forget(&job("ns", "j"));
        assert!(board.is_empty());
    }

    #[test]
    fn publishing_nothing_for_a_job_without_supervisors_keeps_no_entry() {
        let board = SupervisorBoard::default();
        board.publish("ns", "j", "u1", None, &[]);
        assert!(board.is_empty());
    }

    #[test]
    fn the_start_order_carries_the_environment_as_a_json_object() {
        let o = Order::Start {
            attempt: 4,
            env: vec![("A".into(), "1".into()), ("B".into(), "x".into())],
        };
        assert_eq!(
            o.to_json(),
            serde_json::json!({"action": "start", "attempt": 4, "env": {"A": "1", "B": "x"}})
        );
    }

    /// A new leader hears of an exit late (its board starts empty): it dates the exit by the
    /// supervisor's own account, not when it heard of it, and never later on a later poll.
    #[test]
    fn an_exit_heard_late_is_dated_when_the_trainer_exited() {
        let board = SupervisorBoard::default();
        let mut exited = poll("a", 0, SupervisedState::Exited(1));
        exited.exited_ago = Duration::from_secs(20);
        board.poll("ns", "j", "u1", exited.clone(), at(61));
        exited.exited_ago = Duration::from_secs(21);
        board.poll("ns", "j", "u1", exited, at(62));
        let seen = board.snapshot("ns", "j", "u1");
        assert_eq!(seen[0].since, at(41));
        assert_eq!(seen[0].seen_at, at(62));
        // A running supervisor's age is ignored: it is heard now.
        let mut running = poll("b", 0, SupervisedState::Running);
        running.exited_ago = Duration::from_secs(20);
        board.poll("ns", "j", "u1", running, at(62));
        let seen = board.snapshot("ns", "j", "u1");
        assert_eq!(
            seen.iter().find(|s| s.pod_uid == "b").expect("b").since,
            at(62)
        );
    }
}
