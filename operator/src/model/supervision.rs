//! What a worker's supervisor says and what the plan tells it (`spec.restartPolicy.inPlace`):
//! the values the plan and the progress channel (`crate::progress::supervisors`) share.

use std::collections::BTreeMap;

use jiff::Timestamp;

/// What a supervisor said of the attempt it runs or last ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SupervisedState {
    /// The trainer runs.
    Running,
    /// The trainer exited on its own with this (non-zero) code; nothing of it runs.
    Exited(i32),
    /// The trainer was stopped on the operator's order; nothing of it runs.
    Stopped,
}

impl SupervisedState {
    /// Whether nothing of the attempt runs any more.
    pub fn is_done(self) -> bool {
        !matches!(self, Self::Running)
    }
}

/// A supervisor as the plan sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SupervisorSeen {
    /// The pod's uid.
    pub pod_uid: String,
    /// Its rank.
    pub rank: u32,
    /// The attempt it runs or last ran.
    pub attempt: u32,
    /// How it stands.
    pub state: SupervisedState,
    /// When it last polled.
    pub seen_at: Timestamp,
    /// When it first polled with this attempt and state (on the operator's clock): for an
    /// exit, when the trainer exited, as its supervisor dates it (`exitedSecondsAgo`), so that
    /// a new leader that hears of it late still judges it at its time.
    pub since: Timestamp,
    /// A standby still warming what its start needs (its spare interpreter importing): it
    /// polls, but is not ready for the switch yet.
    pub warming: bool,
}

/// What the plan tells a job's supervisors.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Directive {
    /// The attempt the job runs: a supervisor of an earlier one stops.
    pub attempt: u32,
    /// The kept pods that may start `attempt` now, by uid, with the trainer's environment for
    /// it (name, value).
    pub start: BTreeMap<String, Vec<(String, String)>>,
    /// The job ended: every supervisor exits.
    pub exit: bool,
    /// How long a supervisor whose trainer stopped or exited waits for the start before it
    /// gives up: the longest the operator itself may wait first (its backoff, a replaced
    /// pod's grace, the lost-peer hold), so a kept pod is never given up too soon. 0: unsaid.
    pub hold_seconds: u32,
}
