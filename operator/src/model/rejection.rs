//! Writes the API server refuses for good, and the `WriteRejected` condition they set.
//!
//! The CRD schema keeps the pod template as it is written, and a Kubernetes object is validated
//! only when it is written: an env var name pod validation refuses, an invalid extended
//! resource name, a storage class name that is not a DNS name, an admission webhook or a quota
//! that says no. Such a write fails the same way every time until the spec (or the cluster)
//! changes, so it is shown where the user looks, on the TrainingJob: the condition
//! `WriteRejected` with the server's own message and one Warning Event. The controller retries
//! with its error backoff, and the condition is cleared by the next write the API server
//! accepts.

use jiff::Timestamp;

use crate::model::condition::{self, condition_is_true, set_condition};
use crate::model::crd::TrainingJobStatus;
use crate::model::events::JobEvent;
use crate::model::reason;

/// The longest server message kept in the condition (the Event note is cut at 1 kB anyway).
const MAX_MESSAGE: usize = 1024;

/// A write the API server refused in a way that retrying the same write cannot change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// HTTP status code: 400, 403 or 422.
    pub code: u16,
    /// The API's reason: `BadRequest`, `Forbidden` or `Invalid`.
    pub reason: String,
    /// What was written and the server's message.
    pub message: String,
}

/// The reason a status code gets when the server sends none (or one a condition cannot carry).
fn reason_of(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        403 => "Forbidden",
        _ => "Invalid",
    }
}

/// The rejection an API error is, if it is one: 422 Invalid (validation), 400 BadRequest
/// (a malformed object), 403 Forbidden (an admission webhook, a quota, RBAC). Conflicts, missing
/// objects, throttling, server and network errors are transient and are not.
/// `action` says what was written (`creating Pod ns/name`).
pub fn rejection(action: &str, err: &kube::Error) -> Option<Rejection> {
    let kube::Error::Api(status) = err else {
        return None;
    };
    if !matches!(status.code, 400 | 403 | 422) {
        return None;
    }
    let camel =
        !status.reason.is_empty() && status.reason.chars().all(|c| c.is_ascii_alphanumeric());
    let reason = if camel {
        status.reason.clone()
    } else {
        reason_of(status.code).to_owned()
    };
    let mut message = format!(
        "the API server rejected {action} ({} {reason}): {}",
        status.code, status.message
    );
    if message.len() > MAX_MESSAGE {
        let mut cut = MAX_MESSAGE;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
        message.push_str(" ...");
    }
    Some(Rejection {
        code: status.code,
        reason,
        message,
    })
}

/// What one round's writes (creates of pods, the Service and the PVC; deletes of pods) came to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WriteOutcome {
    /// Writes the API server carried out (an AlreadyExists or NotFound is none).
    pub accepted: usize,
    /// Writes it rejected, in the order they were decided.
    pub rejected: Vec<Rejection>,
}

