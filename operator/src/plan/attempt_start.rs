//! The Event that starts an attempt, told once per attempt whichever replica tells it.
//!
//! A gang restart or a resume moves the job to its next attempt, and one Event says so
//! (`Preempted`, `WorkerFailed`, `Hang` or `Resumed`). The status write that starts the
//! attempt and the Event that tells it are two writes: a leader killed between them would
//! leave the attempt untold, and the next leader carries the restart on from the status
//! without deciding it again. So every replica, the first time it carries out a round of a job
//! (or of a new attempt of it), makes sure the current attempt's Event is published; the
//! Event's name comes from the job and the attempt (`events::attempt_event_name`), so telling
//! it again is idempotent and never doubles it.

use jiff::{SignedDuration, Timestamp};

use crate::model::crd::{RestartReason, TrainingJobStatus};
use crate::model::events::JobEvent;
use crate::model::reason;

/// How long the API server keeps an Event (its `--event-ttl`, one hour by default). An
/// Event older than that is gone anyway: telling it again would date an old restart
/// as news.
pub(super) const EVENTS_KEPT: SignedDuration = SignedDuration::from_hours(1);

/// The Event of a gang restart into `attempt`; `detail` says why, `wait` any backoff.
pub(super) fn restart_event(
    reason: RestartReason,
    detail: &str,
    attempt: u32,
    wait: &str,
    at: Timestamp,
) -> JobEvent {
    let note = format!("{detail}; gang restart as attempt {attempt} with RESUME_FROM set{wait}");
    let event = match reason {
        RestartReason::Preemption => JobEvent::warning(reason::PREEMPTED, note),
        RestartReason::Failure => JobEvent::warning(reason::WORKER_FAILED, note),
        RestartReason::Hang => JobEvent::warning(reason::HANG, note),
        RestartReason::Shrink => JobEvent::warning(reason::SHRINKING, note),
        RestartReason::Grow => JobEvent::normal(reason::GROWING, note),
        RestartReason::Requeue => JobEvent::warning(reason::REQUEUED, note),
        RestartReason::Resume => return resume_event(attempt, at),
    };
    event.starting_attempt(attempt, at)
}

/// The Event of a resume that starts `attempt`.
pub(super) fn resume_event(attempt: u32, at: Timestamp) -> JobEvent {
    JobEvent::normal(
        reason::RESUMED,
        format!(
            "spec.suspend is false: recreating the workers as attempt {attempt} with RESUME_FROM set"
        ),
    )
    .starting_attempt(attempt, at)
}

/// Adds the Event that starts the attempt `status` names to `events`, unless one of them
/// is that Event already, or the attempt is the first (nothing restarted), or its restart is
/// older than [`EVENTS_KEPT`]. Called by a replica that has not told this attempt yet.
pub(super) fn tell_attempt_start(
    events: &mut Vec<JobEvent>,
    status: &TrainingJobStatus,
    now: Timestamp,
) {
    let attempt = status.attempt;
    if events
        .iter()
        .any(|e| e.starts_attempt.is_some_and(|a| a.attempt == attempt))
    {
        return;
    }
    let Some(last) = status.last_restart.as_ref().filter(|_| attempt > 0) else {
        return;
    };
    if now.duration_since(last.time.0) > EVENTS_KEPT {
        return;
    }
    events.push(restart_event(
        last.reason,
        &last.detail,
        attempt,
        "",
        last.time.0,
    ));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::crd::LastRestart;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn restarted(attempt: u32, reason: RestartReason, at: Timestamp) -> TrainingJobStatus {
        TrainingJobStatus {
            attempt,
            last_restart: Some(LastRestart::new(
                Time(at),
                reason,
                "worker 1 preempted".to_owned(),
            )),
            ..Default::default()
        }
    }

    #[test]
    fn an_untold_attempt_is_told_with_its_reason_and_time() {
        let at = Timestamp::from_second(1_800_000_000).unwrap();
        let now = at + SignedDuration::from_secs(30);
        for (why, told) in [
            (RestartReason::Preemption, reason::PREEMPTED),
            (RestartReason::Failure, reason::WORKER_FAILED),
            (RestartReason::Hang, reason::HANG),
            (RestartReason::Resume, reason::RESUMED),
            (RestartReason::Shrink, reason::SHRINKING),
            (RestartReason::Grow, reason::GROWING),
        ] {
            let mut events = vec![JobEvent::normal(reason::CREATING_WORKERS, "x")];
            tell_attempt_start(&mut events, &restarted(4, why, at), now);
            assert_eq!(events.len(), 2, "{why:?}");
            assert_eq!(events[1].reason, told);
            assert_eq!(
                events[1].starts_attempt.map(|a| (a.attempt, a.at)),
                Some((4, at)),
                "{why:?}"
            );
            assert!(events[1].note.contains("attempt 4"), "{}", events[1].note);
        }
    }

    #[test]
    fn an_attempt_the_round_starts_itself_is_not_told_twice() {
        let at = Timestamp::from_second(1_800_000_000).unwrap();
        let own = restart_event(
            RestartReason::Failure,
            "exit 1",
            2,
            ", after a 10s backoff",
            at,
        );
        let mut events = vec![own.clone()];
        tell_attempt_start(&mut events, &restarted(2, RestartReason::Failure, at), at);
        assert_eq!(events, vec![own]);
    }

    #[test]
    fn the_first_attempt_and_old_restarts_are_not_told() {
        let at = Timestamp::from_second(1_800_000_000).unwrap();
        let mut events = Vec::new();
        tell_attempt_start(&mut events, &TrainingJobStatus::default(), at);
        let old = at + EVENTS_KEPT + SignedDuration::from_secs(1);
        tell_attempt_start(
            &mut events,
            &restarted(3, RestartReason::Preemption, at),
            old,
        );
        assert!(events.is_empty(), "{events:?}");
    }
}
