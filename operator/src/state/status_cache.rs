//! The status cache: the status the operator wrote last, the per-worker detail it has decided
//! but not written yet, and when a decided status is written ([`StatusCache::schedule`], the
//! batching policy of [`status_write`]); and which of the job's watch events are only the
//! echo of our own write ([`StatusCache::caught_up`]), also while the write is on its way
//! ([`StatusCache::begin_write`]).
//!
//! Decisions read [`StatusCache::current`]: the job's status, or our own newer write while the
//! TrainingJob cache trails it, with the unwritten worker detail laid over it. So a stale
//! status is never decided on twice, and a worker seen and then gone is a preemption even
//! before its detail is written. Entries are per job and forgotten with it
//! ([`crate::state::write_memory::WriteMemory`], [`crate::state::job_memory`]).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::status_write::{DetailBatch, StatusWrite, status_write};
use crate::model::crd::{TrainingJob, TrainingJobStatus};
use crate::state::job_memory::lock;

/// How long per-worker status detail may wait to be written with other changes
/// ([`status_write`]).
pub(crate) const WORKER_DETAIL_BATCH: DetailBatch = DetailBatch {
    running: Duration::from_secs(3),
    before_running: Duration::from_secs(300),
};

/// What one reconcile knows of a job's status.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Known {
    /// What the API server holds (the cache, or our newer write).
    pub(crate) written: TrainingJobStatus,
    /// `written` with the worker detail not written yet: what decisions read.
    pub(crate) current: TrainingJobStatus,
    /// How long that detail has waited, if there is any.
    pub(crate) detail_waiting: Option<Duration>,
}

/// Whether our write that produced resourceVersion `rv` is newer than the cached `job` (the
/// cache trails it). A version that is not a number is never compared.
fn newer_than_cache(rv: u64, job: &TrainingJob) -> bool {
    job.metadata
        .resource_version
        .as_deref()
        .and_then(|cached| cached.parse::<u64>().ok())
        .is_some_and(|cached| rv > cached)
}

/// A status write on its way ([`StatusCache::begin_write`]). Dropped without an answer (its
/// reconcile abandoned), it sets nothing more aside; the failed reconcile's retry decides the
/// job again.
#[must_use = "a write in flight sets the job's events aside until it ends"]
pub(crate) struct WriteInFlight<'a> {
    cache: &'a StatusCache,
    uid: String,
    ended: bool,
}

impl WriteInFlight<'_> {
    /// The write answered: with the resourceVersion it produced and the status when it went
    /// through, None when it failed. True when a watch event that came meanwhile was of
    /// another version than our write's: news the job must be woken for, as its event was
    /// not.
    pub(crate) fn end(mut self, written: Option<(&str, &TrainingJobStatus)>) -> bool {
        self.ended = true;
        self.cache.end_write(&self.uid, written)
    }
}

impl Drop for WriteInFlight<'_> {
    fn drop(&mut self) {
        if !self.ended {
            lock(&self.cache.in_flight).remove(&self.uid);
        }
    }
}

/// Written and deferred status, by job uid.
#[derive(Debug, Default)]
pub(crate) struct StatusCache {
    /// Status we wrote, with the resourceVersion the write produced: used while the
    /// TrainingJob cache has not caught up with our own write.
    written: Mutex<HashMap<String, (u64, TrainingJobStatus)>>,
    /// Status whose only change is per-worker detail, not written yet, with when it was first
    /// deferred.
    deferred: Mutex<HashMap<String, (TrainingJobStatus, Instant)>>,
    /// Status writes on their way, with the resourceVersions of the job's watch events that
    /// came meanwhile: the event of our own write may come before the write's answer, so
    /// those events are judged once it answers ([`WriteInFlight::end`]).
    in_flight: Mutex<HashMap<String, Vec<u64>>>,
}

impl StatusCache {
    /// What a reconcile of `job` decides on.
    pub(crate) fn current(&self, job: &TrainingJob) -> Known {
        let uid = job.metadata.uid.clone().unwrap_or_default();
        let written = self.freshest_status(job);
        let (current, detail_waiting) = self.with_deferred_detail(&uid, &written);
        Known {
            written,
            current,
            detail_waiting,
        }
    }

