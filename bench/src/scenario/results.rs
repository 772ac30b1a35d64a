//! What a run measured: the create phases' throughput, the preemption recoveries, and the
//! operator's memory, CPU and API requests, as the report stores them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::cpu_profile::CpuProfile;
use crate::operator_process::ProcessUsage;
use crate::proxy::RequestCounts;
use crate::recovery_stages::RecoveryStages;
use crate::stats::percentile;

/// Time to create and to schedule every pod.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Throughput {
    /// Pods expected.
    pub pods: u64,
    /// Seconds from the first request to the last pod seen created.
    pub created_seconds: f64,
    /// Seconds from the first request to half of the pods seen created.
    pub half_created_seconds: f64,
    /// Seconds from the first request to the last pod seen scheduled.
    pub scheduled_seconds: f64,
    /// The client's requests in this phase, from the counting proxy.
    pub requests: RequestCounts,
    /// The most of the client's requests waiting for the API server at once.
    #[serde(default)]
    pub peak_in_flight: usize,
    /// Seconds until the benchmark's own requests were answered: the floor's pod creates, the
    /// fair floor's every write, or the TrainingJob creates the operator works from.
    #[serde(default)]
    pub inputs_done_seconds: f64,
}

/// Preemption → new attempt's pods, per job.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Recovery {
    /// Jobs preempted at once.
    pub preempted: u32,
    /// Median seconds from the preemption to every pod of the next attempt seen created.
    pub p50_seconds: f64,
    /// 99th percentile of the same.
    pub p99_seconds: f64,
    /// Slowest job.
    pub max_seconds: f64,
    /// The operator's own view (`trainyard_operator_preemption_recovery_seconds` mean):
    /// from its detection, not from the preemption.
    pub operator_histogram_mean_seconds: Option<f64>,
    /// Where the seconds went, stage by stage (None in reports from before it was measured).
    #[serde(default)]
    pub stages: Option<RecoveryStages>,
}

impl Recovery {
    /// Percentiles of per-job recovery seconds.
    pub(super) fn from_seconds(
        preempted: u32,
        mut seconds: Vec<f64>,
        operator_histogram_mean_seconds: Option<f64>,
    ) -> Self {
        seconds.sort_by(f64::total_cmp);
        Self {
            preempted,
            p50_seconds: percentile(&seconds, 50.0),
            p99_seconds: percentile(&seconds, 99.0),
            max_seconds: seconds.last().copied().unwrap_or_default(),
            operator_histogram_mean_seconds,
            stages: None,
        }
    }
}

/// The operator's /proc figures at the end of each phase.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct OperatorUsage {
    /// Started, caches filled, no job yet.
    pub idle: ProcessUsage,
    /// Every pod created and scheduled.
    pub created: ProcessUsage,
    /// Every job Running.
    pub running: Option<ProcessUsage>,
    /// Every preempted job's next attempt created.
    pub recovered: Option<ProcessUsage>,
    /// Just before it was stopped (VmHWM there is the peak of the whole run).
    pub last: ProcessUsage,
}

/// The operator's API requests, by phase.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct OperatorRequests {
    /// Start-up: CRD check, initial lists, watches.
    pub startup: RequestCounts,
    /// While jobs went Running (pod status written by the benchmark).
    pub running: Option<RequestCounts>,
    /// The preemption burst's first round.
    pub preemption: Option<RequestCounts>,
    /// The whole run.
    pub total: RequestCounts,
}

/// The operator's `trainyard_operator_reconciles_total` read at the boundaries of its
/// phases: what each phase cost in reconciles is the difference.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ReconcileCounts {
    /// Ready and idle, before the first TrainingJob is applied.
    pub before_create: f64,
    /// Every job Running (its pods' status written as kubelets would).
    pub running: Option<f64>,
    /// The first round of the preemption burst over: every preempted job's next attempt
    /// created and Running again.
    pub first_restart: Option<f64>,
}

