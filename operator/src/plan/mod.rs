//! The decision step: from a validated job, what the cluster looks like and the current
//! status, compute the next status, the actions that move the cluster towards it, and the
//! Events that describe the transition.
//!
//! [`decide`] builds one read-only `View` of the job (`view.rs`), then runs the phases of
//! `phases::PHASES` in order, each adding to a `Round` (`round.rs`) and saying whether the
//! round goes on; the phase that stops it is recorded in [`Plan::decided_by`]. Then every row
//! of `phases::FINISH` decides (`finish.rs`), and the round becomes the [`Plan`].
//!
//! Everything that must not happen twice (counting a preemption, bumping the attempt) is a
//! status transition, and every action is idempotent and derived again from status plus
//! observation on the next round. The controller persists a status that deletes or restarts
//! before acting on it, and sends creates together with the status write (the write order is
//! stated once, in `writes/executor.rs`). So a crash between any two steps repeats
//! actions, never decisions:
//! - pods have deterministic names (`<job>-worker-<rank>`), so a repeated create cannot duplicate;
//! - the next attempt's pods are created only after every older pod is gone;
//! - only pods recorded in `status.workers` can "disappear", so a pod the cache has not seen
//!   yet is never mistaken for a preempted one.

use jiff::Timestamp;

use crate::config::OperatorConfig;
use crate::model::condition::{self, set_condition};
use crate::model::crd::{JobCondition, TrainingJobStatus};
use crate::model::events::JobEvent;
use crate::model::reason;
use crate::model::validate::{InvalidSpec, ValidJob};

mod attempt_start;
mod cost_fallback;
mod finish;
mod goodput;
mod in_place;
mod observed;
pub(crate) mod outcome;
mod phases;
mod reads;
mod round;
mod supervised;
mod view;

use finish::write_invalid_spec;
pub use observed::{
    Observed, ObservedClaim, ObservedProgress, ObservedRank, SiblingPlacement, UnseenWrite,
};
pub use outcome::{Action, Plan, Supervise};
pub use phases::elastic::nodes_to_weigh;
pub use reads::sibling_to_read;
use round::Round;
use view::View;
pub use view::attempt_workers;

/// The status for a job whose spec cannot run: condition InvalidSpec, nothing else changes.
pub fn invalid_status(
    current: &TrainingJobStatus,
    err: &InvalidSpec,
    generation: Option<i64>,
    now: Timestamp,
) -> (TrainingJobStatus, Vec<JobEvent>) {
    let mut st = current.clone();
    let events = write_invalid_spec(&mut st, &current.conditions, Some(err), generation, now);
    (st, events)
}

/// The report on an object that does not parse as a TrainingJob (so no status can be
/// decided for it): the `InvalidSpec` condition with reason `MalformedObject`, and its
/// Warning Event. The controller sends the condition alone, as a merge patch.
pub fn malformed_report(
    parse_error: &str,
    generation: Option<i64>,
    now: Timestamp,
) -> (JobCondition, JobEvent) {
    let message = format!("the object does not parse as a TrainingJob: {parse_error}");
    let mut conditions = Vec::new();
    set_condition(
        &mut conditions,
        condition::INVALID_SPEC,
        true,
        reason::MALFORMED_OBJECT,
        &message,
        now,
        generation,
    );
    let condition = conditions.remove(0);
    (condition, JobEvent::warning(reason::INVALID_SPEC, message))
}

/// Decides the next status and actions: runs the phases (`phases::PHASES`) in order over one
/// view of the job until one of them ends the round, then every row of `phases::FINISH`.
pub fn decide(
    job: &ValidJob,
    observed: &Observed,
    current: &TrainingJobStatus,
    config: &OperatorConfig,
) -> Plan {
    let view = View::new(job, observed, current, config);
    let mut round = Round::new(&view);
    for &(name, phase) in phases::PHASES {
        if phase(&view, &mut round) == outcome::Flow::Stop {
            for &(_, row) in phases::FINISH {
                row(&view, &mut round);
            }
            return round.into_plan(name);
        }
    }
    unreachable!("the last phase always ends the round")
}

#[cfg(test)]
mod tests;
