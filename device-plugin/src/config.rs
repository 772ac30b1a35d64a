//! Command line and the validated configuration it turns into.
//!
//! Every flag has an environment fallback so a DaemonSet can set either.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use trainyard_api::crd::DEFAULT_GPU_RESOURCE;

use crate::labels::LabelWriter;
use crate::metrics::liveness::LivenessLimits;
use crate::plugin::DeviceListStrategy;
use crate::plugin::registration::ClientTimeouts;
use crate::rm::health::HealthPolicy;

/// Default of `--label-check-interval`.
pub(crate) const DEFAULT_LABEL_CHECK_INTERVAL: Duration = Duration::from_secs(60);
/// Default of `--gpu-call-timeout`: NVML answers in milliseconds on a GPU
/// in persistence mode; ten seconds is a GPU that does not answer.
pub(crate) const DEFAULT_GPU_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Invalid combinations or values of flags.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// `--backend fake` without a file.
    #[error("--backend fake needs --fake-gpus FILE")]
    FakeWithoutFile,
    /// `--backend nvml` together with `--fake-gpus`.
    #[error("--fake-gpus implies --backend fake; it conflicts with --backend nvml")]
    FakeFileWithNvml,
    /// `--device-list-strategy` has an unknown entry.
    #[error("--device-list-strategy: unknown strategy {0:?} (expected envvar, cdi or envvar,cdi)")]
    UnknownStrategy(String),
    /// `--resource-name` is not `<domain>/<name>`.
    #[error("--resource-name {0:?} must look like <vendor-domain>/<name>, e.g. nvidia.com/gpu")]
    InvalidResourceName(String),
    /// A duration flag could not be parsed.
    #[error("{flag} {value:?}: expected a duration such as 10s, 500ms or 1m")]
    InvalidDuration {
        /// The flag, e.g. `--metrics-interval`.
        flag: &'static str,
        /// What was given.
        value: String,
    },
    /// `--probe-stall-limit` would call a probe loop hung that is only
    /// between rounds, or waiting out the deadline of a GPU that hangs.
    #[error(
        "--probe-stall-limit {limit:?} must be at least twice --probe-interval {interval:?} plus \
         --gpu-call-timeout {call_timeout:?}, or a healthy plugin waiting for its next round, or \
         for a GPU whose call hangs, would be restarted"
    )]
    StallLimitTooShort {
        /// `--probe-stall-limit`.
        limit: Duration,
        /// `--probe-interval`.
        interval: Duration,
        /// `--gpu-call-timeout`.
        call_timeout: Duration,
    },
    /// `--ignored-xids` has a non-number.
    #[error("--ignored-xids: {0:?} is not an XID number")]
    InvalidXid(String),
}

/// Log output encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Which GPU backend to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum BackendKind {
    /// NVML, or the fake backend when `--fake-gpus` is given.
    #[default]
    Auto,
    /// NVML only.
    Nvml,
    /// The fake YAML file only.
    Fake,
}

/// trainyard device plugin: advertises NVIDIA GPUs to the kubelet.
#[derive(Debug, Parser)]
#[command(name = "trainyard-device-plugin", version, about, long_about = None)]
pub struct Cli {
    /// Log encoding.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "TRAINYARD_LOG_FORMAT")]
    pub log_format: LogFormat,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the device plugin until SIGTERM.
    Run(Box<RunArgs>),
    /// Print, as JSON, the GPUs, topology, health and driver facts the backend sees.
    Discover(DiscoverArgs),
    /// Apply node labels read as a JSON object from stdin (used by `run`).
    #[command(hide = true)]
    ApplyLabels(ApplyLabelsArgs),
}

/// Flags of `apply-labels`.
#[derive(Debug, Clone, Args)]
pub struct ApplyLabelsArgs {
    /// The node to label.
    #[arg(long)]
    pub node_name: String,
    /// Read the node first and apply only if a label is missing or different.
    #[arg(long)]
    pub if_missing: bool,
}