/// Everything one run measured. Fields stay None when the run stopped before reaching them.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct OperatorBenchReport {
    /// TrainingJobs.
    pub jobs: u32,
    /// Workers per job.
    pub workers: u32,
    /// Fake nodes.
    pub nodes: u32,
    /// GPUs per worker.
    pub gpus_per_worker: u32,
    /// Workers preempted at once.
    pub preempt: u32,
    /// Jobs in flight at once (both floors and TrainingJob apply).
    pub concurrency: usize,
    /// Runs of the fair floor and rounds of the preemption burst (0 in reports from before
    /// they were repeated: one of each).
    #[serde(default)]
    pub rounds: u32,
    /// The run id labelling everything the run created.
    pub run_id: String,
    /// The pods-only floor: the same pods created directly.
    pub floor: Option<Throughput>,
    /// The fair floor: per job the TrainingJob, its Service, its pods and one status write,
    /// made directly (None in reports from before it was measured). The median of
    /// `fair_floor_runs` by time to every pod created.
    #[serde(default)]
    pub fair_floor: Option<Throughput>,
    /// Every run of the fair floor, in order (empty in reports from before it was repeated).
    #[serde(default)]
    pub fair_floor_runs: Vec<Throughput>,
    /// The operator creating the pods from TrainingJobs.
    pub operator: Option<Throughput>,
    /// Preemption recovery: the median of `recovery_rounds` by p99.
    pub recovery: Option<Recovery>,
    /// Every round of the operator's preemption burst, in order (empty in reports from before
    /// the burst was repeated).
    #[serde(default)]
    pub recovery_rounds: Vec<Recovery>,
    /// The same restarts made directly by a minimal client (no controller in the loop): the
    /// median of `floor_recovery_rounds` by p99.
    #[serde(default)]
    pub floor_recovery: Option<Recovery>,
    /// Every round of the restart floor, in order.
    #[serde(default)]
    pub floor_recovery_rounds: Vec<Recovery>,
    /// The same restarts made directly in the last fair floor run's namespace, among the jobs'
    /// Services and TrainingJobs as the operator's restarts are (the controller-manager keeps
    /// every Service's endpoints, which costs the control plane CPU on every pod change):
    /// the median of `fair_floor_recovery_rounds` by p99. The operator's burst is judged
    /// against it when measured (None in reports from before it was).
    #[serde(default)]
    pub fair_floor_recovery: Option<Recovery>,
    /// Every round of it, in order.
    #[serde(default)]
    pub fair_floor_recovery_rounds: Vec<Recovery>,
    /// The graceful restart floor: the same restarts among the same Services, made as a
    /// correct controller must make them (one status write first, the other workers deleted
    /// gracefully and finished by the benchmark's kubelet, the next attempt created once the
    /// old one is gone; see `restart_as_controller`): the median of
    /// `graceful_floor_recovery_rounds` by p99. The operator's burst is judged against it when
    /// measured (None in reports from before it was).
    #[serde(default)]
    pub graceful_floor_recovery: Option<Recovery>,
    /// Every round of it, in order.
    #[serde(default)]
    pub graceful_floor_recovery_rounds: Vec<Recovery>,
    /// Operator memory and CPU.
    pub usage: Option<OperatorUsage>,
    /// Operator API requests outside the create phase (that one is in `operator.requests`).
    pub requests: Option<OperatorRequests>,
    /// The operator's reconciles counter at the boundaries of its phases (None in reports
    /// from before it was read there).
    #[serde(default)]
    pub reconciles: Option<ReconcileCounts>,
    /// The graceful restart floor's API requests over all its rounds (None in reports from
    /// before they were counted).
    #[serde(default)]
    pub graceful_floor_requests: Option<RequestCounts>,
    /// CPU seconds per process while each phase's clock ran ("floor", "fair floor",
    /// "operator", "preemption"; repeated phases numbered: "fair floor, run 2").
    #[serde(default)]
    pub cpu: BTreeMap<String, CpuProfile>,
    /// Selected operator metrics at the end of the run.
    pub operator_metrics: BTreeMap<String, f64>,
    /// Things that may have distorted the figures.
    pub warnings: Vec<String>,
    /// 1-minute load average just before the run (what else kept the CPUs busy).
    #[serde(default)]
    pub load_before: Option<f64>,
    /// Why the run stopped early, if it did.
    pub error: Option<String>,
}

impl OperatorBenchReport {
    /// operator / pods-only floor, time to every pod created.
    pub fn created_ratio(&self) -> Option<f64> {
        let (f, o) = (self.floor.as_ref()?, self.operator.as_ref()?);
        (f.created_seconds > 0.0).then(|| o.created_seconds / f.created_seconds)
    }

    /// operator / fair floor, time to every pod created.
    pub fn fair_created_ratio(&self) -> Option<f64> {
        let (f, o) = (self.fair_floor.as_ref()?, self.operator.as_ref()?);
        (f.created_seconds > 0.0).then(|| o.created_seconds / f.created_seconds)
    }

    /// operator / pods-only floor, time to every pod scheduled.
    pub fn scheduled_ratio(&self) -> Option<f64> {
        let (f, o) = (self.floor.as_ref()?, self.operator.as_ref()?);
        (f.scheduled_seconds > 0.0).then(|| o.scheduled_seconds / f.scheduled_seconds)
    }

    /// The operator's reconciles per job from the first TrainingJob applied to every job
    /// Running.
    pub fn reconciles_to_running_per_job(&self) -> Option<f64> {
        let r = self.reconciles?;
        let running = r.running?;
        (self.jobs > 0).then(|| (running - r.before_create) / f64::from(self.jobs))
    }

    /// The operator's reconciles per restart in the burst's first round, from the preemption
    /// to the restarted jobs Running again.
    pub fn reconciles_per_restart(&self) -> Option<f64> {
        let r = self.reconciles?;
        let (running, first) = (r.running?, r.first_restart?);
        (self.preempt > 0).then(|| (first - running) / f64::from(self.preempt))
    }

    /// The operator's API requests per job from the first TrainingJob applied to every job
    /// Running, and the fair floor's (its median run's) per job.
    pub fn requests_to_running_per_job(&self) -> Option<(f64, f64)> {
        let creating = self.operator.as_ref()?.requests.total();
        let running = self.requests.as_ref()?.running.as_ref()?.total();
        let floor = self.fair_floor.as_ref()?.requests.total();
        let jobs = f64::from(self.jobs);
        (self.jobs > 0 && floor > 0)
            .then(|| ((creating + running) as f64 / jobs, floor as f64 / jobs))
    }

    /// The operator's API requests per restart in the burst's first round (preemption →
    /// every pod of the next attempt created, with its Event), and the graceful restart
    /// floor's per restart over its rounds.
    pub fn requests_per_restart(&self) -> Option<(f64, f64)> {
        let op = self.requests.as_ref()?.preemption.as_ref()?.total();
        let floor = self.graceful_floor_requests.as_ref()?.total();
        let rounds = self.graceful_floor_recovery_rounds.len();
        let restarts = f64::from(self.preempt);
        (self.preempt > 0 && rounds > 0).then(|| {
            (
                op as f64 / restarts,
                floor as f64 / (restarts * rounds as f64),
            )
        })
    }

    /// The operator's API requests per job while creating.
    pub fn create_requests_per_job(&self) -> Option<f64> {
        let o = self.operator.as_ref()?;
        Some(o.requests.total() as f64 / f64::from(self.jobs))
    }
}
