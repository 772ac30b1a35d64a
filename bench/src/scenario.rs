//! The operator scale benchmark: fake GPU nodes, the pods-only floor (the same pods created
//! directly), the fair floor (the TrainingJobs and everything a controller must write for them,
//! written directly), the restart floors (the same restarts made directly: as cheaply as the
//! API server allows, and as a correct controller must), the operator creating the pods from
//! TrainingJobs, and a burst of preemptions.
//!
//! Everything runs against the real API server, scheduler and controllers of the cluster; only
//! the kubelets are missing, and the benchmark plays their part where the operator depends on
//! it (pods reported Running, pods being deleted finished with grace period 0).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures::{StreamExt, future, stream};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{
    Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod, Service,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Config, Resource, ResourceExt};
use serde::{Deserialize, Serialize};
use serde_json::json;
use trainyard_operator::surface::{
    self, AttemptStart, OperatorConfig, Phase, RestartReason, TrainingJob, TrainingJobStatus,
    desired_pod, desired_service, pod_name, validate,
};

use crate::cpu_profile::{CpuProfile, CpuSampler};
use crate::error::{Error, Result};
use crate::fake_nodes::{FakeNodes, GPU_PRODUCT, GPUS_PER_NODE, LABEL_RUN, TAINT_KEY};
use crate::operator_process::{OperatorProcess, ProcessUsage, metric_value};
use crate::pod_tracker::{PodRecord, PodTracker};
use crate::proxy::{CountingProxy, RequestCounts};
use crate::recovery_stages::{self, ClockPair, FIRST_RESTART, RecoveryStages};
use crate::stats::{median_by, percentile};

/// The PVC every benchmark job mounts as its checkpoint volume (`spec.checkpoint.existingClaim`):
/// the local cluster's hostPath provisioner cannot give each job a ReadWriteMany claim, and an
/// unbound claim would keep every pod unschedulable.
pub const CHECKPOINT_CLAIM: &str = "bench-checkpoints";
/// Field manager of the fair floor's status writes.
const FAIR_FIELD_MANAGER: &str = "trainyard-bench-fair";
/// Image of the trainer container (never pulled: no kubelet runs these pods).
const TRAINER_IMAGE: &str = "docker.io/trainyard/trainer:dev";

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
    /// targets are judged on the median run of each ([`median_by`]).
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
    /// [`OperatorProcess::start`]).
    pub leader_elect: bool,
    /// Record a CPU profile of the operator with `perf record` into this file, from its start
    /// to the end of the preemption phase.
    pub perf_record: Option<PathBuf>,
}

impl OperatorBenchParams {
    fn check(&self) -> Result<()> {
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
    fn from_seconds(
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

    /// The operator's API requests per job while creating.
    pub fn create_requests_per_job(&self) -> Option<f64> {
        let o = self.operator.as_ref()?;
        Some(o.requests.total() as f64 / f64::from(self.jobs))
    }
}

/// What a run created, to be removed whatever happens.
#[derive(Default)]
struct Created {
    nodes: Option<FakeNodes>,
    namespaces: Vec<String>,
    volumes: Vec<String>,
    operator: Option<OperatorProcess>,
}

/// A short id unique to this run (nodes, namespaces and volumes are named after it).
pub fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!(
        "{:06x}",
        (nanos ^ u128::from(std::process::id())) & 0xff_ffff
    )
}

/// A client for the cluster under test whose requests are not retried behind the caller's
/// back (the counting proxy forwards with it, so that the operator sees every 429 itself).
pub async fn upstream_client() -> Result<Client> {
    let kubeconfig = match std::env::var_os("KUBECONFIG") {
        Some(k) => PathBuf::from(k),
        None => trainyard_e2e::state_dir().join("kubeconfig"),
    };
    let kc = kube::config::Kubeconfig::read_from(&kubeconfig).map_err(|e| {
        Error::Cluster(format!(
            "reading kubeconfig {}: {e} (is the local cluster up? `make cluster-up`)",
            kubeconfig.display()
        ))
    })?;
    let mut config = Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .map_err(|e| Error::Cluster(format!("loading kubeconfig {}: {e}", kubeconfig.display())))?;
    config.default_retry = false;
    Client::try_from(config).map_err(Error::kube("building the Kubernetes client"))
}

/// Runs the benchmark; always cleans up, also when `interrupt` completes first.
pub async fn run(
    client: &Client,
    params: &OperatorBenchParams,
    interrupt: impl Future<Output = ()>,
) -> OperatorBenchReport {
    let mut report = OperatorBenchReport {
        jobs: params.jobs,
        workers: params.workers,
        nodes: params.nodes,
        gpus_per_worker: params.gpus_per_worker,
        preempt: params.preempt,
        concurrency: params.concurrency,
        rounds: params.rounds,
        run_id: run_id(),
        ..OperatorBenchReport::default()
    };
    let mut created = Created::default();
    let outcome = tokio::select! {
        r = phases(client, params, &mut report, &mut created) => r,
        () = interrupt => Err(Error::Operator("interrupted".to_owned())),
    };
    if let Err(e) = outcome {
        tracing::error!(error = %e, "benchmark stopped");
        report.error = Some(e.to_string());
    }
    clean_up(client, created, &mut report).await;
    report
}

async fn phases(
    client: &Client,
    params: &OperatorBenchParams,
    report: &mut OperatorBenchReport,
    created: &mut Created,
) -> Result<()> {
    params.check()?;
    let run = report.run_id.clone();
    preflight(client, report).await?;
    let sampler = CpuSampler::new(&trainyard_e2e::state_dir().join("pids"));
    std::fs::create_dir_all(&params.work_dir)
        .map_err(Error::io(format!("creating {}", params.work_dir.display())))?;

    tracing::info!(run = %run, nodes = params.nodes, "creating fake GPU nodes");
    created.nodes = Some(FakeNodes::create(client, &run, params.nodes).await?);
    let floor_ns = format!("tybench-{run}-floor");
    // One namespace per run of the fair floor: removing a run's 1,000 TrainingJobs and
    // Services took minutes (DeleteCollection outlasting the API server's 60 s timeout) and
    // kept the control plane busy into the next run.
    let fair_nss: Vec<String> = (1..=params.rounds)
        .map(|k| format!("tybench-{run}-fair-{k}"))
        .collect();
    let op_ns = format!("tybench-{run}-operator");
    for ns in [&floor_ns, &op_ns].into_iter().chain(&fair_nss) {
        create_namespace(client, ns, &run).await?;
        created.namespaces.push(ns.clone());
        // Each namespace's volume is named after it.
        let pv = ns.clone();
        checkpoint_volume(client, ns, &pv, &run).await?;
        created.volumes.push(pv);
    }
    let upstream = upstream_client().await?;
    let jobs: Vec<TrainingJob> = (0..params.jobs)
        .map(|i| training_job(&format!("job-{i:05}"), &op_ns, &run, params))
        .collect::<Result<_>>()?;
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("listing nodes"))?
        .items;
    let ctx = RunContext {
        client,
        upstream: &upstream,
        params,
        sampler: &sampler,
        run: &run,
        nodes: &nodes,
    };
    pods_only_floor(&ctx, &floor_ns, &jobs, report).await?;
    fair_floors(&ctx, &fair_nss, &jobs, report).await?;
    operator_phases(&ctx, &op_ns, jobs, report, created).await
}

/// What every phase of one run shares.
struct RunContext<'a> {
    /// The benchmark's own client (watches, cleanup, the kubelet's part).
    client: &'a Client,
    /// The API server, for the counting proxies of the floors and the operator.
    upstream: &'a Client,
    params: &'a OperatorBenchParams,
    sampler: &'a CpuSampler,
    run: &'a str,
    /// Every node, fake ones included, for the builders' placement.
    nodes: &'a [Node],
}

