//! Kueue's admission of a job that names a LocalQueue ([`crate::model::kueue`]): no pod before
//! the Workload is admitted, the admitted flavors on every pod, the workers stopped when
//! Kueue evicts it, the quota given back once they are gone, and the Workload marked
//! `Finished` when the job ends. The condition `Admitted` says where the job stands.

use jiff::SignedDuration;

use super::super::outcome::{Action, Flow};
use super::super::round::Round;
use super::super::view::View;
use super::restart::{self, Cause};
use crate::build::workload::{desired_workload, workload_name};
use crate::model::condition;
use crate::model::crd::{Phase, RestartReason};
use crate::model::events::JobEvent;
use crate::model::kueue::{self, Queued, WorkloadSeen};
use crate::model::placement::Placement;
use crate::model::reason;

/// How often a job whose evicted workers are still stopping is looked at again (their going
/// wakes it first).
const DRAIN_RECHECK: SignedDuration = SignedDuration::from_secs(10);
/// How long trainers that report progress get to save the checkpoint asked for on an eviction
/// before their workers are stopped all the same: Kueue waits for the quota meanwhile.
pub(crate) const EVICTION_CHECKPOINT_WAIT: SignedDuration = SignedDuration::from_secs(60);

/// The admission phase: a job that names no queue goes on; one whose Workload is admitted
/// goes on with the condition `Admitted`; any other waits, its workers stopped.
pub(in crate::plan) fn admission(view: &View<'_>, round: &mut Round) -> Flow {
    let Some(queued) = view.observed.queue.as_ref() else {
        return Flow::Continue;
    };
    let queue = view.job.queue.clone().unwrap_or_default();
    let name = workload_name(&view.job.name);
    match queued {
        Queued::NoKueue => {
            let message = format!(
                "the job names LocalQueue {queue:?} (label {}) and no Kueue is installed (no \
                 Workload CRD when the operator started): it waits; install Kueue and restart \
                 the operator, or remove the label",
                kueue::QUEUE_LABEL
            );
            wait(view, round, reason::KUEUE_NOT_INSTALLED, &message)
        }
        Queued::NoWorkload => {
            if let Some(w) = desired_workload(view.job, &Placement::default()) {
                round.actions.push(Action::CreateWorkload(Box::new(w)));
            }
            let message =
                format!("waiting for Kueue to admit Workload {name} (LocalQueue {queue:?})");
            wait(view, round, reason::WAITING_FOR_ADMISSION, &message)
        }
        Queued::Workload(w) if w.admitted && !w.placement.missing.is_empty() => {
            let message = format!(
                "Workload {name} is admitted with ResourceFlavor(s) {} the operator does not \
                 know yet: waiting for them",
                w.placement.missing.join(", ")
            );
            wait(view, round, reason::WAITING_FOR_ADMISSION, &message)
        }
        Queued::Workload(w) if w.admitted => {
            if let Some(flow) = partial(view, round, w) {
                return flow;
            }
            let message = format!(
                "Workload {name} admitted by ClusterQueue {}",
                w.cluster_queue
            );
            if !condition::condition_is_true(&round.st.conditions, condition::ADMITTED) {
                round
                    .events
                    .push(JobEvent::normal(reason::ADMITTED, message.clone()));
            }
            round.condition(view, condition::ADMITTED, true, reason::ADMITTED, &message);
            Flow::Continue
        }
        Queued::Workload(w) => not_admitted(view, round, w),
    }
}

/// The workers Kueue admitted an elastic job with, where that is fewer than its spec asks
/// for (partial admission, down to the Workload's `minCount`): no grow goes past it.
pub(crate) fn admitted_workers(view: &View<'_>) -> Option<u32> {
    view.job.spec.elastic.as_ref()?;
    match view.observed.queue.as_ref() {
        Some(Queued::Workload(w)) if w.admitted => w.admitted_count,
        _ => None,
    }
}

/// A partial admission of an elastic job whose attempt has more workers than were admitted:
/// before any pod of the attempt exists, the attempt takes the admitted size (the next round
/// creates that many); once pods exist, the gang shrinks to it.
fn partial(view: &View<'_>, round: &mut Round, w: &WorkloadSeen) -> Option<Flow> {
    let admitted = admitted_workers(view)?;
    if admitted >= view.workers || admitted == 0 {
        return None;
    }
    let detail = format!(
        "Kueue admitted Workload {} with {admitted} of {} worker(s) (partial admission, \
         minWorkers {}): the gang trains with {admitted}",
        w.name,
        view.job.spec.workers,
        view.job.spec.elastic.as_ref().map_or(0, |e| e.min_workers)
    );
    let started = view.census.current.values().next().is_some() || !view.census.kept.is_empty();
    if started {
        return Some(restart::resize(
            view,
            round,
            RestartReason::Shrink,
            admitted,
            &detail,
        ));
    }
    round.st.world_size = Some(admitted);
    round
        .events
        .push(JobEvent::normal(reason::ADMITTED, detail.clone()));
    round.condition(view, condition::ADMITTED, true, reason::ADMITTED, &detail);
    round.requeue(Some(view.now));
    round.record_workers(view);
    Some(Flow::Stop)
}

