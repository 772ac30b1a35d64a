//! What the controller remembers about each TrainingJob between reconciles, and when it
//! forgets it.
//!
//! Every entry here belongs to one job (by uid, or by namespace/name for the error backoff),
//! so it must go when the job goes, or an operator that runs for months grows with every job
//! it ever saw. Three paths forget:
//! - the job watch's Delete event forgets the job at once ([`JobMemory::on_job_event`]);
//! - the end of a re-list (after a watch gap, which loses Delete events) keeps only the jobs
//!   listed;
//! - a sweep when a map outgrows the jobs catches entries that a reconcile still in flight for
//!   a job wrote after the job was forgotten.
//!
//! [`Expectations`] are keyed by the objects a job owns; they are forgotten with the job too.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::error_boundary::DeserializeGuard;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;

use crate::crd::TrainingJob;
use crate::expectations::Expectations;
use crate::metrics::StateSizes;
use crate::writes::status_cache::StatusCache;

/// The per-job maps of the controller.
#[derive(Debug, Default)]
pub struct JobMemory {
    /// Status written and worker detail not written yet ([`StatusCache`]).
    pub(crate) status: StatusCache,
    /// When a restart was decided, by uid, with the attempt it starts (for the recovery
    /// histogram).
    detected: Mutex<HashMap<String, (u32, Instant)>>,
    /// The attempt whose Event this replica last published (or queued), by uid
    /// ([`crate::plan::tell_attempt_start`]).
    told: Mutex<HashMap<String, u32>>,
    /// Consecutive transient errors, by namespace/name.
    error_counts: Mutex<HashMap<String, u32>>,
    /// Malformed objects already reported, by uid → generation.
    reported_malformed: Mutex<HashMap<String, String>>,
    /// The job object last seen valid, by uid: the job runs on as it while an edit does not
    /// validate. The same allocation as the job cache's entry until the job changes, so it
    /// costs a map entry per job, and one object per job whose spec was edited.
    last_valid: Mutex<HashMap<String, Arc<DeserializeGuard<TrainingJob>>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere cannot leave these maps inconsistent: every update is one insert/remove.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The key of the error backoff: `namespace/name`.
pub fn error_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// The jobs that exist, as the keys the maps use.
#[derive(Debug, Default)]
struct LiveJobs {
    uids: HashSet<String>,
    paths: HashSet<String>,
}

impl LiveJobs {
    fn of(jobs: &Store<DeserializeGuard<TrainingJob>>) -> Self {
        let mut live = Self::default();
        for job in jobs.state() {
            let meta = guard_meta(&job);
            live.uids.insert(meta.uid.clone().unwrap_or_default());
            live.paths.insert(path(meta));
        }
        live
    }
}

fn guard_meta(job: &DeserializeGuard<TrainingJob>) -> &ObjectMeta {
    match &job.0 {
        Ok(job) => &job.metadata,
        Err(invalid) => &invalid.metadata,
    }
}

fn path(meta: &ObjectMeta) -> String {
    error_key(
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default(),
    )
}

impl JobMemory {
    /// The sizes of `memory` and `expectations` now.
    pub fn sizes(&self, expectations: &Expectations) -> StateSizes {
        let (written, deferred) = self.status.sizes();
        StateSizes {
            written,
            deferred,
            detected: lock(&self.detected).len(),
            error_counts: lock(&self.error_counts).len(),
            reported_malformed: lock(&self.reported_malformed).len(),
            last_valid: lock(&self.last_valid).len(),
            expectations: expectations.len(),
        }
    }

    /// A restart into `attempt` was decided now.
    pub fn restart_detected(&self, uid: &str, attempt: u32) {
        lock(&self.detected).insert(uid.to_owned(), (attempt, Instant::now()));
    }

    /// The pods of a new attempt are being created: when its restart was decided, if known.
    pub fn take_detected(&self, uid: &str) -> Option<(u32, Instant)> {
        lock(&self.detected).remove(uid)
    }