/// The pods-only floor: the operator's own pods, built by its pure builders, created directly;
/// then the restart floor among them. Its pods are deleted at the end.
async fn pods_only_floor(
    ctx: &RunContext<'_>,
    ns: &str,
    jobs: &[TrainingJob],
    report: &mut OperatorBenchReport,
) -> Result<()> {
    let (client, params, sampler) = (ctx.client, ctx.params, ctx.sampler);
    let floor_pods = floor_pods(jobs, ns, ctx.nodes, params, 0)?;
    let expected = floor_pods.iter().map(Vec::len).sum::<usize>() as u64;
    let proxy = CountingProxy::start(ctx.upstream.clone()).await?;
    let tracker = PodTracker::start(client, ns, true).await?;
    tracing::info!(pods = expected, "floor: creating the pods directly");
    let api: Api<Pod> = Api::namespaced(proxy.client(ns)?, ns);
    let cpu0 = sampler.sample();
    let creates = floor_pods.into_iter().map(|job_pods| {
        let api = api.clone();
        async move { create_pods(&api, &job_pods).await }
    });
    let mut floor = timed_writes(&tracker, creates, expected, "floor", params, |_| true).await?;
    report.cpu.insert(
        "floor".to_owned(),
        sampler.between(&cpu0, &sampler.sample()),
    );
    floor.requests = proxy.counts();
    floor.peak_in_flight = proxy.take_peak_in_flight();
    tracing::info!(
        created = floor.created_seconds,
        scheduled = floor.scheduled_seconds,
        "floor done"
    );
    report.floor = Some(floor);

    // The restart floor: the same K restarts made directly, no controller in the loop.
    if params.preempt > 0 {
        let cpu = (ctx.sampler, "restart floor", &mut report.cpu);
        let floor = RestartFloor {
            pods: &api,
            ns,
            tracker: &tracker,
            first: FIRST_RESTART,
            controller: None,
        };
        let rounds = floor.rounds(jobs, ctx.nodes, params, cpu).await?;
        report.floor_recovery = median_by(&rounds, |r| r.p99_seconds).cloned();
        report.floor_recovery_rounds = rounds;
    }
    // Free the GPUs for the fair floor's pods.
    delete_pods(client, &tracker, ns, "floor", params.phase_timeout).await
}

/// The fair floor, once per namespace in `nss`: what a correct controller must write at
/// least, written directly. Repeated: it is the reference of a target, and one run of it moved
/// by ±30% (52-97 s at 1,000 jobs) while the operator's own time did not. After the last run,
/// among its jobs' Services, the restart floor the operator is judged against (its pods built
/// from `jobs` in that namespace).
async fn fair_floors(
    ctx: &RunContext<'_>,
    nss: &[String],
    jobs: &[TrainingJob],
    report: &mut OperatorBenchReport,
) -> Result<()> {
    let params = ctx.params;
    for (index, ns) in (0..).zip(nss) {
        let fair_jobs = fair_floor_jobs(ns, ctx.run, ctx.nodes, params)?;
        let fair = fair_floor(
            ctx.client,
            ctx.upstream.clone(),
            ns,
            fair_jobs,
            params,
            ctx.sampler,
            (index, &mut report.cpu),
        )
        .await?;
        // In the same surroundings as the operator's restarts: first as cheaply as the API
        // server allows, then as a correct controller must.
        if index + 1 == params.rounds && params.preempt > 0 {
            let mut floor = RestartFloor {
                pods: &fair.pods,
                ns,
                tracker: &fair.tracker,
                first: FIRST_RESTART,
                controller: None,
            };
            let cpu = (ctx.sampler, "restart floor among Services", &mut report.cpu);
            let rounds = floor.rounds(jobs, ctx.nodes, params, cpu).await?;
            report.fair_floor_recovery = median_by(&rounds, |r| r.p99_seconds).cloned();
            report.fair_floor_recovery_rounds = rounds;
            // A controller watches what it controls through its own client, as the operator
            // does: the pods (apart from the benchmark's watch, which times and plays the
            // kubelet) and the TrainingJobs.
            let own_pods = PodTracker::start(&fair.pods.clone().into_client(), ns, false).await?;
            let _own_jobs = DrainedWatch::start(fair.jobs.clone());
            floor.first += params.rounds;
            floor.controller = Some(ControllerMeans {
                jobs: &fair.jobs,
                pods: &own_pods,
            });
            let cpu = (ctx.sampler, "graceful restart floor", &mut report.cpu);
            let rounds = floor.rounds(jobs, ctx.nodes, params, cpu).await?;
            report.graceful_floor_recovery = median_by(&rounds, |r| r.p99_seconds).cloned();
            report.graceful_floor_recovery_rounds = rounds;
        }
        // Free the GPUs for the next run's or the operator's pods.
        delete_pods(
            ctx.client,
            &fair.tracker,
            ns,
            "fair floor",
            params.phase_timeout,
        )
        .await?;
        report.fair_floor_runs.push(fair.throughput);
    }
    report.fair_floor = median_by(&report.fair_floor_runs, |f| f.created_seconds).cloned();
    Ok(())
}

/// The operator: started idle, then timed creating the pods of `jobs`, then every job
/// Running and the preemption burst; its metrics, memory and requests throughout.
async fn operator_phases(
    ctx: &RunContext<'_>,
    ns: &str,
    jobs: Vec<TrainingJob>,
    report: &mut OperatorBenchReport,
    created: &mut Created,
) -> Result<()> {
    let (client, params, run) = (ctx.client, ctx.params, ctx.run);
    let proxy = CountingProxy::start(ctx.upstream.clone()).await?;
    let log = params.work_dir.join(format!("operator-{run}.log"));
    let identity = format!("trainyard-bench-{run}");
    let tracker = PodTracker::start(client, ns, true).await?;
    let operator = start_operator(ctx, &proxy, ns, &log, &identity).await?;
    let sampler = ctx
        .sampler
        .clone()
        .with("trainyard-operator", operator.pid());
    let perf = match &params.perf_record {
        Some(path) => Some(PerfRecord::start(operator.pid(), path)?),
        None => None,
    };
    let operator = created.operator.insert(operator);
    operator.wait_ready(Duration::from_secs(60)).await?;
    // Let the initial lists (nodes above all) land before the clock starts.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle = operator.usage()?;
    let startup = proxy.counts();
    proxy.take_peak_in_flight();
    tracing::info!(
        jobs = params.jobs,
        rss_mib = idle.rss_mib,
        "operator: applying the TrainingJobs"
    );
    let cpu0 = sampler.sample();
    let outcome = apply_and_wait_created(client, ns, jobs, params, &tracker).await;
    report.cpu.insert(
        "operator".to_owned(),
        sampler.between(&cpu0, &sampler.sample()),
    );
    operator.check_alive()?;
    let mut op = outcome?;
    op.requests = proxy.counts().since(&startup);
    op.peak_in_flight = proxy.take_peak_in_flight();
    let created_usage = operator.usage()?;
    tracing::info!(
        created = op.created_seconds,
        scheduled = op.scheduled_seconds,
        "operator done"
    );
    report.operator = Some(op);
    let mut usage = OperatorUsage {
        idle,
        created: created_usage,
        ..OperatorUsage::default()
    };
    let mut requests = OperatorRequests {
        startup,
        ..OperatorRequests::default()
    };

    if params.preempt > 0 {
        let mut burst = Burst {
            client,
            ns,
            params,
            tracker: &tracker,
            operator,
            log: &log,
            sampler: &sampler,
        };
        burst
            .all_rounds(&proxy, report, &mut usage, &mut requests)
            .await?;
    }

    if let Some(perf) = perf {
        perf.stop().await;
    }
    if let Some(w) = foreign_events(client, ns, &identity).await? {
        report.warnings.push(w);
    }
    record_metrics(operator, report).await;
    if let Some(op) = created.operator.take() {
        usage.last = op.stop().await?;
    }
    requests.total = proxy.counts();
    report.usage = Some(usage);
    report.requests = Some(requests);
    Ok(())
}