/// Backend selection, shared by `run` and `discover`.
#[derive(Debug, Clone, Args)]
pub struct BackendArgs {
    /// GPU backend.
    #[arg(long, value_enum, default_value_t = BackendKind::Auto, env = "TRAINYARD_BACKEND")]
    pub backend: BackendKind,
    /// YAML file describing fake GPUs (implies --backend fake).
    #[arg(long, value_name = "FILE", env = "TRAINYARD_FAKE_GPUS")]
    pub fake_gpus: Option<PathBuf>,
}

/// Flags of `run`.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Backend selection.
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Extended resource to advertise.
    #[arg(
        long,
        default_value = DEFAULT_GPU_RESOURCE,
        env = "TRAINYARD_RESOURCE_NAME"
    )]
    pub resource_name: String,
    /// The kubelet's device-plugin directory (holds kubelet.sock).
    #[arg(
        long,
        default_value = "/var/lib/kubelet/device-plugins",
        env = "TRAINYARD_DEVICE_PLUGIN_DIR"
    )]
    pub device_plugin_dir: PathBuf,
    /// Node to label with GPU facts; labelling is off when unset.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// How Allocate names devices: envvar, cdi, or envvar,cdi.
    #[arg(long, default_value = "envvar", env = "TRAINYARD_DEVICE_LIST_STRATEGY")]
    pub device_list_strategy: String,
    /// Also return /dev/nvidia* device specs from Allocate.
    #[arg(long, env = "TRAINYARD_PASS_DEVICE_SPECS")]
    pub pass_device_specs: bool,
    /// Address for /metrics, /healthz and /readyz, e.g. 0.0.0.0:9400; off when unset.
    #[arg(long, env = "TRAINYARD_METRICS_ADDR")]
    pub metrics_addr: Option<SocketAddr>,
    /// A directory on the node where the GPU resets still owed are kept across restarts of
    /// the plugin (a hostPath); not kept when unset.
    #[arg(long, value_name = "DIR", env = "TRAINYARD_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// How often GPU telemetry is sampled.
    #[arg(long, default_value = "10s", env = "TRAINYARD_METRICS_INTERVAL")]
    pub metrics_interval: String,
    /// XIDs that never mark a GPU unhealthy (comma-separated).
    #[arg(long, default_value = DEFAULT_IGNORED_XIDS_FLAG, env = "TRAINYARD_IGNORED_XIDS")]
    pub ignored_xids: String,
    /// Seconds an unhealthy GPU must stay quiet before a good probe recovers it.
    #[arg(long, default_value_t = 30, env = "TRAINYARD_HEALTH_RECOVERY_SECONDS")]
    pub health_recovery_seconds: u64,
    /// How often every GPU is probed.
    #[arg(long, default_value = "5s", env = "TRAINYARD_PROBE_INTERVAL")]
    pub probe_interval: String,
    /// How long one backend call to a GPU (its check, or a telemetry sample) may
    /// take; a GPU whose call takes longer is marked Unhealthy.
    #[arg(long, default_value = "10s", env = "TRAINYARD_GPU_CALL_TIMEOUT")]
    pub gpu_call_timeout: String,
    /// /healthz fails once no probe round has completed for this long (the probe loop is stuck).
    #[arg(long, default_value = "1m", env = "TRAINYARD_PROBE_STALL_LIMIT")]
    pub probe_stall_limit: String,
    /// /healthz fails once the plugin has not been registered with the kubelet for this long.
    #[arg(long, default_value = "2m", env = "TRAINYARD_UNREGISTERED_GRACE")]
    pub unregistered_grace: String,
    /// How often the node is checked for missing GPU labels (a recreated Node object).
    #[arg(long, default_value = "1m", env = "TRAINYARD_LABEL_CHECK_INTERVAL")]
    pub label_check_interval: String,
    /// How often the plugin socket sends each client an HTTP/2 PING.
    #[arg(long, default_value = "30s", env = "TRAINYARD_GRPC_KEEPALIVE_INTERVAL")]
    pub grpc_keepalive_interval: String,
    /// A client that leaves a PING unanswered this long is disconnected.
    #[arg(long, default_value = "10s", env = "TRAINYARD_GRPC_KEEPALIVE_TIMEOUT")]
    pub grpc_keepalive_timeout: String,
    /// A connection to the plugin socket with no call open this long is closed.
    #[arg(long, default_value = "2m", env = "TRAINYARD_GRPC_IDLE_TIMEOUT")]
    pub grpc_idle_timeout: String,
}

