//! What reconciles remember of each job between them: the error backoff, and the object last
//! seen valid (a job edited into an invalid spec runs on as it). Forgotten with the job
//! ([`crate::state::job_memory`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::core::error_boundary::DeserializeGuard;

use crate::metrics::StateSizes;
use crate::model::crd::TrainingJob;
use crate::state::job_memory::{JobKey, LiveJobs, PerJob, lock};

/// The reconciles' per-job maps.
#[derive(Debug, Default)]
pub(crate) struct ReconcileMemory {
    /// Consecutive transient errors, by uid.
    error_counts: Mutex<HashMap<String, u32>>,
    /// The job object last seen valid, by uid: the job runs on as it while an edit does not
    /// validate. It follows the job cache's entry while the spec is unchanged
    /// ([`ReconcileMemory::follow_cache`]), so it costs a map entry per job, and one object per
    /// job whose spec was edited since it last validated.
    last_valid: Mutex<HashMap<String, Arc<DeserializeGuard<TrainingJob>>>>,
}

impl ReconcileMemory {
    /// One more consecutive transient error of the job `uid`; returns how many in a row.
    pub(crate) fn count_error(&self, uid: &str) -> u32 {
        let mut counts = lock(&self.error_counts);
        let n = counts.entry(uid.to_owned()).or_insert(0);
        *n = n.saturating_add(1);
        *n
    }

    /// A reconcile of the job `uid` succeeded.
    pub(crate) fn clear_errors(&self, uid: &str) {
        let mut counts = lock(&self.error_counts);
        if !counts.is_empty() {
            counts.remove(uid);
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

    /// The job cache now holds `current`: when its spec is the one last seen valid (a status
    /// write or a label changed, not the spec), the remembered object is the cache's, and the
    /// previous version is not kept beside it.
    pub(crate) fn follow_cache(&self, uid: &str, current: &Arc<DeserializeGuard<TrainingJob>>) {
        let Ok(job) = &current.0 else {
            return;
        };
        let mut last = lock(&self.last_valid);
        if let Some(known) = last.get_mut(uid)
            && !Arc::ptr_eq(known, current)
            && known.0.as_ref().is_ok_and(|k| {
                k.metadata.generation == job.metadata.generation && k.spec == job.spec
            })
        {
            *known = current.clone();
        }
    }

    /// The job object last seen valid, if this operator saw one since it started.
    pub(crate) fn last_valid(&self, uid: &str) -> Option<Arc<DeserializeGuard<TrainingJob>>> {
        lock(&self.last_valid).get(uid).cloned()
    }
}

impl PerJob for ReconcileMemory {
    fn forget(&self, job: &JobKey<'_>) {
        lock(&self.last_valid).remove(job.uid);
        lock(&self.error_counts).remove(job.uid);
    }

    fn retain(&self, live: &LiveJobs) {
        lock(&self.last_valid).retain(|uid, _| live.has_uid(uid));
        lock(&self.error_counts).retain(|uid, _| live.has_uid(uid));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::job_yaml;

    fn cached(yaml: &str, generation: i64) -> Arc<DeserializeGuard<TrainingJob>> {
        let mut job = job_yaml(yaml);
        job.metadata.generation = Some(generation);
        Arc::new(DeserializeGuard(Ok(job)))
    }

    #[test]
    fn the_last_valid_object_follows_the_cache_until_the_spec_changes() {
        let memory = ReconcileMemory::default();
        let valid = cached("workers: 2\n", 1);
        let uid = "uid-1";
        memory.remember_valid(uid, &valid);
        // A status write: a new object in the cache, the same spec.
        let written = cached("workers: 2\n", 1);
        memory.follow_cache(uid, &written);
        let last = memory.last_valid(uid).expect("remembered");
        assert!(
            Arc::ptr_eq(&last, &written),
            "the cache's object, not a copy"
        );
        // An edit: the remembered object stays the last valid one.
        let edited = cached("workers: 3\n", 2);
        memory.follow_cache(uid, &edited);
        let last = memory.last_valid(uid).expect("remembered");
        assert!(Arc::ptr_eq(&last, &written));
        // A job never seen valid is not remembered by following the cache.
        memory.follow_cache("uid-2", &edited);
        assert!(memory.last_valid("uid-2").is_none());
    }
}
