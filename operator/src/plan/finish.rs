//! The decisions of a round after the phase that stopped it: the rows of [`super::phases::FINISH`],
//! and the [`Plan`] the round comes to.

use jiff::{SignedDuration, Timestamp};

use super::outcome::{Action, PhaseName, Plan};
use super::round::Round;
use super::view::View;
use crate::model::condition::{self, condition_is_true, set_condition};
use crate::model::crd::{JobCondition, Phase, TrainingJobStatus};
use crate::model::events::JobEvent;
use crate::model::reason;
use crate::model::validate::InvalidSpec;

/// The name of a decision taken after the phases ([`super::phases::FINISH`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FinishName {
    /// Actions on objects whose last write the caches do not show yet are held back.
    HoldBackUnseen,
    /// The round's transitions go into the goodput ledger.
    Ledger,
    /// The condition `InvalidSpec` is set or cleared.
    InvalidSpec,
    /// Writes the API server rejected are shown.
    Rejections,
    /// What the in-place restart supervisors are told.
    Supervise,
    /// The attempt's `CreatingWorkers` Event.
    Announce,
    /// The Event that starts the attempt, on a replica that has not told it yet.
    TellAttempt,
    /// A job that ended marks its Kueue Workload `Finished`.
    FinishWorkload,
    /// `status.waitingFor`, the `WAITING` column.
    WaitingFor,
}

/// One decision after the phases.
pub(crate) type FinishFn = fn(&View<'_>, &mut Round);

/// Drops the actions on objects a write of this operator is on its way to
/// ([`super::UnseenWrite`]), and looks again when the first of those waits lapses at the
/// latest (the watch event that shows the write wakes the job sooner). A round whose pod
/// creates are all held back repeats a round whose creates went out: that round announced
/// the attempt and started its clock.
pub(super) fn hold_back_unseen(view: &View<'_>, round: &mut Round) {
    let unseen = &view.observed.unseen_writes;
    if unseen.is_empty() || round.actions.is_empty() {
        return;
    }
    let creates = |actions: &[Action]| actions.iter().any(|a| matches!(a, Action::CreatePod(_)));
    let created = creates(&round.actions);
    let mut lapses = None;
    round.actions.retain(|action| {
        let (kind, name) = action.target();
        match unseen.iter().find(|w| w.kind == kind && w.name == name) {
            Some(w) => {
                lapses = Some(lapses.map_or(w.lapses_in, |l: SignedDuration| l.min(w.lapses_in)));
                false
            }
            None => true,
        }
    });
    if let Some(lapses) = lapses {
        round.requeue(view.now.checked_add(lapses).ok());
    }
    if created && !creates(&round.actions) {
        round.creates_attempt = None;
        round.announcement = None;
    }
}

/// `InvalidSpec` from the round's verdict on the spec ([`write_invalid_spec`]).
pub(super) fn invalid_spec(view: &View<'_>, round: &mut Round) {
    round.events.extend(write_invalid_spec(
        &mut round.st,
        &view.current.conditions,
        round.invalid.as_ref(),
        view.generation,
        view.now,
    ));
}

/// The condition `WriteRejected` and its Events, from the last round's writes.
pub(super) fn rejections(view: &View<'_>, round: &mut Round) {
    if let Some(writes) = &view.observed.last_writes {
        let (st, shown) =
            crate::model::rejection::after_writes(&round.st, writes, view.generation, view.now);
        round.st = st;
        round.events.extend(shown);
    }
}

/// What the in-place restart supervisors are told ([`super::in_place::supervise`]).
pub(super) fn supervise(view: &View<'_>, round: &mut Round) {
    round.supervise = super::in_place::supervise(view, round);
}

/// The attempt's `CreatingWorkers` Event, unless its creates were held back.
pub(super) fn announce(_: &View<'_>, round: &mut Round) {
    round.events.extend(round.announcement.take());
}

/// `status.waitingFor`: what a job that does not run waits for, in a word, from what the
/// round decided.
pub(super) fn waiting_for(view: &View<'_>, round: &mut Round) {
    use crate::model::condition::{self, condition_is_true};
    use crate::model::crd::{Phase, RestartReason};
    let st = &round.st;
    let admitted = st
        .conditions
        .iter()
        .find(|c| c.type_ == condition::ADMITTED);
    let backing_off = view.census.current.is_empty()
        && super::outcome::next_try(view.job, st).is_some_and(|at| view.now < at);
    let word = match st.phase {
        Some(Phase::Running | Phase::Succeeded | Phase::Failed | Phase::Suspended) => None,
        _ if admitted.is_some_and(|c| c.status == "False") => Some("Admission"),
        _ if backing_off => st.last_restart.as_ref().map(|l| match l.reason {
            RestartReason::Requeue => "Requeue",
            _ => "Backoff",
        }),
        _ if condition_is_true(&st.conditions, condition::UNSCHEDULABLE) => Some("Capacity"),
        _ => None,
    };
    round.st.waiting_for = word.map(str::to_owned);
}

/// The Event that starts the attempt, when this replica has not told it yet.
pub(super) fn tell_attempt(view: &View<'_>, round: &mut Round) {
    if view.observed.told_attempt != Some(round.st.attempt) {
        super::attempt_start::tell_attempt_start(&mut round.events, &round.st, view.now);
    }
}

impl Round {
    /// The plan the round comes to, once the phases and the finish rows have decided.
    pub fn into_plan(self, decided_by: PhaseName) -> Plan {
        Plan {
            supervise: self.supervise,
            status: self.st,
            actions: self.actions,
            events: self.events,
            requeue_at: self.requeue_at,
            restart: self.restart.or(self.resumed),
            creates_attempt: self.creates_attempt,
            checkpoint_request: self.checkpoint_request,
            checkpoint_withdrawal: self.checkpoint_withdrawal,
            steps_lost: self.steps_lost,
            decided_by,
        }
    }
}

/// The one writer of the condition `InvalidSpec`: True with the error (and a Warning Event
/// when its message changes), or False once a job that was invalid is valid again.
pub(super) fn write_invalid_spec(
    st: &mut TrainingJobStatus,
    before: &[JobCondition],
    err: Option<&InvalidSpec>,
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<JobEvent> {
    let Some(err) = err else {
        if condition_is_true(&st.conditions, condition::INVALID_SPEC) {
            set_condition(
                &mut st.conditions,
                condition::INVALID_SPEC,
                false,
                reason::VALID,
                "",
                now,
                generation,
            );
        }
        return Vec::new();
    };
    let message = err.to_string();
    let already = before
        .iter()
        .any(|c| c.type_ == condition::INVALID_SPEC && c.status == "True" && c.message == message);
    set_condition(
        &mut st.conditions,
        condition::INVALID_SPEC,
        true,
        reason::INVALID_SPEC,
        &message,
        now,
        generation,
    );
    st.observed_generation = generation;
    st.phase.get_or_insert(Phase::Pending);
    if already {
        Vec::new()
    } else {
        vec![JobEvent::warning(reason::INVALID_SPEC, message)]
    }
}
