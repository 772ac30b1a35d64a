//! What the supervisors of kept pods report, read off the observation (`restartPolicy.inPlace`).

use jiff::{SignedDuration, Timestamp};
use trainyard_api::ranks::RankSet;

use super::observed::Observed;
use crate::model::cached_pod::CachedPod;
use crate::model::crd::TrainingJobStatus;
use crate::model::supervision::{SupervisedState, SupervisorSeen};

/// A supervisor that polled within this long is there (it polls every second while its
/// trainer runs, or again as each held poll is answered: at most
/// [`crate::progress::supervisors::MAX_HOLD`] apart).
pub const SUPERVISOR_FRESH: SignedDuration = SignedDuration::from_secs(5);
/// The ranks kept for attempt `attempt` by the restart that started it.
pub(crate) fn kept_for(current: &TrainingJobStatus, attempt: u32) -> RankSet {
    match &current.last_restart {
        Some(last) if current.attempt == attempt => RankSet::parse(&last.in_place_ranks),
        _ => RankSet::default(),
    }
}

pub(super) fn supervisor<'a>(
    observed: &'a Observed,
    pod: &CachedPod,
) -> Option<&'a SupervisorSeen> {
    let uid = pod.metadata.uid.as_deref()?;
    observed.supervisors.iter().find(|s| s.pod_uid == uid)
}

pub(super) fn fresh(seen: &SupervisorSeen, now: Timestamp) -> bool {
    now.duration_since(seen.seen_at) <= SUPERVISOR_FRESH
}

/// The code the trainer of `pod` exited with in attempt `attempt`, as its supervisor reports,
/// and when the operator first heard of it (its own clock): the container keeps running, so
/// the pod shows no end of its own.
pub(super) fn exit_seen(
    observed: &Observed,
    pod: &CachedPod,
    attempt: u32,
) -> Option<(i32, Timestamp)> {
    match supervisor(observed, pod)? {
        SupervisorSeen {
            attempt: a,
            state: SupervisedState::Exited(code),
            since,
            ..
        } if *a == attempt => Some((*code, *since)),
        _ => None,
    }
}

/// The code the trainer of `pod` exited with in attempt `attempt`, as its supervisor reports.
pub(crate) fn exit_reported(observed: &Observed, pod: &CachedPod, attempt: u32) -> Option<i32> {
    exit_seen(observed, pod, attempt).map(|(code, _)| code)
}

/// When the operator first heard that the trainer of `pod` exited in attempt `attempt`.
pub(crate) fn exit_heard_at(
    observed: &Observed,
    pod: &CachedPod,
    attempt: u32,
) -> Option<Timestamp> {
    exit_seen(observed, pod, attempt).map(|(_, since)| since)
}

/// Whether the supervisor of `pod` says nothing of an attempt before `attempt` runs.
pub(super) fn stopped_before(observed: &Observed, pod: &CachedPod, attempt: u32) -> bool {
    supervisor(observed, pod).is_some_and(|s| s.attempt < attempt && s.state.is_done())
}

/// Whether the supervisor of `pod` runs attempt `attempt`.
pub(crate) fn started(observed: &Observed, pod: &CachedPod, attempt: u32) -> bool {
    supervisor(observed, pod)
        .is_some_and(|s| s.attempt == attempt && s.state == SupervisedState::Running)
}
