//! When a decided status is written: an I/O batching policy of the controller's status
//! writes.

use crate::crd::TrainingJobStatus;

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

/// Decides when `desired` is written over `written` (what the API server holds).
///
/// Everything but `status.workers` is a decision or a transition users and tools wait on
/// (phase, attempt, counters, conditions, selected GPU): written at once. `status.workers` is
/// per-worker detail that moves with every pod event (a pod seen, bound to a node, started):
/// one write per worker per step would be most of the operator's API traffic (measured 4.3–4.8
/// status writes per job while creating, and as many again while going Running), so such detail
/// waits up to `batch`, counted from the first unwritten change (`pending_for`), and goes out in
/// one write. The controller decides on the unwritten detail meanwhile, so a worker it has seen
/// and that disappears is still a preemption.
pub fn status_write(
    written: &TrainingJobStatus,
    desired: &TrainingJobStatus,
    pending_for: Option<std::time::Duration>,
    batch: std::time::Duration,
) -> StatusWrite {
    if desired == written {
        return StatusWrite::Unchanged;
    }
    let decisions_equal = TrainingJobStatus {
        workers: Vec::new(),
        ..desired.clone()
    } == TrainingJobStatus {
        workers: Vec::new(),
        ..written.clone()
    };
    if !decisions_equal {
        return StatusWrite::Now;
    }
    match pending_for {
        Some(waited) if waited >= batch => StatusWrite::Now,
        Some(waited) => StatusWrite::Later(batch - waited),
        None => StatusWrite::Later(batch),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{Phase, TrainingJobStatus, WorkerStatus};
    use std::time::Duration;

    const BATCH: Duration = Duration::from_secs(3);

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

    #[test]
    fn worker_detail_alone_waits_for_the_batch_counted_from_its_first_change() {
        let mut scheduled = pending();
        scheduled.workers[0].node = Some("n1".to_owned());
        assert_eq!(
            status_write(&pending(), &scheduled, None, BATCH),
            StatusWrite::Later(BATCH)
        );
        assert_eq!(
            status_write(&pending(), &scheduled, Some(Duration::from_secs(1)), BATCH),
            StatusWrite::Later(Duration::from_secs(2))
        );
        assert_eq!(
            status_write(&pending(), &scheduled, Some(BATCH), BATCH),
            StatusWrite::Now
        );
        let mut more = scheduled.clone();
        more.workers.push(worker(1, None, "Pending"));
        assert_eq!(
            status_write(&pending(), &more, Some(Duration::from_secs(1)), BATCH),
            StatusWrite::Later(Duration::from_secs(2))
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