    /// Whether this replica has told the job's `attempt` (queued the Event that starts it); marks it
    /// told from now on.
    pub fn tell(&self, uid: &str, attempt: u32) -> bool {
        let mut told = lock(&self.told);
        if told.get(uid) == Some(&attempt) {
            return true;
        }
        told.insert(uid.to_owned(), attempt);
        false
    }

    /// Publishing the Event that starts `attempt` failed: a later round tells it again.
    pub fn untell(&self, uid: &str, attempt: u32) {
        let mut told = lock(&self.told);
        if told.get(uid) == Some(&attempt) {
            told.remove(uid);
        }
    }

    /// One more consecutive transient error of a job; returns how many in a row.
    pub fn count_error(&self, key: &str) -> u32 {
        let mut counts = lock(&self.error_counts);
        let n = counts.entry(key.to_owned()).or_insert(0);
        *n = n.saturating_add(1);
        *n
    }

    /// A reconcile of the job succeeded.
    pub fn clear_errors(&self, key: &str) {
        let mut counts = lock(&self.error_counts);
        if !counts.is_empty() {
            counts.remove(key);
        }
    }

    /// Whether this generation of a malformed object was reported already.
    pub fn malformed_reported(&self, uid: &str, generation: &str) -> bool {
        lock(&self.reported_malformed)
            .get(uid)
            .is_some_and(|g| g == generation)
    }

    /// This generation of a malformed object has been reported.
    pub fn remember_malformed(&self, uid: &str, generation: &str) {
        lock(&self.reported_malformed).insert(uid.to_owned(), generation.to_owned());
    }

    /// The object parses again.
    pub fn forget_malformed(&self, uid: &str) {
        let mut reported = lock(&self.reported_malformed);
        if !reported.is_empty() {
            reported.remove(uid);
        }
    }

    /// `job` (with this uid) validated: the spec it runs on if a later edit does not.
    pub fn remember_valid(&self, uid: &str, job: &Arc<DeserializeGuard<TrainingJob>>) {
        let mut last = lock(&self.last_valid);
        match last.get_mut(uid) {
            Some(known) if Arc::ptr_eq(known, job) => {}
            Some(known) => *known = job.clone(),
            None => {
                last.insert(uid.to_owned(), job.clone());
            }
        }
    }

    /// The job object last seen valid, if this operator saw one since it started.
    pub fn last_valid(&self, uid: &str) -> Option<Arc<DeserializeGuard<TrainingJob>>> {
        lock(&self.last_valid).get(uid).cloned()
    }

    /// Forgets everything about one job.
    pub fn forget(&self, uid: &str, path: &str) {
        self.status.forget(uid);
        lock(&self.detected).remove(uid);
        lock(&self.told).remove(uid);
        lock(&self.reported_malformed).remove(uid);
        lock(&self.last_valid).remove(uid);
        lock(&self.error_counts).remove(path);
    }

    fn retain(&self, live: &LiveJobs) {
        self.status.retain(|uid| live.uids.contains(uid));
        lock(&self.detected).retain(|uid, _| live.uids.contains(uid));
        lock(&self.told).retain(|uid, _| live.uids.contains(uid));
        lock(&self.reported_malformed).retain(|uid, _| live.uids.contains(uid));
        lock(&self.last_valid).retain(|uid, _| live.uids.contains(uid));
        lock(&self.error_counts).retain(|path, _| live.paths.contains(path));
    }

    fn largest(&self) -> usize {
        let (written, deferred) = self.status.sizes();
        [
            written,
            deferred,
            lock(&self.detected).len(),
            lock(&self.told).len(),
            lock(&self.error_counts).len(),
            lock(&self.reported_malformed).len(),
            lock(&self.last_valid).len(),
        ]
        .into_iter()
        .max()
        .unwrap_or(0)
    }

