//! The one seam between the plugin and the GPUs it advertises.
//!
//! Everything above this module (health, allocation, kubelet API, labels,
//! metrics) works on the plain data types defined here, so the fake backend
//! exercises exactly the same code paths as NVML does on a real node.

pub mod fake;
pub mod nvml;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use serde::Serialize;
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

/// Errors raised while talking to a GPU backend.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The NVIDIA driver or its management library could not be loaded.
    #[error(
        "NVIDIA driver/NVML not found: {0}. Is the NVIDIA driver installed and the container \
         started with the NVIDIA runtime? Use --backend fake --fake-gpus FILE on nodes without GPUs"
    )]
    DriverNotFound(String),
    /// An NVML call failed.
    #[error("NVML {call} failed: {source}")]
    Nvml {
        /// Which query failed, for the log line.
        call: String,
        /// The error NVML returned.
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },
    /// The fake GPU file could not be read.
    #[error("cannot read fake GPU file {path}: {source}")]
    FakeFileRead {
        /// The file named by `--fake-gpus`.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The fake GPU file is not valid YAML for the expected shape.
    #[error("invalid fake GPU file {path}: {message}")]
    FakeFileParse {
        /// The file named by `--fake-gpus`.
        path: PathBuf,
        /// The parser's message, including the location.
        message: String,
    },
    /// The fake GPU file parsed but describes an impossible node.
    #[error("invalid fake GPU file {path}: {field}: {problem}")]
    FakeFileInvalid {
        /// The file named by `--fake-gpus`.
        path: PathBuf,
        /// The offending field, e.g. `gpus[2].uuid`.
        field: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The file watcher could not be started.
    #[error("cannot watch {path}: {message}")]
    Watch {
        /// The watched path.
        path: PathBuf,
        /// The watcher's message.
        message: String,
    },
    /// A GPU that the caller named is not known to the backend.
    #[error("unknown GPU {0}")]
    UnknownGpu(String),
}

/// A CUDA compute capability such as 8.0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ComputeCapability {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

impl fmt::Display for ComputeCapability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl Serialize for ComputeCapability {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl std::str::FromStr for ComputeCapability {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (major, minor) = parse_major_minor(s)?;
        Ok(Self { major, minor })
    }
}

/// Parses `"<major>.<minor>"` with both parts decimal.
pub(crate) fn parse_major_minor(s: &str) -> Result<(u32, u32), String> {
    let (major, minor) = s
        .split_once('.')
        .ok_or_else(|| format!("expected \"<major>.<minor>\", got {s:?}"))?;
    let major = major
        .parse()
        .map_err(|_| format!("major version in {s:?} is not a number"))?;
    let minor = minor
        .parse()
        .map_err(|_| format!("minor version in {s:?} is not a number"))?;
    Ok((major, minor))
}

/// One physical GPU as the backend sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuInfo {
    /// NVML UUID, e.g. `GPU-11111111-2222-3333-4444-000000000000`; the device ID on the wire.
    pub uuid: String,
    /// NVML index (stable across reboots only with a fixed PCI order).
    pub index: u32,
    /// Minor number of `/dev/nvidiaN`.
    pub minor_number: u32,
    /// Product name as NVML reports it.
    pub name: String,
    /// Total framebuffer memory in MiB.
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    /// PCI bus id in sysfs form, e.g. `0000:07:00.0`.
    pub pci_bus_id: Option<String>,
    /// NUMA node the GPU is attached to, if the platform reports one.
    pub numa_node: Option<i64>,
    /// Compute capability.
    pub compute_capability: ComputeCapability,
    /// Peer UUID to number of NVLink links to that peer.
    pub nvlinks: BTreeMap<String, u32>,
}

/// Node-level driver facts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DriverInfo {
    /// Driver version, e.g. `550.54.15`.
    pub driver_version: String,
    /// Highest CUDA version the driver supports, e.g. `12.4`.
    pub cuda_version: String,
}

/// Everything the backend knows about the node's GPUs at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Inventory {
    /// Driver and CUDA versions.
    #[serde(flatten)]
    pub driver: DriverInfo,
    /// GPUs ordered by index.
    pub gpus: Vec<GpuInfo>,
}