/// The status after a round's writes: `WriteRejected` True with the first rejection's message
/// when any write was rejected (and a Warning Event the first time that message is seen),
/// False once a later round has a write accepted and none rejected. A round that wrote nothing
/// leaves the condition as it is: only a write can tell whether the rejection still stands.
pub fn after_writes(
    status: &TrainingJobStatus,
    writes: &WriteOutcome,
    generation: Option<i64>,
    now: Timestamp,
) -> (TrainingJobStatus, Vec<JobEvent>) {
    let mut st = status.clone();
    let mut events = Vec::new();
    let was_rejected = condition_is_true(&status.conditions, condition::WRITE_REJECTED);
    match writes.rejected.first() {
        Some(first) => {
            let more = writes.rejected.len() - 1;
            let message = if more > 0 {
                format!("{} (and {more} more rejected)", first.message)
            } else {
                first.message.clone()
            };
            let repeated = was_rejected
                && status
                    .conditions
                    .iter()
                    .any(|c| c.type_ == condition::WRITE_REJECTED && c.message == message);
            set_condition(
                &mut st.conditions,
                condition::WRITE_REJECTED,
                true,
                &first.reason,
                &message,
                now,
                generation,
            );
            if !repeated {
                events.push(JobEvent::warning(reason::WRITE_REJECTED, message));
            }
        }
        None if was_rejected && writes.accepted > 0 => {
            set_condition(
                &mut st.conditions,
                condition::WRITE_REJECTED,
                false,
                "Accepted",
                "",
                now,
                generation,
            );
            events.push(JobEvent::normal(
                reason::WRITE_ACCEPTED,
                "the API server accepts the job's objects again",
            ));
        }
        None => {}
    }
    (st, events)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::ts;
    use crate::model::events::EventKind;
    use serde_json::json;

    const T0: &str = "2026-01-01T00:00:00Z";
    const POD_INVALID: &str = "Pod \"train-worker-0\" is invalid: spec.containers[0].env[0].name: Invalid value: \"1BAD\": a valid environment variable name must consist of alphabetic characters";

    fn api_error(code: u16, reason: &str, message: &str) -> kube::Error {
        kube::Error::Api(Box::new(
            serde_json::from_value(
                json!({"status": "Failure", "code": code, "reason": reason, "message": message}),
            )
            .expect("status"),
        ))
    }

    fn rejected(code: u16, reason: &str, message: &str) -> Rejection {
        rejection(
            "creating Pod ml/train-worker-0",
            &api_error(code, reason, message),
        )
        .expect("a rejection")
    }

    #[test]
    fn invalid_bad_request_and_forbidden_are_rejections_carrying_the_servers_message() {
        let r = rejected(422, "Invalid", POD_INVALID);
        assert_eq!((r.code, r.reason.as_str()), (422, "Invalid"));
        assert_eq!(
            r.message,
            format!(
                "the API server rejected creating Pod ml/train-worker-0 (422 Invalid): {POD_INVALID}"
            )
        );
        assert_eq!(rejected(400, "BadRequest", "bad").reason, "BadRequest");
        let quota = rejected(
            403,
            "Forbidden",
            "pods \"x\" is forbidden: exceeded quota: gpus",
        );
        assert_eq!(quota.reason, "Forbidden");
        assert!(quota.message.ends_with("exceeded quota: gpus"));
        // A missing or odd reason falls back to the code's.
        assert_eq!(rejected(422, "", "m").reason, "Invalid");
        assert_eq!(rejected(403, "not a reason", "m").reason, "Forbidden");
    }

    #[test]
    fn transient_errors_are_not_rejections() {
        for code in [404, 409, 410, 429, 500, 503, 504] {
            let e = api_error(code, "Whatever", "m");
            assert_eq!(rejection("creating Pod ml/p", &e), None, "{code}");
        }
        let io = kube::Error::Service(Box::new(std::io::Error::other("connection reset")));
        assert_eq!(rejection("creating Pod ml/p", &io), None);
    }

    #[test]
    fn a_long_server_message_is_cut_at_a_char_boundary() {
        let long = "é".repeat(2000);
        let r = rejected(422, "Invalid", &long);
        assert!(r.message.len() <= MAX_MESSAGE + 4, "{}", r.message.len());
        assert!(r.message.ends_with(" ..."));
    }

    fn write_rejected(st: &TrainingJobStatus) -> Option<&crate::model::crd::JobCondition> {
        st.conditions
            .iter()
            .find(|c| c.type_ == condition::WRITE_REJECTED)
    }

    #[test]
    fn a_rejected_write_sets_the_condition_and_one_warning_until_a_write_is_accepted() {
        let now = ts(T0);
        let writes = WriteOutcome {
            accepted: 2,
            rejected: vec![rejected(422, "Invalid", POD_INVALID)],
        };
        let (st, events) = after_writes(&TrainingJobStatus::default(), &writes, Some(3), now);
        let c = write_rejected(&st).expect("condition");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str(), c.observed_generation),
            ("True", "Invalid", Some(3))
        );
        assert!(c.message.contains(POD_INVALID), "{}", c.message);
        assert_eq!(events.len(), 1);
        assert_eq!(
            (events[0].kind, events[0].reason.as_str()),
            (EventKind::Warning, "WriteRejected")
        );
        assert!(events[0].note.contains("1BAD"));

        // The retry is rejected the same way: nothing changes, no second Event.
        let later = ts("2026-01-01T00:00:10Z");
        let (again, events) = after_writes(&st, &writes, Some(3), later);
        assert_eq!(again, st);
        assert!(events.is_empty(), "{events:?}");

        // A round that writes nothing proves nothing.
        let (idle, events) = after_writes(&st, &WriteOutcome::default(), Some(3), later);
        assert_eq!((idle, events.len()), (st.clone(), 0));

        // Fixed: the write goes through and the condition clears.
        let accepted = WriteOutcome {
            accepted: 1,
            rejected: Vec::new(),
        };
        let (fixed, events) = after_writes(&st, &accepted, Some(4), later);
        let c = write_rejected(&fixed).expect("condition");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
            ("False", "Accepted", "")
        );
        assert_eq!(c.last_transition_time.as_ref().map(|t| t.0), Some(later));
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].kind, EventKind::Normal);
    }

    #[test]
    fn a_different_rejection_is_a_new_warning_and_several_are_counted() {
        let first = WriteOutcome {
            accepted: 0,
            rejected: vec![rejected(422, "Invalid", POD_INVALID)],
        };
        let (st, _) = after_writes(&TrainingJobStatus::default(), &first, None, ts(T0));
        let quota = rejected(403, "Forbidden", "exceeded quota");
        let two = WriteOutcome {
            accepted: 0,
            rejected: vec![quota.clone(), quota],
        };
        let (st, events) = after_writes(&st, &two, None, ts(T0));
        let c = write_rejected(&st).expect("condition");
        assert_eq!(c.reason, "Forbidden");
        assert!(
            c.message.ends_with("(and 1 more rejected)"),
            "{}",
            c.message
        );
        assert_eq!(events.len(), 1);
    }

    #[test]
    fn accepted_writes_leave_a_job_that_was_never_rejected_alone() {
        let st = TrainingJobStatus::default();
        let writes = WriteOutcome {
            accepted: 3,
            rejected: Vec::new(),
        };
        let (after, events) = after_writes(&st, &writes, None, ts(T0));
        assert_eq!((after, events.len()), (st, 0));
    }
}