/// The operator as a child process in namespace `ns`, talking to the API server through
/// `proxy`, logging to `log`.
async fn start_operator(
    ctx: &RunContext<'_>,
    proxy: &CountingProxy,
    ns: &str,
    log: &std::path::Path,
    identity: &str,
) -> Result<OperatorProcess> {
    let params = ctx.params;
    let kubeconfig = params
        .work_dir
        .join(format!("operator-{}.kubeconfig", ctx.run));
    proxy.write_kubeconfig(&kubeconfig, ns)?;
    OperatorProcess::start(
        &params.operator_bin,
        ns,
        &kubeconfig,
        log,
        params.leader_elect,
        identity,
    )
    .await
}

/// The operator's own metrics at the end of the run, those the report shows.
async fn record_metrics(operator: &OperatorProcess, report: &mut OperatorBenchReport) {
    let metrics = operator.metrics().await.unwrap_or_default();
    for name in [
        "trainyard_operator_reconciles_total",
        "trainyard_operator_reconcile_errors_total",
        "trainyard_operator_reconcile_duration_seconds_sum",
        "trainyard_operator_reconcile_duration_seconds_count",
        "trainyard_operator_restarts_total",
        "trainyard_operator_preemption_recovery_seconds_sum",
        "trainyard_operator_preemption_recovery_seconds_count",
        "trainyard_operator_write_limit",
    ] {
        if let Some(v) = metric_value(&metrics, name) {
            report.operator_metrics.insert(name.to_owned(), v);
        }
    }
}

/// The timed part of the operator's create phase: the TrainingJobs applied with
/// `concurrency` in flight, then every attempt-0 pod seen created and scheduled.
async fn apply_and_wait_created(
    client: &Client,
    ns: &str,
    jobs: Vec<TrainingJob>,
    params: &OperatorBenchParams,
    tracker: &PodTracker,
) -> Result<Throughput> {
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), ns);
    let creates = jobs.into_iter().map(|job| {
        let api = api.clone();
        async move {
            api.create(&PostParams::default(), &job)
                .await
                .map(|_| ())
                .map_err(Error::kube(format!(
                    "creating TrainingJob {}",
                    job.name_any()
                )))
        }
    });
    let expected = u64::from(params.jobs) * u64::from(params.workers);
    timed_writes(tracker, creates, expected, "operator", params, |p| {
        p.attempt == Some(0)
    })
    .await
}

/// One timed create phase, the same for both floors and the operator: `writes` sent with
/// `concurrency` in flight from the clock's start, then `expected` pods (those `counts`
/// takes) seen created and scheduled. `inputs_done_seconds` is when the writes were answered.
async fn timed_writes(
    tracker: &PodTracker,
    writes: impl Iterator<Item = impl Future<Output = Result<()>>>,
    expected: u64,
    who: &str,
    params: &OperatorBenchParams,
    counts: impl Fn(&PodRecord) -> bool,
) -> Result<Throughput> {
    let t0 = Instant::now();
    let results: Vec<Result<()>> = stream::iter(writes)
        .buffer_unordered(params.concurrency)
        .collect()
        .await;
    let inputs_done = t0.elapsed().as_secs_f64();
    results.into_iter().collect::<Result<()>>()?;
    let mut timed =
        wait_created_scheduled(tracker, t0, expected, who, params.phase_timeout, counts).await?;
    timed.inputs_done_seconds = inputs_done;
    Ok(timed)
}

/// The operator's preemption burst, repeated in rounds on the same jobs.
struct Burst<'a> {
    client: &'a Client,
    ns: &'a str,
    params: &'a OperatorBenchParams,
    tracker: &'a PodTracker,
    operator: &'a mut OperatorProcess,
    log: &'a std::path::Path,
    sampler: &'a CpuSampler,
}

impl Burst<'_> {
    /// Every job Running (as kubelets would report), then every round of the burst; the
    /// operator's memory and requests at each step.
    async fn all_rounds(
        &mut self,
        proxy: &CountingProxy,
        report: &mut OperatorBenchReport,
        usage: &mut OperatorUsage,
        requests: &mut OperatorRequests,
    ) -> Result<()> {
        let params = self.params;
        let before = proxy.counts();
        self.running_again(|_| true).await?;
        usage.running = Some(self.operator.usage()?);
        let after_running = proxy.counts();
        requests.running = Some(after_running.since(&before));

        let before_burst = self.operator.metrics().await.unwrap_or_default();
        if let Some(limit) = metric_value(&before_burst, "trainyard_operator_write_limit") {
            report.operator_metrics.insert(
                "trainyard_operator_write_limit before the burst".to_owned(),
                limit,
            );
        }
        for round in 0..params.rounds {
            if round > 0 {
                // The previous round's new pods Running, and every job Running again.
                let previous = FIRST_RESTART + round - 1;
                self.running_again(|p| p.attempt == Some(previous)).await?;
            }
            let recovery = self
                .round(round, &mut report.cpu, &mut report.warnings)
                .await?;
            if round == 0 {
                requests.preemption = Some(proxy.counts().since(&after_running));
            }
            report.recovery_rounds.push(recovery);
        }
        report.recovery = median_by(&report.recovery_rounds, |r| r.p99_seconds).cloned();
        usage.recovered = Some(self.operator.usage()?);
        Ok(())
    }

    /// One round: K workers of the first K jobs preempted at once, timed until each job's next
    /// attempt is created, with its stages and the CPU it cost.
    async fn round(
        &mut self,
        round: u32,
        cpu: &mut BTreeMap<String, CpuProfile>,
        warnings: &mut Vec<String>,
    ) -> Result<Recovery> {
        let params = self.params;
        let next = FIRST_RESTART + round;
        let histogram = |m: &str| {
            (
                metric_value(m, "trainyard_operator_preemption_recovery_seconds_sum"),
                metric_value(m, "trainyard_operator_preemption_recovery_seconds_count"),
            )
        };
        let before = histogram(&self.operator.metrics().await.unwrap_or_default());
        tracing::info!(
            preempt = params.preempt,
            round = round + 1,
            "preempting workers"
        );
        let cpu0 = self.sampler.sample();
        // The operator's log lines carry wall-clock times; this pair converts them.
        let clock = ClockPair::now();
        let preempted = preempt(self.client, self.ns, params, round).await?;
        let recovered = wait_recovered(
            self.tracker,
            &preempted,
            params.workers,
            next,
            params.phase_timeout,
        )
        .await?;
        cpu.insert(
            numbered("preemption", "round", round, params.rounds),
            self.sampler.between(&cpu0, &self.sampler.sample()),
        );
        self.operator.check_alive()?;
        // The operator's own view of this round: the histogram's growth over it.
        let hist_mean = match (
            before,
            histogram(&self.operator.metrics().await.unwrap_or_default()),
        ) {
            ((sum0, count0), (Some(sum), Some(count))) => {
                let (sum, count) = (sum - sum0.unwrap_or(0.0), count - count0.unwrap_or(0.0));
                (count > 0.0).then(|| sum / count)
            }
            _ => None,
        };
        let mut recovery =
            Recovery::from_seconds(params.preempt, recovered.into_values().collect(), hist_mean);
        recovery.stages = Some(self.stages(&preempted, clock, next, warnings));
        tracing::info!(
            round = round + 1,
            p50 = recovery.p50_seconds,
            p99 = recovery.p99_seconds,
            "recovery done"
        );
        Ok(recovery)
    }

    /// The round's stages: the pod watch's records and the restart decisions in the operator's
    /// log. A log that cannot be read leaves the decisions out (with a warning), never the run.
    fn stages(
        &self,
        preempted: &HashMap<String, Instant>,
        clock: ClockPair,
        next: u32,
        warnings: &mut Vec<String>,
    ) -> RecoveryStages {
        let decided = match std::fs::read(self.log) {
            Ok(bytes) => {
                recovery_stages::decisions(&String::from_utf8_lossy(&bytes), self.ns, next, clock)
            }
            Err(e) => {
                warnings.push(format!(
                    "reading the operator's log {} for its restart decisions: {e}; the recovery breakdown leaves out the stages that need them",
                    self.log.display()
                ));
                HashMap::new()
            }
        };
        RecoveryStages::from_timelines(&recovery_stages::timelines(
            &self.tracker.records(),
            preempted,
            &decided,
            self.params.workers,
            next,
        ))
    }

    /// The pods that are not deleted and that `which` takes reported Running, as kubelets
    /// would, then every job Running; then a second for the status writes to settle.
    async fn running_again(&self, which: impl Fn(&PodRecord) -> bool) -> Result<()> {
        let pods: Vec<String> = self
            .tracker
            .records()
            .into_iter()
            .filter(|p| p.deleted.is_none() && which(p))
            .map(|p| p.name)
            .collect();
        report_running(self.client, self.ns, pods, self.params.concurrency).await?;
        let jobs = Api::namespaced(self.client.clone(), self.ns);
        wait_jobs_running(&jobs, self.params.jobs, self.params.phase_timeout).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        Ok(())
    }
}