/// A Workload that is not admitted (it waits, or Kueue evicted it): the current attempt's
/// workers restart as a preemption (Kueue took their quota), older pods go, and an evicted
/// Workload whose pods are all gone gives its quota back.
fn not_admitted(view: &View<'_>, round: &mut Round, w: &WorkloadSeen) -> Flow {
    let live = view
        .census
        .current
        .values()
        .any(|p| p.metadata.deletion_timestamp.is_none());
    if live && round.st.phase.is_some_and(|p| !p.is_terminal()) {
        // Trainers that report progress checkpoint first, as on a termination notice
        // (`progress::termination_notice`), for at most EVICTION_CHECKPOINT_WAIT.
        if w.evicted.is_some() && super::progress::current(view, round).is_some() {
            let due = super::progress::requested_time(round)
                .and_then(|at| at.checked_add(EVICTION_CHECKPOINT_WAIT).ok());
            match due {
                Some(due) if view.now >= due => {}
                _ => {
                    round.requeue(due);
                    let message = format!(
                        "{}: the trainers are asked for a checkpoint before the workers stop",
                        evicted_message(w)
                    );
                    round.condition(view, condition::ADMITTED, false, reason::EVICTED, &message);
                    return Flow::Continue;
                }
            }
        }
        let why = w
            .evicted
            .as_deref()
            .unwrap_or("its admission was withdrawn");
        let detail = format!("Kueue evicted Workload {} ({why})", w.name);
        return restart::restart_for(
            view,
            round,
            Cause {
                reason: RestartReason::Preemption,
                detail,
            },
        );
    }
    if !view.observed.pods.is_empty() {
        // Every pod goes, those already ended too: the quota is given back only once none is
        // left.
        round.remove_pods(view, view.observed.pods.iter());
        round.record_workers(view);
        round.requeue(view.now.saturating_add(DRAIN_RECHECK).ok());
        return wait(view, round, reason::EVICTED, &evicted_message(w));
    }
    if w.evicted.is_some() && w.holds_quota {
        let conditions = kueue::with_condition(
            &w.conditions,
            kueue::QUOTA_RESERVED,
            false,
            "Pending",
            "the workers stopped after the eviction: the quota is given back",
            view.now,
        );
        let conditions = kueue::with_condition(
            &conditions,
            kueue::ADMITTED,
            false,
            "NoReservation",
            "the quota is given back",
            view.now,
        );
        round.actions.push(Action::WriteWorkloadStatus {
            name: w.name.clone(),
            resource_version: w.resource_version.clone(),
            conditions,
            release: true,
        });
        return wait(view, round, reason::EVICTED, &evicted_message(w));
    }
    let message = match &w.waiting {
        Some(why) => format!("waiting for Kueue to admit Workload {}: {why}", w.name),
        None => format!("waiting for Kueue to admit Workload {}", w.name),
    };
    wait(view, round, reason::WAITING_FOR_ADMISSION, &message)
}

fn evicted_message(w: &WorkloadSeen) -> String {
    format!(
        "Kueue evicted Workload {} ({}): the workers stop, and the job waits to be admitted again",
        w.name,
        w.evicted.as_deref().unwrap_or("admission withdrawn")
    )
}

/// The round stops with the job Pending (a restart under way stays Restarting), the
/// condition `Admitted` False with `reason` and `message`.
fn wait(view: &View<'_>, round: &mut Round, why: &str, message: &str) -> Flow {
    if round.st.phase == Some(Phase::Running) {
        round.st.phase = Some(Phase::Pending);
    }
    round.condition(view, condition::ADMITTED, false, why, message);
    round.record_workers(view);
    Flow::Stop
}

/// A job that ended marks its Workload `Finished`, once, so that Kueue frees its quota.
pub(crate) fn finish_workload(view: &View<'_>, round: &mut Round) {
    let Some(Queued::Workload(w)) = view.observed.queue.as_ref() else {
        return;
    };
    let Some(phase) = round.st.phase.filter(|p| p.is_terminal()) else {
        return;
    };
    if w.finished {
        return;
    }
    let (why, message) = match phase {
        Phase::Succeeded => ("Succeeded", "the TrainingJob succeeded"),
        _ => ("Failed", "the TrainingJob failed"),
    };
    let conditions =
        kueue::with_condition(&w.conditions, kueue::FINISHED, true, why, message, view.now);
    round.actions.push(Action::WriteWorkloadStatus {
        name: w.name.clone(),
        resource_version: w.resource_version.clone(),
        conditions,
        release: false,
    });
}
