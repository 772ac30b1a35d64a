//! The one seam between the plugin and the GPUs it advertises.
//!
//! Everything above this module (health, allocation, kubelet API, labels,
//! metrics) works on the plain data types defined here, so the fake backend
//! exercises exactly the same code paths as NVML does on a real node.

pub mod fake;
pub(crate) mod nvml;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use serde::Serialize;
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;
use trainyard_api::{Version, VersionError};

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
    /// One GPU failed; the others are unaffected.
    #[error("GPU {uuid}: {source}")]
    Device {
        /// The GPU.
        uuid: String,
        /// What failed.
        #[source]
        source: DeviceError,
    },
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
        let Version { major, minor } = s.parse().map_err(|e: VersionError| e.to_string())?;
        Ok(Self { major, minor })
    }
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
    /// GPUs whose facts are known, ordered by index. A GPU that could not be
    /// read this round but was read before keeps its last facts here (facts
    /// such as name, memory and links do not change while a GPU is broken)
    /// and also has an entry in `faults`.
    pub gpus: Vec<GpuInfo>,
    /// GPUs the driver counts but that could not be read this round, ordered
    /// by index. Each is advertised as Unhealthy; the rest are served.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub faults: Vec<GpuFault>,
}

impl Inventory {
    /// The fault of the device with this ID, if it could not be read this round.
    pub(crate) fn fault(&self, id: &str) -> Option<&GpuFault> {
        self.faults.iter().find(|f| f.device_id() == id)
    }

    /// Faults of GPUs with no known facts (never read since start-up).
    pub(crate) fn faults_without_facts(&self) -> impl Iterator<Item = &GpuFault> {
        self.faults.iter().filter(|f| {
            f.uuid
                .as_deref()
                .is_none_or(|uuid| !self.gpus.iter().any(|g| g.uuid == uuid))
        })
    }

    /// Every device the kubelet is told about, in index order, as (index,
    /// device ID, facts if known).
    pub(crate) fn devices(&self) -> Vec<(u32, String, Option<&GpuInfo>)> {
        let mut devices: Vec<_> = self
            .gpus
            .iter()
            .map(|g| (g.index, g.uuid.clone(), Some(g)))
            .chain(
                self.faults_without_facts()
                    .map(|f| (f.index, f.device_id(), None)),
            )
            .collect();
        devices.sort_by_key(|(index, _, _)| *index);
        devices
    }

    /// Every device ID the kubelet is told about, in index order.
    pub(crate) fn device_ids(&self) -> Vec<String> {
        self.devices().into_iter().map(|(_, id, _)| id).collect()
    }
}

/// How a per-GPU error bears on health.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Deserialize, Serialize,
)]
pub enum DeviceErrorKind {
    /// The GPU fell off the bus or is otherwise inaccessible (NVML `GpuLost`).
    GpuLost,
    /// The driver refuses the GPU until it is reset (NVML `ResetRequired`).
    ResetRequired,
    /// The driver no longer knows the GPU (NVML `NotFound`).
    NotFound,
    /// Any other error.
    Other,
}

/// A per-GPU error: what kind, and the failed call with the driver's words.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[serde(rename_all = "camelCase")]
#[error("{detail}")]
pub struct DeviceError {
    /// What kind of error, for the health rules.
    pub kind: DeviceErrorKind,
    /// For people, e.g. `NVML memory_info failed: the GPU has fallen off the bus`.
    pub detail: String,
}

/// A GPU that the driver counts but that could not be read this round.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuFault {
    /// The driver's index of the GPU.
    pub index: u32,
    /// Its UUID, when it could be read this round or was read before.
    pub uuid: Option<String>,
    /// Why it could not be read.
    pub error: DeviceError,
}

impl GpuFault {
    /// The device ID it is advertised under: its UUID, or, while no UUID
    /// was ever read, `unreadable-gpu-<index>` (short and printable, as the
    /// kubelet requires).
    pub(crate) fn device_id(&self) -> String {
        match &self.uuid {
            Some(uuid) => uuid.clone(),
            None => format!("unreadable-gpu-{}", self.index),
        }
    }
}

/// A per-GPU read that failed, as a backend reports it to [`KnownGpus::assemble`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FailedRead {
    /// The driver's index of the GPU.
    pub index: u32,
    /// Its UUID, if that much could be read.
    pub uuid: Option<String>,
    /// Why the read failed.
    pub error: DeviceError,
}

/// The facts of every GPU read so far, by index.
///
/// A GPU that stops answering (NVML `GpuLost` after XID 79, say) keeps the
/// UUID and facts it had, so the kubelet sees the same device turn
/// Unhealthy rather than one device vanish and another appear.
#[derive(Debug, Default)]
pub(crate) struct KnownGpus {
    by_index: BTreeMap<u32, GpuInfo>,
}