/// A repeated phase's name: `what` alone when it runs once, else numbered from 1 in `unit`s
/// ("fair floor, run 2", "preemption, round 3").
fn numbered(what: &str, unit: &str, index: u32, of: u32) -> String {
    if of <= 1 {
        what.to_owned()
    } else {
        format!("{what}, {unit} {}", index + 1)
    }
}

/// `perf record` attached to a process.
struct PerfRecord {
    child: tokio::process::Child,
    pid: u32,
}

impl PerfRecord {
    fn start(target: u32, out: &std::path::Path) -> Result<Self> {
        let child = tokio::process::Command::new("perf")
            .args(["record", "-F", "499", "-p", &target.to_string(), "-o"])
            .arg(out)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(Error::io("starting perf record (is perf installed?)"))?;
        let pid = child
            .id()
            .ok_or_else(|| Error::Operator("perf record exited at once".to_owned()))?;
        Ok(PerfRecord { child, pid })
    }

    /// SIGINT makes perf write its file and exit.
    async fn stop(mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-INT", &self.pid.to_string()])
            .status();
        if tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .is_err()
        {
            tracing::warn!("perf record did not stop within 30 s");
        }
    }
}

async fn preflight(client: &Client, report: &mut OperatorBenchReport) -> Result<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    // Install or update the CRD the operator under test was built with (a fresh
    // cluster has none), under the operator's field manager as its own tests do.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = surface::CRD_NAME;
    crds.patch(
        name,
        &kube::api::PatchParams::apply(surface::FIELD_MANAGER).force(),
        &kube::api::Patch::Apply(surface::crd()),
    )
    .await
    .map_err(Error::kube("applying the TrainingJob CRD"))?;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let established = crds
            .get_opt(name)
            .await
            .map_err(Error::kube("looking up the TrainingJob CRD"))?
            .and_then(|c| c.status)
            .and_then(|s| s.conditions)
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            });
        if established {
            break;
        }
        if std::time::Instant::now() > deadline {
            return Err(Error::Cluster(
                "the TrainingJob CRD was not Established within 60 s".to_owned(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    report.load_before = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse().ok());
    // Another operator watching every namespace would reconcile our jobs too.
    let others = other_operators();
    if !others.is_empty() {
        report.warnings.push(format!(
            "other trainyard-operator processes were running on the machine (pids {}) and shared its CPUs; a further warning says so if one of them also reconciled these jobs",
            others.join(", ")
        ));
    }
    Ok(())
}

/// PIDs of trainyard-operator processes on this machine (the kernel truncates comm to 15
/// bytes). Checked before ours starts.
fn other_operators() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter(|e| {
            std::fs::read_to_string(e.path().join("comm"))
                .is_ok_and(|c| c.trim() == "trainyard-opera")
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// Events in the namespace written by another trainyard-operator instance: proof that another
/// operator (one watching every namespace) reconciled the benchmark's jobs too.
async fn foreign_events(client: &Client, ns: &str, identity: &str) -> Result<Option<String>> {
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), ns);
    let list = events
        .list(&ListParams::default())
        .await
        .map_err(Error::kube(format!("listing Events in {ns}")))?;
    let mut foreign: BTreeMap<String, usize> = BTreeMap::new();
    for e in &list.items {
        let ours = e.reporting_component.as_deref() == Some(surface::FIELD_MANAGER);
        match e.reporting_instance.as_deref() {
            Some(instance) if ours && instance != identity => {
                *foreign.entry(instance.to_owned()).or_insert(0) += 1;
            }
            _ => {}
        }
    }
    Ok((!foreign.is_empty()).then(|| {
        let who: Vec<String> = foreign.iter().map(|(i, n)| format!("{i} ({n})")).collect();
        format!(
            "other trainyard-operator instances wrote Events on these jobs: {}; they reconciled them too, so the operator figures are not this operator's alone",
            who.join(", ")
        )
    }))
}

async fn create_namespace(client: &Client, name: &str, run: &str) -> Result<()> {
    let ns: Namespace = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "labels": {LABEL_RUN: run}},
    }))
    .map_err(|e| Error::Build {
        what: format!("Namespace {name}"),
        message: e.to_string(),
    })?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .map_err(Error::kube(format!("creating namespace {name}")))?;
    Ok(())
}

