//! The operator scale benchmark: fake GPU nodes, the pods-only floor (the same pods created
//! directly), the fair floor (the TrainingJobs and everything a controller must write for them,
//! written directly), the restart floors (the same restarts made directly: as cheaply as the
//! API server allows, and as a correct controller must), the operator creating the pods from
//! TrainingJobs, and a burst of preemptions.
//!
//! Everything runs against the real API server, scheduler and controllers of the cluster; only
//! the kubelets are missing, and the benchmark plays their part where the operator depends on
//! it (pods reported Running, pods being deleted finished with grace period 0).
//!
//! [`run`] drives the phases in order. By what each measures:
//! - `create_floors`: the pods-only floor and the fair floor, each timed creating every pod,
//!   and the restart floors run among their pods;
//! - `restart_floors`: the preemption burst's restarts made directly, without a controller
//!   and as a correct controller must;
//! - `operator`: the operator started idle, timed creating the pods from TrainingJobs, its
//!   memory, requests and metrics;
//! - `operator_recovery`: the operator's preemption burst, round by round, each job's
//!   recovery split into stages.
//!
//! What they share: `params` (what to run), `results` (what a run measured), `objects`
//! (the TrainingJobs and what the floors write, built by the operator's own builders),
//! `kubelet` (the kubelet's part the benchmark plays), `timing` (the clocks and waits on
//! the pod watch) and `cluster` (what a run sets up and removes).

mod cluster;
mod create_floors;
mod kubelet;
mod objects;
mod operator;
mod operator_recovery;
mod params;
mod restart_floors;
mod results;
mod timing;

pub use cluster::upstream_client;
pub use objects::{CHECKPOINT_CLAIM, training_job};
pub use params::OperatorBenchParams;
pub use results::{
    OperatorBenchReport, OperatorRequests, OperatorUsage, ReconcileCounts, Recovery, Throughput,
};

use std::future::Future;

use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, ListParams};
use trainyard_operator::surface::TrainingJob;

use crate::cpu_profile::CpuSampler;
use crate::error::{Error, Result};
use crate::fake_nodes::FakeNodes;
use crate::operator_process::OperatorProcess;
use cluster::checkpoint_volume;
use cluster::clean_up;
use cluster::create_namespace;
use cluster::preflight;
use create_floors::fair_floors;
use create_floors::pods_only_floor;
use operator::operator_phases;

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

/// A repeated phase's name: `what` alone when it runs once, else numbered from 1 in `unit`s
/// ("fair floor, run 2", "preemption, round 3").
fn numbered(what: &str, unit: &str, index: u32, of: u32) -> String {
    if of <= 1 {
        what.to_owned()
    } else {
        format!("{what}, {unit} {}", index + 1)
    }
}
