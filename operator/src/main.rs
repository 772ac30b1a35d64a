//! `trainyard-operator`: `run` reconciles TrainingJobs, `crd` prints the CRD.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{ArgAction, Parser, Subcommand, ValueEnum};
use trainyard_operator::{
    AudienceCheck, DEFAULT_MAX_CONCURRENT_RECONCILES, HttpLimits, LeaderElection, OperatorConfig,
    ProgressChannel, ProgressServing, RunConfig, SealKey, crd_yaml, run, seal_secret,
};

#[derive(Parser, Debug)]
#[command(
    name = "trainyard-operator",
    version,
    about = "Runs TrainingJobs as preemption-tolerant GPU pod gangs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Reconcile TrainingJobs (kubeconfig or in-cluster config).
    Run(Box<RunArgs>),
    /// Print the TrainingJob CRD as YAML.
    Crd,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "TRAINYARD_NAMESPACE")]
    namespace: Option<String>,
    /// Operator config file (prices, spot labels and taints, timeouts); defaults apply without it.
    #[arg(long, env = "TRAINYARD_CONFIG")]
    config: Option<PathBuf>,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "TRAINYARD_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,
    /// Take a coordination/v1 Lease before reconciling, so that replicas never overlap.
    #[arg(long, env = "TRAINYARD_LEADER_ELECT", default_value_t = true, action = ArgAction::Set)]
    leader_elect: bool,
    /// Name of the leader Lease.
    #[arg(long, default_value = "trainyard-operator")]
    lease_name: String,
    /// Namespace of the leader Lease (default: the pod's namespace, else the kubeconfig's).
    #[arg(long, env = "POD_NAMESPACE")]
    lease_namespace: Option<String>,
    /// Identity in the Lease and in Events (default: the pod name, else the hostname).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Seconds the Lease stays valid without renewal.
    #[arg(long, default_value_t = 15)]
    lease_duration_seconds: u64,
    /// Reconciles in flight at once: each carries out its own round (a status write, a gang's
    /// pod creates or deletes), so this bounds the writes in flight and the operator's memory
    /// with them; half of them may write status alone (docs/operator.md).
    #[arg(
        long,
        alias = "max-concurrent-writes",
        env = "TRAINYARD_MAX_CONCURRENT_RECONCILES",
        default_value_t = DEFAULT_MAX_CONCURRENT_RECONCILES,
        value_parser = clap::value_parser!(u16).range(1..)
    )]
    max_concurrent_reconciles: u16,
    /// No longer used (the adaptive write bound is gone): accepted, so that an older chart or
    /// command line still starts the operator, and logged as ignored.
    #[arg(long, env = "TRAINYARD_WRITE_LATENCY_TARGET_MS", hide = true)]
    write_latency_target_ms: Option<String>,
    /// No longer used (memory is bounded by the reconciles in flight): accepted and ignored.
    #[arg(long, env = "TRAINYARD_MEMORY_BUDGET_MIB", hide = true)]
    memory_budget_mib: Option<String>,
    /// Log format.
    #[arg(long, value_enum, env = "TRAINYARD_LOG_FORMAT", default_value = "text")]
    log_format: LogFormat,
    /// Serve the progress channel trainers report to (POST /v1/progress) on this address while
    /// leading; unset: no channel, and worker pods get no progress URL or token.
    #[arg(long, env = "TRAINYARD_PROGRESS_ADDR", requires = "progress_url")]
    progress_addr: Option<SocketAddr>,
    /// The URL trainers reach that address at (TRAINYARD_PROGRESS_URL in their environment),
    /// e.g. http://trainyard-progress.trainyard-system.svc.cluster.local:8082/v1/progress.
    #[arg(long, env = "TRAINYARD_PROGRESS_URL", requires = "progress_addr")]
    progress_url: Option<String>,
    /// Audience of the service-account token worker pods report with.
    #[arg(
        long,
        env = "TRAINYARD_PROGRESS_AUDIENCE",
        default_value = "trainyard-progress"
    )]
    progress_audience: String,
    /// Secret (in the pod's namespace) that holds the key sealing the worker pods allowed to
    /// report; made by the first replica that finds none. Without it each replica seals with
    /// a key of its own, made when it starts (pods made before are taken on their labels): run
    /// more than one replica only with it.
    #[arg(long, env = "TRAINYARD_SEAL_SECRET")]
    seal_secret: Option<String>,
    /// Endpoints object (in the pod's namespace) the leader points at its own pod IP, behind
    /// the progress Service.
    #[arg(long, env = "TRAINYARD_PROGRESS_ENDPOINTS")]
    progress_endpoints: Option<String>,
    /// This replica's pod IP (the downward API's status.podIP).
    #[arg(long, env = "POD_IP")]
    pod_ip: Option<String>,
    /// Accept TokenReview answers that list no audiences, for an API server whose token
    /// authenticator does not report them. Such an answer shows only that the token is valid
    /// for the API server, so by default it is refused.
    #[arg(long, env = "TRAINYARD_PROGRESS_AUDIENCE_UNAWARE_REVIEWER", default_value_t = false,
          action = ArgAction::Set)]
    progress_audience_unaware_reviewer: bool,
    /// Connections the progress port holds at once; more are closed as soon as accepted.
    #[arg(long, env = "TRAINYARD_PROGRESS_MAX_CONNECTIONS",
          default_value_t = HttpLimits::PROGRESS.max_connections as u64,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    progress_max_connections: u64,
    /// Connections the metrics port holds at once; more are closed as soon as accepted.
    #[arg(long, env = "TRAINYARD_METRICS_MAX_CONNECTIONS",
          default_value_t = HttpLimits::METRICS.max_connections as u64,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    metrics_max_connections: u64,
    /// Seconds a connection to the metrics or progress port has to send a complete request
    /// head, from when it opened or got its previous answer (so also how long a kept-alive
    /// connection may idle).
    #[arg(long, env = "TRAINYARD_HTTP_HEADER_TIMEOUT_SECONDS",
          default_value_t = HttpLimits::PROGRESS.header_timeout.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    http_header_timeout_seconds: u64,
    /// Seconds a connection to either port may stall, no byte moving either way, while the
    /// operator waits on it (a body that stops coming, an answer it stops reading).
    #[arg(long, env = "TRAINYARD_HTTP_IDLE_TIMEOUT_SECONDS",
          default_value_t = HttpLimits::PROGRESS.idle_timeout.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    http_idle_timeout_seconds: u64,
    /// The largest request head (request line and headers) either port accepts, bytes;
    /// a larger one is answered 431.
    #[arg(long, env = "TRAINYARD_HTTP_MAX_HEADER_BYTES",
          default_value_t = HttpLimits::PROGRESS.max_header_bytes as u64,
          value_parser = clap::value_parser!(u64).range(1024..=1_048_576))]
    http_max_header_bytes: u64,
}