/// A PersistentVolume pre-bound to the namespace's checkpoint claim, and that claim; waits
/// until it is Bound (the scheduler refuses pods with unbound claims).
async fn checkpoint_volume(client: &Client, ns: &str, pv_name: &str, run: &str) -> Result<()> {
    let build = |what: &str, v: serde_json::Value| {
        let what = what.to_owned();
        move |e: serde_json::Error| Error::Build {
            what,
            message: format!("{e}: {v}"),
        }
    };
    let pv_json = json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": pv_name, "labels": {LABEL_RUN: run}},
        "spec": {
            "capacity": {"storage": "50Gi"},
            "accessModes": ["ReadWriteMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            // Never mounted: no kubelet runs the benchmark's pods.
            "hostPath": {"path": "/tmp/trainyard-bench-unused"},
            "claimRef": {"namespace": ns, "name": CHECKPOINT_CLAIM},
        },
    });
    let pv: PersistentVolume =
        serde_json::from_value(pv_json.clone()).map_err(build("the PersistentVolume", pv_json))?;
    Api::<PersistentVolume>::all(client.clone())
        .create(&PostParams::default(), &pv)
        .await
        .map_err(Error::kube(format!("creating PersistentVolume {pv_name}")))?;
    let pvc_json = json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": CHECKPOINT_CLAIM, "namespace": ns, "labels": {LABEL_RUN: run}},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "volumeName": pv_name,
            "resources": {"requests": {"storage": "50Gi"}},
        },
    });
    let pvc: PersistentVolumeClaim =
        serde_json::from_value(pvc_json.clone()).map_err(build("the claim", pvc_json))?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    claims
        .create(&PostParams::default(), &pvc)
        .await
        .map_err(Error::kube(format!(
            "creating PersistentVolumeClaim {ns}/{CHECKPOINT_CLAIM}"
        )))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let phase = claims
            .get(CHECKPOINT_CLAIM)
            .await
            .map_err(Error::kube(format!(
                "reading PersistentVolumeClaim {ns}/{CHECKPOINT_CLAIM}"
            )))?
            .status
            .and_then(|s| s.phase);
        if phase.as_deref() == Some("Bound") {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::Timeout {
                what: format!("PersistentVolumeClaim {ns}/{CHECKPOINT_CLAIM} to be Bound"),
                after: Duration::from_secs(60),
                progress: format!("phase {phase:?}"),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One benchmark TrainingJob: W workers pinned to this run's fake nodes.
pub fn training_job(
    name: &str,
    ns: &str,
    run: &str,
    params: &OperatorBenchParams,
) -> Result<TrainingJob> {
    let v = json!({
        "apiVersion": "trainyard.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": ns, "labels": {LABEL_RUN: run}},
        "spec": {
            "workers": params.workers,
            "gpusPerWorker": params.gpus_per_worker,
            // Pinned, so that GPUs elsewhere in the cluster (a fake device plugin's) never win
            // the Cheapest choice.
            "gpu": {"products": [GPU_PRODUCT]},
            "checkpoint": {"existingClaim": CHECKPOINT_CLAIM},
            "template": {"spec": {
                "nodeSelector": {LABEL_RUN: run},
                "tolerations": [{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [{
                    "name": "trainer",
                    "image": TRAINER_IMAGE,
                    "command": ["sleep", "infinity"],
                }],
            }},
        },
    });
    serde_json::from_value(v).map_err(|e| Error::Build {
        what: format!("TrainingJob {name}"),
        message: e.to_string(),
    })
}

/// The uid the floors' jobs are validated with before they exist (the builders need one; the
/// owner references that carry it are removed or replaced).
const PLACEHOLDER_UID: &str = "00000000-0000-0000-0000-000000000000";

/// The pods the operator would create for `attempt` of each job (attempts after 0 as restarts
/// after a preemption), in namespace `ns` and without owner references, grouped by job.
fn floor_pods(
    jobs: &[TrainingJob],
    ns: &str,
    nodes: &[Node],
    params: &OperatorBenchParams,
    attempt: u32,
) -> Result<Vec<Vec<Pod>>> {
    let config = OperatorConfig::default();
    let node_refs: Vec<&Node> = nodes.iter().collect();
    jobs.iter()
        .map(|job| {
            let mut job = job.clone();
            job.metadata.namespace = Some(ns.to_owned());
            // Any uid: the floor pods lose their owner reference below.
            job.metadata.uid = Some(PLACEHOLDER_UID.to_owned());
            let valid = validate(&job).map_err(|e| Error::Build {
                what: format!("the floor's pods of {}", job.name_any()),
                message: e.to_string(),
            })?;
            let place = surface::place(&valid, &config, &node_refs, 0);
            Ok((0..params.workers)
                .map(|rank| {
                    let restart = (attempt > 0).then_some(RestartReason::Preemption);
                    let start = AttemptStart::of(attempt, restart, false);
                    let mut pod = desired_pod(&valid, rank, attempt, start, &place, None);
                    pod.metadata.owner_references = None;
                    pod
                })
                .collect())
        })
        .collect()
}

/// One job of the fair floor: the TrainingJob the benchmark creates, and what a correct
/// controller must write for it at least (its Service and pods, built by the operator's own
/// builders, and one status write).
struct FairJob {
    job: TrainingJob,
    /// Without owner reference until the job exists.
    service: Service,
    /// Without owner references until the job exists.
    pods: Vec<Pod>,
}

/// The fair floor's jobs in namespace `ns`: the same TrainingJobs as the operator's, with the
/// Service and attempt-0 pods the operator would create for them.
fn fair_floor_jobs(
    ns: &str,
    run: &str,
    nodes: &[Node],
    params: &OperatorBenchParams,
) -> Result<Vec<FairJob>> {
    let jobs: Vec<TrainingJob> = (0..params.jobs)
        .map(|i| training_job(&format!("job-{i:05}"), ns, run, params))
        .collect::<Result<_>>()?;
    let pods = floor_pods(&jobs, ns, nodes, params, 0)?;
    jobs.into_iter()
        .zip(pods)
        .map(|(job, pods)| {
            let mut placeholder = job.clone();
            placeholder.metadata.uid = Some(PLACEHOLDER_UID.to_owned());
            let valid = validate(&placeholder).map_err(|e| Error::Build {
                what: format!("the fair floor's Service of {}", job.name_any()),
                message: e.to_string(),
            })?;
            let mut service = desired_service(&valid);
            service.metadata.owner_references = None;
            Ok(FairJob { job, service, pods })
        })
        .collect()
}

/// Makes the created job the controller owner of its Service and pods, as the operator's are
/// (an owner reference to a uid that does not exist would have the garbage collector delete
/// them).
fn set_owner(service: &mut Service, pods: &mut [Pod], owner: &OwnerReference) {
    service.metadata.owner_references = Some(vec![owner.clone()]);
    for pod in pods {
        pod.metadata.owner_references = Some(vec![owner.clone()]);
    }
}

/// The fair floor's one status write: a server-side apply of the least status a controller
/// writes for a new job (Pending, attempt 0, the generation it saw).
fn fair_status_patch(job: &TrainingJob) -> Result<serde_json::Value> {
    let status = TrainingJobStatus {
        phase: Some(Phase::Pending),
        attempt: 0,
        observed_generation: job.metadata.generation,
        ..TrainingJobStatus::default()
    };
    status_apply(
        &format!("the status of TrainingJob {}", job.name_any()),
        &status,
    )
}

/// The body of a server-side apply of a TrainingJob's `status`; `what` names it in errors.
fn status_apply(what: &str, status: &TrainingJobStatus) -> Result<serde_json::Value> {
    let status = serde_json::to_value(status).map_err(|e| Error::Build {
        what: what.to_owned(),
        message: e.to_string(),
    })?;
    Ok(json!({
        "apiVersion": TrainingJob::api_version(&()),
        "kind": TrainingJob::kind(&()),
        "status": status,
    }))
}

/// The fair floor's client, through its counting proxy.
#[derive(Clone)]
struct FairApis {
    jobs: Api<TrainingJob>,
    services: Api<Service>,
    pods: Api<Pod>,
}

/// One job of the fair floor: the TrainingJob created, then at once its Service, its pods
/// and its status write.
async fn write_fair_job(apis: FairApis, ns: &str, fair: FairJob) -> Result<()> {
    let FairJob {
        job,
        mut service,
        mut pods,
    } = fair;
    let name = job.name_any();
    let created = apis
        .jobs
        .create(&PostParams::default(), &job)
        .await
        .map_err(Error::kube(format!(
            "fair floor: creating TrainingJob {ns}/{name}"
        )))?;
    let owner = created
        .controller_owner_ref(&())
        .ok_or_else(|| Error::Build {
            what: format!("an owner reference to TrainingJob {ns}/{name}"),
            message: "the created job has no name or uid".to_owned(),
        })?;
    set_owner(&mut service, &mut pods, &owner);
    let status = fair_status_patch(&created)?;
    let create_service = async {
        apis.services
            .create(&PostParams::default(), &service)
            .await
            .map(|_| ())
            .map_err(Error::kube(format!(
                "fair floor: creating Service {ns}/{name}"
            )))
    };
    let write_status = async {
        apis.jobs
            .patch_status(
                &name,
                &PatchParams::apply(FAIR_FIELD_MANAGER).force(),
                &Patch::Apply(&status),
            )
            .await
            .map(|_| ())
            .map_err(Error::kube(format!(
                "fair floor: writing the status of TrainingJob {ns}/{name}"
            )))
    };
    let (service, pods, status) =
        future::join3(create_service, create_pods(&apis.pods, &pods), write_status).await;
    service.and(pods).and(status)
}

/// The fair floor: per job, the benchmark's TrainingJob create and what a correct controller
/// must write at least for it (Service, pods, one status write), all made directly by a
/// minimal client through a counting proxy with `concurrency` jobs in flight. Timed by a pod
/// watch from the first request, like the other runs; its pods are then deleted, so that the
/// operator finds the fake nodes' GPUs free.
async fn fair_floor(
    client: &Client,
    upstream: Client,
    ns: &str,
    jobs: Vec<FairJob>,
    params: &OperatorBenchParams,
    sampler: &CpuSampler,
    (index, cpu): (u32, &mut BTreeMap<String, CpuProfile>),
) -> Result<FairRun> {
    let expected = jobs.iter().map(|j| j.pods.len()).sum::<usize>() as u64;
    let proxy = CountingProxy::start(upstream).await?;
    let fair_client = proxy.client(ns)?;
    let apis = FairApis {
        jobs: Api::namespaced(fair_client.clone(), ns),
        services: Api::namespaced(fair_client.clone(), ns),
        pods: Api::namespaced(fair_client, ns),
    };
    let tracker = PodTracker::start(client, ns, true).await?;
    tracing::info!(
        pods = expected,
        run = index + 1,
        "fair floor: creating TrainingJobs, Services, pods and status directly"
    );
    let cpu0 = sampler.sample();
    let writes = jobs
        .into_iter()
        .map(|job| write_fair_job(apis.clone(), ns, job));
    let mut fair = timed_writes(&tracker, writes, expected, "fair floor", params, |_| true).await?;
    cpu.insert(
        numbered("fair floor", "run", index, params.rounds),
        sampler.between(&cpu0, &sampler.sample()),
    );
    fair.requests = proxy.counts();
    fair.peak_in_flight = proxy.take_peak_in_flight();
    tracing::info!(
        run = index + 1,
        created = fair.created_seconds,
        scheduled = fair.scheduled_seconds,
        "fair floor done"
    );
    Ok(FairRun {
        throughput: fair,
        jobs: apis.jobs,
        pods: apis.pods,
        tracker,
        _proxy: proxy,
    })
}

/// A timed run of the fair floor, its pods still there.
struct FairRun {
    throughput: Throughput,
    /// Its TrainingJobs, through its counting proxy.
    jobs: Api<TrainingJob>,
    /// Its pods, through its counting proxy.
    pods: Api<Pod>,
    /// The watch of its namespace's pods.
    tracker: PodTracker,
    /// Serves `pods`.
    _proxy: CountingProxy,
}

/// Force-deletes every pod of a floor's namespace and waits until the watch saw them gone.
/// One DeleteCollection of thousands of pods can outlast the API server's etcd deadline on a
/// busy machine: it is repeated until it goes through (what it deleted before failing stays
/// deleted).
async fn delete_pods(
    client: &Client,
    tracker: &PodTracker,
    ns: &str,
    who: &str,
    timeout: Duration,
) -> Result<()> {
    let api = Api::<Pod>::namespaced(client.clone(), ns);
    let force = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    let mut tries = 0;
    while let Err(e) = api.delete_collection(&force, &ListParams::default()).await {
        tries += 1;
        if tries >= 5 {
            return Err(Error::kube(format!(
                "deleting the {who}'s pods in {ns} ({tries} tries)"
            ))(e));
        }
        tracing::warn!(error = %e, who, "deleting a floor's pods; trying again");
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    tracker
        .wait_until(
            &format!("the {who}'s pods to be deleted"),
            timeout,
            |pods| {
                let left = pods.filter(|p| p.deleted.is_none()).count();
                if left == 0 {
                    Ok(())
                } else {
                    Err(format!("{left} left"))
                }
            },
        )
        .await
}

async fn wait_created_scheduled(
    tracker: &PodTracker,
    t0: Instant,
    expected: u64,
    who: &str,
    timeout: Duration,
    counts: impl Fn(&PodRecord) -> bool,
) -> Result<Throughput> {
    let times = |pods: &mut dyn Iterator<Item = &PodRecord>| -> (Vec<Instant>, Vec<Instant>) {
        let mut seen = Vec::new();
        let mut scheduled = Vec::new();
        for p in pods.filter(|p| counts(p)) {
            seen.push(p.seen);
            scheduled.extend(p.scheduled);
        }
        (seen, scheduled)
    };
    let (mut seen, scheduled) = tracker
        .wait_until(
            &format!("{who}: {expected} pods created and scheduled"),
            timeout,
            |pods| {
                let (seen, scheduled) = times(pods);
                if scheduled.len() as u64 >= expected {
                    Ok((seen, scheduled))
                } else {
                    Err(format!(
                        "{} created, {} scheduled",
                        seen.len(),
                        scheduled.len()
                    ))
                }
            },
        )
        .await?;
    seen.sort();
    let secs = |t: Option<&Instant>| {
        t.map(|t| t.saturating_duration_since(t0).as_secs_f64())
            .unwrap_or_default()
    };
    Ok(Throughput {
        pods: expected,
        created_seconds: secs(seen.last()),
        half_created_seconds: secs(seen.get(seen.len() / 2)),
        scheduled_seconds: secs(scheduled.iter().max()),
        requests: RequestCounts::default(),
        peak_in_flight: 0,
        inputs_done_seconds: 0.0,
    })
}

/// Writes what a kubelet would once the containers run: phase Running, the trainer running.
async fn report_running(
    client: &Client,
    ns: &str,
    pods: Vec<String>,
    concurrency: usize,
) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let now = Timestamp::now().to_string();
    let patch = json!({"status": {
        "phase": "Running",
        "startTime": now,
        "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": now},
            {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
        ],
        "containerStatuses": [{
            "name": "trainer", "ready": true, "restartCount": 0, "started": true,
            "image": TRAINER_IMAGE, "imageID": "",
            "state": {"running": {"startedAt": now}},
        }],
    }});
    let results: Vec<Result<()>> = stream::iter(pods)
        .map(|name| {
            let (api, patch) = (api.clone(), &patch);
            async move {
                api.patch_status(&name, &PatchParams::default(), &Patch::Strategic(patch))
                    .await
                    .map(|_| ())
                    .map_err(Error::kube(format!("reporting pod {ns}/{name} Running")))
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    results.into_iter().collect()
}

async fn wait_jobs_running(api: &Api<TrainingJob>, jobs: u32, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let list = api
            .list(&ListParams::default())
            .await
            .map_err(Error::kube("listing the TrainingJobs"))?;
        let running = list
            .items
            .iter()
            .filter(|j| j.status.as_ref().and_then(|s| s.phase) == Some(Phase::Running))
            .count();
        if running as u64 >= u64::from(jobs) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::Timeout {
                what: "every TrainingJob Running".to_owned(),
                after: timeout,
                progress: format!("{running} of {jobs} Running"),
            });
        }
        // Listing every job is not free at 1,000 jobs; this phase is not timed.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Preempts one worker of each of the first K jobs at once, as a kubelet's graceful node
/// shutdown does: DisruptionTarget, then deletion (grace 0: no kubelet would finish a graceful
/// one). Returns when each job was preempted.
async fn preempt(
    client: &Client,
    ns: &str,
    params: &OperatorBenchParams,
    round: u32,
) -> Result<HashMap<String, Instant>> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let burst = (0..params.preempt).map(|i| {
        let api = api.clone();
        async move {
            let job = format!("job-{i:05}");
            let pod = pod_name(&job, preempted_rank(i, round, params.workers));
            let at = Instant::now();
            preempt_pod(&api, ns, &pod).await?;
            Ok((job, at))
        }
    });
    future::join_all(burst).await.into_iter().collect()
}

/// A spot preemption of one pod as a newer kubelet reports it: DisruptionTarget, then deleted
/// with grace period 0 (gone already is fine: the operator may have deleted it first).
async fn preempt_pod(api: &Api<Pod>, ns: &str, pod: &str) -> Result<()> {
    let patch = json!({"status": {"conditions": [{
        "type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet",
        "message": "trainyard-bench: simulated spot preemption",
        "lastTransitionTime": Timestamp::now().to_string(),
    }]}});
    api.patch_status(pod, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .map_err(Error::kube(format!(
            "setting DisruptionTarget on pod {ns}/{pod}"
        )))?;
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    delete_pod(api, ns, pod, &dp).await
}

/// Deletes pod `ns/name` with `dp`. A pod already gone (404) is done, and so is one whose uid
/// precondition no longer holds (409: the name holds another pod now, the one meant is gone).
async fn delete_pod(api: &Api<Pod>, ns: &str, name: &str, dp: &DeleteParams) -> Result<()> {
    match api.delete(name, dp).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 && dp.preconditions.is_some() => Ok(()),
        Err(e) => Err(Error::kube(format!("deleting pod {ns}/{name}"))(e)),
    }
}

/// Creates one job's pods at once, as the floor's minimal client.
async fn create_pods(api: &Api<Pod>, pods: &[Pod]) -> Result<()> {
    let creates = pods.iter().map(|p| async move {
        api.create(&PostParams::default(), p)
            .await
            .map(|_| ())
            .map_err(Error::kube(format!("floor: creating pod {}", p.name_any())))
    });
    future::join_all(creates).await.into_iter().collect()
}

/// Where a restart floor's rounds record the CPU they cost: the sampler, the phase's name, the
/// report's table.
type CpuRecord<'a> = (
    &'a CpuSampler,
    &'a str,
    &'a mut BTreeMap<String, CpuProfile>,
);

/// Where and how a restart floor restarts the jobs.
struct RestartFloor<'a> {
    /// The pods' API (through a counting proxy).
    pods: &'a Api<Pod>,
    ns: &'a str,
    /// The watch of `ns`'s pods, which finishes graceful deletions as a kubelet would.
    tracker: &'a PodTracker,
    /// The attempt its first round creates (each round creates the next one).
    first: u32,
    /// With a controller's means: restart as a correct controller must
    /// ([`restart_as_controller`]); without: as cheaply as the API server allows
    /// ([`restart_directly`]).
    controller: Option<ControllerMeans<'a>>,
}

/// What a correct controller restarts the jobs with: the TrainingJobs' API and its own pod
/// watch (the TrainingJob watch it also keeps is a [`DrainedWatch`]).
#[derive(Clone, Copy)]
struct ControllerMeans<'a> {
    jobs: &'a Api<TrainingJob>,
    pods: &'a PodTracker,
}

