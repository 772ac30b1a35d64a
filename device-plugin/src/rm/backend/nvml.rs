//! The NVML backend: real GPUs through the NVIDIA management library.
//!
//! NVML is loaded at run time, so the binary starts (and `--backend fake`
//! works) on nodes without a driver. Every query that can fail transiently
//! degrades to "unknown" instead of failing the caller: an NVML hiccup must
//! never fail a pod's admission or flip health.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{Clock, EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::FieldValueSample;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::sys_exports::field_id::{
    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, NVML_FI_DEV_REMAPPED_FAILURE, NVML_FI_DEV_REMAPPED_PENDING,
};
use nvml_wrapper::{Device, Nvml};
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use super::{
    BackendError, BackendEvent, ComputeCapability, DeviceError, DeviceErrorKind, DriverInfo,
    FailedRead, GpuBackend, GpuInfo, Inventory, KnownGpus, NvlinkLanes, ProbeOutcome,
    RecoveryAction, ResetEvidence, Telemetry, ThrottleReason,
};

/// NVLink lanes NVML can report per GPU.
const MAX_NVLINKS: u32 = 18;
/// XID the driver logs for a double-bit ECC error; NVML reports it as its own event type.
const XID_DOUBLE_BIT_ECC: u64 = 48;
const EVENT_WAIT_MS: u32 = 1000;
const MIB: u64 = 1024 * 1024;

/// The NVML backend.
pub(crate) struct NvmlBackend {
    nvml: Arc<Nvml>,
    /// Facts of every GPU read so far, so a GPU that stops answering keeps its identity.
    known: Mutex<KnownGpus>,
    /// The most NVLink lanes seen active at once, by UUID: what "back up" means after XID 74.
    lanes: Mutex<BTreeMap<String, u32>>,
    /// Readings that start over when a GPU is re-initialised, by UUID, and the resets counted.
    inits: Mutex<BTreeMap<String, InitReadings>>,
}

/// Readings of one GPU that only grow while it stays initialised (the
/// volatile ECC error count, the energy consumed), and the resets counted
/// from seeing one of them start over.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct InitReadings {
    /// Volatile (since initialisation) ECC errors, corrected and uncorrected.
    volatile_ecc: Option<u64>,
    /// Energy consumed since initialisation, in mJ.
    energy_mj: Option<u64>,
    /// Resets counted so far.
    resets: u64,
}

impl InitReadings {
    /// Takes new readings (`None`: could not be read, the last one is kept)
    /// and counts a reset when one reads lower than the last. Returns the
    /// count, or `None` while neither reading has ever been read.
    fn observe(&mut self, volatile_ecc: Option<u64>, energy_mj: Option<u64>) -> Option<u64> {
        let dropped = |last: Option<u64>, now: Option<u64>| matches!((last, now), (Some(l), Some(n)) if n < l);
        if dropped(self.volatile_ecc, volatile_ecc) || dropped(self.energy_mj, energy_mj) {
            self.resets += 1;
        }
        self.volatile_ecc = volatile_ecc.or(self.volatile_ecc);
        self.energy_mj = energy_mj.or(self.energy_mj);
        (self.volatile_ecc.is_some() || self.energy_mj.is_some()).then_some(self.resets)
    }
}

/// The volatile ECC error count of a device, corrected and uncorrected together.
fn volatile_ecc_errors(device: &Device<'_>) -> Option<u64> {
    let count = |kind| device.total_ecc_errors(kind, EccCounter::Volatile).ok();
    Some(count(MemoryError::Corrected)?.saturating_add(count(MemoryError::Uncorrected)?))
}

impl std::fmt::Debug for NvmlBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlBackend").finish_non_exhaustive()
    }
}

fn nvml_err(call: &str) -> impl FnOnce(NvmlError) -> BackendError + '_ {
    move |source| BackendError::Nvml {
        call: call.to_string(),
        source,
    }
}

