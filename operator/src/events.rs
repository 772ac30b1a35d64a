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
}

impl JobEvent {
    pub(crate) fn normal(reason: &str, note: impl Into<String>) -> Self {
        Self {
            kind: EventKind::Normal,
            reason: reason.to_owned(),
            note: note.into(),
        }
    }
    pub(crate) fn warning(reason: &str, note: impl Into<String>) -> Self {
        Self {
            kind: EventKind::Warning,
            reason: reason.to_owned(),
            note: note.into(),
        }
    }
}