/// A watch whose events are read and dropped: what a controller's watch of its objects costs
/// the API server and the client. Stops when dropped.
struct DrainedWatch(tokio::task::JoinHandle<()>);

impl DrainedWatch {
    fn start(api: Api<TrainingJob>) -> Self {
        Self(tokio::spawn(async move {
            let mut events = watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            while events.next().await.is_some() {}
        }))
    }
}

impl Drop for DrainedWatch {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl RestartFloor<'_> {
    /// The floor, once per round: the same K restarts made directly, no controller in the
    /// loop. Round `r` (from 0) restarts the jobs' attempt `first + r - 1` as `first + r`,
    /// preempting the rank the operator's round `r` preempts. Each round's CPU goes into
    /// `cpu`, as the operator's rounds' does, so that their costs can be compared.
    async fn rounds(
        &self,
        jobs: &[TrainingJob],
        nodes: &[Node],
        params: &OperatorBenchParams,
        (sampler, phase, cpu): CpuRecord<'_>,
    ) -> Result<Vec<Recovery>> {
        let (ns, tracker) = (self.ns, self.tracker);
        let mut rounds = Vec::new();
        for round in 0..params.rounds {
            let next = self.first + round;
            let pods = floor_pods(&jobs[..params.preempt as usize], ns, nodes, params, next)?;
            tracing::info!(
                restarts = params.preempt,
                round = round + 1,
                ns,
                phase,
                "floor: restarting jobs directly"
            );
            let cpu0 = sampler.sample();
            let restarted = match self.controller {
                None => restart_directly(self.pods, ns, pods, params, round).await?,
                Some(means) => {
                    let old = live_pods(means.pods, next - 1);
                    let apis = (means.jobs, self.pods, means.pods);
                    let attempts = (next, round);
                    restart_as_controller(apis, ns, pods, old, params, attempts).await?
                }
            };
            let recovered = wait_recovered(
                tracker,
                &restarted,
                params.workers,
                next,
                params.phase_timeout,
            )
            .await?;
            cpu.insert(
                numbered(phase, "round", round, params.rounds),
                sampler.between(&cpu0, &sampler.sample()),
            );
            // Let the scheduler bind them before they are deleted: binding pods that are gone
            // would still occupy it when the operator's pods arrive (seen: a scheduled ratio
            // of 1.74 instead of about 1.0 at 100 jobs).
            wait_all_scheduled(tracker, "the restart floor's pods", params.phase_timeout).await?;
            let mut recovery =
                Recovery::from_seconds(params.preempt, recovered.into_values().collect(), None);
            // The floor decides nothing: no decision instants, no log.
            recovery.stages = Some(RecoveryStages::from_timelines(&recovery_stages::timelines(
                &tracker.records(),
                &restarted,
                &HashMap::new(),
                params.workers,
                next,
            )));
            tracing::info!(
                round = round + 1,
                ns,
                phase,
                p50 = recovery.p50_seconds,
                p99 = recovery.p99_seconds,
                "restart floor done"
            );
            rounds.push(recovery);
        }
        Ok(rounds)
    }
}