/// How an NVML error bears on health.
pub(crate) fn device_error_kind(error: &NvmlError) -> DeviceErrorKind {
    match error {
        NvmlError::GpuLost => DeviceErrorKind::GpuLost,
        NvmlError::ResetRequired => DeviceErrorKind::ResetRequired,
        NvmlError::NotFound => DeviceErrorKind::NotFound,
        _ => DeviceErrorKind::Other,
    }
}

fn device_error(call: &str, error: &NvmlError) -> DeviceError {
    DeviceError {
        kind: device_error_kind(error),
        detail: format!("NVML {call} failed: {error}"),
    }
}

/// A field value as an unsigned number; `None` when NVML could not read it.
pub(crate) fn field_value(sample: &Result<FieldValueSample, NvmlError>) -> Option<u64> {
    match sample.as_ref().ok()?.value.as_ref().ok()? {
        SampleValue::U32(v) => Some(u64::from(*v)),
        SampleValue::U64(v) => Some(*v),
        SampleValue::I64(v) => u64::try_from(*v).ok(),
        SampleValue::F64(v) if v.is_finite() && *v >= 0.0 => Some(*v as u64),
        SampleValue::F64(_) => None,
    }
}

/// Converts NVML's `00000000:07:00.0` into the sysfs form `0000:07:00.0`.
pub(crate) fn sysfs_bus_id(nvml_bus_id: &str) -> String {
    let trimmed = nvml_bus_id.trim_end_matches('\0');
    match trimmed.split_once(':') {
        Some((domain, rest)) => match u32::from_str_radix(domain, 16) {
            Ok(domain) => format!("{domain:04x}:{}", rest.to_ascii_lowercase()),
            Err(_) => trimmed.to_ascii_lowercase(),
        },
        None => trimmed.to_ascii_lowercase(),
    }
}

/// Reads the NUMA node of a PCI device from sysfs; `-1` means none.
pub(crate) fn numa_node_from_sysfs(sysfs_root: &Path, bus_id: &str) -> Option<i64> {
    let path = sysfs_root
        .join("bus/pci/devices")
        .join(bus_id)
        .join("numa_node");
    let node: i64 = std::fs::read_to_string(path).ok()?.trim().parse().ok()?;
    (node >= 0).then_some(node)
}

/// Formats NVML's CUDA driver version integer (12040) as `12.4`.
pub(crate) fn cuda_version_string(version: i32) -> String {
    format!(
        "{}.{}",
        nvml_wrapper::cuda_driver_version_major(version),
        nvml_wrapper::cuda_driver_version_minor(version)
    )
}

/// Maps NVML's throttle bitmask onto our reason set.
pub(crate) fn throttle_reasons(bits: ThrottleReasons) -> BTreeSet<ThrottleReason> {
    let mut reasons = BTreeSet::new();
    let pairs = [
        (ThrottleReasons::SW_POWER_CAP, ThrottleReason::PowerCap),
        (ThrottleReasons::HW_SLOWDOWN, ThrottleReason::HwSlowdown),
        (ThrottleReasons::SYNC_BOOST, ThrottleReason::SyncBoost),
        (
            ThrottleReasons::SW_THERMAL_SLOWDOWN,
            ThrottleReason::SwThermal,
        ),
        (
            ThrottleReasons::HW_THERMAL_SLOWDOWN,
            ThrottleReason::HwThermal,
        ),
        (
            ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN,
            ThrottleReason::HwPowerBrake,
        ),
        (ThrottleReasons::GPU_IDLE, ThrottleReason::Idle),
        (
            ThrottleReasons::APPLICATIONS_CLOCKS_SETTING,
            ThrottleReason::ApplicationsClocks,
        ),
        (
            ThrottleReasons::DISPLAY_CLOCK_SETTING,
            ThrottleReason::DisplayClocks,
        ),
    ];
    for (bit, reason) in pairs {
        if bits.contains(bit) {
            reasons.insert(reason);
        }
    }
    if bits.intersects(ThrottleReasons::SW_THERMAL_SLOWDOWN | ThrottleReasons::HW_THERMAL_SLOWDOWN)
    {
        reasons.insert(ThrottleReason::Thermal);
    }
    reasons
}

