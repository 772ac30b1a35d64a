//! What to run: the benchmark's parameters, and the checks that every pod can be scheduled.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::fake_nodes::GPUS_PER_NODE;

/// What to run.
#[derive(Clone, Debug)]
pub struct OperatorBenchParams {
    /// TrainingJobs (M).
    pub jobs: u32,
    /// Workers per job (W).
    pub workers: u32,
    /// Fake GPU nodes (N), 8 GPUs each.
    pub nodes: u32,
    /// GPUs per worker.
    pub gpus_per_worker: u32,
    /// Workers preempted at once, each of a different job (K); 0 skips the preemption phase.
    pub preempt: u32,
    /// How often the fair floor and the preemption burst are repeated in the run (each burst
    /// restarts the same K jobs once more, the operator's and the restart floor's alike); the
    /// targets are judged on the median run of each ([`median_by`](crate::stats::median_by)).
    pub rounds: u32,
    /// Jobs in flight at once, for both floors' writes and for applying the TrainingJobs.
    pub concurrency: usize,
    /// The `trainyard-operator` binary.
    pub operator_bin: PathBuf,
    /// Limit of each waiting phase.
    pub phase_timeout: Duration,
    /// Where the operator's log and kubeconfig go.
    pub work_dir: PathBuf,
    /// Run the operator with leader election on a Lease of its own (see
    /// [`OperatorProcess::start`](crate::operator_process::OperatorProcess::start)).
    pub leader_elect: bool,
    /// Record a CPU profile of the operator with `perf record` into this file, from its start
    /// to the end of the preemption phase.
    pub perf_record: Option<PathBuf>,
    /// The operator's `--max-concurrent-reconciles` (its default when None).
    pub max_concurrent_reconciles: Option<u16>,
}

impl OperatorBenchParams {
    pub(super) fn check(&self) -> Result<()> {
        let param = |name, message: String| Err(Error::Param { name, message });
        if self.jobs == 0 || self.workers == 0 || self.nodes == 0 {
            return param(
                "--jobs/--workers/--nodes",
                "must all be at least 1".to_owned(),
            );
        }
        if self.gpus_per_worker == 0 || self.gpus_per_worker > GPUS_PER_NODE {
            return param(
                "--gpus-per-worker",
                format!("must be 1..={GPUS_PER_NODE} (a fake node has {GPUS_PER_NODE} GPUs)"),
            );
        }
        let wanted =
            u64::from(self.jobs) * u64::from(self.workers) * u64::from(self.gpus_per_worker);
        let offered = u64::from(self.nodes) * u64::from(GPUS_PER_NODE);
        if wanted > offered {
            return param(
                "--nodes",
                format!(
                    "{} nodes offer {offered} GPUs but {} jobs × {} workers × {} GPUs need {wanted}: not every pod could be scheduled",
                    self.nodes, self.jobs, self.workers, self.gpus_per_worker
                ),
            );
        }
        if self.preempt > self.jobs {
            return param(
                "--preempt",
                format!(
                    "{} preemptions need as many jobs; there are {}",
                    self.preempt, self.jobs
                ),
            );
        }
        if self.concurrency == 0 {
            return param("--concurrency", "must be at least 1".to_owned());
        }
        if self.rounds == 0 {
            return param("--rounds", "must be at least 1".to_owned());
        }
        Ok(())
    }
}