/// Waits until the watch saw every pod that is not deleted scheduled.
async fn wait_all_scheduled(tracker: &PodTracker, what: &str, timeout: Duration) -> Result<()> {
    tracker
        .wait_until(&format!("{what} to be scheduled"), timeout, |pods| {
            let left = pods
                .filter(|p| p.deleted.is_none() && p.scheduled.is_none())
                .count();
            if left == 0 {
                Ok(())
            } else {
                Err(format!("{left} not scheduled"))
            }
        })
        .await
}

/// The rank of job `i` preempted in round `round`: a different one each round.
fn preempted_rank(i: u32, round: u32, workers: u32) -> u32 {
    (i + round) % workers
}

/// The restart floor: for each job at once, what a restart minimally costs the API server with
/// no controller in the loop: the preemption itself (DisruptionTarget, then delete, as in
/// [`preempt`]), the other workers deleted with grace period 0 and the next attempt's pods
/// created. Returns when each job's restart began.
async fn restart_directly(
    api: &Api<Pod>,
    ns: &str,
    next: Vec<Vec<Pod>>,
    params: &OperatorBenchParams,
    round: u32,
) -> Result<HashMap<String, Instant>> {
    let burst = next.into_iter().enumerate().map(|(i, pods)| {
        let api = api.clone();
        async move {
            let job = format!("job-{i:05}");
            let rank = preempted_rank(i as u32, round, params.workers);
            let preempted = pod_name(&job, rank);
            let at = Instant::now();
            preempt_pod(&api, ns, &preempted).await?;
            let dp = DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            };
            let deletes = pods.iter().map(|p| {
                let (api, dp, name) = (api.clone(), dp.clone(), p.name_any());
                async move { delete_pod(&api, ns, &name, &dp).await }
            });
            future::join_all(deletes)
                .await
                .into_iter()
                .collect::<Result<()>>()?;
            create_pods(&api, &pods).await?;
            Ok((job, at))
        }
    });
    future::join_all(burst).await.into_iter().collect()
}

/// The pods of `attempt` that the watch shows not deleted, by job: (name, uid).
fn live_pods(tracker: &PodTracker, attempt: u32) -> HashMap<String, Vec<(String, String)>> {
    let mut by_job: HashMap<String, Vec<(String, String)>> = HashMap::new();
    for p in tracker.records() {
        if let Some(job) = p
            .job
            .filter(|_| p.attempt == Some(attempt) && p.deleted.is_none())
        {
            by_job.entry(job).or_default().push((p.name, p.uid));
        }
    }
    by_job
}