impl RunArgs {
    /// Logs the flags that are accepted and no longer used.
    fn warn_of_ignored_flags(&self) {
        for (flag, set) in [
            ("--write-latency-target-ms", &self.write_latency_target_ms),
            ("--memory-budget-mib", &self.memory_budget_mib),
        ] {
            if let Some(value) = set {
                tracing::warn!(
                    flag,
                    value,
                    "ignored: the operator no longer has an adaptive write bound; --max-concurrent-reconciles bounds its writes"
                );
            }
        }
    }

    /// The limits of one listener, with a cap of `max_connections`.
    fn http_limits(&self, max_connections: u64) -> HttpLimits {
        // Both within the ranges clap checked, far below usize::MAX.
        let as_usize = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        // Per source address an eighth of the cap, at most 64, as by default.
        HttpLimits {
            header_timeout: std::time::Duration::from_secs(self.http_header_timeout_seconds),
            idle_timeout: std::time::Duration::from_secs(self.http_idle_timeout_seconds),
            max_header_bytes: as_usize(self.http_max_header_bytes),
            ..HttpLimits::with_max_connections(as_usize(max_connections))
        }
    }
}

fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
                .filter(|h| !h.is_empty())
        })
        .unwrap_or_else(|| format!("trainyard-operator-{}", std::process::id()))
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // No colour codes when stderr is a pod log or a file, not a terminal.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {},
                    _ = term.recv() => {},
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
    tracing::info!("shutting down");
}

/// The key that seals worker pods: the Secret `namespace/secret`'s, or this process's own.
async fn seal_key(
    client: &kube::Client,
    namespace: &str,
    secret: Option<&str>,
) -> anyhow::Result<SealKey> {
    let seal = match secret.filter(|n| !n.is_empty()) {
        Some(name) => seal_secret::load_or_create(client, namespace, name).await?,
        None => {
            tracing::warn!(
                "no --seal-secret: this replica seals worker pods with a key of its own; pods \
                 made before it started are taken on their labels"
            );
            // Made now: the workers a previous run made stay workers (as before sealing).
            let bytes = SealKey::generate()
                .map_err(|_| anyhow::anyhow!("no system randomness for the seal key"))?;
            SealKey::new(&bytes, Some(jiff::Timestamp::now()))
        }
    };
    tracing::info!(key = seal.id(), "sealing worker pods");
    Ok(seal)
}