    /// The backstop: a reconcile in flight when its job was deleted may write an entry after the
    /// Delete event forgot the job. Once a map outgrows the jobs, keep only the jobs that exist.
    pub fn sweep_if_outgrown(&self, jobs: &Store<DeserializeGuard<TrainingJob>>) {
        if self.largest() > 2 * jobs.len() + 16 {
            self.retain(&LiveJobs::of(jobs));
        }
    }

    /// Follows the TrainingJob watch, after its reflector has applied `event` to `jobs`: a
    /// deleted job (malformed or not) is forgotten, and the end of a re-list keeps only the
    /// jobs listed, since Delete events that fell into a watch gap never come.
    pub fn on_job_event(
        &self,
        expectations: &Expectations,
        event: &watcher::Event<DeserializeGuard<TrainingJob>>,
        jobs: &Store<DeserializeGuard<TrainingJob>>,
    ) {
        match event {
            watcher::Event::Delete(job) => {
                let meta = guard_meta(job);
                self.forget(meta.uid.as_deref().unwrap_or_default(), &path(meta));
                expectations.forget_job(
                    meta.namespace.as_deref().unwrap_or_default(),
                    meta.name.as_deref().unwrap_or_default(),
                );
            }
            watcher::Event::InitDone => {
                let live = LiveJobs::of(jobs);
                self.retain(&live);
                expectations.retain_jobs(|ns, job| live.paths.contains(&error_key(ns, job)));
            }
            watcher::Event::Apply(_) | watcher::Event::Init | watcher::Event::InitApply(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::TrainingJobStatus;
    use crate::expectations::Kind;
    use crate::fixtures::job_yaml;
    use kube::core::error_boundary::InvalidObject;
    use kube::runtime::reflector;
    use std::time::Duration;

    const JOBS: usize = 1000;

    fn job(i: usize) -> DeserializeGuard<TrainingJob> {
        let mut tj = job_yaml("workers: 2\n");
        tj.metadata.name = Some(format!("train-{i}"));
        tj.metadata.namespace = Some(format!("ns-{}", i % 7));
        tj.metadata.uid = Some(format!("uid-{i}"));
        tj.metadata.resource_version = Some("10".to_owned());
        // Every tenth object does not parse (see report_malformed in the controller).
        if i % 10 == 9 {
            return DeserializeGuard(Err(InvalidObject {
                error: "spec.template.spec.containers: invalid type".to_owned(),
                metadata: tj.metadata,
            }));
        }
        DeserializeGuard(Ok(tj))
    }

    /// The entries one job leaves behind, through the calls the controller makes.
    fn remember(
        memory: &JobMemory,
        expectations: &Expectations,
        job: &DeserializeGuard<TrainingJob>,
    ) {
        let meta = guard_meta(job);
        let uid = meta.uid.as_deref().unwrap_or_default();
        let ns = meta.namespace.as_deref().unwrap_or_default();
        let name = meta.name.as_deref().unwrap_or_default();
        let Ok(tj) = &job.0 else {
            memory.remember_malformed(uid, "1");
            assert!(memory.malformed_reported(uid, "1"));
            return;
        };
        let status = TrainingJobStatus {
            attempt: 1,
            ..TrainingJobStatus::default()
        };
        memory.status.remember_written(uid, Some("11"), &status);
        assert_eq!(
            memory.status.freshest_status(tj),
            status,
            "the cache trails our write"
        );
        memory.status.defer_detail(uid, &status);
        memory.remember_valid(uid, &Arc::new(job.clone()));
        memory.restart_detected(uid, 1);
        memory.count_error(&error_key(ns, name));
        for rank in 0..2 {
            expectations.expect(Kind::Pod, ns, &format!("{name}-worker-{rank}"));
        }
        expectations.expect(Kind::Service, ns, name);
        expectations.expect(Kind::Claim, ns, &format!("{name}-checkpoints"));
    }

    /// A world of `JOBS` jobs that each left entries, listed by a fresh watch.
    fn world() -> (
        JobMemory,
        Expectations,
        Store<DeserializeGuard<TrainingJob>>,
        reflector::store::Writer<DeserializeGuard<TrainingJob>>,
    ) {
        let memory = JobMemory::default();
        let expectations = Expectations::new(Duration::from_secs(15));
        let (store, mut writer) = reflector::store();
        let mut apply = |event: watcher::Event<DeserializeGuard<TrainingJob>>| {
            writer.apply_watcher_event(&event);
            memory.on_job_event(&expectations, &event, &store);
        };
        apply(watcher::Event::Init);
        for i in 0..JOBS {
            apply(watcher::Event::InitApply(job(i)));
        }
        apply(watcher::Event::InitDone);
        for i in 0..JOBS {
            remember(&memory, &expectations, &job(i));
        }
        (memory, expectations, store, writer)
    }

    #[test]
    fn deleting_a_thousand_jobs_leaves_every_map_empty() {
        let (memory, expectations, store, mut writer) = world();
        let before = memory.sizes(&expectations);
        let valid = JOBS - JOBS / 10;
        assert_eq!(
            before,
            StateSizes {
                written: valid,
                deferred: valid,
                detected: valid,
                error_counts: valid,
                reported_malformed: JOBS / 10,
                last_valid: valid,
                expectations: 4 * valid,
            }
        );
        for i in 0..JOBS {
            let event = watcher::Event::Delete(job(i));
            writer.apply_watcher_event(&event);
            memory.on_job_event(&expectations, &event, &store);
        }
        assert_eq!(memory.sizes(&expectations), StateSizes::default());
    }

    #[test]
    fn a_relist_after_a_watch_gap_forgets_the_jobs_deleted_meanwhile() {
        let (memory, expectations, store, mut writer) = world();
        // The watch broke; while it was down every job but the first 10 (and 19, malformed) went.
        for event in std::iter::once(watcher::Event::Init)
            .chain(
                (0..10)
                    .chain([19])
                    .map(|i| watcher::Event::InitApply(job(i))),
            )
            .chain([watcher::Event::InitDone])
        {
            writer.apply_watcher_event(&event);
            memory.on_job_event(&expectations, &event, &store);
        }
        assert_eq!(
            memory.sizes(&expectations),
            StateSizes {
                written: 9,
                deferred: 9,
                detected: 9,
                error_counts: 9,
                reported_malformed: 2,
                last_valid: 9,
                expectations: 4 * 9,
            }
        );
    }

    #[test]
    fn entries_written_after_the_delete_are_swept_once_a_map_outgrows_the_jobs() {
        let (memory, expectations, store, mut writer) = world();
        for i in 0..JOBS {
            let event = watcher::Event::Delete(job(i));
            writer.apply_watcher_event(&event);
            memory.on_job_event(&expectations, &event, &store);
        }
        // Reconciles still in flight for deleted jobs fail and count an error each.
        for i in 0..16 {
            memory.count_error(&error_key("ns-0", &format!("train-{i}")));
        }
        memory.sweep_if_outgrown(&store);
        assert_eq!(memory.sizes(&expectations).error_counts, 16);
        memory.count_error(&error_key("ns-0", "train-16"));
        memory.sweep_if_outgrown(&store);
        assert_eq!(memory.sizes(&expectations), StateSizes::default());
    }

    #[test]
    fn a_malformed_object_that_parses_again_is_forgotten() {
        let memory = JobMemory::default();
        memory.remember_malformed("u", "3");
        assert!(memory.malformed_reported("u", "3"));
        assert!(!memory.malformed_reported("u", "4"));
        memory.forget_malformed("u");
        assert!(!memory.malformed_reported("u", "3"));
        assert_eq!(
            memory.sizes(&Expectations::new(Duration::from_secs(1))),
            StateSizes::default()
        );
    }
}