    /// Whether `desired` is written now, deferred (kept here, to be written after the
    /// returned wait), or unchanged ([`status_write`] with [`WORKER_DETAIL_BATCH`]).
    pub(crate) fn schedule(
        &self,
        uid: &str,
        known: &Known,
        desired: &TrainingJobStatus,
    ) -> StatusWrite {
        let write = status_write(
            &known.written,
            desired,
            known.detail_waiting,
            WORKER_DETAIL_BATCH,
        );
        match write {
            StatusWrite::Unchanged => self.drop_deferred(uid),
            StatusWrite::Now => {}
            StatusWrite::Later(_) => self.defer_detail(uid, desired),
        }
        write
    }

    /// The job's status, or the one we wrote last if the cache has not caught up with it.
    pub(crate) fn freshest_status(&self, job: &TrainingJob) -> TrainingJobStatus {
        let uid = job.metadata.uid.clone().unwrap_or_default();
        let mut written = lock(&self.written);
        if let Some((_, status)) = written
            .get(&uid)
            .filter(|(rv, _)| newer_than_cache(*rv, job))
        {
            return status.clone();
        }
        written.remove(&uid);
        job.status.clone().unwrap_or_default()
    }

    /// The resourceVersion the job's next status write is conditioned on: the one our last
    /// write produced while the TrainingJob cache trails it, the cached one otherwise. A write
    /// conditioned on it lands only if nobody wrote the job since this replica last saw it, so
    /// a deposed leader's delayed write cannot land after its successor's ([`super::executor`]).
    pub(crate) fn freshest_rv(&self, job: &TrainingJob) -> Option<String> {
        let uid = job.metadata.uid.as_deref().unwrap_or_default();
        match lock(&self.written).get(uid) {
            Some((rv, _)) if newer_than_cache(*rv, job) => Some(rv.to_string()),
            _ => job.metadata.resource_version.clone(),
        }
    }

    /// The written status with the worker detail still waiting to be written, and how long
    /// that has waited.
    pub(crate) fn with_deferred_detail(
        &self,
        uid: &str,
        written: &TrainingJobStatus,
    ) -> (TrainingJobStatus, Option<Duration>) {
        let mut current = written.clone();
        let mut deferred = lock(&self.deferred);
        match deferred.get(uid) {
            Some((status, since)) if status.attempt == written.attempt => {
                current.workers = status.workers.clone();
                current.worker_summary = status.worker_summary.clone();
                (current, Some(since.elapsed()))
            }
            Some(_) => {
                deferred.remove(uid);
                (current, None)
            }
            None => (current, None),
        }
    }

    /// Keeps a status whose only change is worker detail, to be written later.
    pub(crate) fn defer_detail(&self, uid: &str, status: &TrainingJobStatus) {
        let mut deferred = lock(&self.deferred);
        let since = deferred
            .get(uid)
            .map_or_else(Instant::now, |(_, since)| *since);
        deferred.insert(uid.to_owned(), (status.clone(), since));
    }

    /// Nothing is left to write.
    pub(crate) fn drop_deferred(&self, uid: &str) {
        lock(&self.deferred).remove(uid);
    }

    /// The TrainingJob cache now holds `job`: our written status is dropped once the cache
    /// holds that version or a newer one. True when `job` is exactly the version our last
    /// status write produced: it holds nothing a round has not decided on already, so its watch
    /// event need not wake a reconcile.
    ///
    /// While a status write of the job is on its way, every event is set aside as ours for
    /// now and judged when the write answers ([`WriteInFlight::end`]).
    pub(crate) fn caught_up(&self, job: &TrainingJob) -> bool {
        let Some(cached) = job
            .metadata
            .resource_version
            .as_deref()
            .and_then(|rv| rv.parse::<u64>().ok())
        else {
            return false;
        };
        let uid = job.metadata.uid.as_deref().unwrap_or_default();
        if let Some(seen) = lock(&self.in_flight).get_mut(uid) {
            seen.push(cached);
            return true;
        }
        let mut written = lock(&self.written);
        match written.get(uid) {
            Some((rv, _)) if *rv <= cached => {
                let own = *rv == cached;
                written.remove(uid);
                own
            }
            _ => false,
        }
    }

