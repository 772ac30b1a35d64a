//! When what the operator remembers about each TrainingJob is forgotten: one list of owners
//! ([`PerJob`]), one forgetting. The maps and their keys are tabled in [`crate::state`].
//!
//! Every entry belongs to one job, so it must go when the job goes, or an operator that runs
//! for months grows with every job it ever saw. Three paths forget:
//! - the job watch's Delete event forgets the job at once ([`JobMemory::on_job_event`]);
//! - the end of a re-list (after a watch gap, which loses Delete events) keeps only the jobs
//!   listed;
//! - a sweep when a map outgrows the jobs catches entries that a reconcile still in flight for
//!   a job wrote after the job was forgotten.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::error_boundary::DeserializeGuard;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;

use crate::metrics::{Metrics, StateSizes};
use crate::model::crd::TrainingJob;

/// Per-job state of one part of the operator, forgotten with the job.
pub(crate) trait PerJob: Send + Sync {
    /// Forgets `job`.
    fn forget(&self, job: &JobKey<'_>);
    /// Keeps only the jobs `live` names.
    fn retain(&self, live: &LiveJobs);
    /// Entries of its largest map that the sweep bounds.
    fn largest(&self) -> usize;
    /// Sets its maps' sizes in `sizes`; a map the gauge does not show sets none.
    fn add_sizes(&self, _sizes: &mut StateSizes) {}
}

/// Every part's per-job state, and when it is forgotten.
pub struct JobMemory {
    owners: Vec<Arc<dyn PerJob>>,
}

/// A map's lock: every update is one insert or remove, so a panic elsewhere cannot leave a map
/// inconsistent.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One job, by each key a per-job map uses.
#[derive(Clone, Copy, Debug)]
pub(crate) struct JobKey<'a> {
    pub(crate) uid: &'a str,
    pub(crate) namespace: &'a str,
    pub(crate) name: &'a str,
}

impl<'a> JobKey<'a> {
    /// The job `meta` describes.
    pub(crate) fn of(meta: &'a ObjectMeta) -> Self {
        Self {
            uid: meta.uid.as_deref().unwrap_or_default(),
            namespace: meta.namespace.as_deref().unwrap_or_default(),
            name: meta.name.as_deref().unwrap_or_default(),
        }
    }
}

/// The jobs that exist, by each key the maps use.
#[derive(Debug, Default)]
pub(crate) struct LiveJobs {
    uids: HashSet<String>,
    /// Names by namespace.
    names: HashMap<String, HashSet<String>>,
}

impl<'a> FromIterator<JobKey<'a>> for LiveJobs {
    fn from_iter<I: IntoIterator<Item = JobKey<'a>>>(jobs: I) -> Self {
        let mut live = Self::default();
        for job in jobs {
            live.uids.insert(job.uid.to_owned());
            let names = live.names.entry(job.namespace.to_owned()).or_default();
            names.insert(job.name.to_owned());
        }
        live
    }
}

impl LiveJobs {
    fn of(jobs: &Store<DeserializeGuard<TrainingJob>>) -> Self {
        let jobs = jobs.state();
        jobs.iter().map(|job| JobKey::of(guard_meta(job))).collect()
    }

    /// Whether the job of `uid` exists.
    pub(crate) fn has_uid(&self, uid: &str) -> bool {
        self.uids.contains(uid)
    }

    /// Whether the job `namespace/name` exists.
    pub(crate) fn has(&self, namespace: &str, name: &str) -> bool {
        self.names.get(namespace).is_some_and(|n| n.contains(name))
    }
}

fn guard_meta(job: &DeserializeGuard<TrainingJob>) -> &ObjectMeta {
    match &job.0 {
        Ok(job) => &job.metadata,
        Err(invalid) => &invalid.metadata,
    }
}

impl JobMemory {
    /// The forgetting of `owners`' per-job state.
    pub(crate) fn new(owners: Vec<Arc<dyn PerJob>>) -> Self {
        Self { owners }
    }

    /// The sizes of every part's maps now.
    pub fn sizes(&self) -> StateSizes {
        let mut sizes = StateSizes::default();
        for owner in &self.owners {
            owner.add_sizes(&mut sizes);
        }
        sizes
    }

    /// Entries of the largest map the sweep bounds.
    fn largest(&self) -> usize {
        self.owners.iter().map(|o| o.largest()).max().unwrap_or(0)
    }

