//! The write gate: a reconcile that has decided writes waits here for slots, one per request
//! it will have in flight at once, restarts and creates ahead of status-only writes; the number
//! of slots follows the API server ([`AdaptiveLimit`]).
//!
//! Slots count requests, not rounds: a round creating a job has six in flight (four pods, the
//! Service, the status), and memory follows the requests in flight (about 35 kB each: the
//! concurrency sweep of the fourth benchmark round, in docs/benchmarks.md's git history: 10
//! MiB more peak RSS for about 290 more requests).
//! A round that writes its status before its deletes (see the write order in
//! [`super::executor`]) takes a slot per phase: a restart of a 4-worker job takes one for its
//! status write, then gives it back and waits for three for its deletes ([`Permit::widen`]),
//! ahead of every round that has written nothing yet ([`Urgency::Continuing`]). So a burst of
//! restarts writes as many statuses at once as there are slots, restarts already started
//! finish before new ones begin, and a burst of creates stays within the memory target.
//!
//! A round never holds slots while it waits for more: were every slot held by a round waiting
//! to widen, none would ever be freed.
//!
//! kube-runtime's scheduler has no priorities: with a constant bound on reconciles, a burst
//! of preemptions among 1,000 jobs waited behind thousands of reconciles that only recorded
//! pod detail. Here every triggered job is decided at once (decisions read caches only and
//! cost no request), and only the writes queue, by [`Urgency`]. A reconcile whose round only
//! writes status does not queue at all when the gate is full: its job is parked
//! ([`WriteGate::enter_or_park`]) and woken on the stream [`WriteGate::new`] returns once slots are free and no
//! urgent round waits. So the reconciles in flight (bounded by kube-runtime) are never all
//! held by status writes while a preempted job waits to be decided.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::Stream;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::JobRef;

use super::limit::{AdaptiveLimit, Change, LimitConfig};
use crate::metrics::Metrics;
use crate::plan::Plan;

/// Which writes go first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Urgency {
    /// The rest of a round whose status is written already: the deletes and creates of a
    /// restart. Started restarts finish before new ones begin.
    Continuing = 0,
    /// GPUs wait on it: a restart, pods to create or delete, a Service or PVC to create; or
    /// its status records a checkpoint asked for on a termination notice (the node has
    /// seconds left, and the restart from that checkpoint follows).
    Urgent = 1,
    /// A status write alone (a transition recorded, detail that waited its batch).
    Routine = 2,
}

/// How many urgencies there are: the gate keeps a queue for each.
const URGENCIES: usize = 3;

impl Urgency {
    /// The urgency of a plan's writes.
    pub(super) fn of(plan: &Plan) -> Self {
        if plan.restart.is_some() || !plan.actions.is_empty() || plan.checkpoint_request.is_some() {
            Self::Urgent
        } else {
            Self::Routine
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::Continuing => "continuing",
            Self::Urgent => "urgent",
            Self::Routine => "routine",
        }
    }
}

struct Inner {
    limit: AdaptiveLimit,
    /// Slots taken.
    in_flight: usize,
    /// Waiting rounds and the slots each takes, by [`Urgency`] (continuing first).
    /// A waiter is sent the slots it was granted.
    waiting: [VecDeque<(usize, oneshot::Sender<usize>)>; URGENCIES],
    /// Jobs whose status-only round found the gate full, in the order they came, once each.
    parked: VecDeque<JobRef>,
    parked_set: HashSet<JobRef>,
    /// Parked jobs woken and not back yet, with when: each counts as a slot taken, so that
    /// free slots wake as many jobs as they can serve, not every parked job at once.
    woken: HashMap<JobRef, Instant>,
}

/// A woken job that has not come back within this is taken to be gone (deleted, or its
/// reconcile cancelled): its reservation lapses.
const WOKEN_LAPSES: Duration = Duration::from_secs(5);

/// The slots write rounds take, and the rounds waiting for one.
pub(super) struct WriteGate {
    inner: Mutex<Inner>,
    metrics: Arc<Metrics>,
    /// Where parked jobs are woken: the stream [`WriteGate::new`] returns.
    wake: mpsc::UnboundedSender<JobRef>,
}

/// Slots: held while a round writes, given back when dropped.
pub(super) struct Permit {
    gate: Arc<WriteGate>,
    slots: usize,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.gate.release(self.slots);
    }
}

