//! When a decided status is written: an I/O batching policy of the controller's status
//! writes.

use std::time::Duration;

use crate::model::crd::{Phase, TrainingJobStatus};

/// How long per-worker detail may wait to be written with other changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DetailBatch {
    /// While the job is Running: detail there is news (a worker finished).
    pub running: Duration,
    /// Before it runs: the detail of pods being created and scheduled, which the write that
    /// makes the job Running carries anyway. Only a job that stays Pending this long shows
    /// its workers before that.
    pub before_running: Duration,
}

/// When to write a decided status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusWrite {
    /// Nothing changed.
    Unchanged,
    /// Write it now.
    Now,
    /// Only per-worker detail changed: keep it in memory and write it after this long, together
    /// with whatever else changes meanwhile.
    Later(std::time::Duration),
}

impl StatusWrite {
    /// Whether the status is written in this round.
    pub fn now(self) -> bool {
        self == Self::Now
    }

    /// How long the status waits to be written, when it waits.
    pub fn later(self) -> Option<Duration> {
        match self {
            Self::Later(after) => Some(after),
            Self::Now | Self::Unchanged => None,
        }
    }
}

/// Decides when `desired` is written over `written` (what the API server holds).
///
/// Everything but `status.workers` and `status.workerSummary` is a decision or a transition users and tools wait on
/// (phase, attempt, counters, conditions, selected GPU): written at once. `status.workers` is
/// per-worker detail that moves with every pod event (a pod seen, bound to a node, started):
/// one write per worker per step would be most of the operator's API traffic (several status
/// writes per job while creating, and as many again while going Running), so such detail
/// waits, counted from the first unwritten change (`pending_for`), and goes out in one write:
/// before the job runs until the transition to Running carries it (one status write when the
/// pods are created, one when they run; docs/benchmarks.md counts them), or
/// [`DetailBatch::before_running`] at the latest; once it runs, within
/// [`DetailBatch::running`]. The controller decides on the unwritten detail meanwhile, so a
/// worker it has seen and that disappears is still a preemption.
pub fn status_write(
    written: &TrainingJobStatus,
    desired: &TrainingJobStatus,
    pending_for: Option<Duration>,
    batch: DetailBatch,
) -> StatusWrite {
    if desired == written {
        return StatusWrite::Unchanged;
    }
    let decisions_equal = TrainingJobStatus {
        workers: Vec::new(),
        worker_summary: None,
        ..desired.clone()
    } == TrainingJobStatus {
        workers: Vec::new(),
        worker_summary: None,
        ..written.clone()
    };
    if !decisions_equal {
        return StatusWrite::Now;
    }
    let batch = match desired.phase {
        Some(Phase::Running) => batch.running,
        _ => batch.before_running,
    };
    match pending_for {
        Some(waited) if waited >= batch => StatusWrite::Now,
        Some(waited) => StatusWrite::Later(batch - waited),
        None => StatusWrite::Later(batch),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::crd::{Phase, TrainingJobStatus, WorkerStatus};

    const RUNNING: Duration = Duration::from_secs(3);
    const BEFORE: Duration = Duration::from_secs(300);
    const BATCH: DetailBatch = DetailBatch {
        running: RUNNING,
        before_running: BEFORE,
    };

    fn worker(rank: u32, node: Option<&str>, phase: &str) -> WorkerStatus {
        WorkerStatus {
            rank,
            pod: format!("j-worker-{rank}"),
            node: node.map(str::to_owned),
            phase: phase.to_owned(),
            reason: None,
        }
    }

    fn pending() -> TrainingJobStatus {
        TrainingJobStatus {
            phase: Some(Phase::Pending),
            workers: vec![worker(0, None, "Pending")],
            ..TrainingJobStatus::default()
        }
    }

    #[test]
    fn an_unchanged_status_is_not_written() {
        assert_eq!(
            status_write(&pending(), &pending(), None, BATCH),
            StatusWrite::Unchanged
        );
    }

    fn running() -> TrainingJobStatus {
        TrainingJobStatus {
            phase: Some(Phase::Running),
            workers: vec![worker(0, Some("n1"), "Running")],
            ..TrainingJobStatus::default()
        }
    }

    #[test]
    fn detail_of_a_running_job_waits_for_the_batch_counted_from_its_first_change() {
        let mut finished = running();
        finished.workers[0].phase = "Succeeded".to_owned();
        assert_eq!(
            status_write(&running(), &finished, None, BATCH),
            StatusWrite::Later(RUNNING)
        );
        assert_eq!(
            status_write(&running(), &finished, Some(Duration::from_secs(1)), BATCH),
            StatusWrite::Later(Duration::from_secs(2))
        );
        assert_eq!(
            status_write(&running(), &finished, Some(RUNNING), BATCH),
            StatusWrite::Now
        );
    }

    #[test]
    fn detail_before_the_job_runs_waits_for_the_transition_that_carries_it() {
        let mut scheduled = pending();
        scheduled.workers[0].node = Some("n1".to_owned());
        assert_eq!(
            status_write(&pending(), &scheduled, None, BATCH),
            StatusWrite::Later(BEFORE)
        );
        let mut more = scheduled.clone();
        more.workers.push(worker(1, None, "Pending"));
        // Past the running batch: still held, the job does not run yet.
        assert_eq!(
            status_write(&pending(), &more, Some(Duration::from_secs(10)), BATCH),
            StatusWrite::Later(BEFORE - Duration::from_secs(10))
        );
        // A job that stays Pending shows its workers at last.
        assert_eq!(
            status_write(&pending(), &more, Some(BEFORE), BATCH),
            StatusWrite::Now
        );
    }

    #[test]
    fn a_transition_is_written_at_once_with_the_detail_that_waited() {
        let mut running = pending();
        running.workers[0] = worker(0, Some("n1"), "Running");
        running.phase = Some(Phase::Running);
        assert_eq!(
            status_write(&pending(), &running, Some(Duration::ZERO), BATCH),
            StatusWrite::Now
        );
        let mut restarted = pending();
        restarted.attempt = 1;
        restarted.workers.clear();
        assert_eq!(
            status_write(&pending(), &restarted, None, BATCH),
            StatusWrite::Now
        );
    }
}