    fn forget(&self, job: &JobKey<'_>) {
        for owner in &self.owners {
            owner.forget(job);
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
        if self.largest() > 2 * jobs.len() + 16 {
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
        event: &watcher::Event<DeserializeGuard<TrainingJob>>,
        jobs: &Store<DeserializeGuard<TrainingJob>>,
    ) {
        match event {
            watcher::Event::Delete(job) => self.forget(&JobKey::of(guard_meta(job))),
            watcher::Event::InitDone => self.retain(&LiveJobs::of(jobs)),
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

/// The per-job metric series (ledger totals, step rate), by namespace and name.
impl PerJob for Metrics {
    fn forget(&self, job: &JobKey<'_>) {
        self.forget_job(job.namespace, job.name);
    }

    fn retain(&self, live: &LiveJobs) {
        self.retain_jobs(|namespace, name| live.has(namespace, name));
    }

    fn largest(&self) -> usize {
        self.jobs_with_series()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::job_yaml;
    use crate::model::crd::{GoodputLedger, TrainingJobStatus};
    use crate::model::ownership::Kind;
    use crate::model::rejection::WriteOutcome;
    use crate::model::supervision::SupervisedState;
    use crate::progress::store::{ProgressStore, Report};
    use crate::progress::supervisors::Poll;
    use crate::state::expectations::Expectations;
    use crate::state::reconcile_memory::ReconcileMemory;
    use crate::state::write_memory::WriteMemory;
    use kube::core::error_boundary::InvalidObject;
    use kube::runtime::reflector;
    use std::time::Duration;

    const JOBS: usize = 1000;

    /// Every owner of per-job state, registered as the runtime wires them.
    struct Memory {
        all: JobMemory,
        writes: Arc<WriteMemory>,
        reconciles: Arc<ReconcileMemory>,
        expectations: Arc<Expectations>,
        progress: Arc<ProgressStore>,
        metrics: Arc<Metrics>,
    }

    impl Memory {
        fn new() -> Self {
            let writes = Arc::new(WriteMemory::default());
            let reconciles = Arc::new(ReconcileMemory::default());
            let expectations = Arc::new(Expectations::new(Duration::from_secs(15)));
            let progress = Arc::new(ProgressStore::default());
            let metrics = Arc::new(Metrics::new());
            let all = JobMemory::new(vec![
                writes.clone(),
                reconciles.clone(),
                expectations.clone(),
                progress.clone(),
                metrics.clone(),
            ]);
            Self {
                all,
                writes,
                reconciles,
                expectations,
                progress,
                metrics,
            }
        }

        /// The metric series that name `job`.
        fn series_of(&self, job: &str) -> usize {
            let label = format!("job=\"{job}\"");
            self.metrics
                .render()
                .lines()
                .filter(|l| l.contains(&label))
                .count()
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

    /// What the trainers and supervisors of a job leave behind, and its metric series.
    fn remember_channel(memory: &Memory, job: &JobKey<'_>) {
        let (ns, name, uid) = (job.namespace, job.name, job.uid);
        let now = jiff::Timestamp::UNIX_EPOCH;
        let report = Report {
            rank: 0,
            attempt: 1,
            step: 5,
            loss: None,
            checkpoint_step: None,
            checkpoint_file: None,
            resumed_from: None,
        };
        memory.progress.record(ns, name, uid, &report, now);
        let poll = Poll {
            pod_uid: format!("{uid}-pod-0"),
            rank: 0,
            attempt: 1,
            state: SupervisedState::Running,
            exited_ago: Duration::ZERO,
            warming: false,
        };
        memory.progress.supervisors.poll(ns, name, uid, poll, now);
        let ledger = GoodputLedger::default();
        memory.metrics.record_ledger(ns, name, uid, Some(&ledger));
        memory.metrics.set_steps_per_second(ns, name, 1.5);
    }

    /// The entries one job leaves behind, through the calls the controller makes.
    fn remember(memory: &Memory, job: &DeserializeGuard<TrainingJob>) {
        let key = JobKey::of(guard_meta(job));
        let (ns, name, uid) = (key.namespace, key.name, key.uid);
        let Ok(tj) = &job.0 else {
            memory.writes.remember_malformed(uid, "1");
            assert!(memory.writes.malformed_reported(uid, "1"));
            return;
        };
        let status = TrainingJobStatus {
            attempt: 1,
            ..TrainingJobStatus::default()
        };
        let status_cache = &memory.writes.status;
        status_cache.remember_written(uid, Some("11"), &status);
        assert_eq!(
            status_cache.freshest_status(tj),
            status,
            "the cache trails our write"
        );
        status_cache.defer_detail(uid, &status);
        memory
            .reconciles
            .remember_valid(uid, &Arc::new(job.clone()));
        memory.writes.restart_detected(uid, 1);
        memory.writes.told(uid, 1);
        memory.writes.record_writes(uid, WriteOutcome::default());
        memory.reconciles.count_error(uid);
        for rank in 0..2 {
            let pod = format!("{name}-worker-{rank}");
            memory.expectations.expect(Kind::Pod, ns, &pod);
        }
        memory.expectations.expect(Kind::Service, ns, name);
        let claim = format!("{name}-checkpoints");
        memory.expectations.expect(Kind::Claim, ns, &claim);
        remember_channel(memory, &key);
    }

    /// Hands `event` to the job cache, then to the memory, as the job watch does.
    fn apply(
        memory: &Memory,
        store: &Store<DeserializeGuard<TrainingJob>>,
        writer: &mut reflector::store::Writer<DeserializeGuard<TrainingJob>>,
        event: watcher::Event<DeserializeGuard<TrainingJob>>,
    ) {
        writer.apply_watcher_event(&event);
        memory.all.on_job_event(&event, store);
    }

    type World = (
        Memory,
        Store<DeserializeGuard<TrainingJob>>,
        reflector::store::Writer<DeserializeGuard<TrainingJob>>,
    );

    /// A world of `jobs` jobs that each left entries, listed by a fresh watch.
    fn world(jobs: usize) -> World {
        let memory = Memory::new();
        let (store, mut writer) = reflector::store();
        apply(&memory, &store, &mut writer, watcher::Event::Init);
        for i in 0..jobs {
            apply(
                &memory,
                &store,
                &mut writer,
                watcher::Event::InitApply(job(i)),
            );
        }
        apply(&memory, &store, &mut writer, watcher::Event::InitDone);
        for i in 0..jobs {
            remember(&memory, &job(i));
        }
        (memory, store, writer)
    }

    /// Every map of every owner is empty, and no per-job series is exposed.
    fn assert_forgotten(memory: &Memory, job: &str) {
        assert_eq!(memory.all.sizes(), StateSizes::default());
        assert_eq!(memory.all.largest(), 0, "a map the gauge does not show");
        assert!(memory.progress.is_empty());
        assert!(memory.progress.supervisors.is_empty());
        assert_eq!(memory.series_of(job), 0, "{}", memory.metrics.render());
    }

    #[test]
    fn a_deleted_job_leaves_no_entry_in_any_map() {
        let (memory, store, mut writer) = world(1);
        assert_eq!(memory.all.largest(), 1);
        assert_eq!(memory.progress.len(), 1);
        assert_eq!(memory.progress.supervisors.len(), 1);
        assert_eq!(memory.series_of("train-0"), 2 * 8 + 2 + 1);
        apply(&memory, &store, &mut writer, watcher::Event::Delete(job(0)));
        assert_forgotten(&memory, "train-0");
    }

    #[test]
    fn a_job_deleted_during_a_watch_gap_leaves_no_entry_in_any_map() {
        let (memory, store, mut writer) = world(2);
        // The watch broke; while it was down job 0 went, and a re-list shows job 1 alone.
        apply(&memory, &store, &mut writer, watcher::Event::Init);
        apply(
            &memory,
            &store,
            &mut writer,
            watcher::Event::InitApply(job(1)),
        );
        apply(&memory, &store, &mut writer, watcher::Event::InitDone);
        assert_eq!(memory.series_of("train-0"), 0);
        assert_eq!(memory.series_of("train-1"), 2 * 8 + 2 + 1);
        assert_eq!(memory.progress.len(), 1);
        assert_eq!(memory.progress.supervisors.len(), 1);
        assert_eq!(memory.expectations.len(), 4);
        apply(&memory, &store, &mut writer, watcher::Event::Delete(job(1)));
        assert_forgotten(&memory, "train-1");
    }

    #[test]
    fn deleting_a_thousand_jobs_leaves_every_map_empty() {
        let (memory, store, mut writer) = world(JOBS);
        let valid = JOBS - JOBS / 10;
        assert_eq!(
            memory.all.sizes(),
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
            apply(&memory, &store, &mut writer, watcher::Event::Delete(job(i)));
        }
        assert_forgotten(&memory, "train-0");
    }

    #[test]
    fn a_relist_after_a_watch_gap_forgets_the_jobs_deleted_meanwhile() {
        let (memory, store, mut writer) = world(JOBS);
        // The watch broke; while it was down every job but the first 10 (and 19, malformed) went.
        apply(&memory, &store, &mut writer, watcher::Event::Init);
        for i in (0..10).chain([19]) {
            apply(
                &memory,
                &store,
                &mut writer,
                watcher::Event::InitApply(job(i)),
            );
        }
        apply(&memory, &store, &mut writer, watcher::Event::InitDone);
        assert_eq!(
            memory.all.sizes(),
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
        assert_eq!(memory.progress.len(), 9);
        assert_eq!(memory.metrics.jobs_with_series(), 9);
    }

    #[test]
    fn entries_written_after_the_delete_are_swept_once_a_map_outgrows_the_jobs() {
        let (memory, store, mut writer) = world(JOBS);
        for i in 0..JOBS {
            apply(&memory, &store, &mut writer, watcher::Event::Delete(job(i)));
        }
        // Reconciles still in flight for deleted jobs fail and count an error each.
        for i in 0..16 {
            memory.reconciles.count_error(&format!("uid-{i}"));
        }
        memory.all.sweep_if_outgrown(&store);
        assert_eq!(memory.all.sizes().error_counts, 16);
        memory.reconciles.count_error("uid-16");
        memory.all.sweep_if_outgrown(&store);
        assert_eq!(memory.all.sizes(), StateSizes::default());
    }

    #[test]
    fn a_malformed_object_that_parses_again_is_forgotten() {
        let memory = Memory::new();
        memory.writes.remember_malformed("u", "3");
        assert!(memory.writes.malformed_reported("u", "3"));
        assert!(!memory.writes.malformed_reported("u", "4"));
        memory.writes.forget_malformed("u");
        assert!(!memory.writes.malformed_reported("u", "3"));
        assert_eq!(memory.all.sizes(), StateSizes::default());
    }
}
