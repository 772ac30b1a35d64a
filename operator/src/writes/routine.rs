//! Routine slots: the share of the reconciles in flight that rounds writing status alone may
//! hold, so that a burst of them never fills every reconcile while a preempted job waits.
//!
//! kube-runtime bounds the reconciles in flight and has no priorities. A round that restarts a
//! gang, creates or deletes pods, or records a checkpoint asked for on a notice is carried out
//! at once, in the reconcile that decided it. A round that only writes status takes a routine
//! slot first (there are half as many as reconciles in flight); when none is free it sends
//! nothing and parks its job, and the job is reconciled again, and decided afresh, once a
//! slot is given back. So at most half the reconciles wait on status writes, and a status
//! write costs a reconcile slot for one request's time, never while it waits.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use futures::Stream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use crate::metrics::Metrics;
use crate::state::JobRef;

/// The routine slots and the jobs parked until one is free.
pub(super) struct RoutineSlots {
    slots: Arc<Semaphore>,
    /// Parked jobs in the order they came, each once.
    parked: Mutex<Parked>,
    /// Where parked jobs are woken: the stream [`RoutineSlots::new`] returns.
    wake: mpsc::UnboundedSender<JobRef>,
    metrics: Arc<Metrics>,
}

#[derive(Default)]
struct Parked {
    order: VecDeque<JobRef>,
    set: HashSet<JobRef>,
}

/// A routine slot, given back (and a parked job woken) when dropped.
pub(super) struct RoutineSlot {
    _permit: OwnedSemaphorePermit,
    slots: Arc<RoutineSlots>,
}

impl Drop for RoutineSlot {
    fn drop(&mut self) {
        self.slots.wake_one();
    }
}

/// The routine share of `reconciles` in flight: half, at least one.
pub(crate) fn routine_share(reconciles: u16) -> usize {
    usize::from(reconciles / 2).max(1)
}

impl RoutineSlots {
    /// `count` slots; also the stream of parked jobs to reconcile again.
    pub(super) fn new(
        count: usize,
        metrics: Arc<Metrics>,
    ) -> (Arc<Self>, impl Stream<Item = JobRef> + Send + 'static) {
        let (wake, mut woken) = mpsc::unbounded_channel();
        let slots = Arc::new(Self {
            slots: Arc::new(Semaphore::new(count.max(1))),
            parked: Mutex::new(Parked::default()),
            wake,
            metrics,
        });
        (
            slots,
            futures::stream::poll_fn(move |cx| woken.poll_recv(cx)),
        )
    }

    /// A free slot for `job`'s status write, or none: then the job is parked (once) and woken
    /// when a slot is given back.
    pub(super) fn take_or_park(self: &Arc<Self>, job: &JobRef) -> Option<RoutineSlot> {
        // Parked under the lock that wakes: a slot given back between a failed take and the
        // park would otherwise wake nobody.
        let mut parked = self.parked.lock().unwrap_or_else(|e| e.into_inner());
        if let Ok(permit) = self.slots.clone().try_acquire_owned() {
            // Reconciled by another trigger meanwhile: it need not be woken.
            if parked.set.remove(job) {
                parked.order.retain(|j| j != job);
            }
            return Some(RoutineSlot {
                _permit: permit,
                slots: self.clone(),
            });
        }
        if parked.set.insert(job.clone()) {
            parked.order.push_back(job.clone());
            self.metrics.status_rounds_parked.inc();
        }
        None
    }

    /// Wakes `job` now, on the same stream as parked jobs: a change whose watch event woke
    /// nothing (it came while the job's status was written).
    pub(super) fn wake(&self, job: JobRef) {
        // The receiver is gone only once the controller has stopped.
        let _ = self.wake.send(job);
    }

    /// Wakes the job parked longest, if any: called as a slot is given back.
    fn wake_one(&self) {
        let mut parked = self.parked.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(job) = parked.order.pop_front() {
            parked.set.remove(&job);
            // The receiver is gone only once the controller has stopped.
            let _ = self.wake.send(job);
        }
    }

    /// Jobs parked now.
    #[cfg(test)]
    fn parked(&self) -> usize {
        self.parked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .order
            .len()
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;

    fn job(name: &str) -> JobRef {
        JobRef::new(name).within("ml")
    }

    fn woken(wakes: &mut (impl Stream<Item = JobRef> + Unpin)) -> Option<JobRef> {
        wakes.next().now_or_never().flatten()
    }

    use futures::FutureExt;

    #[test]
    fn half_the_reconciles_at_least_one_write_status_alone() {
        assert_eq!(routine_share(32), 16);
        assert_eq!(routine_share(3), 1);
        assert_eq!(routine_share(1), 1);
    }

    #[tokio::test]
    async fn a_round_that_finds_no_slot_parks_its_job_once_and_a_freed_slot_wakes_it() {
        let (slots, wakes) = RoutineSlots::new(1, Arc::new(Metrics::new()));
        let mut wakes = Box::pin(wakes);
        let held = slots.take_or_park(&job("a")).expect("a free slot");
        assert!(slots.take_or_park(&job("b")).is_none(), "b parks");
        assert!(slots.take_or_park(&job("b")).is_none(), "b parks again");
        assert!(slots.take_or_park(&job("c")).is_none(), "c parks");
        assert_eq!(slots.parked(), 2, "each job is parked once");
        assert_eq!(
            woken(&mut wakes),
            None,
            "nothing is woken while the slot is held"
        );
        drop(held);
        assert_eq!(
            woken(&mut wakes),
            Some(job("b")),
            "the job parked first is woken first"
        );
        assert_eq!(woken(&mut wakes), None, "one job per freed slot");
        let again = slots
            .take_or_park(&job("b"))
            .expect("the woken job finds the slot free");
        drop(again);
        assert_eq!(woken(&mut wakes), Some(job("c")));
        assert_eq!(slots.parked(), 0);
    }

    #[tokio::test]
    async fn a_slot_given_back_with_nobody_parked_is_free_for_the_next_round() {
        let (slots, wakes) = RoutineSlots::new(2, Arc::new(Metrics::new()));
        let mut wakes = Box::pin(wakes);
        let a = slots.take_or_park(&job("a")).expect("slot");
        let b = slots.take_or_park(&job("b")).expect("slot");
        drop((a, b));
        assert_eq!(woken(&mut wakes), None);
        assert!(slots.take_or_park(&job("c")).is_some());
    }
}
