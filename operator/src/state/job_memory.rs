//! When what the operator remembers about each TrainingJob between reconciles is forgotten.
//!
//! Each part of the operator keeps its own per-job state ([`crate::state::write_memory`]: the status
//! cache, restarts and Events told, malformed objects reported; `reconcile_memory`: the error
//! backoff and the last valid object) and hands it here as a [`PerJob`]. Every entry belongs
//! to one job (by uid, or by namespace/name for the error backoff), so it must go when the job
//! goes, or an operator that runs for months grows with every job it ever saw. Three paths
//! forget:
//! - the job watch's Delete event forgets the job at once ([`JobMemory::on_job_event`]);
//! - the end of a re-list (after a watch gap, which loses Delete events) keeps only the jobs
//!   listed;
//! - a sweep when a map outgrows the jobs catches entries that a reconcile still in flight for
//!   a job wrote after the job was forgotten.
//!
//! [`Expectations`] are keyed by the objects a job owns; they are forgotten with the job too.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::error_boundary::DeserializeGuard;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;

use crate::metrics::StateSizes;
use crate::model::crd::TrainingJob;
use crate::state::expectations::Expectations;

/// Per-job state of one part of the operator, forgotten with the job.
pub(crate) trait PerJob: std::fmt::Debug + Send + Sync {
    /// Forgets the job of `uid` (and `namespace/name` `path`).
    fn forget(&self, uid: &str, path: &str);
    /// Keeps only the jobs `live` names.
    fn retain(&self, live: &LiveJobs);
    /// Entries of its largest map.
    fn largest(&self) -> usize;
    /// Sets its maps' sizes in `sizes`.
    fn add_sizes(&self, sizes: &mut StateSizes);
}

/// Every part's per-job state, and when it is forgotten.
#[derive(Debug)]
pub struct JobMemory {
    owners: Vec<Arc<dyn PerJob>>,
}

/// A map's lock: every update is one insert or remove, so a panic elsewhere cannot leave a map
/// inconsistent.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The key of the error backoff: `namespace/name`.
pub fn error_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// The jobs that exist, as the keys the maps use.
#[derive(Debug, Default)]
pub(crate) struct LiveJobs {
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

    /// Whether the job of `uid` exists.
    pub(crate) fn has_uid(&self, uid: &str) -> bool {
        self.uids.contains(uid)
    }

    /// Whether the job at `namespace/name` exists.
    pub(crate) fn has_path(&self, path: &str) -> bool {
        self.paths.contains(path)
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
    /// The forgetting of `owners`' per-job state.
    pub(crate) fn new(owners: Vec<Arc<dyn PerJob>>) -> Self {
        Self { owners }
    }

    /// The sizes of every part's maps and of `expectations` now.
    pub fn sizes(&self, expectations: &Expectations) -> StateSizes {
        let mut sizes = StateSizes {
            expectations: expectations.len(),
            ..StateSizes::default()
        };
        for owner in &self.owners {
            owner.add_sizes(&mut sizes);
        }
        sizes
    }

    fn forget(&self, uid: &str, path: &str) {
        for owner in &self.owners {
            owner.forget(uid, path);
        }
    }

    fn retain(&self, live: &LiveJobs) {
        for owner in &self.owners {
            owner.retain(live);
        }
    }

    /// The backstop: a reconcile in flight when its job was deleted may write an entry after the
    /// Delete event forgot the job. Once a map outgrows the jobs, keep only the jobs that exist.
    pub fn sweep_if_outgrown(&self, jobs: &Store<DeserializeGuard<TrainingJob>>) {
        let largest = self.owners.iter().map(|o| o.largest()).max().unwrap_or(0);
        if largest > 2 * jobs.len() + 16 {
            self.retain(&LiveJobs::of(jobs));
        }
    }

    /// The sweep of this memory against `jobs`.
    pub(crate) fn sweep(self: &Arc<Self>, jobs: Store<DeserializeGuard<TrainingJob>>) -> Sweep {
        Sweep {
            memory: self.clone(),
            jobs,
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
                expectations.retain_jobs(|ns, job| live.has_path(&error_key(ns, job)));
            }
            watcher::Event::Apply(_) | watcher::Event::Init | watcher::Event::InitApply(_) => {}
        }
    }
}

/// [`JobMemory::sweep_if_outgrown`] against the jobs that exist, for a writer that adds
/// entries after the job may be gone.
#[derive(Clone)]
pub(crate) struct Sweep {
    memory: Arc<JobMemory>,
    jobs: Store<DeserializeGuard<TrainingJob>>,
}