impl KnownGpus {
    /// The last facts read for the GPU at `index`.
    pub(crate) fn get(&self, index: u32) -> Option<&GpuInfo> {
        self.by_index.get(&index)
    }

    /// Builds one round's inventory from the per-GPU reads of that round
    /// (one entry per index the driver counts) and remembers what was read.
    pub(crate) fn assemble(
        &mut self,
        driver: DriverInfo,
        reads: Vec<Result<GpuInfo, FailedRead>>,
    ) -> Inventory {
        let mut gpus = Vec::with_capacity(reads.len());
        let mut faults = Vec::new();
        let mut seen = BTreeSet::new();
        for read in reads {
            match read {
                Ok(info) => {
                    seen.insert(info.index);
                    self.by_index.insert(info.index, info.clone());
                    gpus.push(info);
                }
                Err(failed) => {
                    seen.insert(failed.index);
                    // Facts read before count only if they are this GPU's:
                    // a different UUID at the index means the GPUs moved.
                    let cached = self.by_index.get(&failed.index).filter(|known| {
                        failed.uuid.as_deref().is_none_or(|uuid| uuid == known.uuid)
                    });
                    let uuid = failed
                        .uuid
                        .clone()
                        .or_else(|| cached.map(|known| known.uuid.clone()));
                    if let Some(known) = cached {
                        gpus.push(known.clone());
                    }
                    faults.push(GpuFault {
                        index: failed.index,
                        uuid,
                        error: failed.error,
                    });
                }
            }
        }
        self.by_index.retain(|index, _| seen.contains(index));
        gpus.sort_by_key(|g| g.index);
        faults.sort_by_key(|f| f.index);
        Inventory {
            driver,
            gpus,
            faults,
        }
    }
}

/// Result of probing one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ProbeOutcome {
    /// The GPU answered as a working GPU does.
    Healthy,
    /// The GPU is definitely broken (fallen off the bus, marked bad, ...).
    Unhealthy(DeviceError),
    /// The probe could not tell, e.g. a transient NVML error; health must not change.
    Inconclusive(String),
}

/// What the driver says must happen before a GPU can be used again
/// (NVML's `nvmlDeviceGpuRecoveryAction_t`, read as the field
/// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RecoveryAction {
    /// Nothing: the GPU is usable.
    None,
    /// The GPU must be reset.
    GpuReset,
    /// The node must be rebooted.
    NodeReboot,
    /// Peer-to-peer work must be drained.
    DrainP2p,
    /// Work must be drained and the GPU reset.
    DrainAndReset,
    /// A value this plugin does not know; treated as "something is needed".
    #[serde(skip)]
    Unknown(u64),
}

impl RecoveryAction {
    /// Maps NVML's numeric value.
    pub(crate) fn from_nvml(value: u64) -> Self {
        match value {
            0 => Self::None,
            1 => Self::GpuReset,
            2 => Self::NodeReboot,
            3 => Self::DrainP2p,
            4 => Self::DrainAndReset,
            other => Self::Unknown(other),
        }
    }
}

impl fmt::Display for RecoveryAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::None => f.write_str("none"),
            Self::GpuReset => f.write_str("GPU reset"),
            Self::NodeReboot => f.write_str("node reboot"),
            Self::DrainP2p => f.write_str("drain peer-to-peer work"),
            Self::DrainAndReset => f.write_str("drain and reset"),
            Self::Unknown(v) => write!(f, "unknown recovery action {v}"),
        }
    }
}

/// NVLink lanes of one GPU: up now, and up at best since start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NvlinkLanes {
    /// Lanes active now.
    pub active: u32,
    /// The most lanes seen active at once since start-up.
    pub expected: u32,
}

/// What a backend can observe about whether a GPU has had the reset that a
/// fault (XID 79, 48, 74, ...) needs. `None` fields could not be read (the
/// GPU or driver does not support the query, or it failed): they cannot tell.
///
/// Gathering is the backend's job; judging is `health::ResetCheck`'s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ResetEvidence {
    /// Whether the GPU answers NVML at all.
    pub reachable: Result<(), DeviceError>,
    /// The driver's recovery action for the GPU (recent drivers only).
    pub recovery_action: Option<RecoveryAction>,
    /// Whether pages wait for retirement, which happens at the next reset
    /// (GPUs before Ampere).
    pub retired_pages_pending: Option<bool>,
    /// Whether a row remapping waits for the next reset (Ampere and later).
    pub row_remap_pending: Option<bool>,
    /// Whether a row remapping failed: the GPU's memory can no longer be repaired.
    pub row_remap_failed: Option<bool>,
    /// NVLink lanes now and before.
    pub nvlink_lanes: Option<NvlinkLanes>,
    /// How many resets of this GPU the backend has counted since it
    /// started. It only ever grows, so a higher count than at a fault shows
    /// a reset even when nothing was pending to clear (XID 62, 119, 120).
    pub resets: Option<u64>,
}

