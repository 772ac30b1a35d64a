//! The conditions of a TrainingJob's status: their types, and how one is set.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::model::crd::{JobCondition, MAX_MESSAGE_CHARS};

/// Every worker runs.
pub const RUNNING: &str = "Running";
/// A gang restart is under way.
pub const RESTARTING: &str = "Restarting";
/// Every trainer exited 0.
pub const SUCCEEDED: &str = "Succeeded";
/// The job failed for good.
pub const FAILED: &str = "Failed";
/// No node can take the workers.
pub const UNSCHEDULABLE: &str = "Unschedulable";
/// The spec cannot run as written.
pub const INVALID_SPEC: &str = "InvalidSpec";
/// The API server rejected a write the job needs (see [`crate::model::rejection`]).
pub const WRITE_REJECTED: &str = "WriteRejected";
/// An object holding one of the job's names is not the job's (see [`crate::model::ownership`]).
pub const NAME_CONFLICT: &str = "NameConflict";
/// The trainers' progress reports arrive (False: they stopped while every worker runs).
pub const PROGRESS_CHANNEL: &str = "ProgressChannel";
/// `spot.fallback: Cost` found that spot no longer pays: later attempts run on on-demand
/// nodes (False: it still pays, or cannot be judged).
pub const SPOT_FALLBACK: &str = "SpotFallback";
/// `spec.elastic`: True while the attempt runs fewer workers than `spec.workers` (reason
/// `CapacityGone`), False once it runs all of them again (`FullSize`).
pub const SHRUNK: &str = "Shrunk";
/// A job that names a Kueue LocalQueue: whether Kueue admitted its Workload.
pub const ADMITTED: &str = "Admitted";

/// Sets a condition, moving lastTransitionTime only when the status flips.
pub fn set_condition(
    conditions: &mut Vec<JobCondition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    now: Timestamp,
    generation: Option<i64>,
) {
    let status_str = if status { "True" } else { "False" };
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            if c.status != status_str {
                c.status = status_str.to_owned();
                c.last_transition_time = Some(Time(now));
            }
            c.reason = reason.to_owned();
            c.message = cut_to_chars(message, MAX_MESSAGE_CHARS);
            c.observed_generation = generation;
        }
        None => conditions.push(JobCondition {
            type_: type_.to_owned(),
            status: status_str.to_owned(),
            reason: reason.to_owned(),
            message: cut_to_chars(message, MAX_MESSAGE_CHARS),
            last_transition_time: Some(Time(now)),
            observed_generation: generation,
        }),
    }
}

/// Whether a condition is currently True.
pub fn condition_is_true(conditions: &[JobCondition], type_: &str) -> bool {
    conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == "True")
}

/// `text` cut to at most `max` characters, ending with "…" when it was longer: messages and
/// reasons in status quote kubelets, the scheduler and pods, whose length trainyard does not
/// choose.
pub fn cut_to_chars(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_owned(),
        Some(_) => {
            let keep: String = text.chars().take(max.saturating_sub(1)).collect();
            keep + "…"
        }
    }
}

#[cfg(test)]
mod cut_tests {
    use super::*;

    #[test]
    fn text_is_cut_at_a_character_not_a_byte() {
        assert_eq!(cut_to_chars("short", 8), "short");
        assert_eq!(cut_to_chars("exactly8", 8), "exactly8");
        assert_eq!(cut_to_chars("nine char", 8), "nine ch…");
        assert_eq!(cut_to_chars("ééééééééé", 8).chars().count(), 8);
    }
}
