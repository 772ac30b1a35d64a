//! `trainyard-bench`: `operator` runs the operator scale benchmark against the cluster that
//! KUBECONFIG names (or the local cluster); `progress-load` loads the operator's progress
//! endpoint in-process with reporting ranks; `render-doc` writes docs/benchmarks.md from the
//! reports.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};
use trainyard_bench::doc::{self, DocInputs, Machine};
use trainyard_bench::progress_load::{self, ProgressLoadParams};
use trainyard_bench::scenario::{self, OperatorBenchParams, OperatorBenchReport};

#[derive(Parser, Debug)]
#[command(
    name = "trainyard-bench",
    version,
    about = "Benchmarks trainyard against the local cluster"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// M TrainingJobs × W workers on N fake GPU nodes: operator vs. both floors, preemption recovery, cost.
    Operator(OperatorArgs),
    /// R ranks of J jobs report progress to the operator's endpoint in-process, then a flood.
    ProgressLoad(ProgressLoadArgs),
    /// Rewrite docs/benchmarks.md from operator reports (JSON) and the device plugin's table,
    /// and the companion file of every run in full.
    RenderDoc(RenderDocArgs),
}

#[derive(clap::Args, Debug)]
struct OperatorArgs {
    /// TrainingJobs (M).
    #[arg(long)]
    jobs: u32,
    /// Workers per job (W).
    #[arg(long, default_value_t = 4)]
    workers: u32,
    /// Fake GPU nodes (N), 8 GPUs each.
    #[arg(long)]
    nodes: u32,
    /// GPUs per worker (1 or 2 fit the sizes).
    #[arg(long, default_value_t = 1)]
    gpus_per_worker: u32,
    /// Workers preempted at once, one per job (default: min(100, jobs); 0 skips).
    #[arg(long)]
    preempt: Option<u32>,
    /// Jobs in flight at once, for both floors' writes and for applying TrainingJobs.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Runs of the fair floor and rounds of the preemption burst (operator and restart floor);
    /// the targets are judged on the median of each.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// The operator binary (default: trainyard-operator next to this binary).
    #[arg(long, env = "TRAINYARD_BENCH_OPERATOR")]
    operator_bin: Option<PathBuf>,
    /// Limit of each waiting phase, seconds.
    #[arg(long, default_value_t = 900)]
    phase_timeout: u64,
    /// Directory for the operator's log and kubeconfig.
    #[arg(long, default_value = "target/bench")]
    work_dir: PathBuf,
    /// Run the operator with leader election on a private Lease (true) or with
    /// --leader-elect=false.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// Record the operator's CPU profile with `perf record` into this file.
    #[arg(long)]
    perf_record: Option<PathBuf>,
    /// Write the report as JSON here (also when the run stops early).
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
struct ProgressLoadArgs {
    /// Reporting ranks in all.
    #[arg(long, default_value_t = 1000)]
    ranks: u32,
    /// Jobs the ranks belong to (ranks must be a multiple).
    #[arg(long, default_value_t = 250)]
    jobs: u32,
    /// How long the ranks report, seconds.
    #[arg(long, default_value_t = 30.0)]
    seconds: f64,
    /// How often each rank reports, milliseconds.
    #[arg(long, default_value_t = 5000)]
    interval_ms: u64,
    /// Requests of the flood (oversized bodies, bad tokens).
    #[arg(long, default_value_t = 5000)]
    flood: u32,
    /// Connections the flood sends over at once.
    #[arg(long, default_value_t = 128)]
    flood_connections: u32,
    /// Write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

async fn progress_load(args: ProgressLoadArgs) -> anyhow::Result<()> {
    let params = ProgressLoadParams {
        ranks: args.ranks,
        jobs: args.jobs,
        seconds: args.seconds,
        interval_ms: args.interval_ms,
        flood_requests: args.flood,
        flood_connections: args.flood_connections,
    };
    let report = progress_load::run(&params).await?;
    if let Some(path) = &args.json {
        write(path, &serde_json::to_string_pretty(&report)?)?;
    }
    println!("{}", progress_load::markdown(&report));
    let problems = report.problems();
    if !problems.is_empty() {
        bail!("the progress load test failed: {}", problems.join("; "));
    }
    Ok(())
}

#[derive(clap::Args, Debug)]
struct RenderDocArgs {
    /// An operator report (JSON from `operator --json`) of a judged run; repeat in the order to
    /// show (several of one size are its repeated runs, judged by their worst).
    #[arg(long = "report")]
    reports: Vec<PathBuf>,
    /// A judged run that produced no report, with why ("1000 jobs × 4 workers on 500 nodes,
    /// run 2 of 3: ...").
    #[arg(long = "missing")]
    missing: Vec<String>,
    /// An operator report of a further size for the memory table only; repeat.
    #[arg(long = "slope-report")]
    slope_reports: Vec<PathBuf>,
    /// Such a run that produced no report, with why.
    #[arg(long = "slope-missing")]
    slope_missing: Vec<String>,
    /// The device plugin benchmark's markdown output.
    #[arg(long)]
    device_plugin: Option<PathBuf>,
    /// Why there is no device plugin output.
    #[arg(long)]
    device_plugin_missing: Option<String>,
    /// The command to name as the figures' source.
    #[arg(long, default_value = "make bench")]
    command: String,
    /// The document to rewrite.
    #[arg(long, default_value = "docs/benchmarks.md")]
    doc: PathBuf,
    /// The companion file to write: each run's detail tables, which the document names
    /// (give it relative to the repository root, as the document shows it).
    #[arg(long, default_value = doc::DETAILS_PATH)]
    details: PathBuf,
}

fn default_operator_bin() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locating trainyard-bench")?;
    let dir = exe
        .parent()
        .context("trainyard-bench has no parent directory")?;
    Ok(dir.join("trainyard-operator"))
}

async fn operator(args: OperatorArgs) -> anyhow::Result<()> {
    let params = OperatorBenchParams {
        jobs: args.jobs,
        workers: args.workers,
        nodes: args.nodes,
        gpus_per_worker: args.gpus_per_worker,
        preempt: args.preempt.unwrap_or_else(|| args.jobs.min(100)),
        concurrency: args.concurrency,
        rounds: args.rounds,
        operator_bin: match args.operator_bin {
            Some(p) => p,
            None => default_operator_bin()?,
        },
        phase_timeout: Duration::from_secs(args.phase_timeout),
        work_dir: args.work_dir,
        leader_elect: args.leader_elect,
        perf_record: args.perf_record,
        max_concurrent_reconciles: None,
    };
    let client = trainyard_e2e::client().await?;
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let report = scenario::run(&client, &params, interrupt).await;
    if let Some(path) = &args.json {
        write(path, &serde_json::to_string_pretty(&report)?)?;
    }
    println!("{}", trainyard_bench::report::markdown(&report));
    if let Some(e) = &report.error {
        bail!("the benchmark stopped early: {e}");
    }
    Ok(())
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

fn read_reports(paths: &[PathBuf]) -> anyhow::Result<Vec<OperatorBenchReport>> {
    paths
        .iter()
        .map(|p| {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            serde_json::from_str::<OperatorBenchReport>(&text)
                .with_context(|| format!("parsing {}", p.display()))
        })
        .collect()
}

fn render_doc(args: RenderDocArgs) -> anyhow::Result<()> {
    let operator_runs = read_reports(&args.reports)?;
    let slope_runs = read_reports(&args.slope_reports)?;
    let device_plugin = match (&args.device_plugin, &args.device_plugin_missing) {
        (_, Some(why)) => Err(why.clone()),
        (Some(p), None) => std::fs::read_to_string(p)
            .map_err(|e| format!("reading {}: {e}", p.display()))
            .and_then(|t| {
                if t.trim().is_empty() {
                    Err("the benchmark printed nothing".to_owned())
                } else {
                    Ok(t)
                }
            }),
        (None, None) => Err("not run".to_owned()),
    };
    let existing = std::fs::read_to_string(&args.doc).ok();
    let inputs = DocInputs {
        command: args.command,
        date: jiff::Timestamp::now()
            .strftime("%Y-%m-%d %H:%M UTC")
            .to_string(),
        machine: Machine::detect(),
        operator_runs,
        missing_runs: args.missing,
        slope_runs,
        slope_missing: args.slope_missing,
        device_plugin,
        existing,
        details: args.details.display().to_string(),
    };
    write(&args.details, &doc::render_details(&inputs))?;
    write(&args.doc, &doc::render(&inputs))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Operator(args) => operator(args).await,
        Command::ProgressLoad(args) => progress_load(args).await,
        Command::RenderDoc(args) => render_doc(args),
    }
}