impl NvmlBackend {
    /// Loads NVML; without a driver this fails with [`BackendError::DriverNotFound`].
    pub(crate) fn init() -> Result<Self, BackendError> {
        let nvml = Nvml::init().map_err(|e| match e {
            NvmlError::LibloadingError(_)
            | NvmlError::DriverNotLoaded
            | NvmlError::LibraryNotFound
            | NvmlError::NoPermission
            | NvmlError::FailedToLoadSymbol(_) => BackendError::DriverNotFound(e.to_string()),
            other => BackendError::Nvml {
                call: "init".into(),
                source: other,
            },
        })?;
        Ok(Self {
            nvml: Arc::new(nvml),
            known: Mutex::default(),
            lanes: Mutex::default(),
            inits: Mutex::default(),
        })
    }

    /// Reads one GPU; any error is that GPU's alone.
    fn read_gpu(&self, index: u32) -> Result<(GpuInfo, Vec<String>), FailedRead> {
        let failed = |uuid: Option<String>, call: &str, e: NvmlError| FailedRead {
            index,
            uuid,
            error: device_error(call, &e),
        };
        let device = self
            .nvml
            .device_by_index(index)
            .map_err(|e| failed(None, "device_by_index", e))?;
        // The UUID first: with it a broken GPU keeps its device ID.
        let uuid = device.uuid().map_err(|e| failed(None, "uuid", e))?;
        let (info, remotes, active_lanes) = gpu_info(&device, uuid.clone(), index)
            .map_err(|(call, e)| failed(Some(uuid), call, e))?;
        let mut lanes = self.lanes.lock().unwrap_or_else(PoisonError::into_inner);
        let most = lanes.entry(info.uuid.clone()).or_default();
        *most = (*most).max(active_lanes);
        Ok((info, remotes))
    }
}

/// Active NVLink lanes of a device and the remote PCI bus id of each.
fn nvlink_lanes(device: &Device<'_>) -> (u32, Vec<String>) {
    let mut active = 0;
    let mut remote_bus_ids = Vec::new();
    for link in 0..MAX_NVLINKS {
        let wrapper = device.link_wrapper_for(link);
        // Unsupported or inactive links end the useful range on most GPUs,
        // but not all, so every lane is asked.
        if matches!(wrapper.is_active(), Ok(true)) {
            active += 1;
            if let Ok(remote) = wrapper.remote_pci_info() {
                remote_bus_ids.push(sysfs_bus_id(&remote.bus_id));
            }
        }
    }
    (active, remote_bus_ids)
}