async fn run_command(args: RunArgs) -> anyhow::Result<()> {
    init_tracing(args.log_format);
    args.warn_of_ignored_flags();
    let mut operator = match &args.config {
        Some(path) => OperatorConfig::load(path)?,
        None => OperatorConfig::default(),
    };
    let client = kube::Client::try_default()
        .await
        .context("connecting to Kubernetes (kubeconfig or in-cluster config)")?;
    let identity = args
        .identity
        .clone()
        .filter(|i| !i.is_empty())
        .unwrap_or_else(hostname);
    let leader_election = args.leader_elect.then(|| LeaderElection {
        lease_name: args.lease_name.clone(),
        lease_namespace: args
            .lease_namespace
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| client.default_namespace().to_owned()),
        identity: identity.clone(),
        lease_duration_seconds: args.lease_duration_seconds,
        renew_grace_seconds: (args.lease_duration_seconds / 2).max(1),
    });
    let own_namespace = args
        .lease_namespace
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| client.default_namespace().to_owned());
    let progress_limits = args.http_limits(args.progress_max_connections);
    let metrics_limits = args.http_limits(args.metrics_max_connections);
    let audiences = if args.progress_audience_unaware_reviewer {
        AudienceCheck::UnawareReviewer
    } else {
        AudienceCheck::Listed
    };
    let progress = match (args.progress_addr, args.progress_url) {
        (Some(addr), Some(url)) => {
            let seal = seal_key(&client, &own_namespace, args.seal_secret.as_deref()).await?;
            operator.progress_channel = Some(ProgressChannel {
                url,
                audience: args.progress_audience.clone(),
                seal: seal.clone(),
            });
            Some(ProgressServing {
                addr,
                audience: args.progress_audience.clone(),
                endpoints: args
                    .progress_endpoints
                    .filter(|e| !e.is_empty())
                    .map(|name| (own_namespace.clone(), name)),
                pod_ip: args.pod_ip.filter(|ip| !ip.is_empty()),
                limits: progress_limits,
                audiences,
                seal,
            })
        }
        _ => None,
    };
    let config = RunConfig {
        progress,
        namespace: args.namespace.filter(|n| !n.is_empty()),
        operator,
        metrics_addr: Some(args.metrics_addr),
        metrics_limits,
        leader_election,
        instance: identity,
        max_concurrent_reconciles: args.max_concurrent_reconciles,
    };
    run(client, config, shutdown_signal()).await?;
    Ok(())
}

// One thread: the operator waits on the API server, not on its CPU (15 s of CPU over the
// 4-minute 1,000-job benchmark), and one thread allocates from one malloc arena instead of one
// per worker thread (peak RSS).
#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd => {
            print!("{}", crd_yaml().context("rendering the CRD")?);
            Ok(())
        }
        Command::Run(args) => run_command(*args).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_args(args: &[&str]) -> Result<RunArgs, clap::Error> {
        let argv = ["trainyard-operator", "run"].iter().chain(args);
        match Cli::try_parse_from(argv)?.command {
            Command::Run(args) => Ok(*args),
            Command::Crd => unreachable!("parsed as run"),
        }
    }

    #[test]
    fn the_bound_on_reconciles_has_a_default_and_its_former_name_still_sets_it() {
        let default = run_args(&[]).expect("no flags");
        assert_eq!(
            default.max_concurrent_reconciles,
            DEFAULT_MAX_CONCURRENT_RECONCILES
        );
        let former = run_args(&["--max-concurrent-writes", "8"]).expect("the alias");
        assert_eq!(former.max_concurrent_reconciles, 8);
        let zero = run_args(&["--max-concurrent-reconciles", "0"]).expect_err("zero");
        assert!(
            zero.to_string().contains("max-concurrent-reconciles"),
            "{zero}"
        );
    }

    #[test]
    fn the_flags_of_the_removed_write_bound_are_accepted_and_kept_for_the_warning() {
        let args = run_args(&[
            "--memory-budget-mib",
            "64",
            "--write-latency-target-ms",
            "5000",
        ])
        .expect("an older chart's flags still start the operator");
        assert_eq!(args.memory_budget_mib.as_deref(), Some("64"));
        assert_eq!(args.write_latency_target_ms.as_deref(), Some("5000"));
    }
}
