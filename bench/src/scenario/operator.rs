//! The operator's phases: the real binary started idle, timed creating the pods from the
//! TrainingJobs, then the preemption burst; its memory, API requests and metrics throughout.

use std::collections::BTreeMap;
use std::time::Duration;

use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use trainyard_operator::surface::{self, TrainingJob};

use super::Created;
use super::RunContext;
use super::operator_recovery::Burst;
use super::params::OperatorBenchParams;
use super::results::OperatorBenchReport;
use super::results::OperatorRequests;
use super::results::OperatorUsage;
use super::results::ReconcileCounts;
use super::results::Throughput;
use super::timing::timed_writes;
use crate::cpu_profile::CpuSampler;
use crate::error::{Error, Result};
use crate::operator_process::{OperatorProcess, metric_value};
use crate::pod_tracker::PodTracker;
use crate::proxy::CountingProxy;

/// The operator: started idle, then timed creating the pods of `jobs`, then every job
/// Running and the preemption burst; its metrics, memory and requests throughout.
pub(super) async fn operator_phases(
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
    let watch = OperatorWatch {
        proxy: &proxy,
        tracker: &tracker,
        sampler: &sampler,
    };
    let (mut usage, mut requests) = create_phase(operator, ctx, ns, jobs, &watch, report).await?;

    if params.preempt > 0 {
        let mut burst = Burst {
            client,
            ns,
            params,
            tracker: &tracker,
            operator,
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

/// What watches the operator while it runs: its API requests (through the proxy it talks to),
/// the namespace's pods, and the CPU of every process.
struct OperatorWatch<'a> {
    proxy: &'a CountingProxy,
    tracker: &'a PodTracker,
    sampler: &'a CpuSampler,
}

/// The operator's create phase: ready and idle (its start-up requests and memory), then timed
/// creating the pods of `jobs` into `report.operator`; its memory and requests up to there.
async fn create_phase(
    operator: &mut OperatorProcess,
    ctx: &RunContext<'_>,
    ns: &str,
    jobs: Vec<TrainingJob>,
    watch: &OperatorWatch<'_>,
    report: &mut OperatorBenchReport,
) -> Result<(OperatorUsage, OperatorRequests)> {
    let (client, params) = (ctx.client, ctx.params);
    let (proxy, sampler) = (watch.proxy, watch.sampler);
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
    let reconciles = reconciles_total(operator).await;
    let cpu0 = sampler.sample();
    let outcome = apply_and_wait_created(client, ns, jobs, params, watch.tracker).await;
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
    report.reconciles = reconciles.map(|before_create| ReconcileCounts {
        before_create,
        ..ReconcileCounts::default()
    });
    let usage = OperatorUsage {
        idle,
        created: created_usage,
        ..OperatorUsage::default()
    };
    let requests = OperatorRequests {
        startup,
        ..OperatorRequests::default()
    };
    Ok((usage, requests))
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
        params.max_concurrent_reconciles,
    )
    .await
}

/// The operator's `trainyard_operator_reconciles_total` now.
pub(super) async fn reconciles_total(operator: &OperatorProcess) -> Option<f64> {
    let metrics = operator.metrics().await.ok()?;
    metric_value(&metrics, "trainyard_operator_reconciles_total")
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
        "trainyard_operator_status_rounds_parked_total",
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