/// Flags of `discover`.
#[derive(Debug, Clone, Args)]
pub struct DiscoverArgs {
    /// Backend selection.
    #[command(flatten)]
    pub backend: BackendArgs,
}

/// `DEFAULT_IGNORED_XIDS` as the flag's default text; a test keeps them equal.
const DEFAULT_IGNORED_XIDS_FLAG: &str = "13,31,43,45,68,109";

/// The backend to open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendChoice {
    /// NVML if present; an error otherwise.
    Auto,
    /// NVML.
    Nvml,
    /// The fake file.
    Fake(PathBuf),
}

impl BackendArgs {
    /// Resolves `--backend` and `--fake-gpus` into one choice.
    pub fn choice(&self) -> Result<BackendChoice, ConfigError> {
        match (self.backend, &self.fake_gpus) {
            (BackendKind::Nvml, Some(_)) => Err(ConfigError::FakeFileWithNvml),
            (BackendKind::Nvml, None) => Ok(BackendChoice::Nvml),
            (BackendKind::Fake, None) => Err(ConfigError::FakeWithoutFile),
            (_, Some(path)) => Ok(BackendChoice::Fake(path.clone())),
            (BackendKind::Auto, None) => Ok(BackendChoice::Auto),
        }
    }
}

impl std::str::FromStr for DeviceListStrategy {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut strategy = Self {
            envvar: false,
            cdi: false,
        };
        for part in s.split(',').map(str::trim) {
            match part {
                "envvar" => strategy.envvar = true,
                "cdi" | "cdi-cri" => strategy.cdi = true,
                other => return Err(ConfigError::UnknownStrategy(other.to_string())),
            }
        }
        Ok(strategy)
    }
}

/// Parses `10s`, `500ms`, `2m`, `1h` or a bare number of seconds.
pub(crate) fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let value: f64 = number.parse().ok()?;
    let seconds = match unit {
        "" | "s" => value,
        "ms" => value / 1000.0,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => return None,
    };
    (seconds.is_finite() && seconds > 0.0).then(|| Duration::from_secs_f64(seconds))
}

/// Validated configuration of `run`.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// Backend to open.
    pub backend: BackendChoice,
    /// Extended resource name.
    pub resource_name: String,
    /// The kubelet's device-plugin directory.
    pub device_plugin_dir: PathBuf,
    /// Node to label, if any.
    pub node_name: Option<String>,
    /// Names returned by Allocate.
    pub device_list_strategy: DeviceListStrategy,
    /// Whether Allocate returns `/dev/nvidia*` specs.
    pub pass_device_specs: bool,
    /// Where to serve metrics, if anywhere.
    pub metrics_addr: Option<SocketAddr>,
    /// Where the owed GPU resets are kept on the node, if anywhere.
    pub state_dir: Option<PathBuf>,
    /// Telemetry sampling interval.
    pub metrics_interval: Duration,
    /// Health rules.
    pub health: HealthPolicy,
    /// How often every GPU is probed.
    pub probe_interval: Duration,
    /// Deadline of one backend call to a GPU.
    pub gpu_call_timeout: Duration,
    /// When `/healthz` fails.
    pub liveness: LivenessLimits,
    /// How often the node is checked for missing labels.
    pub label_check_interval: Duration,
    /// When a client's connection to the plugin socket is dropped.
    pub grpc_clients: ClientTimeouts,
    /// How node labels are written.
    pub label_writer: LabelWriter,
}