impl Permit {
    /// `wanted` slots for the round's next phase, kept as they are when the permit holds
    /// them already (or the whole limit). Otherwise the slots held are given back first and
    /// the round waits, at [`Urgency::Continuing`], without holding any: a round that held
    /// its slots while it waited for more would deadlock with every other such round.
    pub(super) async fn widen(mut self, wanted: usize) -> Permit {
        if wanted.min(self.gate.limit()) <= self.slots {
            return self;
        }
        let held = std::mem::take(&mut self.slots);
        let gate = self.gate.clone();
        // The emptied permit gives back nothing: `held` is given back by the entry below, in
        // the same step as the round queues, so that no lower urgency takes the freed slots.
        drop(self);
        gate.enter_giving_back(held, Urgency::Continuing, wanted)
            .await
    }
}

/// A round waiting for slots. Dropped after they were handed to it but before it took them,
/// it gives them back.
struct Waiter {
    rx: Option<oneshot::Receiver<usize>>,
    gate: Arc<WriteGate>,
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if let Some(mut rx) = self.rx.take() {
            rx.close();
            if let Ok(granted) = rx.try_recv() {
                self.gate.release(granted);
            }
        }
    }
}

impl WriteGate {
    /// The gate, and the stream of parked jobs to reconcile again as slots free up (for
    /// `Controller::reconcile_on`).
    pub(super) fn new(
        config: LimitConfig,
        metrics: Arc<Metrics>,
    ) -> (Arc<Self>, impl Stream<Item = JobRef> + Send + 'static) {
        let limit = AdaptiveLimit::new(config);
        metrics.write_limit.set(gauge(limit.limit()));
        let (wake, mut wakes) = mpsc::unbounded_channel();
        let gate = Arc::new(Self {
            inner: Mutex::new(Inner {
                limit,
                in_flight: 0,
                waiting: std::array::from_fn(|_| VecDeque::new()),
                parked: VecDeque::new(),
                parked_set: HashSet::new(),
                woken: HashMap::new(),
            }),
            metrics,
            wake,
        });
        (
            gate,
            futures::stream::poll_fn(move |cx| wakes.poll_recv(cx)),
        )
    }