/// Result of probing one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// The GPU answered as a working GPU does.
    Healthy,
    /// The GPU is definitely broken (fallen off the bus, marked bad, ...).
    Unhealthy(String),
    /// The probe could not tell, e.g. a transient NVML error; health must not change.
    Inconclusive(String),
}

/// A clock-throttle reason, one 0/1 metric series each.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Deserialize, Serialize,
)]
#[serde(rename_all = "snake_case")]
pub enum ThrottleReason {
    /// Any thermal slowdown (software or hardware).
    Thermal,
    /// Software power capping.
    PowerCap,
    /// Hardware slowdown (thermal or power brake).
    HwSlowdown,
    /// Sync boost with other GPUs.
    SyncBoost,
    /// Software thermal slowdown.
    SwThermal,
    /// Hardware thermal slowdown.
    HwThermal,
    /// Hardware power brake slowdown.
    HwPowerBrake,
    /// The GPU is idle.
    Idle,
    /// Clocks limited by the applications clocks setting.
    ApplicationsClocks,
    /// Clocks limited by the display clock setting.
    DisplayClocks,
}

impl ThrottleReason {
    /// Every reason, in the order metrics are rendered.
    pub const ALL: [ThrottleReason; 10] = [
        Self::Thermal,
        Self::PowerCap,
        Self::HwSlowdown,
        Self::SyncBoost,
        Self::SwThermal,
        Self::HwThermal,
        Self::HwPowerBrake,
        Self::Idle,
        Self::ApplicationsClocks,
        Self::DisplayClocks,
    ];

    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Thermal => "thermal",
            Self::PowerCap => "power_cap",
            Self::HwSlowdown => "hw_slowdown",
            Self::SyncBoost => "sync_boost",
            Self::SwThermal => "sw_thermal",
            Self::HwThermal => "hw_thermal",
            Self::HwPowerBrake => "hw_power_brake",
            Self::Idle => "idle",
            Self::ApplicationsClocks => "applications_clocks",
            Self::DisplayClocks => "display_clocks",
        }
    }
}

/// One telemetry sample of one GPU. A `None` field is not reported.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Telemetry {
    /// GPU utilization in percent.
    pub utilization_percent: Option<f64>,
    /// Memory controller utilization in percent.
    pub memory_utilization_percent: Option<f64>,
    /// Framebuffer memory in use, bytes.
    pub memory_used_bytes: Option<u64>,
    /// Framebuffer memory in total, bytes.
    pub memory_total_bytes: Option<u64>,
    /// Die temperature in °C.
    pub temperature_celsius: Option<f64>,
    /// Power draw in W.
    pub power_draw_watts: Option<f64>,
    /// Enforced power limit in W.
    pub power_limit_watts: Option<f64>,
    /// SM clock in MHz.
    pub sm_clock_mhz: Option<f64>,
    /// Memory clock in MHz.
    pub memory_clock_mhz: Option<f64>,
    /// Active throttle reasons; `None` when they could not be read.
    pub throttle_reasons: Option<BTreeSet<ThrottleReason>>,
}

/// Something the backend noticed on its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendEvent {
    /// The set of GPUs or their facts may have changed: re-read the inventory.
    InventoryChanged,
    /// An XID error; `uuid` is `None` when it cannot be tied to one GPU.
    Xid {
        /// The GPU that reported it, when known.
        uuid: Option<String>,
        /// The XID number.
        xid: u64,
    },
    /// An error that is not tied to one GPU (e.g. the event wait failed).
    Unattributed(String),
}

/// The GPUs of a node, whatever provides them.
///
/// Methods block (NVML calls are synchronous); async callers run them on the
/// blocking pool.
pub trait GpuBackend: Send + Sync + 'static {
    /// Short name for logs and `discover`.
    fn name(&self) -> &'static str;

    /// The GPUs and driver facts right now.
    fn inventory(&self) -> Result<Inventory, BackendError>;

    /// Checks that one GPU still works.
    fn probe(&self, uuid: &str) -> ProbeOutcome;

    /// A telemetry sample of one GPU. Fields that cannot be read are `None`.
    fn telemetry(&self, uuid: &str) -> Result<Telemetry, BackendError>;

    /// Starts background watchers that report events until `shutdown`.
    fn watch(
        self: Arc<Self>,
        events: UnboundedSender<BackendEvent>,
        shutdown: CancellationToken,
    ) -> Result<(), BackendError>;
}