type NvmlFailure = (&'static str, NvmlError);

/// The facts of one GPU, its NVLink remotes and its active lane count.
fn gpu_info(
    device: &Device<'_>,
    uuid: String,
    index: u32,
) -> Result<(GpuInfo, Vec<String>, u32), NvmlFailure> {
    let name = device.name().map_err(|e| ("name", e))?;
    let memory = device.memory_info().map_err(|e| ("memory_info", e))?;
    let minor_number = device.minor_number().unwrap_or(index);
    let pci_bus_id = device.pci_info().ok().map(|p| sysfs_bus_id(&p.bus_id));
    let numa_node = pci_bus_id
        .as_deref()
        .and_then(|id| numa_node_from_sysfs(Path::new("/sys"), id));
    let compute_capability = device
        .cuda_compute_capability()
        .map(|cc| ComputeCapability {
            major: u32::try_from(cc.major).unwrap_or(0),
            minor: u32::try_from(cc.minor).unwrap_or(0),
        })
        .map_err(|e| ("cuda_compute_capability", e))?;
    let (active_lanes, remote_bus_ids) = nvlink_lanes(device);
    Ok((
        GpuInfo {
            uuid,
            index,
            minor_number,
            name,
            memory_mib: memory.total / MIB,
            pci_bus_id,
            numa_node,
            compute_capability,
            nvlinks: BTreeMap::new(),
        },
        remote_bus_ids,
        active_lanes,
    ))
}

/// Turns per-GPU lists of remote bus ids into peer link counts.
///
/// A remote that is not one of our GPUs is an NVSwitch: GPUs that both reach
/// switches talk all-to-all with as many links as the poorer of the two has.
/// `unread` are GPUs that could not be read this round (their last facts):
/// a link to one of them is still a direct link, not a switch.
pub(crate) fn resolve_nvlinks(gpus: &mut [GpuInfo], remotes: &[Vec<String>], unread: &[GpuInfo]) {
    let by_bus: BTreeMap<String, String> = gpus
        .iter()
        .chain(unread)
        .filter_map(|g| g.pci_bus_id.clone().map(|b| (b, g.uuid.clone())))
        .collect();
    let mut switch_links = vec![0u32; gpus.len()];
    let mut direct: Vec<BTreeMap<String, u32>> = vec![BTreeMap::new(); gpus.len()];
    for (i, remote_ids) in remotes.iter().enumerate() {
        for remote in remote_ids {
            match by_bus.get(remote) {
                Some(peer) if *peer != gpus[i].uuid => {
                    *direct[i].entry(peer.clone()).or_default() += 1;
                }
                Some(_) => {}
                None => switch_links[i] += 1,
            }
        }
    }
    let uuids: Vec<String> = gpus.iter().map(|g| g.uuid.clone()).collect();
    for (i, gpu) in gpus.iter_mut().enumerate() {
        let mut links = std::mem::take(&mut direct[i]);
        if switch_links[i] > 0 {
            for (j, peer) in uuids.iter().enumerate() {
                if i != j && switch_links[j] > 0 {
                    *links.entry(peer.clone()).or_default() += switch_links[i].min(switch_links[j]);
                }
            }
        }
        gpu.nvlinks = links;
    }
}

impl GpuBackend for NvmlBackend {
    fn name(&self) -> &'static str {
        "nvml"
    }

    fn inventory(&self) -> Result<Inventory, BackendError> {
        let driver_version = self
            .nvml
            .sys_driver_version()
            .map_err(nvml_err("sys_driver_version"))?;
        let cuda_version = cuda_version_string(
            self.nvml
                .sys_cuda_driver_version()
                .map_err(nvml_err("sys_cuda_driver_version"))?,
        );
        let count = self.nvml.device_count().map_err(nvml_err("device_count"))?;
        let mut gpus = Vec::with_capacity(count as usize);
        let mut remotes = Vec::with_capacity(count as usize);
        let mut failures = Vec::new();
        for index in 0..count {
            match self.read_gpu(index) {
                Ok((info, remote)) => {
                    gpus.push(info);
                    remotes.push(remote);
                }
                Err(failed) => failures.push(failed),
            }
        }
        let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        let unread: Vec<GpuInfo> = failures
            .iter()
            .filter_map(|failed| known.get(failed.index).cloned())
            .collect();
        resolve_nvlinks(&mut gpus, &remotes, &unread);
        let reads = gpus
            .into_iter()
            .map(Ok)
            .chain(failures.into_iter().map(Err))
            .collect();
        Ok(known.assemble(
            DriverInfo {
                driver_version,
                cuda_version,
            },
            reads,
        ))
    }

    fn probe(&self, uuid: &str) -> ProbeOutcome {
        let result = self
            .nvml
            .device_by_uuid(uuid)
            .map_err(|e| device_error("device_by_uuid", &e))
            .and_then(|d| {
                d.memory_info()
                    .map(|_| ())
                    .map_err(|e| device_error("memory_info", &e))
            });
        match result {
            Ok(()) => ProbeOutcome::Healthy,
            Err(e) if e.kind == DeviceErrorKind::Other => ProbeOutcome::Inconclusive(e.detail),
            Err(e) => ProbeOutcome::Unhealthy(e),
        }
    }

    fn reset_evidence(&self, uuid: &str) -> ResetEvidence {
        let device = match self.nvml.device_by_uuid(uuid) {
            Ok(device) => device,
            Err(e) => return ResetEvidence::unreachable(device_error("device_by_uuid", &e)),
        };
        let reachable = device
            .memory_info()
            .map(|_| ())
            .map_err(|e| device_error("memory_info", &e));
        // One call for the three fields; each comes back on its own.
        let fields = device
            .field_values_for(&[
                FieldId(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION),
                FieldId(NVML_FI_DEV_REMAPPED_PENDING),
                FieldId(NVML_FI_DEV_REMAPPED_FAILURE),
            ])
            .unwrap_or_default();
        let field = |i: usize| fields.get(i).and_then(field_value);
        let expected = self
            .lanes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(uuid)
            .copied();
        let resets = self
            .inits
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(uuid.to_string())
            .or_default()
            .observe(
                volatile_ecc_errors(&device),
                device.total_energy_consumption().ok(),
            );
        ResetEvidence {
            reachable,
            recovery_action: field(0).map(RecoveryAction::from_nvml),
            retired_pages_pending: device.are_pages_pending_retired().ok(),
            row_remap_pending: field(1).map(|v| v != 0),
            row_remap_failed: field(2).map(|v| v != 0),
            nvlink_lanes: expected.map(|expected| NvlinkLanes {
                active: nvlink_lanes(&device).0,
                expected,
            }),
            resets,
        }
    }

    fn telemetry(&self, uuid: &str) -> Result<Telemetry, BackendError> {
        let device = self
            .nvml
            .device_by_uuid(uuid)
            .map_err(nvml_err("device_by_uuid"))?;
        let utilization = device.utilization_rates().ok();
        let memory = device.memory_info().ok();
        Ok(Telemetry {
            utilization_percent: utilization.as_ref().map(|u| f64::from(u.gpu)),
            memory_utilization_percent: utilization.as_ref().map(|u| f64::from(u.memory)),
            memory_used_bytes: memory.as_ref().map(|m| m.used),
            memory_total_bytes: memory.as_ref().map(|m| m.total),
            temperature_celsius: device
                .temperature(TemperatureSensor::Gpu)
                .ok()
                .map(f64::from),
            power_draw_watts: device.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
            power_limit_watts: device
                .enforced_power_limit()
                .ok()
                .map(|mw| f64::from(mw) / 1000.0),
            sm_clock_mhz: device.clock_info(Clock::SM).ok().map(f64::from),
            memory_clock_mhz: device.clock_info(Clock::Memory).ok().map(f64::from),
            throttle_reasons: device.current_throttle_reasons().ok().map(throttle_reasons),
        })
    }

    fn watch(
        self: Arc<Self>,
        events: UnboundedSender<BackendEvent>,
        shutdown: CancellationToken,
    ) -> Result<(), BackendError> {
        let nvml = Arc::clone(&self.nvml);
        std::thread::Builder::new()
            .name("nvml-events".into())
            .stack_size(256 * 1024)
            .spawn(move || xid_event_loop(&nvml, &events, &shutdown))
            .map_err(|e| BackendError::Watch {
                path: "NVML event set".into(),
                message: e.to_string(),
            })?;
        Ok(())
    }
}