    /// `wanted` slots now for a round that only writes status, as [`Self::try_enter`] would
    /// give them; else `job` is parked (once, however often it comes) and sent on
    /// the wake stream when slots are free and no urgent round waits.
    pub(super) fn enter_or_park(self: &Arc<Self>, job: &JobRef, wanted: usize) -> Option<Permit> {
        self.lock().woken.remove(job);
        if let Some(permit) = self.try_enter(Urgency::Routine, wanted) {
            return Some(permit);
        }
        {
            let mut inner = self.lock();
            if inner.parked_set.insert(job.clone()) {
                inner.parked.push_back(job.clone());
            }
            inner.limit.saturated();
        }
        self.metrics.status_rounds_parked.inc();
        // Slots freed between try_enter and parking must not be missed.
        self.dispatch();
        None
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every update below leaves the counts consistent before anything can panic.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The number of slots now.
    fn limit(&self) -> usize {
        self.lock().limit.limit()
    }

    /// `wanted` slots now (as many as the limit at most), if they are free and no round of
    /// this urgency or a higher one waits.
    pub(super) fn try_enter(self: &Arc<Self>, urgency: Urgency, wanted: usize) -> Option<Permit> {
        let slots = Self::take_free(&mut self.lock(), urgency, wanted)?;
        Some(Permit {
            gate: self.clone(),
            slots,
        })
    }

    /// Takes `wanted` slots (as many as the limit at most) and says how many, if they are
    /// free and no round of this urgency or a higher one waits.
    fn take_free(inner: &mut Inner, urgency: Urgency, wanted: usize) -> Option<usize> {
        let slots = wanted.clamp(1, inner.limit.limit());
        let ahead = inner.waiting[..=urgency as usize]
            .iter()
            .any(|q| !q.is_empty());
        let reserved = match urgency {
            Urgency::Continuing | Urgency::Urgent => 0,
            Urgency::Routine => inner.woken.len(),
        };
        if ahead || inner.in_flight + reserved + slots > inner.limit.limit() {
            return None;
        }
        inner.in_flight += slots;
        Some(slots)
    }

    /// Waits for `wanted` slots (as many as the limit at most), behind every round of the
    /// same or a higher urgency.
    pub(super) async fn enter(self: &Arc<Self>, urgency: Urgency, wanted: usize) -> Permit {
        self.enter_giving_back(0, urgency, wanted).await
    }

    /// Gives back `held` slots and waits for `wanted` as [`Self::enter`] does, in one step
    /// under the lock: the slots given back go to the rounds ahead, not around the queue.
    async fn enter_giving_back(
        self: &Arc<Self>,
        held: usize,
        urgency: Urgency,
        wanted: usize,
    ) -> Permit {
        let (tx, rx) = oneshot::channel();
        {
            let mut inner = self.lock();
            inner.in_flight = inner.in_flight.saturating_sub(held);
            if let Some(slots) = Self::take_free(&mut inner, urgency, wanted) {
                drop(inner);
                return Permit {
                    gate: self.clone(),
                    slots,
                };
            }
            inner.waiting[urgency as usize].push_back((wanted.max(1), tx));
            self.metrics.write_rounds_queued.inc();
            inner.limit.saturated();
            self.export_waiting(&inner);
        }
        // The slots given back may serve the rounds ahead of this one.
        self.dispatch();
        let mut waiter = Waiter {
            rx: Some(rx),
            gate: self.clone(),
        };
        let granted = match waiter.rx.as_mut() {
            Some(rx) => rx.await.ok(),
            None => None,
        };
        waiter.rx = None;
        let slots = granted.unwrap_or_else(|| {
            // The gate dropped the sender (never while a round holds it): go on, counted.
            tracing::debug!("write gate dropped a waiting round");
            let mut inner = self.lock();
            inner.in_flight += 1;
            1
        });
        Permit {
            gate: self.clone(),
            slots,
        }
    }

    /// Awaits one write request and lets the limit learn from it: how long it took, and
    /// whether the server throttled it (429).
    pub(super) async fn timed<T, E: Throttled>(
        &self,
        request: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let started = std::time::Instant::now();
        let result = request.await;
        let throttled = result.as_ref().err().is_some_and(Throttled::throttled);
        self.sample(started.elapsed(), throttled);
        result
    }

    /// One answered write: the limit learns from it (and, when a window closes under a memory
    /// budget, from the resident set).
    pub(super) fn sample(&self, latency: Duration, throttled: bool) {
        let mut resident = None;
        let (change, budget) = {
            let mut inner = self.lock();
            let change = inner.limit.sample_within(latency, throttled, || {
                resident = resident_bytes();
                resident
            });
            if change != Change::Kept {
                self.metrics.write_limit.set(gauge(inner.limit.limit()));
            }
            (change, inner.limit.config().memory_budget)
        };
        match change {
            Change::Raised(_) => self.dispatch(),
            Change::Lowered(limit) => {
                tracing::debug!(limit, throttled, ?latency, "write limit lowered");
            }
            Change::Capped(limit) => tracing::info!(
                limit,
                resident_mib = resident.map(|r| r >> 20),
                budget_mib = budget.map(|b| b >> 20),
                "write limit lowered: the operator's memory is in its budget's last eighth"
            ),
            Change::Kept => {}
        }
    }

    fn release(&self, slots: usize) {
        {
            let mut inner = self.lock();
            inner.in_flight = inner.in_flight.saturating_sub(slots);
        }
        self.dispatch();
    }

    /// Hands free slots to waiting rounds in order of [`Urgency`]. The first waiting round
    /// waits until its slots are free (a round wanting more slots than the limit has takes the
    /// whole limit), so that a wide round is not starved by narrow ones behind it.
    fn dispatch(&self) {
        let mut inner = self.lock();
        loop {
            let limit = inner.limit.limit();
            let free = limit.saturating_sub(inner.in_flight);
            let Some(queue) = inner.waiting.iter_mut().find(|q| !q.is_empty()) else {
                break;
            };
            let Some(&(wanted, _)) = queue.front() else {
                break;
            };
            let slots = wanted.min(limit);
            if slots > free {
                break;
            }
            let Some((_, tx)) = queue.pop_front() else {
                break;
            };
            // A waiter that is gone (its reconcile was cancelled) takes no slot.
            if tx.send(slots).is_ok() {
                inner.in_flight += slots;
            }
        }
        self.wake_parked(&mut inner);
        self.export_waiting(&inner);
    }

    /// Wakes parked jobs, one per slot no waiting round and no woken job has claimed.
    fn wake_parked(&self, inner: &mut Inner) {
        if inner.parked.is_empty() || inner.waiting.iter().any(|q| !q.is_empty()) {
            return;
        }
        inner.woken.retain(|_, at| at.elapsed() < WOKEN_LAPSES);
        let mut free = inner
            .limit
            .limit()
            .saturating_sub(inner.in_flight + inner.woken.len());
        while free > 0 {
            let Some(job) = inner.parked.pop_front() else {
                break;
            };
            inner.parked_set.remove(&job);
            if self.wake.send(job.clone()).is_ok() {
                inner.woken.insert(job, Instant::now());
                free -= 1;
            }
        }
    }

    fn export_waiting(&self, inner: &Inner) {
        for urgency in [Urgency::Continuing, Urgency::Urgent, Urgency::Routine] {
            let parked = match urgency {
                Urgency::Continuing | Urgency::Urgent => 0,
                Urgency::Routine => inner.parked.len(),
            };
            self.metrics
                .write_rounds_waiting(urgency.as_str())
                .set(gauge(inner.waiting[urgency as usize].len() + parked));
        }
    }

    /// The limit, the slots taken and the rounds waiting by urgency.
    #[cfg(test)]
    pub(super) fn counts(&self) -> (usize, usize, [usize; URGENCIES]) {
        let inner = self.lock();
        (
            inner.limit.limit(),
            inner.in_flight,
            inner.waiting.each_ref().map(VecDeque::len),
        )
    }
}

/// An error that says whether the API server throttled the request (429).
pub(super) trait Throttled {
    fn throttled(&self) -> bool;
}

impl Throttled for kube::Error {
    fn throttled(&self) -> bool {
        matches!(self, kube::Error::Api(s) if s.code == 429)
    }
}

impl Throttled for crate::error::Error {
    fn throttled(&self) -> bool {
        matches!(self, crate::error::Error::Kube { source, .. } if source.throttled())
    }
}

/// The operator's resident set size, bytes (None where the platform does not say).
fn resident_bytes() -> Option<u64> {
    memory_stats::memory_stats().and_then(|m| u64::try_from(m.physical_mem).ok())
}

fn gauge(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    /// The parked jobs a test gate wakes.
    type Wakes = std::pin::Pin<Box<dyn Stream<Item = JobRef> + Send>>;

    fn gate(initial: usize) -> (Arc<WriteGate>, Wakes) {
        let (gate, wakes) = WriteGate::new(
            LimitConfig {
                min: 1,
                max: 8,
                initial,
                latency_target: Duration::from_secs(1),
                memory_budget: None,
            },
            Arc::new(Metrics::new()),
        );
        (gate, Box::pin(wakes))
    }

    /// Rounds queued at a gate one after the other, each for one slot, recording the order
    /// they are served in.
    struct Queued {
        order: Arc<Mutex<Vec<&'static str>>>,
        tasks: Vec<tokio::task::JoinHandle<()>>,
    }

    impl Queued {
        async fn one_slot_each(
            g: &Arc<WriteGate>,
            rounds: impl IntoIterator<Item = (&'static str, Urgency)>,
        ) -> Self {
            let order = Arc::new(Mutex::new(Vec::new()));
            let mut tasks = Vec::new();
            for (name, urgency) in rounds {
                let (g, order) = (g.clone(), order.clone());
                tasks.push(tokio::spawn(async move {
                    let _permit = g.enter(urgency, 1).await;
                    order.lock().expect("order").push(name);
                }));
                // Queued in this order.
                tokio::task::yield_now().await;
            }
            Self { order, tasks }
        }

        /// The order they were served in, once every one was.
        async fn served(self) -> Vec<&'static str> {
            for t in self.tasks {
                t.await.expect("task");
            }
            self.order.lock().expect("order").clone()
        }
    }

    #[tokio::test]
    async fn urgent_rounds_take_freed_slots_before_routine_rounds_that_waited_longer() {
        let (g, _wakes) = gate(1);
        let held = g.enter(Urgency::Routine, 1).await;
        let queued = Queued::one_slot_each(
            &g,
            [
                ("routine-1", Urgency::Routine),
                ("routine-2", Urgency::Routine),
                ("urgent", Urgency::Urgent),
            ],
        )
        .await;
        assert_eq!(g.counts(), (1, 1, [0, 1, 2]));
        assert_eq!(
            g.metrics.write_rounds_queued.get(),
            3,
            "each queued round counted"
        );
        drop(held);
        assert_eq!(
            queued.served().await,
            vec!["urgent", "routine-1", "routine-2"]
        );
        assert_eq!(g.counts().1, 0, "every slot given back");
        assert_eq!(
            g.metrics.write_rounds_queued.get(),
            3,
            "served: nothing more queued"
        );
    }

    /// A round that only asks the trainers for a checkpoint (and records it in the status).
    fn asking_for_a_checkpoint() -> Plan {
        Plan {
            status: crate::crd::TrainingJobStatus::default(),
            actions: Vec::new(),
            events: Vec::new(),
            requeue_at: None,
            restart: None,
            creates_attempt: None,
            announcement: None,
            checkpoint_request: Some(0),
            checkpoint_withdrawal: None,
            steps_lost: None,
            decided_by: crate::plan::PhaseName::TerminationNotice,
        }
    }

    #[tokio::test]
    async fn a_round_that_asks_for_a_checkpoint_goes_before_status_writes_that_waited_longer() {
        let asking = asking_for_a_checkpoint();
        let (g, _wakes) = gate(1);
        let held = g.enter(Urgency::Routine, 1).await;
        let queued = Queued::one_slot_each(
            &g,
            [
                ("status-1", Urgency::Routine),
                ("status-2", Urgency::Routine),
                ("checkpoint", Urgency::of(&asking)),
            ],
        )
        .await;
        assert_eq!(g.counts(), (1, 1, [0, 1, 2]));
        drop(held);
        assert_eq!(
            queued.served().await,
            vec!["checkpoint", "status-1", "status-2"]
        );
        // And it is never parked: only status-only rounds are.
        assert_eq!(Urgency::of(&asking), Urgency::Urgent);
        let plain = Plan {
            checkpoint_request: None,
            ..asking
        };
        assert_eq!(Urgency::of(&plain), Urgency::Routine);
    }

    #[tokio::test]
    async fn a_continuing_round_takes_freed_slots_before_urgent_rounds_that_waited_longer() {
        let (g, _wakes) = gate(1);
        let held = g.enter(Urgency::Urgent, 1).await;
        let queued = Queued::one_slot_each(
            &g,
            [
                ("urgent-1", Urgency::Urgent),
                ("urgent-2", Urgency::Urgent),
                ("continuing", Urgency::Continuing),
            ],
        )
        .await;
        assert_eq!(g.counts(), (1, 1, [1, 2, 0]));
        // A newcomer at urgent waits behind the continuing round too.
        assert!(g.try_enter(Urgency::Urgent, 1).is_none());
        drop(held);
        assert_eq!(
            queued.served().await,
            vec!["continuing", "urgent-1", "urgent-2"]
        );
        assert_eq!(g.counts().1, 0, "every slot given back");
    }

    #[tokio::test]
    async fn a_widening_round_gives_its_slot_back_first_and_no_urgent_round_takes_it_meanwhile() {
        let (g, _wakes) = gate(3);
        let status_write = g.enter(Urgency::Urgent, 1).await;
        let other = g.enter(Urgency::Urgent, 2).await;
        let mut urgent = Box::pin(g.enter(Urgency::Urgent, 1));
        assert!((&mut urgent).now_or_never().is_none());
        let mut deletes = Box::pin(status_write.widen(3));
        assert!((&mut deletes).now_or_never().is_none());
        // Its slot is given back while it waits, and kept for it, not for the urgent round.
        assert_eq!(g.counts(), (3, 2, [1, 1, 0]));
        assert!((&mut urgent).now_or_never().is_none());
        drop(other);
        let deletes = (&mut deletes)
            .now_or_never()
            .expect("the continuing round first");
        assert_eq!(g.counts(), (3, 3, [0, 1, 0]));
        assert!((&mut urgent).now_or_never().is_none());
        drop(deletes);
        assert!(urgent.now_or_never().is_some());
    }

    #[tokio::test]
    async fn a_permit_that_holds_enough_slots_is_kept_as_it_is_when_widened() {
        let (g, _wakes) = gate(2);
        let wide = g.enter(Urgency::Urgent, 2).await;
        let mut waiting = Box::pin(g.enter(Urgency::Urgent, 1));
        assert!((&mut waiting).now_or_never().is_none());
        let wide = wide.widen(1).now_or_never().expect("kept");
        // Never given back: the waiting round did not get a slot in between.
        assert!((&mut waiting).now_or_never().is_none());
        assert_eq!(g.counts(), (2, 2, [0, 1, 0]));
        drop((wide, waiting));
        // Wanting more than the limit: the whole limit is enough.
        let (g, _wakes) = gate(1);
        let one = g.enter(Urgency::Urgent, 1).await;
        let one = one.widen(3).now_or_never().expect("the whole limit held");
        assert_eq!(g.counts(), (1, 1, [0, 0, 0]));
        drop(one);
    }

    #[tokio::test(start_paused = true)]
    async fn rounds_that_widen_while_they_hold_every_slot_do_not_deadlock() {
        let (g, _wakes) = gate(2);
        let mut rounds = Vec::new();
        for _ in 0..2 {
            // Both status writes in flight: every slot held by a round that will widen.
            let permit = g.enter(Urgency::Urgent, 1).await;
            rounds.push(tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                let deletes = permit.widen(2).await;
                tokio::time::sleep(Duration::from_millis(10)).await;
                drop(deletes);
            }));
        }
        assert_eq!(g.counts(), (2, 2, [0, 0, 0]));
        let done = tokio::time::timeout(Duration::from_secs(60), futures::future::join_all(rounds))
            .await
            .expect("both rounds finish");
        assert!(done.iter().all(Result::is_ok));
        assert_eq!(g.counts(), (2, 0, [0, 0, 0]));
    }

    #[tokio::test]
    async fn a_round_never_jumps_the_queue_of_its_own_urgency() {
        let (g, _wakes) = gate(1);
        let held = g.enter(Urgency::Urgent, 1).await;
        let mut waiting = Box::pin(g.enter(Urgency::Urgent, 1));
        assert!((&mut waiting).now_or_never().is_none());
        drop(held);
        // The slot went to the waiter: a newcomer does not get it.
        assert!(g.try_enter(Urgency::Urgent, 1).is_none());
        let permit = waiting.await;
        assert_eq!(g.counts(), (1, 1, [0, 0, 0]));
        drop(permit);
        assert!(g.try_enter(Urgency::Routine, 1).is_some());
    }

    #[tokio::test]
    async fn a_cancelled_waiter_gives_back_the_slot_it_was_handed() {
        let (g, _wakes) = gate(1);
        let held = g.enter(Urgency::Urgent, 1).await;
        let mut waiting = Box::pin(g.enter(Urgency::Routine, 1));
        assert!((&mut waiting).now_or_never().is_none());
        drop(held); // hands the slot to the waiter, which never takes it
        drop(waiting);
        assert_eq!(g.counts(), (1, 0, [0, 0, 0]));
        // And one cancelled before any slot came is skipped.
        let held = g.enter(Urgency::Urgent, 1).await;
        let mut gone = Box::pin(g.enter(Urgency::Urgent, 1));
        assert!((&mut gone).now_or_never().is_none());
        drop(gone);
        drop(held);
        assert_eq!(g.counts(), (1, 0, [0, 0, 0]));
    }

    #[tokio::test]
    async fn slots_count_requests_and_a_wide_round_is_not_starved_by_narrow_ones() {
        let (g, _wakes) = gate(6);
        let narrow = g.enter(Urgency::Urgent, 2).await;
        // Six requests wanted, four free: it waits, and the narrow round behind it too.
        let mut wide = Box::pin(g.enter(Urgency::Urgent, 6));
        assert!((&mut wide).now_or_never().is_none());
        assert!(g.try_enter(Urgency::Urgent, 1).is_none());
        drop(narrow);
        let wide = (&mut wide)
            .now_or_never()
            .expect("the wide round goes first");
        assert_eq!(g.counts(), (6, 6, [0, 0, 0]));
        drop(wide);
        // More than the limit: takes the whole limit, and gives back what it took.
        let huge = g.enter(Urgency::Routine, 100).await;
        assert_eq!(g.counts(), (6, 6, [0, 0, 0]));
        drop(huge);
        assert_eq!(g.counts(), (6, 0, [0, 0, 0]));
    }

    #[tokio::test]
    async fn a_throttled_request_halves_the_limit_through_timed() {
        let (g, _wakes) = gate(8);
        let throttled = kube::Error::Api(Box::new(
            kube::core::Status::failure("slow down", "TooManyRequests").with_code(429),
        ));
        let r: Result<(), kube::Error> = g.timed(async { Err(throttled) }).await;
        assert!(r.is_err());
        assert_eq!(g.counts().0, 4);
        let ok: Result<(), kube::Error> = g.timed(async { Ok(()) }).await;
        assert!(ok.is_ok());
        assert_eq!(g.counts().0, 4, "one fast answer closes no window");
    }

    fn job(name: &str) -> JobRef {
        JobRef::new(name).within("ns")
    }

    /// The job woken now, if any.
    fn woken(wakes: &mut (impl Stream<Item = JobRef> + Unpin)) -> Option<JobRef> {
        futures::StreamExt::next(wakes).now_or_never().flatten()
    }

    #[tokio::test]
    async fn a_status_only_round_at_a_full_gate_parks_its_job_once_and_is_woken_by_a_free_slot() {
        let (g, mut wakes) = gate(1);
        let held = g.enter(Urgency::Urgent, 1).await;
        assert!(g.enter_or_park(&job("a"), 1).is_none());
        assert!(g.enter_or_park(&job("a"), 1).is_none(), "parked once");
        assert!(g.enter_or_park(&job("b"), 1).is_none());
        assert_eq!(woken(&mut wakes), None);
        drop(held);
        // One slot: one job woken, in the order they parked, and the slot kept for it.
        assert_eq!(woken(&mut wakes), Some(job("a")));
        assert_eq!(woken(&mut wakes), None);
        assert!(g.try_enter(Urgency::Routine, 1).is_none(), "reserved for a");
        let permit = g.enter_or_park(&job("a"), 1).expect("the woken job enters");
        drop(permit);
        assert_eq!(woken(&mut wakes), Some(job("b")));
    }

    #[tokio::test]
    async fn urgent_rounds_take_a_freed_slot_before_a_parked_job_is_woken() {
        let (g, mut wakes) = gate(1);
        let held = g.enter(Urgency::Urgent, 1).await;
        assert!(g.enter_or_park(&job("a"), 1).is_none());
        let mut urgent = Box::pin(g.enter(Urgency::Urgent, 1));
        assert!((&mut urgent).now_or_never().is_none());
        drop(held);
        let urgent = (&mut urgent)
            .now_or_never()
            .expect("the urgent round first");
        assert_eq!(woken(&mut wakes), None);
        drop(urgent);
        assert_eq!(woken(&mut wakes), Some(job("a")));
    }

    #[tokio::test(start_paused = true)]
    async fn a_woken_job_that_never_comes_back_gives_up_its_slot_after_a_while() {
        let (g, mut wakes) = gate(1);
        let held = g.enter(Urgency::Urgent, 1).await;
        assert!(g.enter_or_park(&job("gone"), 1).is_none());
        assert!(g.enter_or_park(&job("b"), 1).is_none());
        drop(held);
        assert_eq!(woken(&mut wakes), Some(job("gone")));
        assert!(g.try_enter(Urgency::Routine, 1).is_none());
        tokio::time::advance(WOKEN_LAPSES + Duration::from_millis(1)).await;
        // The next look at the gate lets the reservation lapse and wakes the next job.
        assert!(g.enter_or_park(&job("c"), 1).is_none());
        assert_eq!(woken(&mut wakes), Some(job("b")));
    }

    #[tokio::test]
    async fn a_raised_limit_lets_waiting_rounds_in_at_once() {
        let (g, _wakes) = gate(1);
        let _held = g.enter(Urgency::Urgent, 1).await;
        let mut waiting = Box::pin(g.enter(Urgency::Routine, 1));
        assert!((&mut waiting).now_or_never().is_none());
        for _ in 0..8 {
            g.sample(Duration::from_millis(1), false);
        }
        assert_eq!(g.counts().0, 2);
        assert!((&mut waiting).now_or_never().is_some());
    }
}