    /// A status write of `uid` is about to be sent: its events are set aside until it ends
    /// ([`StatusCache::caught_up`], [`WriteInFlight::end`]).
    pub(crate) fn begin_write(&self, uid: &str) -> WriteInFlight<'_> {
        lock(&self.in_flight).insert(uid.to_owned(), Vec::new());
        WriteInFlight {
            cache: self,
            uid: uid.to_owned(),
            ended: false,
        }
    }

    /// See [`WriteInFlight::end`].
    fn end_write(&self, uid: &str, written: Option<(&str, &TrainingJobStatus)>) -> bool {
        let seen = lock(&self.in_flight).remove(uid).unwrap_or_default();
        let ours = written.and_then(|(rv, _)| rv.parse::<u64>().ok());
        if let Some((rv, status)) = written {
            self.remember_written(uid, Some(rv), status);
            if ours.is_some_and(|ours| seen.contains(&ours)) {
                // The cache holds our write already.
                lock(&self.written).remove(uid);
            }
        }
        seen.iter().any(|rv| Some(*rv) != ours)
    }

    /// A status write went through, producing resourceVersion `rv`.
    pub(crate) fn remember_written(&self, uid: &str, rv: Option<&str>, status: &TrainingJobStatus) {
        lock(&self.deferred).remove(uid);
        if let Some(rv) = rv.and_then(|rv| rv.parse::<u64>().ok()) {
            lock(&self.written).insert(uid.to_owned(), (rv, status.clone()));
        }
    }

    /// Forgets one job.
    pub(crate) fn forget(&self, uid: &str) {
        lock(&self.written).remove(uid);
        lock(&self.deferred).remove(uid);
        lock(&self.in_flight).remove(uid);
    }

    /// Keeps only the jobs `live` says exist.
    pub(crate) fn retain(&self, live: impl Fn(&str) -> bool) {
        lock(&self.written).retain(|uid, _| live(uid));
        lock(&self.deferred).retain(|uid, _| live(uid));
        lock(&self.in_flight).retain(|uid, _| live(uid));
    }

    /// Entries of the written and the deferred map.
    pub(crate) fn sizes(&self) -> (usize, usize) {
        (lock(&self.written).len(), lock(&self.deferred).len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::job_yaml;
    use crate::model::crd::WorkerStatus;

    fn with_worker(status: &TrainingJobStatus, phase: &str) -> TrainingJobStatus {
        TrainingJobStatus {
            workers: vec![WorkerStatus {
                rank: 0,
                pod: "train-worker-0".to_owned(),
                node: None,
                phase: phase.to_owned(),
                reason: None,
            }],
            ..status.clone()
        }
    }

    /// `job` at resourceVersion `rv`, as its watch event brings it.
    fn version(job: &mut TrainingJob, rv: &str) -> TrainingJob {
        job.metadata.resource_version = Some(rv.to_owned());
        job.clone()
    }

    #[test]
    fn the_watch_event_of_our_own_status_write_is_ours_and_the_write_is_dropped_once_seen() {
        let cache = StatusCache::default();
        let mut job = job_yaml("workers: 1\n");
        let uid = job.metadata.uid.clone().unwrap_or_default();
        assert!(!cache.caught_up(&version(&mut job, "5")), "nothing written");
        cache.remember_written(&uid, Some("7"), &TrainingJobStatus::default());
        // A version before ours: someone else's; ours is still the newest.
        assert!(!cache.caught_up(&version(&mut job, "6")));
        assert_eq!(cache.freshest_rv(&job).as_deref(), Some("7"));
        // Exactly ours: nothing new to decide on, and the cache holds it now.
        assert!(cache.caught_up(&version(&mut job, "7")));
        assert_eq!(cache.sizes().0, 0, "our written status is dropped");
        // A version after ours (another writer, or a watch that skipped ours) is news.
        cache.remember_written(&uid, Some("8"), &TrainingJobStatus::default());
        assert!(!cache.caught_up(&version(&mut job, "9")));
        assert_eq!(cache.sizes().0, 0);
    }

    /// The event of our own write can come before the write's answer: it wakes nothing then
    /// either; another version that came meanwhile (a spec edit) is news once the write
    /// answers, and so is any version that came while a write failed.
    #[test]
    fn events_during_our_status_write_are_judged_when_it_answers() {
        let cache = StatusCache::default();
        let mut job = job_yaml("workers: 1\n");
        let uid = job.metadata.uid.clone().unwrap_or_default();
        let status = TrainingJobStatus::default();
        // Our write's event first, then its answer.
        let write = cache.begin_write(&uid);
        assert!(cache.caught_up(&version(&mut job, "7")), "set aside");
        assert!(!write.end(Some(("7", &status))), "ours: no news");
        assert_eq!(cache.sizes().0, 0, "the cache holds our write already");
        // The answer first, then the event: as before.
        let write = cache.begin_write(&uid);
        assert!(!write.end(Some(("8", &status))));
        assert!(cache.caught_up(&version(&mut job, "8")));
        // A spec edit and our write's event, both before the answer: news.
        let write = cache.begin_write(&uid);
        assert!(cache.caught_up(&version(&mut job, "9")));
        assert!(cache.caught_up(&version(&mut job, "10")));
        assert!(write.end(Some(("10", &status))), "the edit wakes the job");
        // A version that came while the write failed is news too; nothing came: none.
        let write = cache.begin_write(&uid);
        assert!(cache.caught_up(&version(&mut job, "11")));
        assert!(write.end(None));
        assert!(!cache.begin_write(&uid).end(None));
        // With no write on its way, events are judged at once again; so they are after a
        // write dropped unanswered (its reconcile abandoned, to be retried).
        assert!(!cache.caught_up(&version(&mut job, "12")));
        let abandoned = cache.begin_write(&uid);
        assert!(cache.caught_up(&version(&mut job, "13")));
        drop(abandoned);
        assert!(!cache.caught_up(&version(&mut job, "14")));
    }

    #[test]
    fn worker_detail_is_deferred_read_back_and_dropped_once_written() {
        let cache = StatusCache::default();
        let mut job = job_yaml("workers: 1\n");
        job.metadata.resource_version = Some("5".to_owned());
        let known = cache.current(&job);
        assert_eq!(known.detail_waiting, None);
        // Only per-worker detail changed: kept, and what the next reconcile decides on.
        let detail = with_worker(&known.written, "Pending");
        let write = cache.schedule("uid-1", &known, &detail);
        assert_eq!(
            write,
            StatusWrite::Later(WORKER_DETAIL_BATCH.before_running)
        );
        let next = cache.current(&job);
        assert_eq!(next.current, detail);
        assert_eq!(next.written, known.written);
        assert!(next.detail_waiting.is_some());
        // Our write is newer than the cached job: it is what the API server holds.
        cache.remember_written("uid-1", Some("6"), &detail);
        let after = cache.current(&job);
        assert_eq!(
            (after.written.clone(), after.detail_waiting),
            (detail.clone(), None)
        );
        assert_eq!(
            cache.schedule("uid-1", &after, &detail),
            StatusWrite::Unchanged
        );
        // A write is conditioned on our own newer write, not on the trailing cache.
        assert_eq!(cache.freshest_rv(&job).as_deref(), Some("6"));
        // The job cache caught up: our copy is dropped.
        job.metadata.resource_version = Some("6".to_owned());
        job.status = Some(detail.clone());
        assert_eq!(cache.current(&job).written, detail);
        assert_eq!(cache.sizes(), (0, 0));
        // Someone else wrote after us: the cache's newer version is the condition.
        job.metadata.resource_version = Some("9".to_owned());
        assert_eq!(cache.freshest_rv(&job).as_deref(), Some("9"));
    }
}