impl RunConfig {
    /// Defaults for an in-process plugin (tests, benches) on a fake file.
    pub fn fake(fake_gpus: impl Into<PathBuf>, device_plugin_dir: impl Into<PathBuf>) -> Self {
        Self {
            backend: BackendChoice::Fake(fake_gpus.into()),
            resource_name: DEFAULT_GPU_RESOURCE.into(),
            device_plugin_dir: device_plugin_dir.into(),
            node_name: None,
            device_list_strategy: DeviceListStrategy::default(),
            pass_device_specs: false,
            metrics_addr: None,
            state_dir: None,
            metrics_interval: Duration::from_secs(10),
            health: HealthPolicy::default(),
            probe_interval: Duration::from_secs(5),
            gpu_call_timeout: DEFAULT_GPU_CALL_TIMEOUT,
            liveness: LivenessLimits::default(),
            label_check_interval: DEFAULT_LABEL_CHECK_INTERVAL,
            grpc_clients: ClientTimeouts::default(),
            label_writer: LabelWriter::InProcess,
        }
    }

    /// The socket file name inside the device-plugin dir, unique per resource.
    pub(crate) fn socket_name(&self) -> String {
        socket_name(&self.resource_name)
    }
}

/// `trainyard-<resource with / and . replaced>.sock`.
pub(crate) fn socket_name(resource_name: &str) -> String {
    let flat: String = resource_name
        .chars()
        .map(|c| if c == '/' || c == '.' { '-' } else { c })
        .collect();
    format!("trainyard-{flat}.sock")
}

fn valid_resource_name(name: &str) -> bool {
    let Some((domain, resource)) = name.split_once('/') else {
        return false;
    };
    let label_ok = |s: &str| {
        !s.is_empty()
            && s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
            && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
    };
    domain.contains('.') && label_ok(domain) && label_ok(resource)
}

impl TryFrom<RunArgs> for RunConfig {
    type Error = ConfigError;