/// The restart floor as a correct controller restarts, for each job at once: the preemption
/// (as in [`preempt`]); one status write (server-side apply: Restarting, the next attempt),
/// which a controller must make before it stops anything, so that a controller that dies
/// mid-restart neither loses nor double-counts it; the other workers deleted gracefully with
/// their uid preconditions, so that their trainers can save a checkpoint (here the pod
/// watch finishes each deletion at once, as a kubelet does once the containers stopped);
/// and, once the watch shows every old pod gone (the next attempt reuses their names), the
/// next attempt's pods created, owned by the job. No Event, no decision: what any correct
/// controller must ask of the API server, and nothing more. Returns when each job's restart
/// began.
async fn restart_as_controller(
    (jobs, api, tracker): (&Api<TrainingJob>, &Api<Pod>, &PodTracker),
    ns: &str,
    next: Vec<Vec<Pod>>,
    mut old: HashMap<String, Vec<(String, String)>>,
    params: &OperatorBenchParams,
    (attempt, round): (u32, u32),
) -> Result<HashMap<String, Instant>> {
    let burst = next.into_iter().enumerate().map(|(i, mut pods)| {
        let job = format!("job-{i:05}");
        let old = old.remove(&job).unwrap_or_default();
        async move {
            let rank = preempted_rank(i as u32, round, params.workers);
            let preempted = pod_name(&job, rank);
            let at = Instant::now();
            preempt_pod(api, ns, &preempted).await?;
            let status = restart_status_patch(&job, attempt)?;
            let written = jobs
                .patch_status(
                    &job,
                    &PatchParams::apply(FAIR_FIELD_MANAGER).force(),
                    &Patch::Apply(&status),
                )
                .await
                .map_err(Error::kube(format!(
                    "floor: writing the restart status of TrainingJob {ns}/{job}"
                )))?;
            let deletes = old
                .iter()
                .filter(|(name, _)| *name != preempted)
                .map(|(name, uid)| {
                    let dp = DeleteParams {
                        preconditions: Some(Preconditions {
                            uid: Some(uid.clone()),
                            resource_version: None,
                        }),
                        ..DeleteParams::default()
                    };
                    async move { delete_pod(api, ns, name, &dp).await }
                });
            future::join_all(deletes)
                .await
                .into_iter()
                .collect::<Result<()>>()?;
            let uids: Vec<String> = old.into_iter().map(|(_, uid)| uid).collect();
            let what = format!("the old pods of {ns}/{job} to be gone");
            tracker.gone(&what, &uids, params.phase_timeout).await?;
            if let Some(owner) = written.controller_owner_ref(&()) {
                for pod in &mut pods {
                    pod.metadata.owner_references = Some(vec![owner.clone()]);
                }
            }
            create_pods(api, &pods).await?;
            Ok((job, at))
        }
    });
    future::join_all(burst).await.into_iter().collect()
}

/// The status a controller writes when it restarts a job: Restarting as attempt `attempt`.
fn restart_status_patch(job: &str, attempt: u32) -> Result<serde_json::Value> {
    let status = TrainingJobStatus {
        phase: Some(Phase::Restarting),
        attempt,
        ..TrainingJobStatus::default()
    };
    status_apply(&format!("the restart status of TrainingJob {job}"), &status)
}

/// Seconds from each job's preemption to every pod of its attempt `next` seen created.
async fn wait_recovered(
    tracker: &PodTracker,
    preempted: &HashMap<String, Instant>,
    workers: u32,
    next: u32,
    timeout: Duration,
) -> Result<HashMap<String, f64>> {
    let jobs: HashSet<&String> = preempted.keys().collect();
    tracker
        .wait_until(
            &format!("{} preempted jobs' next attempts", jobs.len()),
            timeout,
            |pods| {
                let mut latest: HashMap<&str, (u32, Instant)> = HashMap::new();
                for p in pods {
                    let Some(job) = p.job.as_ref().filter(|j| jobs.contains(j)) else {
                        continue;
                    };
                    if p.attempt != Some(next) {
                        continue;
                    }
                    let e = latest.entry(job.as_str()).or_insert((0, p.seen));
                    e.0 += 1;
                    e.1 = e.1.max(p.seen);
                }
                let done = latest.values().filter(|(n, _)| *n >= workers).count();
                if done < jobs.len() {
                    return Err(format!("{done} of {} recovered", jobs.len()));
                }
                Ok(latest
                    .into_iter()
                    .filter_map(|(job, (_, at))| {
                        let start = preempted.get(job)?;
                        Some((
                            job.to_owned(),
                            at.saturating_duration_since(*start).as_secs_f64(),
                        ))
                    })
                    .collect())
            },
        )
        .await
}

async fn clean_up(client: &Client, mut created: Created, report: &mut OperatorBenchReport) {
    if let Some(op) = created.operator.take() {
        match op.stop().await {
            Ok(last) => {
                if let Some(u) = report.usage.as_mut() {
                    u.last = last;
                }
            }
            Err(e) => report.warnings.push(format!("stopping the operator: {e}")),
        }
    }
    let force = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    for ns in &created.namespaces {
        // The pods first, with grace period 0: deleted gracefully (as the namespace controller
        // would), they would wait forever for the kubelet the fake nodes lack. The operator is
        // stopped, so nothing recreates them.
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let _ = pods.delete_collection(&force, &ListParams::default()).await;
            match pods.list_metadata(&ListParams::default().limit(1)).await {
                Ok(l) if l.items.is_empty() => break,
                _ if Instant::now() > deadline => {
                    report
                        .warnings
                        .push(format!("pods were left in namespace {ns} after 120 s"));
                    break;
                }
                _ => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
        if let Err(e) = Api::<Namespace>::all(client.clone())
            .delete(ns, &DeleteParams::background())
            .await
        {
            report
                .warnings
                .push(format!("deleting namespace {ns}: {e}"));
        }
    }
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    for pv in &created.volumes {
        if let Err(e) = pvs.delete(pv, &DeleteParams::default()).await {
            report
                .warnings
                .push(format!("deleting PersistentVolume {pv}: {e}"));
        }
    }
    if let Some(nodes) = created.nodes.take() {
        nodes.delete().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(jobs: u32, workers: u32) -> OperatorBenchParams {
        OperatorBenchParams {
            jobs,
            workers,
            nodes: 4,
            gpus_per_worker: 1,
            preempt: 0,
            concurrency: 16,
            rounds: 1,
            operator_bin: PathBuf::from("trainyard-operator"),
            phase_timeout: Duration::from_secs(60),
            work_dir: PathBuf::from("target/bench"),
            leader_elect: false,
            perf_record: None,
        }
    }

    #[test]
    fn the_fair_floor_builds_each_job_its_service_and_pods_in_its_namespace() {
        let jobs = fair_floor_jobs("tybench-x-fair", "x", &[], &params(3, 2)).expect("built");
        assert_eq!(jobs.len(), 3);
        for (i, fair) in jobs.iter().enumerate() {
            let name = format!("job-{i:05}");
            assert_eq!(fair.job.name_any(), name);
            assert_eq!(fair.job.namespace().as_deref(), Some("tybench-x-fair"));
            assert_eq!(fair.service.name_any(), name);
            assert_eq!(fair.service.namespace().as_deref(), Some("tybench-x-fair"));
            assert_eq!(fair.pods.len(), 2);
            assert!(
                fair.pods
                    .iter()
                    .all(|p| p.namespace().as_deref() == Some("tybench-x-fair"))
            );
            // No owner yet: the job's uid is only known once it is created.
            assert!(fair.service.metadata.owner_references.is_none());
            assert!(
                fair.pods
                    .iter()
                    .all(|p| p.metadata.owner_references.is_none())
            );
        }
    }

    #[test]
    fn the_created_job_owns_the_fair_floors_service_and_pods() {
        let mut fair = fair_floor_jobs("ns", "x", &[], &params(1, 2))
            .expect("built")
            .remove(0);
        let mut created = fair.job.clone();
        created.metadata.uid = Some("6c1f2e6a-0000-4000-8000-000000000001".to_owned());
        let owner = created.controller_owner_ref(&()).expect("name and uid");
        set_owner(&mut fair.service, &mut fair.pods, &owner);
        assert_eq!(
            fair.service.metadata.owner_references,
            Some(vec![owner.clone()])
        );
        for pod in &fair.pods {
            assert_eq!(pod.metadata.owner_references, Some(vec![owner.clone()]));
        }
    }

    #[test]
    fn the_fair_floors_status_write_is_an_apply_of_a_pending_first_attempt() {
        let mut job = training_job("job-00000", "ns", "x", &params(1, 2)).expect("built");
        job.metadata.generation = Some(1);
        let patch = fair_status_patch(&job).expect("built");
        assert_eq!(patch["apiVersion"], "trainyard.dev/v1alpha1");
        assert_eq!(patch["kind"], "TrainingJob");
        assert_eq!(patch["status"]["phase"], "Pending");
        assert_eq!(patch["status"]["attempt"], 0);
        assert_eq!(patch["status"]["observedGeneration"], 1);
        let status: TrainingJobStatus =
            serde_json::from_value(patch["status"].clone()).expect("a valid status");
        assert_eq!(status.phase, Some(Phase::Pending));
    }
}
