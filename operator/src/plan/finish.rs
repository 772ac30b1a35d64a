//! How a round finishes into its [`Plan`] once a phase stopped it: unseen writes held back, the
//! ledger folded, `InvalidSpec` set or cleared, rejections shown, supervisors told.

use jiff::{SignedDuration, Timestamp};

use super::outcome::{Action, PhaseName, Plan};
use super::round::Round;
use super::view::View;
use crate::model::condition::{self, condition_is_true, set_condition};
use crate::model::crd::{JobCondition, Phase, TrainingJobStatus};
use crate::model::events::JobEvent;
use crate::model::reason;
use crate::model::validate::InvalidSpec;

impl Round {
    /// The plan, with the actions on objects whose last write the caches do not show yet held
    /// back, the round's transitions in the goodput ledger and `InvalidSpec` set or cleared.
    pub fn finish(mut self, view: &View<'_>, decided_by: PhaseName) -> Plan {
        self.hold_back_unseen(view);
        super::goodput::fold(view, &mut self);
        self.events.extend(write_invalid_spec(
            &mut self.st,
            &view.current.conditions,
            self.invalid.as_ref(),
            view.generation,
            view.now,
        ));
        if let Some(writes) = &view.observed.last_writes {
            let (st, shown) =
                crate::model::rejection::after_writes(&self.st, writes, view.generation, view.now);
            self.st = st;
            self.events.extend(shown);
        }
        let supervise = super::in_place::supervise(view, &self);
        self.events.extend(self.announcement);
        if view.observed.told_attempt != Some(self.st.attempt) {
            super::attempt_start::tell_attempt_start(&mut self.events, &self.st, view.now);
        }
        Plan {
            supervise,
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

    /// Drops the actions on objects a write of this operator is on its way to
    /// ([`super::UnseenWrite`]), and looks again when the first of those waits lapses at the
    /// latest (the watch event that shows the write wakes the job sooner). A round whose pod
    /// creates are all held back repeats a round whose creates went out: that round announced
    /// the attempt and started its clock.
    fn hold_back_unseen(&mut self, view: &View<'_>) {
        let unseen = &view.observed.unseen_writes;
        if unseen.is_empty() || self.actions.is_empty() {
            return;
        }
        let creates =
            |actions: &[Action]| actions.iter().any(|a| matches!(a, Action::CreatePod(_)));
        let created = creates(&self.actions);
        let mut lapses = None;
        self.actions.retain(|action| {
            let (kind, name) = action.target();
            match unseen.iter().find(|w| w.kind == kind && w.name == name) {
                Some(w) => {
                    lapses =
                        Some(lapses.map_or(w.lapses_in, |l: SignedDuration| l.min(w.lapses_in)));
                    false
                }
                None => true,
            }
        });
        if let Some(lapses) = lapses {
            self.requeue(view.now.checked_add(lapses).ok());
        }
        if created && !creates(&self.actions) {
            self.creates_attempt = None;
            self.announcement = None;
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