impl Sweep {
    /// Keeps only the jobs that exist once a map outgrows them.
    pub(crate) fn if_outgrown(&self) {
        self.memory.sweep_if_outgrown(&self.jobs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::job_yaml;
    use crate::model::crd::TrainingJobStatus;
    use crate::model::ownership::Kind;
    use crate::state::reconcile_memory::ReconcileMemory;
    use crate::state::write_memory::WriteMemory;
    use kube::core::error_boundary::InvalidObject;
    use kube::runtime::reflector;
    use std::time::Duration;

    const JOBS: usize = 1000;

    /// The parts' memories, as the controller wires them.
    struct Memory {
        all: JobMemory,
        writes: Arc<WriteMemory>,
        reconciles: Arc<ReconcileMemory>,
    }

    impl Memory {
        fn new() -> Self {
            let writes = Arc::new(WriteMemory::default());
            let reconciles = Arc::new(ReconcileMemory::default());
            let all = JobMemory::new(vec![writes.clone(), reconciles.clone()]);
            Self {
                all,
                writes,
                reconciles,
            }
        }
    }

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
    fn remember(memory: &Memory, expectations: &Expectations, job: &DeserializeGuard<TrainingJob>) {
        let meta = guard_meta(job);
        let uid = meta.uid.as_deref().unwrap_or_default();
        let ns = meta.namespace.as_deref().unwrap_or_default();
        let name = meta.name.as_deref().unwrap_or_default();
        let Ok(tj) = &job.0 else {
            memory.writes.remember_malformed(uid, "1");
            assert!(memory.writes.malformed_reported(uid, "1"));
            return;
        };
        let status = TrainingJobStatus {
            attempt: 1,
            ..TrainingJobStatus::default()
        };
        memory
            .writes
            .status
            .remember_written(uid, Some("11"), &status);
        assert_eq!(
            memory.writes.status.freshest_status(tj),
            status,
            "the cache trails our write"
        );
        memory.writes.status.defer_detail(uid, &status);
        memory
            .reconciles
            .remember_valid(uid, &Arc::new(job.clone()));
        memory.writes.restart_detected(uid, 1);
        memory.reconciles.count_error(&error_key(ns, name));
        for rank in 0..2 {
            expectations.expect(Kind::Pod, ns, &format!("{name}-worker-{rank}"));
        }
        expectations.expect(Kind::Service, ns, name);
        expectations.expect(Kind::Claim, ns, &format!("{name}-checkpoints"));
    }

    /// A world of `JOBS` jobs that each left entries, listed by a fresh watch.
    fn world() -> (
        Memory,
        Expectations,
        Store<DeserializeGuard<TrainingJob>>,
        reflector::store::Writer<DeserializeGuard<TrainingJob>>,
    ) {
        let memory = Memory::new();
        let expectations = Expectations::new(Duration::from_secs(15));
        let (store, mut writer) = reflector::store();
        let mut apply = |event: watcher::Event<DeserializeGuard<TrainingJob>>| {
            writer.apply_watcher_event(&event);
            memory.all.on_job_event(&expectations, &event, &store);
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
        let before = memory.all.sizes(&expectations);
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
            memory.all.on_job_event(&expectations, &event, &store);
        }
        assert_eq!(memory.all.sizes(&expectations), StateSizes::default());
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
            memory.all.on_job_event(&expectations, &event, &store);
        }
        assert_eq!(
            memory.all.sizes(&expectations),
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
            memory.all.on_job_event(&expectations, &event, &store);
        }
        // Reconciles still in flight for deleted jobs fail and count an error each.
        for i in 0..16 {
            memory
                .reconciles
                .count_error(&error_key("ns-0", &format!("train-{i}")));
        }
        memory.all.sweep_if_outgrown(&store);
        assert_eq!(memory.all.sizes(&expectations).error_counts, 16);
        memory
            .reconciles
            .count_error(&error_key("ns-0", "train-16"));
        memory.all.sweep_if_outgrown(&store);
        assert_eq!(memory.all.sizes(&expectations), StateSizes::default());
    }

    #[test]
    fn a_malformed_object_that_parses_again_is_forgotten() {
        let memory = Memory::new();
        memory.writes.remember_malformed("u", "3");
        assert!(memory.writes.malformed_reported("u", "3"));
        assert!(!memory.writes.malformed_reported("u", "4"));
        memory.writes.forget_malformed("u");
        assert!(!memory.writes.malformed_reported("u", "3"));
        assert_eq!(
            memory.all.sizes(&Expectations::new(Duration::from_secs(1))),
            StateSizes::default()
        );
    }
}
