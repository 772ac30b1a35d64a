//! What reconciles remember of each job between them: the error backoff, and the object last
//! seen valid (a job edited into an invalid spec runs on as it). Forgotten with the job
//! ([`crate::job_memory`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::core::error_boundary::DeserializeGuard;

use crate::crd::TrainingJob;
use crate::job_memory::{LiveJobs, PerJob, lock};
use crate::metrics::StateSizes;

/// The reconciles' per-job maps.
#[derive(Debug, Default)]
pub(crate) struct ReconcileMemory {
    /// Consecutive transient errors, by namespace/name.
    error_counts: Mutex<HashMap<String, u32>>,
    /// The job object last seen valid, by uid: the job runs on as it while an edit does not
    /// validate. The same allocation as the job cache's entry until the job changes, so it
    /// costs a map entry per job, and one object per job whose spec was edited.
    last_valid: Mutex<HashMap<String, Arc<DeserializeGuard<TrainingJob>>>>,
}

impl ReconcileMemory {
    /// One more consecutive transient error of a job; returns how many in a row.
    pub(crate) fn count_error(&self, key: &str) -> u32 {
        let mut counts = lock(&self.error_counts);
        let n = counts.entry(key.to_owned()).or_insert(0);
        *n = n.saturating_add(1);
        *n
    }

    /// A reconcile of the job succeeded.
    pub(crate) fn clear_errors(&self, key: &str) {
        let mut counts = lock(&self.error_counts);
        if !counts.is_empty() {
            counts.remove(key);
        }
    }

    /// `job` (with this uid) validated: the spec it runs on if a later edit does not.
    pub(crate) fn remember_valid(&self, uid: &str, job: &Arc<DeserializeGuard<TrainingJob>>) {
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
    pub(crate) fn last_valid(&self, uid: &str) -> Option<Arc<DeserializeGuard<TrainingJob>>> {
        lock(&self.last_valid).get(uid).cloned()
    }
}

impl PerJob for ReconcileMemory {
    fn forget(&self, uid: &str, path: &str) {
        lock(&self.last_valid).remove(uid);
        lock(&self.error_counts).remove(path);
    }

    fn retain(&self, live: &LiveJobs) {
        lock(&self.last_valid).retain(|uid, _| live.has_uid(uid));
        lock(&self.error_counts).retain(|path, _| live.has_path(path));
    }

    fn largest(&self) -> usize {
        lock(&self.error_counts)
            .len()
            .max(lock(&self.last_valid).len())
    }

    fn add_sizes(&self, sizes: &mut StateSizes) {
        sizes.error_counts = lock(&self.error_counts).len();
        sizes.last_valid = lock(&self.last_valid).len();
    }
}