fn xid_event_loop(
    nvml: &Nvml,
    events: &UnboundedSender<BackendEvent>,
    shutdown: &CancellationToken,
) {
    let mut set = match nvml.create_event_set() {
        Ok(set) => set,
        Err(e) => {
            let _ = events.send(BackendEvent::Unattributed(format!(
                "cannot create NVML event set, XID events will not be seen: {e}"
            )));
            return;
        }
    };
    let count = nvml.device_count().unwrap_or(0);
    for index in 0..count {
        let Ok(device) = nvml.device_by_index(index) else {
            continue;
        };
        let wanted = EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR;
        let supported = device.supported_event_types().unwrap_or(wanted) & wanted;
        if supported.is_empty() {
            tracing::warn!(index, "GPU supports no XID events; health relies on probes");
            continue;
        }
        set = match device.register_events(supported, set) {
            Ok(set) => set,
            Err(e) => {
                // Registration failure releases the set, so start over with a fresh one.
                tracing::warn!(index, error = %e.error, "cannot register for XID events");
                match nvml.create_event_set() {
                    Ok(set) => set,
                    Err(_) => return,
                }
            }
        };
    }
    while !shutdown.is_cancelled() {
        match set.wait(EVENT_WAIT_MS) {
            Ok(data) => {
                let uuid = data.device.uuid().ok();
                let xid = if data.event_type.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
                    Some(XID_DOUBLE_BIT_ECC)
                } else {
                    match data.event_data {
                        Some(XidError::Value(xid)) => Some(xid),
                        _ => None,
                    }
                };
                let event = match xid {
                    Some(xid) => BackendEvent::Xid { uuid, xid },
                    None => BackendEvent::Unattributed("XID event without a value".into()),
                };
                if events.send(event).is_err() {
                    return;
                }
            }
            Err(NvmlError::Timeout) => {}
            Err(e) => {
                if events
                    .send(BackendEvent::Unattributed(format!(
                        "waiting for NVML events: {e}"
                    )))
                    .is_err()
                {
                    return;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvml_bus_ids_become_sysfs_names() {
        assert_eq!(sysfs_bus_id("00000000:07:00.0"), "0000:07:00.0");
        assert_eq!(sysfs_bus_id("00000001:B7:00.0"), "0001:b7:00.0");
    }

    #[test]
    fn cuda_versions_are_major_dot_minor() {
        assert_eq!(cuda_version_string(12040), "12.4");
        assert_eq!(cuda_version_string(11080), "11.8");
    }

    #[test]
    fn thermal_reason_is_set_by_either_thermal_bit() {
        let r = throttle_reasons(ThrottleReasons::HW_THERMAL_SLOWDOWN | ThrottleReasons::GPU_IDLE);
        assert!(r.contains(&ThrottleReason::Thermal));
        assert!(r.contains(&ThrottleReason::HwThermal));
        assert!(r.contains(&ThrottleReason::Idle));
        assert!(!r.contains(&ThrottleReason::SwThermal));
    }

    #[test]
    fn numa_node_minus_one_means_none() {
        let root = tempfile::tempdir().unwrap();
        let dev = root.path().join("bus/pci/devices/0000:07:00.0");
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(dev.join("numa_node"), "-1\n").unwrap();
        assert_eq!(numa_node_from_sysfs(root.path(), "0000:07:00.0"), None);
        std::fs::write(dev.join("numa_node"), "1\n").unwrap();
        assert_eq!(numa_node_from_sysfs(root.path(), "0000:07:00.0"), Some(1));
    }

    fn gpu(uuid: &str, bus: &str) -> GpuInfo {
        GpuInfo {
            uuid: uuid.into(),
            index: 0,
            minor_number: 0,
            name: "x".into(),
            memory_mib: 1,
            pci_bus_id: Some(bus.into()),
            numa_node: None,
            compute_capability: ComputeCapability { major: 8, minor: 0 },
            nvlinks: BTreeMap::new(),
        }
    }

    #[test]
    fn direct_links_are_counted_and_nvswitch_links_become_all_to_all() {
        let mut direct = vec![gpu("a", "0000:01:00.0"), gpu("b", "0000:02:00.0")];
        let remotes = vec![
            vec!["0000:02:00.0".into(), "0000:02:00.0".into()],
            vec!["0000:01:00.0".into(), "0000:01:00.0".into()],
        ];
        resolve_nvlinks(&mut direct, &remotes, &[]);
        assert_eq!(direct[0].nvlinks, BTreeMap::from([("b".into(), 2)]));

        let mut switched = vec![
            gpu("a", "0000:01:00.0"),
            gpu("b", "0000:02:00.0"),
            gpu("c", "0000:03:00.0"),
        ];
        let sw = |n: usize| vec!["0000:99:00.0".to_string(); n];
        resolve_nvlinks(&mut switched, &[sw(12), sw(12), sw(6)], &[]);
        assert_eq!(
            switched[0].nvlinks,
            BTreeMap::from([("b".into(), 12), ("c".into(), 6)])
        );
    }

    #[test]
    fn a_link_to_a_gpu_that_could_not_be_read_stays_direct() {
        // DGX-1-like direct links: a -- b -- c, and b cannot be read.
        let mut read = vec![gpu("a", "0000:01:00.0"), gpu("c", "0000:03:00.0")];
        let unread = [gpu("b", "0000:02:00.0")];
        let remotes = vec![vec!["0000:02:00.0".into()], vec!["0000:02:00.0".into()]];
        resolve_nvlinks(&mut read, &remotes, &unread);
        // Not mistaken for NVSwitch lanes (which would link a and c).
        assert_eq!(read[0].nvlinks, BTreeMap::from([("b".into(), 1)]));
        assert_eq!(read[1].nvlinks, BTreeMap::from([("b".into(), 1)]));
    }

    #[test]
    fn nvml_errors_map_to_the_kinds_the_health_rules_tell_apart() {
        assert_eq!(
            device_error_kind(&NvmlError::GpuLost),
            DeviceErrorKind::GpuLost
        );
        assert_eq!(
            device_error_kind(&NvmlError::ResetRequired),
            DeviceErrorKind::ResetRequired
        );
        assert_eq!(
            device_error_kind(&NvmlError::NotFound),
            DeviceErrorKind::NotFound
        );
        for other in [
            NvmlError::Timeout,
            NvmlError::Unknown,
            NvmlError::NotSupported,
        ] {
            assert_eq!(device_error_kind(&other), DeviceErrorKind::Other);
        }
        let e = device_error("memory_info", &NvmlError::GpuLost);
        assert!(e.detail.starts_with("NVML memory_info failed: "), "{e}");
    }

    #[test]
    fn a_reset_is_counted_when_a_reading_since_initialisation_starts_over() {
        let mut r = InitReadings::default();
        assert_eq!(r.observe(None, None), None, "nothing read: cannot tell");
        assert_eq!(r.observe(Some(3), Some(1_000)), Some(0));
        assert_eq!(
            r.observe(Some(5), Some(9_000)),
            Some(0),
            "growing: no reset"
        );
        assert_eq!(r.observe(None, None), Some(0), "unreadable: the last stays");
        assert_eq!(
            r.observe(Some(0), Some(9_500)),
            Some(1),
            "ECC count started over"
        );
        assert_eq!(r.observe(Some(0), Some(20)), Some(2), "energy started over");
        assert_eq!(
            r.observe(Some(0), Some(20)),
            Some(2),
            "the same again: no reset"
        );
    }

    #[test]
    fn field_values_read_as_numbers_and_errors_as_unknown() {
        let sample = |value: Result<SampleValue, NvmlError>| {
            Ok(FieldValueSample {
                field: FieldId(NVML_FI_DEV_REMAPPED_PENDING),
                timestamp: 0,
                latency: 0,
                value,
            })
        };
        assert_eq!(field_value(&sample(Ok(SampleValue::U32(1)))), Some(1));
        assert_eq!(field_value(&sample(Ok(SampleValue::U64(0)))), Some(0));
        assert_eq!(field_value(&sample(Ok(SampleValue::I64(-1)))), None);
        assert_eq!(field_value(&sample(Err(NvmlError::NotSupported))), None);
        assert_eq!(field_value(&Err(NvmlError::GpuLost)), None);
        assert_eq!(RecoveryAction::from_nvml(0), RecoveryAction::None);
        assert_eq!(RecoveryAction::from_nvml(1), RecoveryAction::GpuReset);
        assert_eq!(RecoveryAction::from_nvml(9), RecoveryAction::Unknown(9));
    }
}
