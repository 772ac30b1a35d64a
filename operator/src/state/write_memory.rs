//! What the write path remembers of each job between rounds: the status cache (what it wrote
//! and the worker detail it has not written yet), when a restart was decided (for the recovery
//! histogram), which attempt's Event it has told, which malformed objects it has reported, and
//! what the writes of a job whose writes are being rejected came to.
//! Forgotten with the job ([`crate::state::job_memory`]).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use super::status_cache::StatusCache;
use crate::metrics::StateSizes;
use crate::model::rejection::WriteOutcome;
use crate::state::job_memory::{JobKey, LiveJobs, PerJob, lock};

/// The write path's per-job maps.
#[derive(Debug, Default)]
pub(crate) struct WriteMemory {
    /// Status written and worker detail not written yet ([`StatusCache`]).
    pub(crate) status: StatusCache,
    /// When a restart was decided, by uid, with the attempt it starts.
    detected: Mutex<HashMap<String, (u32, Instant)>>,
    /// The attempt whose Event this replica last published (or queued), by uid
    /// ([`crate::plan::Observed::told_attempt`]).
    told: Mutex<HashMap<String, u32>>,
    /// Malformed objects already reported, by uid → generation.
    reported_malformed: Mutex<HashMap<String, String>>,
    /// What the last round that wrote to the job's objects came to, by uid: the next round
    /// shows it ([`crate::plan::Observed::last_writes`]).
    last_writes: Mutex<HashMap<String, WriteOutcome>>,
}

impl WriteMemory {
    /// A restart into `attempt` was decided now.
    pub(crate) fn restart_detected(&self, uid: &str, attempt: u32) {
        lock(&self.detected).insert(uid.to_owned(), (attempt, Instant::now()));
    }

    /// The pods of a new attempt are being created: when its restart was decided, if known.
    pub(crate) fn take_detected(&self, uid: &str) -> Option<(u32, Instant)> {
        lock(&self.detected).remove(uid)
    }

    /// The attempt of the job whose starting Event this replica has told, if any.
    pub(crate) fn told_attempt(&self, uid: &str) -> Option<u32> {
        lock(&self.told).get(uid).copied()
    }

    /// This replica has told the job's `attempt` (queued the Event that starts it, or carried
    /// out a round that did).
    pub(crate) fn told(&self, uid: &str, attempt: u32) {
        lock(&self.told).insert(uid.to_owned(), attempt);
    }

    /// Publishing the Event that starts `attempt` failed: a later round tells it again.
    pub(crate) fn untell(&self, uid: &str, attempt: u32) {
        let mut told = lock(&self.told);
        if told.get(uid) == Some(&attempt) {
            told.remove(uid);
        }
    }

    /// A round's writes to the job's objects came to `writes`.
    pub(crate) fn record_writes(&self, uid: &str, writes: WriteOutcome) {
        lock(&self.last_writes).insert(uid.to_owned(), writes);
    }

    /// The job shows what its writes came to: nothing more to show.
    pub(crate) fn forget_writes(&self, uid: &str) {
        let mut last = lock(&self.last_writes);
        if !last.is_empty() {
            last.remove(uid);
        }
    }

    /// What the last round that wrote to the job's objects came to.
    pub(crate) fn last_writes(&self, uid: &str) -> Option<WriteOutcome> {
        lock(&self.last_writes).get(uid).cloned()
    }

    /// Whether this generation of a malformed object was reported already.
    pub(crate) fn malformed_reported(&self, uid: &str, generation: &str) -> bool {
        lock(&self.reported_malformed)
            .get(uid)
            .is_some_and(|g| g == generation)
    }

    /// This generation of a malformed object has been reported.
    pub(crate) fn remember_malformed(&self, uid: &str, generation: &str) {
        lock(&self.reported_malformed).insert(uid.to_owned(), generation.to_owned());
    }

    /// The object parses again.
    pub(crate) fn forget_malformed(&self, uid: &str) {
        let mut reported = lock(&self.reported_malformed);
        if !reported.is_empty() {
            reported.remove(uid);
        }
    }
}

impl PerJob for WriteMemory {
    fn forget(&self, job: &JobKey<'_>) {
        let uid = job.uid;
        self.status.forget(uid);
        lock(&self.detected).remove(uid);
        lock(&self.told).remove(uid);
        lock(&self.reported_malformed).remove(uid);
        lock(&self.last_writes).remove(uid);
    }

    fn retain(&self, live: &LiveJobs) {
        self.status.retain(|uid| live.has_uid(uid));
        lock(&self.detected).retain(|uid, _| live.has_uid(uid));
        lock(&self.told).retain(|uid, _| live.has_uid(uid));
        lock(&self.reported_malformed).retain(|uid, _| live.has_uid(uid));
        lock(&self.last_writes).retain(|uid, _| live.has_uid(uid));
    }

    fn largest(&self) -> usize {
        let (written, deferred) = self.status.sizes();
        [
            written,
            deferred,
            lock(&self.detected).len(),
            lock(&self.told).len(),
            lock(&self.reported_malformed).len(),
            lock(&self.last_writes).len(),
        ]
        .into_iter()
        .max()
        .unwrap_or(0)
    }

    fn add_sizes(&self, sizes: &mut StateSizes) {
        (sizes.written, sizes.deferred) = self.status.sizes();
        sizes.detected = lock(&self.detected).len();
        sizes.reported_malformed = lock(&self.reported_malformed).len();
    }
}