    fn try_from(args: RunArgs) -> Result<Self, Self::Error> {
        if !valid_resource_name(&args.resource_name) {
            return Err(ConfigError::InvalidResourceName(args.resource_name));
        }
        let duration = |flag: &'static str, value: &str| {
            parse_duration(value).ok_or_else(|| ConfigError::InvalidDuration {
                flag,
                value: value.to_string(),
            })
        };
        let metrics_interval = duration("--metrics-interval", &args.metrics_interval)?;
        let probe_interval = duration("--probe-interval", &args.probe_interval)?;
        let gpu_call_timeout = duration("--gpu-call-timeout", &args.gpu_call_timeout)?;
        let liveness = LivenessLimits {
            unregistered_grace: duration("--unregistered-grace", &args.unregistered_grace)?,
            probe_stall_limit: duration("--probe-stall-limit", &args.probe_stall_limit)?,
        };
        // Between two completed rounds: the interval, an inventory re-read
        // and the round's checks, each of the last two bounded by the deadline.
        if liveness.probe_stall_limit < (probe_interval + gpu_call_timeout) * 2 {
            return Err(ConfigError::StallLimitTooShort {
                limit: liveness.probe_stall_limit,
                interval: probe_interval,
                call_timeout: gpu_call_timeout,
            });
        }
        let label_check_interval = duration("--label-check-interval", &args.label_check_interval)?;
        let grpc_clients = ClientTimeouts {
            keepalive_interval: duration(
                "--grpc-keepalive-interval",
                &args.grpc_keepalive_interval,
            )?,
            keepalive_timeout: duration("--grpc-keepalive-timeout", &args.grpc_keepalive_timeout)?,
            idle_timeout: duration("--grpc-idle-timeout", &args.grpc_idle_timeout)?,
        };
        let ignored_xids = args
            .ignored_xids
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| {
                s.parse()
                    .map_err(|_| ConfigError::InvalidXid(s.to_string()))
            })
            .collect::<Result<BTreeSet<u64>, _>>()?;
        Ok(Self {
            backend: args.backend.choice()?,
            resource_name: args.resource_name,
            device_plugin_dir: args.device_plugin_dir,
            node_name: args.node_name.filter(|n| !n.is_empty()),
            device_list_strategy: args.device_list_strategy.parse()?,
            pass_device_specs: args.pass_device_specs,
            metrics_addr: args.metrics_addr,
            state_dir: args.state_dir.filter(|d| !d.as_os_str().is_empty()),
            metrics_interval,
            health: HealthPolicy {
                ignored_xids,
                recovery_quiet_period: Duration::from_secs(args.health_recovery_seconds),
                ..HealthPolicy::default()
            },
            probe_interval,
            gpu_call_timeout,
            liveness,
            label_check_interval,
            grpc_clients,
            label_writer: LabelWriter::InProcess,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rm::health::DEFAULT_IGNORED_XIDS;

    fn run_args(extra: &[&str]) -> Result<RunConfig, String> {
        let mut argv = vec!["trainyard-device-plugin", "run"];
        argv.extend_from_slice(extra);
        let cli = Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
        match cli.command {
            Command::Run(args) => RunConfig::try_from(*args).map_err(|e| e.to_string()),
            _ => Err("not run".into()),
        }
    }

    #[test]
    fn defaults_match_the_documented_ones() {
        let c = run_args(&[]).unwrap();
        assert_eq!(c.backend, BackendChoice::Auto);
        assert_eq!(c.resource_name, "nvidia.com/gpu");
        assert_eq!(
            c.device_plugin_dir,
            PathBuf::from("/var/lib/kubelet/device-plugins")
        );
        assert_eq!(
            c.device_list_strategy,
            DeviceListStrategy {
                envvar: true,
                cdi: false
            }
        );
        assert_eq!(c.metrics_interval, Duration::from_secs(10));
        assert_eq!(c.metrics_addr, None);
        assert_eq!(
            c.health.ignored_xids,
            DEFAULT_IGNORED_XIDS.into_iter().collect()
        );
        assert_eq!(c.socket_name(), "trainyard-nvidia-com-gpu.sock");
        assert_eq!(c.probe_interval, Duration::from_secs(5));
        assert_eq!(c.gpu_call_timeout, Duration::from_secs(10));
        assert_eq!(c.liveness, LivenessLimits::default());
        assert_eq!(c.liveness.probe_stall_limit, Duration::from_secs(60));
        assert_eq!(c.liveness.unregistered_grace, Duration::from_secs(120));
        assert_eq!(c.label_check_interval, DEFAULT_LABEL_CHECK_INTERVAL);
        assert_eq!(c.grpc_clients, ClientTimeouts::default());
        assert_eq!(c.grpc_clients.keepalive_interval, Duration::from_secs(30));
        assert_eq!(c.grpc_clients.keepalive_timeout, Duration::from_secs(10));
        assert_eq!(c.grpc_clients.idle_timeout, Duration::from_secs(120));
    }

    #[test]
    fn grpc_client_timeouts_are_flags() {
        let c = run_args(&[
            "--grpc-keepalive-interval",
            "1s",
            "--grpc-keepalive-timeout",
            "500ms",
            "--grpc-idle-timeout",
            "1h",
        ])
        .unwrap();
        assert_eq!(
            c.grpc_clients,
            ClientTimeouts {
                keepalive_interval: Duration::from_secs(1),
                keepalive_timeout: Duration::from_millis(500),
                idle_timeout: Duration::from_secs(3600),
            }
        );
        for flag in [
            "--grpc-keepalive-interval",
            "--grpc-keepalive-timeout",
            "--grpc-idle-timeout",
        ] {
            let e = run_args(&[flag, "0s"]).unwrap_err();
            assert!(e.contains(flag), "{e}");
        }
    }

    #[test]
    fn liveness_bounds_are_flags_and_a_stall_limit_must_outlast_two_rounds_with_a_hung_gpu() {
        let c = run_args(&[
            "--probe-interval",
            "200ms",
            "--gpu-call-timeout",
            "500ms",
            "--probe-stall-limit",
            "2s",
            "--unregistered-grace",
            "3s",
            "--label-check-interval",
            "1s",
        ])
        .unwrap();
        assert_eq!(c.probe_interval, Duration::from_millis(200));
        assert_eq!(c.gpu_call_timeout, Duration::from_millis(500));
        assert_eq!(c.liveness.probe_stall_limit, Duration::from_secs(2));
        assert_eq!(c.liveness.unregistered_grace, Duration::from_secs(3));
        assert_eq!(c.label_check_interval, Duration::from_secs(1));
        let short =
            run_args(&["--probe-interval", "10s", "--probe-stall-limit", "15s"]).unwrap_err();
        assert!(short.contains("--probe-stall-limit"), "{short}");
        // Two intervals alone fit, but not with the default deadline of a hung GPU.
        let short =
            run_args(&["--probe-interval", "10s", "--probe-stall-limit", "30s"]).unwrap_err();
        assert!(short.contains("--gpu-call-timeout"), "{short}");
        for flag in [
            "--gpu-call-timeout",
            "--probe-interval",
            "--probe-stall-limit",
            "--unregistered-grace",
            "--label-check-interval",
        ] {
            let e = run_args(&[flag, "never"]).unwrap_err();
            assert!(e.contains(flag), "{e}");
        }
    }

    #[test]
    fn fake_file_implies_fake_backend_and_conflicts_with_nvml() {
        let c = run_args(&["--fake-gpus", "/x.yaml"]).unwrap();
        assert_eq!(c.backend, BackendChoice::Fake("/x.yaml".into()));
        assert!(
            run_args(&["--backend", "nvml", "--fake-gpus", "/x"])
                .unwrap_err()
                .contains("conflicts")
        );
        assert!(
            run_args(&["--backend", "fake"])
                .unwrap_err()
                .contains("--fake-gpus")
        );
    }

    #[test]
    fn strategies_parse_singly_and_combined() {
        let c = run_args(&[
            "--device-list-strategy",
            "envvar,cdi",
            "--pass-device-specs",
        ])
        .unwrap();
        assert_eq!(
            c.device_list_strategy,
            DeviceListStrategy {
                envvar: true,
                cdi: true
            }
        );
        assert!(c.pass_device_specs);
        let c = run_args(&["--device-list-strategy", "cdi"]).unwrap();
        assert_eq!(
            c.device_list_strategy,
            DeviceListStrategy {
                envvar: false,
                cdi: true
            }
        );
        assert!(
            run_args(&["--device-list-strategy", "volume-mounts"])
                .unwrap_err()
                .contains("volume-mounts")
        );
    }

    #[test]
    fn bad_values_are_rejected_with_the_flag_named() {
        let mig = run_args(&["--resource-name", "nvidia.com/mig-1g.5gb"]).unwrap();
        assert_eq!(mig.socket_name(), "trainyard-nvidia-com-mig-1g-5gb.sock");
        assert!(
            run_args(&["--resource-name", "gpu"])
                .unwrap_err()
                .contains("--resource-name")
        );
        assert!(
            run_args(&["--metrics-interval", "soon"])
                .unwrap_err()
                .contains("--metrics-interval")
        );
        assert!(
            run_args(&["--ignored-xids", "13,x"])
                .unwrap_err()
                .contains("--ignored-xids")
        );
        let c = run_args(&["--ignored-xids", "", "--health-recovery-seconds", "0"]).unwrap();
        assert!(c.health.ignored_xids.is_empty());
        assert_eq!(c.health.recovery_quiet_period, Duration::ZERO);
    }

    #[test]
    fn durations_accept_common_units() {
        assert_eq!(parse_duration("10s"), Some(Duration::from_secs(10)));
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Some(Duration::from_secs(3)));
        assert_eq!(parse_duration("0s"), None);
        assert_eq!(parse_duration("5d"), None);
    }
}