impl ResetEvidence {
    /// Evidence from a GPU that does not answer: nothing can be told.
    pub(crate) fn unreachable(error: DeviceError) -> Self {
        Self {
            reachable: Err(error),
            recovery_action: None,
            retired_pages_pending: None,
            row_remap_pending: None,
            row_remap_failed: None,
            nvlink_lanes: None,
            resets: None,
        }
    }
}

/// A clock-throttle reason, one 0/1 metric series each.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Deserialize, Serialize,
)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ThrottleReason {
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
    pub(crate) const ALL: [ThrottleReason; 10] = [
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
    pub(crate) fn as_str(self) -> &'static str {
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
pub(crate) struct Telemetry {
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
pub(crate) enum BackendEvent {
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
pub(crate) trait GpuBackend: Send + Sync + 'static {
    /// Short name for logs and `discover`.
    fn name(&self) -> &'static str;

    /// The GPUs and driver facts right now.
    fn inventory(&self) -> Result<Inventory, BackendError>;

    /// Checks that one GPU still works.
    fn probe(&self, uuid: &str) -> ProbeOutcome;

    /// Gathers what can tell whether a GPU owes a reset, or has had the one
    /// a fault needs; asked for every GPU that can be read, every probe round
    /// and at start-up.
    fn reset_evidence(&self, uuid: &str) -> ResetEvidence;

    /// A telemetry sample of one GPU. Fields that cannot be read are `None`.
    fn telemetry(&self, uuid: &str) -> Result<Telemetry, BackendError>;

    /// Starts background watchers that report events until `shutdown`.
    fn watch(
        self: Arc<Self>,
        events: UnboundedSender<BackendEvent>,
        shutdown: CancellationToken,
    ) -> Result<(), BackendError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn driver() -> DriverInfo {
        DriverInfo {
            driver_version: "550.54.15".into(),
            cuda_version: "12.4".into(),
        }
    }

    fn gpu(index: u32) -> GpuInfo {
        GpuInfo {
            uuid: format!("GPU-{index}"),
            index,
            minor_number: index,
            name: "NVIDIA A100-SXM4-80GB".into(),
            memory_mib: 81920,
            pci_bus_id: None,
            numa_node: Some(0),
            compute_capability: ComputeCapability { major: 8, minor: 0 },
            nvlinks: BTreeMap::new(),
        }
    }

    fn lost(index: u32, uuid: Option<&str>) -> FailedRead {
        FailedRead {
            index,
            uuid: uuid.map(str::to_string),
            error: DeviceError {
                kind: DeviceErrorKind::GpuLost,
                detail: "NVML memory_info failed: GPU lost".into(),
            },
        }
    }

    #[test]
    fn one_failed_read_is_one_fault_and_the_other_gpus_are_inventoried() {
        let mut known = KnownGpus::default();
        let inv = known.assemble(driver(), vec![Ok(gpu(0)), Err(lost(1, None)), Ok(gpu(2))]);
        assert_eq!(inv.gpus, vec![gpu(0), gpu(2)]);
        assert_eq!(inv.faults.len(), 1);
        assert_eq!(inv.faults[0].device_id(), "unreadable-gpu-1");
        assert_eq!(
            inv.device_ids(),
            ["GPU-0", "unreadable-gpu-1", "GPU-2"].map(String::from)
        );
        assert!(inv.fault("unreadable-gpu-1").is_some());
        assert!(inv.fault("GPU-0").is_none());
    }

    #[test]
    fn a_gpu_read_before_keeps_its_uuid_and_facts_when_it_fails() {
        let mut known = KnownGpus::default();
        known.assemble(driver(), vec![Ok(gpu(0)), Ok(gpu(1))]);
        // Now not even its UUID can be read.
        let inv = known.assemble(driver(), vec![Ok(gpu(0)), Err(lost(1, None))]);
        assert_eq!(inv.gpus, vec![gpu(0), gpu(1)]);
        assert_eq!(inv.faults[0].uuid.as_deref(), Some("GPU-1"));
        assert_eq!(inv.device_ids(), ["GPU-0", "GPU-1"].map(String::from));
        assert_eq!(inv.faults_without_facts().count(), 0);
        // A different GPU at that index: the old facts are not its.
        let inv = known.assemble(driver(), vec![Ok(gpu(0)), Err(lost(1, Some("GPU-9")))]);
        assert_eq!(inv.gpus, vec![gpu(0)]);
        assert_eq!(inv.device_ids(), ["GPU-0", "GPU-9"].map(String::from));
        // A GPU the driver no longer counts is forgotten.
        known.assemble(driver(), vec![Ok(gpu(0))]);
        assert!(known.get(1).is_none());
    }
}
