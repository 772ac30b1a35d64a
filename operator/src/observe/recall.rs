//! The progress channel as a reconcile recalls it: the store's reports as the decision reads
//! them, and the step-rate gauge derived from them.

use crate::metrics::Metrics;
use crate::model::validate::ValidJob;
use crate::plan::{ObservedProgress, ObservedRank};
use crate::progress::store::{JobProgress, ProgressStore};

/// The store's reports as the decision reads them.
pub(crate) fn as_observed(
    p: JobProgress,
    channel_refused_at: Option<jiff::Timestamp>,
) -> ObservedProgress {
    ObservedProgress {
        attempt: p.attempt,
        ranks: p
            .ranks
            .iter()
            .map(|(&rank, r)| ObservedRank {
                rank,
                step: r.step,
                advanced_at: r.advanced_at,
                reported_at: r.reported_at,
            })
            .collect(),
        checkpoint: p.checkpoint_step.zip(p.checkpoint_at),
        checkpoint_file: p.checkpoint_file.clone(),
        resumed_from: p.resumed_from,
        previous_attempt_step: p.previous_attempt_step,
        checkpoint_requested: p.checkpoint_requested,
        checkpoint_saved_on_request: p.checkpoint_saved_on_request,
        channel_refused_at,
        report_cadence: p.report_cadence(),
    }
}

/// What the job's trainers have reported, and its step rate on the gauge.
pub(crate) fn observe_progress(
    store: &ProgressStore,
    metrics: &Metrics,
    job: &ValidJob,
) -> Option<ObservedProgress> {
    // Reports of an earlier job of the same name are not this job's.
    let progress = store
        .snapshot(&job.namespace, &job.name)
        .filter(|p| p.job_uid == job.uid)?;
    if let Some(rate) = progress.steps_per_second {
        metrics.set_steps_per_second(&job.namespace, &job.name, rate);
    }
    Some(as_observed(progress, store.last_refusal()))
}
