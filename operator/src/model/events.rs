//! The Kubernetes Events the operator publishes on a TrainingJob.

/// Severity of an Event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// Normal.
    Normal,
    /// Warning.
    Warning,
}

/// A Kubernetes Event to publish on the TrainingJob.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobEvent {
    /// Normal or Warning.
    pub kind: EventKind,
    /// CamelCase reason.
    pub reason: String,
    /// Human-readable note.
    pub note: String,
    /// Set on the Event that starts an attempt (a gang restart or a resume): see
    /// [`StartsAttempt`].
    pub starts_attempt: Option<StartsAttempt>,
}

/// The attempt an Event starts, and when that attempt was decided.
///
/// Such an Event is published under a name derived from the job and the attempt
/// ([`attempt_event_name`]), so publishing it is idempotent: a new leader can publish the
/// Event of the job's current attempt again (its predecessor may have died between writing
/// the restart and publishing its Event) without ever doubling it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StartsAttempt {
    /// The attempt that starts.
    pub attempt: u32,
    /// When the restart or resume was decided: the Event's time, also when told again.
    pub at: jiff::Timestamp,
}

/// The longest name the API server takes for an Event (a DNS subdomain).
const NAME_LIMIT: usize = 253;

/// The name of the Event that starts `attempt` of the job with this name and uid.
///
/// The uid keeps a job deleted and applied again (a new uid) from finding its predecessor's
/// Events, which the API server keeps for an hour.
pub fn attempt_event_name(job: &str, uid: &str, attempt: u32) -> String {
    let suffix = format!(".{uid}.attempt-{attempt}");
    let mut cut = NAME_LIMIT.saturating_sub(suffix.len()).min(job.len());
    while !job.is_char_boundary(cut) {
        cut -= 1;
    }
    let prefix = job[..cut].trim_end_matches(['.', '-']);
    format!("{prefix}{suffix}")
}

impl JobEvent {
    pub(crate) fn normal(reason: &str, note: impl Into<String>) -> Self {
        Self {
            kind: EventKind::Normal,
            reason: reason.to_owned(),
            note: note.into(),
            starts_attempt: None,
        }
    }
    pub(crate) fn warning(reason: &str, note: impl Into<String>) -> Self {
        Self {
            kind: EventKind::Warning,
            reason: reason.to_owned(),
            note: note.into(),
            starts_attempt: None,
        }
    }
    /// This Event starts `attempt`, decided `at`.
    pub(crate) fn starting_attempt(self, attempt: u32, at: jiff::Timestamp) -> Self {
        Self {
            starts_attempt: Some(StartsAttempt { attempt, at }),
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempt_event_is_named_by_job_uid_and_attempt() {
        let uid = "0f0e8a4c-3b7e-4c52-9a57-5d3f1f7a9b10";
        assert_eq!(
            attempt_event_name("train", uid, 3),
            format!("train.{uid}.attempt-3")
        );
        assert_ne!(
            attempt_event_name("train", uid, 3),
            attempt_event_name("train", "another-uid", 3)
        );
    }

    #[test]
    fn a_long_job_name_is_cut_to_a_valid_event_name() {
        let uid = "0f0e8a4c-3b7e-4c52-9a57-5d3f1f7a9b10";
        let job = format!("{}-{}", "a".repeat(200), "b".repeat(52));
        let name = attempt_event_name(&job, uid, u32::MAX);
        assert!(name.len() <= NAME_LIMIT, "{} characters", name.len());
        assert!(name.ends_with(&format!(".{uid}.attempt-{}", u32::MAX)));
        let first = name.split('.').next().unwrap_or_default();
        assert!(first.starts_with('a') && !first.ends_with('-'), "{name}");
    }
}
