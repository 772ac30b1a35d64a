//! Writes the operator has made that its watch caches do not show yet.
//!
//! A reconcile decides from the caches, and the caches trail the API server. Right after the
//! operator creates a pod (or deletes one, or applies a Service), the next reconcile of the same
//! job may still see the old state and decide the same write again: an AlreadyExists create or a
//! repeated delete, each one more request for a saturated API server. So every write records
//! its object here before it goes out (and forgets it when nothing was written: a failure,
//! AlreadyExists, NotFound), and until a watch event for that object arrives (or `ttl` passes, in case the
//! event is lost with a broken watch) further writes to the same object are held back.
//! Recording before the write means its own watch event can never arrive first and be missed.
//!
//! Holding a write back never loses it: the decision is taken again on the next reconcile, which
//! the watch event itself triggers, or the caller requeues for when the expectation expires.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::metrics::StateSizes;
use crate::model::ownership::Kind;
use crate::state::job_memory::{JobKey, LiveJobs, PerJob};

type Key = (Kind, String, String);

/// Outstanding writes, by kind, namespace and name.
#[derive(Debug)]
pub struct Expectations {
    pending: Mutex<HashMap<Key, Instant>>,
    ttl: Duration,
}

impl Expectations {
    /// Expectations that lapse after `ttl` without a watch event.
    pub fn new(ttl: Duration) -> Self {
        Self {
            pending: Mutex::default(),
            ttl,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Instant>> {
        // Every update is one insert or remove: a panic elsewhere cannot leave it inconsistent.
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a write the caches should soon show.
    pub fn expect(&self, kind: Kind, namespace: &str, name: &str) {
        self.expect_at(kind, namespace, name, Instant::now());
    }

    fn expect_at(&self, kind: Kind, namespace: &str, name: &str, at: Instant) {
        let mut pending = self.lock();
        // Lapsed entries of objects whose event never came are dropped as the map grows.
        if pending.len() >= 1024 && pending.len().is_power_of_two() {
            let ttl = self.ttl;
            pending.retain(|_, since| at.saturating_duration_since(*since) < ttl);
        }
        pending.insert((kind, namespace.to_owned(), name.to_owned()), at);
    }

    /// A watch event for the object arrived: the caches have caught up with it.
    pub fn observed(&self, kind: Kind, namespace: &str, name: &str) {
        let mut pending = self.lock();
        if !pending.is_empty() {
            pending.remove(&(kind, namespace.to_owned(), name.to_owned()));
        }
    }

    /// A watch event for the object arrived that is a new version of it (not a delete, not a
    /// relist): true when it met a write of ours the caches did not show yet, within its time
    /// to live. That event is the version our write made (a watch delivers every version in
    /// order, and the write was recorded before it was sent), or one before it, whose news the
    /// event of our write's version carries on: either way it holds nothing a round has not
    /// decided on, or will not see with the next event.
    pub fn met(&self, kind: Kind, namespace: &str, name: &str) -> bool {
        let mut pending = self.lock();
        if pending.is_empty() {
            return false;
        }
        pending
            .remove(&(kind, namespace.to_owned(), name.to_owned()))
            .is_some_and(|since| since.elapsed() < self.ttl)
    }

    /// How much longer a write to the object is held back; None when it may go.
    pub fn holds(&self, kind: Kind, namespace: &str, name: &str) -> Option<Duration> {
        self.holds_at(kind, namespace, name, Instant::now())
    }

    fn holds_at(&self, kind: Kind, namespace: &str, name: &str, now: Instant) -> Option<Duration> {
        let mut pending = self.lock();
        let key = (kind, namespace.to_owned(), name.to_owned());
        let since = *pending.get(&key)?;
        let age = now.saturating_duration_since(since);
        if age >= self.ttl {
            pending.remove(&key);
            return None;
        }
        Some(self.ttl - age)
    }

    /// Keeps only the expectations on objects of the jobs `keep(namespace, job)` says exist.
    fn retain_jobs(&self, keep: impl Fn(&str, &str) -> bool) {
        let mut pending = self.lock();
        if pending.is_empty() {
            return;
        }
        pending.retain(|(kind, ns, name), _| job_of(*kind, name).is_none_or(|job| keep(ns, job)));
    }

    /// Number of outstanding expectations (lapsed ones included until they are looked at).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether nothing is outstanding.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Forgotten by the job each object's name says it belongs to ([`job_of`]).
impl PerJob for Expectations {
    /// Whatever a deleted job's writes were, nothing will act on them again.
    fn forget(&self, job: &JobKey<'_>) {
        self.retain_jobs(|ns, name| ns != job.namespace || name != job.name);
    }

    fn retain(&self, live: &LiveJobs) {
        self.retain_jobs(|namespace, job| live.has(namespace, job));
    }

    /// Lapsed entries go as the map grows ([`Self::expect`]): the sweep need not bound it.
    fn largest(&self) -> usize {
        0
    }

    fn add_sizes(&self, sizes: &mut StateSizes) {
        sizes.expectations = self.len();
    }
}

/// The job an object the operator writes belongs to, by the names the builders give:
/// `<job>-worker-<rank>`, the Service and the PodGroup `<job>`, the claim `<job>-checkpoints`.
fn job_of(kind: Kind, name: &str) -> Option<&str> {
    match kind {
        Kind::Pod => name
            .rsplit_once("-worker-")
            .filter(|(_, rank)| !rank.is_empty() && rank.bytes().all(|b| b.is_ascii_digit()))
            .map(|(job, _)| job),
        Kind::Service | Kind::PodGroup => Some(name),
        Kind::Workload => name.strip_prefix("trainingjob-"),
        Kind::Claim => name.strip_suffix("-checkpoints"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(10);

    #[test]
    fn a_write_is_held_back_until_its_watch_event_arrives() {
        let e = Expectations::new(TTL);
        assert_eq!(e.holds(Kind::Pod, "ns", "j-worker-0"), None);
        e.expect(Kind::Pod, "ns", "j-worker-0");
        assert!(e.holds(Kind::Pod, "ns", "j-worker-0").is_some());
        e.observed(Kind::Pod, "ns", "j-worker-0");
        assert_eq!(e.holds(Kind::Pod, "ns", "j-worker-0"), None);
        assert!(e.is_empty());
    }

    #[test]
    fn a_version_that_meets_a_write_of_ours_is_an_echo_once_and_a_lapsed_one_is_news() {
        let e = Expectations::new(TTL);
        assert!(!e.met(Kind::Pod, "ns", "j-worker-0"), "nothing was written");
        e.expect(Kind::Pod, "ns", "j-worker-0");
        assert!(!e.met(Kind::Pod, "ns", "j-worker-1"), "another pod");
        assert!(
            e.met(Kind::Pod, "ns", "j-worker-0"),
            "the echo of our create"
        );
        assert!(
            !e.met(Kind::Pod, "ns", "j-worker-0"),
            "the next version is news"
        );
        assert!(e.is_empty());
        // Past its time to live the write is not known to be ours any more.
        let long_ago = Instant::now() - TTL - Duration::from_secs(1);
        e.expect_at(Kind::Pod, "ns", "j-worker-0", long_ago);
        assert!(!e.met(Kind::Pod, "ns", "j-worker-0"));
        assert!(e.is_empty());
    }

    #[test]
    fn expectations_are_per_kind_namespace_and_name() {
        let e = Expectations::new(TTL);
        e.expect(Kind::Pod, "ns", "j");
        assert_eq!(e.holds(Kind::Service, "ns", "j"), None);
        assert_eq!(e.holds(Kind::Pod, "other", "j"), None);
        assert_eq!(e.holds(Kind::Pod, "ns", "k"), None);
        e.observed(Kind::Service, "ns", "j");
        assert!(e.holds(Kind::Pod, "ns", "j").is_some());
    }

    #[test]
    fn an_expectation_lapses_after_the_ttl_when_no_event_comes() {
        let e = Expectations::new(TTL);
        let t0 = Instant::now();
        e.expect_at(Kind::Claim, "ns", "c", t0);
        assert_eq!(
            e.holds_at(Kind::Claim, "ns", "c", t0 + Duration::from_secs(4)),
            Some(Duration::from_secs(6))
        );
        assert_eq!(e.holds_at(Kind::Claim, "ns", "c", t0 + TTL), None);
        assert!(e.is_empty());
    }

    #[test]
    fn lapsed_expectations_are_swept_as_the_map_grows() {
        let e = Expectations::new(TTL);
        let t0 = Instant::now();
        for i in 0..1024 {
            e.expect_at(Kind::Pod, "ns", &format!("p{i}"), t0);
        }
        e.expect_at(Kind::Pod, "ns", "fresh", t0 + TTL);
        assert_eq!(e.len(), 1);
    }

    fn forget(e: &Expectations, namespace: &str, name: &str) {
        PerJob::forget(
            e,
            &JobKey {
                uid: "",
                namespace,
                name,
            },
        );
    }

    #[test]
    fn forgetting_a_job_forgets_its_pods_service_and_claim_only() {
        let e = Expectations::new(TTL);
        for (kind, name) in [
            (Kind::Pod, "a-worker-0"),
            (Kind::Pod, "a-worker-12"),
            (Kind::Service, "a"),
            (Kind::Claim, "a-checkpoints"),
            // Job "a-worker-1": its Service shares a pod's name of job "a", its pods are its own.
            (Kind::Service, "a-worker-1"),
            (Kind::Pod, "a-worker-1-worker-0"),
            (Kind::Pod, "ab-worker-0"),
        ] {
            e.expect(kind, "ns", name);
        }
        e.expect(Kind::Pod, "other", "a-worker-0");
        forget(&e, "ns", "a");
        assert_eq!(e.len(), 4);
        assert!(e.holds(Kind::Service, "ns", "a-worker-1").is_some());
        assert!(e.holds(Kind::Pod, "ns", "a-worker-1-worker-0").is_some());
        assert!(e.holds(Kind::Pod, "other", "a-worker-0").is_some());
        forget(&e, "ns", "a-worker-1");
        forget(&e, "ns", "ab");
        forget(&e, "other", "a");
        assert!(e.is_empty());
    }
}
