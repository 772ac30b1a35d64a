//! A backend that reads GPUs from a YAML file and follows its changes.
//!
//! CI and the local cluster have no GPUs; this backend lets them run the
//! whole plugin and lets tests add or remove GPUs, flip health or change
//! topology while the plugin runs. The file is re-read on every inotify
//! event in its directory (ConfigMap updates swap a symlink, so watching the
//! file alone misses them) and, as a fallback, whenever a cheap metadata poll
//! sees a different mtime, size or inode.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use notify::Watcher;
use serde::Deserialize;
use tokio::sync::Notify;
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;
use trainyard_api::Version;
use trainyard_api::version::is_dotted_numbers;

use super::{
    BackendError, BackendEvent, ComputeCapability, DeviceError, DeviceErrorKind, DriverInfo,
    FailedRead, GpuBackend, GpuInfo, Inventory, KnownGpus, NvlinkLanes, ProbeOutcome,
    RecoveryAction, ResetEvidence, Telemetry, ThrottleReason,
};

/// Driver version reported when the file does not name one.
pub(crate) const DEFAULT_DRIVER_VERSION: &str = "550.54.15";
/// CUDA version reported when the file does not name one.
pub(crate) const DEFAULT_CUDA_VERSION: &str = "12.4";
/// Compute capability reported when a GPU does not name one.
pub(crate) const DEFAULT_COMPUTE_CAPABILITY: ComputeCapability =
    ComputeCapability { major: 8, minor: 0 };
/// XID reported for a GPU marked unhealthy without one (79: fallen off the bus).
pub(crate) const DEFAULT_UNHEALTHY_XID: u64 = 79;

const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Longest `probeDelaySeconds`: a day is a hang for every purpose.
pub(crate) const MAX_PROBE_DELAY_SECONDS: f64 = 86_400.0;
/// How often a delayed probe looks at the file again, so that an edit
/// lowering the delay ends a probe in progress.
const PROBE_DELAY_RECHECK: Duration = Duration::from_millis(50);
const MIB: u64 = 1024 * 1024;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileSpec {
    driver_version: Option<String>,
    cuda_version: Option<String>,
    #[serde(default)]
    gpus: Vec<GpuSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct GpuSpec {
    uuid: String,
    index: Option<u32>,
    name: String,
    #[serde(rename = "memoryMiB")]
    memory_mib: u64,
    numa_node: Option<i64>,
    pci_bus_id: Option<String>,
    compute_capability: Option<String>,
    #[serde(default = "default_true")]
    healthy: bool,
    xid: Option<u64>,
    error: Option<DeviceErrorKind>,
    #[serde(default)]
    retired_pages_pending: bool,
    #[serde(default)]
    row_remap_pending: bool,
    #[serde(default)]
    row_remap_failed: bool,
    recovery_action: Option<RecoveryAction>,
    #[serde(default)]
    nvlink_lanes_down: u32,
    probe_delay_seconds: Option<f64>,
    #[serde(default)]
    nvlinks: BTreeMap<String, u32>,
    utilization_percent: Option<f64>,
    memory_utilization_percent: Option<f64>,
    #[serde(rename = "memoryUsedMiB")]
    memory_used_mib: Option<u64>,
    temperature_c: Option<f64>,
    power_w: Option<f64>,
    power_limit_w: Option<f64>,
    sm_clock_m_hz: Option<f64>,
    mem_clock_m_hz: Option<f64>,
    #[serde(default)]
    throttle_reasons: BTreeSet<ThrottleReason>,
}

fn default_true() -> bool {
    true
}

/// Per-GPU facts that only the fake file has.
#[derive(Debug, Clone, PartialEq)]
struct FakeGpuState {
    healthy: bool,
    xid: u64,
    /// The error every NVML call on this GPU would return.
    error: Option<DeviceErrorKind>,
    reset: FakeResetState,
    telemetry: Telemetry,
    /// How long a probe of this GPU takes, as a hung NVML call would.
    probe_delay: Duration,
}

/// What the file says a reset probe would find.
#[derive(Debug, Clone, PartialEq)]
struct FakeResetState {
    retired_pages_pending: bool,
    row_remap_pending: bool,
    row_remap_failed: bool,
    recovery_action: RecoveryAction,
    /// Lanes are counted as the file's link counts to all peers.
    nvlink_lanes: u32,
    nvlink_lanes_down: u32,
}

/// A validated fake GPU file.
#[derive(Debug, Clone, PartialEq)]
pub struct FakeNode {
    inventory: Inventory,
    states: BTreeMap<String, FakeGpuState>,
}

impl FakeNode {
    /// The GPUs and driver facts the file describes.
    pub fn inventory(&self) -> &Inventory {
        &self.inventory
    }

    /// Parses and validates the contents of a fake GPU file; `path` only names it in errors.
    pub fn parse(path: &Path, text: &str) -> Result<Self, BackendError> {
        let spec: FileSpec =
            serde_saphyr::from_str(text).map_err(|e| BackendError::FakeFileParse {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?;
        validate(path, spec)
    }

    /// Reads, parses and validates a fake GPU file.
    pub(crate) fn load(path: &Path) -> Result<Self, BackendError> {
        let text = std::fs::read_to_string(path).map_err(|source| BackendError::FakeFileRead {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(path, &text)
    }
}

/// A field of the fake file and what is wrong with it; [`validate`] adds the file's path.
#[derive(Debug)]
struct Invalid {
    field: String,
    problem: String,
}

impl Invalid {
    fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            problem: problem.into(),
        }
    }

    /// A problem with field `name` of the GPU at position `pos` in the file.
    fn gpu(pos: usize, name: &str, problem: impl Into<String>) -> Self {
        Self::new(format!("gpus[{pos}].{name}"), problem)
    }
}

/// NVLink counts by pair of UUIDs, the smaller UUID first: each pair once.
type Links = BTreeMap<(String, String), u32>;

fn validate(path: &Path, spec: FileSpec) -> Result<FakeNode, BackendError> {
    fake_node(spec).map_err(|Invalid { field, problem }| BackendError::FakeFileInvalid {
        path: path.to_path_buf(),
        field,
        problem,
    })
}

/// The checks run in this order and stop at the first problem, so a file with several
/// problems always names the same one: the versions, then every GPU in file order, then the
/// links between them, then what depends on the links.
fn fake_node(spec: FileSpec) -> Result<FakeNode, Invalid> {
    let driver_version = driver_version(spec.driver_version)?;
    let cuda_version = cuda_version(spec.cuda_version)?;
    let uuids = check_gpus(&spec.gpus)?;
    let links = symmetric_links(&spec.gpus, &uuids)?;
    let mut gpus = Vec::with_capacity(spec.gpus.len());
    let mut states = BTreeMap::new();
    for (pos, gpu) in spec.gpus.into_iter().enumerate() {
        let (info, state) = fake_gpu(pos, gpu, &links)?;
        states.insert(info.uuid.clone(), state);
        gpus.push(info);
    }
    gpus.sort_by_key(|g| g.index);
    Ok(FakeNode {
        inventory: Inventory {
            driver: DriverInfo {
                driver_version,
                cuda_version,
            },
            gpus,
            faults: Vec::new(),
        },
        states,
    })
}

/// The file's driver version, or the default: dotted numbers, as NVML reports one.
fn driver_version(given: Option<String>) -> Result<String, Invalid> {
    let version = given.unwrap_or_else(|| DEFAULT_DRIVER_VERSION.to_string());
    if !is_dotted_numbers(&version) {
        return Err(Invalid::new(
            "driverVersion",
            format!("expected dotted numbers like \"550.54.15\", got {version:?}"),
        ));
    }
    Ok(version)
}

/// The file's CUDA version, or the default: "major.minor".
fn cuda_version(given: Option<String>) -> Result<String, Invalid> {
    let version = given.unwrap_or_else(|| DEFAULT_CUDA_VERSION.to_string());
    version
        .parse::<Version>()
        .map_err(|e| Invalid::new("cudaVersion", e.to_string()))?;
    Ok(version)
}

/// Checks every GPU completely, in file order: its identity, then its values. Returns the
/// UUIDs, which the links may name.
fn check_gpus(gpus: &[GpuSpec]) -> Result<BTreeSet<&str>, Invalid> {
    let mut positions: BTreeMap<&str, usize> = BTreeMap::new();
    let mut indices: BTreeMap<u32, usize> = BTreeMap::new();
    for (pos, gpu) in gpus.iter().enumerate() {
        check_uuid(&gpu.uuid).map_err(|problem| Invalid::gpu(pos, "uuid", problem))?;
        if let Some(first) = positions.insert(&gpu.uuid, pos) {
            return Err(Invalid::gpu(
                pos,
                "uuid",
                format!("duplicate uuid {} (also gpus[{first}])", gpu.uuid),
            ));
        }
        let index = gpu.index.unwrap_or(pos as u32);
        if let Some(first) = indices.insert(index, pos) {
            return Err(Invalid::gpu(
                pos,
                "index",
                format!("duplicate index {index} (also gpus[{first}])"),
            ));
        }
        check_gpu_values(pos, gpu)?;
    }
    Ok(positions.into_keys().collect())
}

/// A device ID the kubelet accepts.
fn check_uuid(uuid: &str) -> Result<(), String> {
    if uuid.trim().is_empty() {
        return Err("must not be empty".into());
    }
    // The kubelet rejects device IDs longer than 63 characters.
    if uuid.len() > 63 || !uuid.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "{uuid:?} must be at most 63 printable ASCII characters without spaces"
        ));
    }
    Ok(())
}

/// One GPU's facts other than its identity and links.
fn check_gpu_values(pos: usize, gpu: &GpuSpec) -> Result<(), Invalid> {
    if gpu.name.trim().is_empty() {
        return Err(Invalid::gpu(pos, "name", "must not be empty"));
    }
    if gpu.memory_mib == 0 {
        return Err(Invalid::gpu(pos, "memoryMiB", "must be greater than 0"));
    }
    check_telemetry(pos, gpu)?;
    if let Some(delay) = gpu.probe_delay_seconds
        && !(delay.is_finite() && (0.0..=MAX_PROBE_DELAY_SECONDS).contains(&delay))
    {
        return Err(Invalid::gpu(
            pos,
            "probeDelaySeconds",
            format!("{delay} is not within 0..={MAX_PROBE_DELAY_SECONDS}"),
        ));
    }
    if let Some(numa) = gpu.numa_node
        && numa < 0
    {
        return Err(Invalid::gpu(pos, "numaNode", format!("{numa} is negative")));
    }
    if let Some(cc) = &gpu.compute_capability {
        cc.parse::<ComputeCapability>()
            .map_err(|e| Invalid::gpu(pos, "computeCapability", e))?;
    }
    Ok(())
}

/// The telemetry the file reports for one GPU: memory in use, percentages and readings.
fn check_telemetry(pos: usize, gpu: &GpuSpec) -> Result<(), Invalid> {
    if let Some(used) = gpu.memory_used_mib
        && used > gpu.memory_mib
    {
        return Err(Invalid::gpu(
            pos,
            "memoryUsedMiB",
            format!("{used} exceeds memoryMiB {}", gpu.memory_mib),
        ));
    }
    for (name, value) in [
        ("utilizationPercent", gpu.utilization_percent),
        ("memoryUtilizationPercent", gpu.memory_utilization_percent),
    ] {
        if let Some(v) = value
            && !(0.0..=100.0).contains(&v)
        {
            return Err(Invalid::gpu(
                pos,
                name,
                format!("{v} is not within 0..=100"),
            ));
        }
    }
    for (name, value) in [
        ("temperatureC", gpu.temperature_c),
        ("powerW", gpu.power_w),
        ("powerLimitW", gpu.power_limit_w),
        ("smClockMHz", gpu.sm_clock_m_hz),
        ("memClockMHz", gpu.mem_clock_m_hz),
    ] {
        if let Some(v) = value
            && !(v.is_finite() && v >= 0.0)
        {
            return Err(Invalid::gpu(
                pos,
                name,
                format!("{v} must be a non-negative number"),
            ));
        }
    }
    Ok(())
}

/// The links of all GPUs, each pair once. Links are symmetric: a pair listed on one side only
/// counts for both, a pair listed on both sides must agree.
fn symmetric_links(gpus: &[GpuSpec], uuids: &BTreeSet<&str>) -> Result<Links, Invalid> {
    let mut links = Links::new();
    for (pos, gpu) in gpus.iter().enumerate() {
        for (peer, &count) in &gpu.nvlinks {
            let field = format!("gpus[{pos}].nvlinks.{peer}");
            check_link(&gpu.uuid, peer, count, uuids)
                .map_err(|problem| Invalid::new(field.clone(), problem))?;
            let key = if gpu.uuid < *peer {
                (gpu.uuid.clone(), peer.clone())
            } else {
                (peer.clone(), gpu.uuid.clone())
            };
            if let Some(previous) = links.insert(key, count)
                && previous != count
            {
                return Err(Invalid::new(
                    field,
                    format!(
                        "{count} links, but {peer} lists {previous} links back to {}",
                        gpu.uuid
                    ),
                ));
            }
        }
    }
    Ok(links)
}

/// One side's entry for a link from `uuid` to `peer`.
fn check_link(uuid: &str, peer: &str, count: u32, uuids: &BTreeSet<&str>) -> Result<(), String> {
    if !uuids.contains(peer) {
        return Err(format!("unknown nvlink peer {peer}"));
    }
    if peer == uuid {
        return Err("a GPU cannot link to itself".into());
    }
    if count == 0 {
        return Err("link count must be at least 1 (omit the peer instead)".into());
    }
    Ok(())
}

/// What the plugin sees of one (checked) GPU, and what only the fake file knows of it.
fn fake_gpu(pos: usize, gpu: GpuSpec, links: &Links) -> Result<(GpuInfo, FakeGpuState), Invalid> {
    let index = gpu.index.unwrap_or(pos as u32);
    let lanes = nvlinks_sum(links, &gpu.uuid);
    if gpu.nvlink_lanes_down > lanes {
        return Err(Invalid::gpu(
            pos,
            "nvlinkLanesDown",
            format!(
                "{} exceeds the {lanes} NVLink lanes to its peers",
                gpu.nvlink_lanes_down
            ),
        ));
    }
    let compute_capability = match &gpu.compute_capability {
        Some(cc) => cc
            .parse()
            .map_err(|e| Invalid::gpu(pos, "computeCapability", e))?,
        None => DEFAULT_COMPUTE_CAPABILITY,
    };
    let state = fake_state(&gpu, lanes);
    let info = GpuInfo {
        nvlinks: peers(links, &gpu.uuid),
        uuid: gpu.uuid,
        index,
        minor_number: index,
        name: gpu.name,
        memory_mib: gpu.memory_mib,
        pci_bus_id: gpu.pci_bus_id,
        numa_node: gpu.numa_node,
        compute_capability,
    };
    Ok((info, state))
}

/// The facts of a GPU that only the fake file has; `lanes` are its NVLink lanes to all peers.
fn fake_state(gpu: &GpuSpec, lanes: u32) -> FakeGpuState {
    FakeGpuState {
        healthy: gpu.healthy,
        xid: gpu.xid.unwrap_or(DEFAULT_UNHEALTHY_XID),
        error: gpu.error,
        reset: FakeResetState {
            retired_pages_pending: gpu.retired_pages_pending,
            row_remap_pending: gpu.row_remap_pending,
            row_remap_failed: gpu.row_remap_failed,
            recovery_action: gpu.recovery_action.unwrap_or(RecoveryAction::None),
            nvlink_lanes: lanes,
            nvlink_lanes_down: gpu.nvlink_lanes_down,
        },
        telemetry: Telemetry {
            utilization_percent: gpu.utilization_percent,
            memory_utilization_percent: gpu.memory_utilization_percent,
            memory_used_bytes: gpu.memory_used_mib.map(|m| m * MIB),
            memory_total_bytes: Some(gpu.memory_mib * MIB),
            temperature_celsius: gpu.temperature_c,
            power_draw_watts: gpu.power_w,
            power_limit_watts: gpu.power_limit_w,
            sm_clock_mhz: gpu.sm_clock_m_hz,
            memory_clock_mhz: gpu.mem_clock_m_hz,
            throttle_reasons: Some(gpu.throttle_reasons.clone()),
        },
        probe_delay: Duration::from_secs_f64(gpu.probe_delay_seconds.unwrap_or(0.0)),
    }
}

/// The peers of `uuid` and the link count to each.
fn peers(links: &Links, uuid: &str) -> BTreeMap<String, u32> {
    links
        .iter()
        .filter_map(|((a, b), &count)| {
            if a == uuid {
                Some((b.clone(), count))
            } else if b == uuid {
                Some((a.clone(), count))
            } else {
                None
            }
        })
        .collect()
}

/// Lanes of `uuid`: the sum of its (symmetric) link counts.
fn nvlinks_sum(links: &Links, uuid: &str) -> u32 {
    links
        .iter()
        .filter(|((a, b), _)| a == uuid || b == uuid)
        .map(|(_, &count)| count)
        .sum()
}

/// Identity of the file's current contents, cheap to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Fingerprint {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

fn fingerprint(path: &Path) -> Option<Fingerprint> {
    use std::os::unix::fs::MetadataExt;
    // `metadata` follows symlinks, so a ConfigMap's `..data` swap shows up.
    let meta = std::fs::metadata(path).ok()?;
    Some(Fingerprint {
        modified: meta.modified().ok(),
        len: meta.len(),
        inode: meta.ino(),
    })
}

/// The fake backend.
#[derive(Debug)]
pub(crate) struct FakeBackend {
    path: PathBuf,
    current: Mutex<Arc<FakeNode>>,
    /// As NVML's: a GPU whose `error` is set keeps the facts read before.
    known: Mutex<KnownGpus>,
    /// Resets counted per GPU: a GPU the file turns from `healthy: false`
    /// back to `healthy: true` has been repaired, which for the faults the
    /// fake plays (XID 79 by default) takes a reset.
    resets: Mutex<BTreeMap<String, u64>>,
}

impl FakeBackend {
    /// Loads the file; an invalid file is an error naming the file and the field.
    pub(crate) fn open(path: impl Into<PathBuf>) -> Result<Self, BackendError> {
        let path = path.into();
        let node = FakeNode::load(&path)?;
        Ok(Self {
            path,
            current: Mutex::new(Arc::new(node)),
            known: Mutex::default(),
            resets: Mutex::default(),
        })
    }

    /// The error the file sets for this GPU, as NVML would report it.
    fn device_error(&self, kind: DeviceErrorKind) -> DeviceError {
        DeviceError {
            kind,
            detail: format!("fake NVML error {kind:?} (set in {})", self.path.display()),
        }
    }

    /// Blocks, as a hung NVML call blocks its thread, until the GPU's
    /// `probeDelaySeconds` has passed since the probe began; the delay is
    /// read again while waiting, so lowering it in the file ends the wait.
    fn wait_out_probe_delay(&self, uuid: &str) {
        let began = std::time::Instant::now();
        loop {
            let delay = self
                .snapshot()
                .states
                .get(uuid)
                .map_or(Duration::ZERO, |s| s.probe_delay);
            let Some(left) = delay.checked_sub(began.elapsed()).filter(|d| !d.is_zero()) else {
                return;
            };
            std::thread::sleep(left.min(PROBE_DELAY_RECHECK));
        }
    }

    fn snapshot(&self) -> Arc<FakeNode> {
        Arc::clone(&self.current.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Re-reads the file and swaps it in when valid and different.
    ///
    /// Returns the events the change implies. An invalid file keeps the last
    /// good contents: a typo while editing must not take GPUs away.
    fn reload(&self) -> Result<Vec<BackendEvent>, BackendError> {
        let node = FakeNode::load(&self.path)?;
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if **current == node {
            return Ok(Vec::new());
        }
        let mut events = vec![BackendEvent::InventoryChanged];
        let mut resets = self.resets.lock().unwrap_or_else(PoisonError::into_inner);
        for (uuid, state) in &node.states {
            let was_healthy = current.states.get(uuid).is_none_or(|s| s.healthy);
            if was_healthy && !state.healthy {
                events.push(BackendEvent::Xid {
                    uuid: Some(uuid.clone()),
                    xid: state.xid,
                });
            }
            if !was_healthy && state.healthy {
                *resets.entry(uuid.clone()).or_default() += 1;
            }
        }
        *current = Arc::new(node);
        Ok(events)
    }
}

impl GpuBackend for FakeBackend {
    fn name(&self) -> &'static str {
        "fake"
    }

    fn inventory(&self) -> Result<Inventory, BackendError> {
        let node = self.snapshot();
        let reads = node
            .inventory
            .gpus
            .iter()
            .map(
                |gpu| match node.states.get(&gpu.uuid).and_then(|s| s.error) {
                    Some(kind) => Err(FailedRead {
                        index: gpu.index,
                        uuid: Some(gpu.uuid.clone()),
                        error: self.device_error(kind),
                    }),
                    None => Ok(gpu.clone()),
                },
            )
            .collect();
        let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(known.assemble(node.inventory.driver.clone(), reads))
    }

    fn probe(&self, uuid: &str) -> ProbeOutcome {
        self.wait_out_probe_delay(uuid);
        match self.snapshot().states.get(uuid) {
            Some(FakeGpuState {
                error: Some(kind), ..
            }) => ProbeOutcome::Unhealthy(self.device_error(*kind)),
            Some(state) if state.healthy => ProbeOutcome::Healthy,
            Some(state) => ProbeOutcome::Unhealthy(DeviceError {
                kind: DeviceErrorKind::Other,
                detail: format!(
                    "marked unhealthy in {} (xid {})",
                    self.path.display(),
                    state.xid
                ),
            }),
            None => ProbeOutcome::Unhealthy(DeviceError {
                kind: DeviceErrorKind::NotFound,
                detail: format!("no longer listed in {}", self.path.display()),
            }),
        }
    }

    fn reset_evidence(&self, uuid: &str) -> ResetEvidence {
        let node = self.snapshot();
        let Some(state) = node.states.get(uuid) else {
            return ResetEvidence::unreachable(DeviceError {
                kind: DeviceErrorKind::NotFound,
                detail: format!("no longer listed in {}", self.path.display()),
            });
        };
        if let Some(kind) = state.error {
            return ResetEvidence::unreachable(self.device_error(kind));
        }
        let reset = &state.reset;
        ResetEvidence {
            reachable: Ok(()),
            recovery_action: Some(reset.recovery_action),
            retired_pages_pending: Some(reset.retired_pages_pending),
            row_remap_pending: Some(reset.row_remap_pending),
            row_remap_failed: Some(reset.row_remap_failed),
            nvlink_lanes: Some(NvlinkLanes {
                active: reset.nvlink_lanes.saturating_sub(reset.nvlink_lanes_down),
                expected: reset.nvlink_lanes,
            }),
            resets: Some(
                self.resets
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get(uuid)
                    .copied()
                    .unwrap_or(0),
            ),
        }
    }

    fn telemetry(&self, uuid: &str) -> Result<Telemetry, BackendError> {
        let node = self.snapshot();
        let state = node
            .states
            .get(uuid)
            .ok_or_else(|| BackendError::UnknownGpu(uuid.to_string()))?;
        match state.error {
            Some(kind) => Err(BackendError::Device {
                uuid: uuid.to_string(),
                source: self.device_error(kind),
            }),
            None => Ok(state.telemetry.clone()),
        }
    }

    fn watch(
        self: Arc<Self>,
        events: UnboundedSender<BackendEvent>,
        shutdown: CancellationToken,
    ) -> Result<(), BackendError> {
        let wake = Arc::new(Notify::new());
        let dir = self
            .path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_path_buf();
        let watcher = {
            let wake = Arc::clone(&wake);
            notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
                // Our own reads raise access events; reacting to them would
                // re-read the file in a loop.
                if res.is_ok_and(|e| !e.kind.is_access()) {
                    wake.notify_one();
                }
            })
            .and_then(|mut w| {
                w.watch(&dir, notify::RecursiveMode::NonRecursive)
                    .map(|()| w)
            })
        };
        let watcher = match watcher {
            Ok(w) => Some(w),
            Err(e) => {
                // The poll below still notices changes, only more slowly.
                tracing::warn!(dir = %dir.display(), error = %e, "cannot watch fake GPU file directory; polling only");
                None
            }
        };
        tokio::spawn(async move {
            let _watcher = watcher;
            let mut seen = fingerprint(&self.path);
            let mut last_error: Option<String> = None;
            loop {
                let notified = tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = wake.notified() => true,
                    () = tokio::time::sleep(POLL_INTERVAL) => false,
                };
                let now = fingerprint(&self.path);
                if !notified && now == seen {
                    continue;
                }
                seen = now;
                match self.reload() {
                    Ok(new_events) => {
                        if !new_events.is_empty() {
                            tracing::info!(path = %self.path.display(), "fake GPU file changed");
                        }
                        last_error = None;
                        for event in new_events {
                            if events.send(event).is_err() {
                                return;
                            }
                        }
                    }
                    Err(e) => {
                        let message = e.to_string();
                        if last_error.as_deref() != Some(message.as_str()) {
                            tracing::error!(error = %message, "ignoring invalid fake GPU file; keeping the last valid contents");
                            last_error = Some(message);
                        }
                    }
                }
            }
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How long a test waits for the watcher: a bound on a hang, not a latency claim.
    const HANG_LIMIT: Duration = Duration::from_secs(30);

    fn parse(text: &str) -> Result<FakeNode, BackendError> {
        FakeNode::parse(Path::new("/etc/fake.yaml"), text)
    }

    const TWO: &str = r#"
gpus:
  - uuid: GPU-a
    index: 0
    name: NVIDIA A100-SXM4-80GB
    memoryMiB: 81920
    numaNode: 0
    nvlinks: {GPU-b: 2}
  - uuid: GPU-b
    index: 1
    name: NVIDIA A100-SXM4-80GB
    memoryMiB: 81920
    numaNode: 1
    healthy: false
    xid: 48
    computeCapability: "9.0"
    utilizationPercent: 87
    memoryUsedMiB: 100
    throttleReasons: [thermal, power_cap]
"#;

    #[test]
    fn valid_file_yields_symmetric_links_and_defaults() {
        let node = parse(TWO).unwrap();
        let inv = node.inventory();
        assert_eq!(inv.driver.driver_version, DEFAULT_DRIVER_VERSION);
        assert_eq!(inv.driver.cuda_version, DEFAULT_CUDA_VERSION);
        assert_eq!(inv.gpus[0].nvlinks.get("GPU-b"), Some(&2));
        assert_eq!(inv.gpus[1].nvlinks.get("GPU-a"), Some(&2));
        assert_eq!(inv.gpus[0].compute_capability, DEFAULT_COMPUTE_CAPABILITY);
        assert_eq!(inv.gpus[1].compute_capability.to_string(), "9.0");
        let b = &node.states["GPU-b"];
        assert!(!b.healthy);
        assert_eq!(b.xid, 48);
        assert_eq!(b.telemetry.memory_used_bytes, Some(100 * MIB));
        assert_eq!(
            b.telemetry.throttle_reasons,
            Some(BTreeSet::from([
                ThrottleReason::Thermal,
                ThrottleReason::PowerCap
            ]))
        );
    }

    fn invalid_field(text: &str) -> (String, String) {
        match parse(text) {
            Err(BackendError::FakeFileInvalid { field, problem, .. }) => (field, problem),
            other => panic!("expected a validation error, got {other:?}"),
        }
    }

    #[test]
    fn duplicate_uuid_is_rejected_naming_the_field() {
        let (field, problem) = invalid_field(
            "gpus:\n  - {uuid: GPU-a, name: x, memoryMiB: 1}\n  - {uuid: GPU-a, name: x, memoryMiB: 1}\n",
        );
        assert_eq!(field, "gpus[1].uuid");
        assert!(problem.contains("duplicate uuid GPU-a"), "{problem}");
    }

    #[test]
    fn unknown_nvlink_peer_is_rejected_naming_the_field() {
        let (field, problem) =
            invalid_field("gpus:\n  - {uuid: GPU-a, name: x, memoryMiB: 1, nvlinks: {GPU-z: 2}}\n");
        assert_eq!(field, "gpus[0].nvlinks.GPU-z");
        assert!(problem.contains("unknown nvlink peer GPU-z"), "{problem}");
    }

    #[test]
    fn asymmetric_link_counts_are_rejected() {
        let (field, _) = invalid_field(
            "gpus:\n  - {uuid: GPU-a, name: x, memoryMiB: 1, nvlinks: {GPU-b: 2}}\n  - {uuid: GPU-b, name: x, memoryMiB: 1, nvlinks: {GPU-a: 3}}\n",
        );
        assert_eq!(field, "gpus[1].nvlinks.GPU-a");
    }

    #[test]
    fn duplicate_index_bad_versions_and_percentages_are_rejected() {
        let (field, _) = invalid_field(
            "gpus:\n  - {uuid: GPU-a, index: 0, name: x, memoryMiB: 1}\n  - {uuid: GPU-b, index: 0, name: x, memoryMiB: 1}\n",
        );
        assert_eq!(field, "gpus[1].index");
        let (field, _) = invalid_field("cudaVersion: twelve\ngpus: []\n");
        assert_eq!(field, "cudaVersion");
        let (field, _) = invalid_field("driverVersion: 550.x\ngpus: []\n");
        assert_eq!(field, "driverVersion");
        let (field, _) = invalid_field(
            "gpus:\n  - {uuid: GPU-a, name: x, memoryMiB: 1, utilizationPercent: 120}\n",
        );
        assert_eq!(field, "gpus[0].utilizationPercent");
        let (field, _) = invalid_field(
            "gpus:\n  - {uuid: GPU-a, name: x, memoryMiB: 1, computeCapability: \"8\"}\n",
        );
        assert_eq!(field, "gpus[0].computeCapability");
    }

    #[test]
    fn a_file_with_several_problems_names_the_first_in_check_order() {
        // GPU 0's own values are checked before GPU 1's identity, and every GPU before any link.
        let (field, _) = invalid_field(
            "gpus:\n  - {uuid: GPU-a, name: x, memoryMiB: 1, numaNode: -1, nvlinks: {GPU-z: 1}}\n  - {uuid: GPU-a, name: x, memoryMiB: 1}\n",
        );
        assert_eq!(field, "gpus[0].numaNode");
        let (field, _) = invalid_field(
            "gpus:\n  - {uuid: GPU-a, name: x, memoryMiB: 1, nvlinks: {GPU-z: 1}}\n  - {uuid: GPU-a, name: x, memoryMiB: 1}\n",
        );
        assert_eq!(field, "gpus[1].uuid");
        // The versions come first of all, and a bad driver version reads as before.
        let text = "driverVersion: \"550..1\"\ncudaVersion: twelve\ngpus:\n  - {uuid: '', name: x, memoryMiB: 1}\n";
        let (field, problem) = invalid_field(text);
        assert_eq!(field, "driverVersion");
        assert_eq!(
            problem,
            r#"expected dotted numbers like "550.54.15", got "550..1""#
        );
    }

    #[test]
    fn unknown_fields_and_throttle_reasons_are_parse_errors_naming_the_file() {
        for text in [
            "gpus:\n  - {uuid: GPU-a, name: x, memoryMiB: 1, colour: red}\n",
            "gpus:\n  - {uuid: GPU-a, name: x, memoryMiB: 1, throttleReasons: [sleepy]}\n",
            "gpus: [",
        ] {
            let err = parse(text).unwrap_err();
            assert!(matches!(err, BackendError::FakeFileParse { .. }), "{err:?}");
            assert!(err.to_string().contains("/etc/fake.yaml"), "{err}");
        }
    }

    #[test]
    fn shipped_examples_are_valid() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
        let eight = FakeNode::load(&dir.join("fake-gpus-8.yaml")).unwrap();
        assert_eq!(eight.inventory().gpus.len(), 8);
        assert!(
            eight
                .inventory()
                .gpus
                .iter()
                .all(|g| g.nvlinks.len() == 7 && g.nvlinks.values().all(|&n| n == 12))
        );
        let sixteen = FakeNode::load(&dir.join("fake-gpus-16.yaml")).unwrap();
        assert_eq!(sixteen.inventory().gpus.len(), 16);
    }

    #[test]
    fn reload_reports_inventory_change_and_xid_of_newly_unhealthy_gpu() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gpus.yaml");
        std::fs::write(&path, TWO.replace("healthy: false", "healthy: true")).unwrap();
        let backend = FakeBackend::open(&path).unwrap();
        assert_eq!(backend.probe("GPU-b"), ProbeOutcome::Healthy);
        assert!(backend.reload().unwrap().is_empty());
        std::fs::write(&path, TWO).unwrap();
        assert_eq!(
            backend.reload().unwrap(),
            vec![
                BackendEvent::InventoryChanged,
                BackendEvent::Xid {
                    uuid: Some("GPU-b".into()),
                    xid: 48
                }
            ]
        );
        assert!(matches!(backend.probe("GPU-b"), ProbeOutcome::Unhealthy(_)));
        std::fs::write(&path, "gpus: [").unwrap();
        assert!(backend.reload().is_err());
        assert_eq!(backend.inventory().unwrap().gpus.len(), 2);
    }

    #[tokio::test]
    async fn watch_reports_in_place_edits_and_stops_on_shutdown() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gpus.yaml");
        std::fs::write(&path, TWO).unwrap();
        let backend = Arc::new(FakeBackend::open(&path).unwrap());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let shutdown = CancellationToken::new();
        Arc::clone(&backend).watch(tx, shutdown.clone()).unwrap();
        // An in-place write (no rename), as an editor or `echo >` does.
        std::fs::write(
            &path,
            TWO.replace("utilizationPercent: 87", "utilizationPercent: 12"),
        )
        .unwrap();
        let event = tokio::time::timeout(HANG_LIMIT, rx.recv()).await.unwrap();
        assert_eq!(event, Some(BackendEvent::InventoryChanged));
        assert_eq!(
            backend.telemetry("GPU-b").unwrap().utilization_percent,
            Some(12.0)
        );
        shutdown.cancel();
        // The watcher task drops its sender when it stops.
        let closed = tokio::time::timeout(HANG_LIMIT, rx.recv()).await.unwrap();
        assert_eq!(closed, None);
    }

    #[test]
    fn a_gpu_with_an_error_is_a_fault_of_the_inventory_and_its_probes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gpus.yaml");
        let text = TWO.replace("    xid: 48\n", "    xid: 48\n    error: GpuLost\n");
        std::fs::write(&path, &text).unwrap();
        let backend = FakeBackend::open(&path).unwrap();
        let inv = backend.inventory().unwrap();
        assert_eq!(inv.gpus.len(), 1);
        assert_eq!(inv.faults.len(), 1);
        assert_eq!(inv.faults[0].uuid.as_deref(), Some("GPU-b"));
        assert_eq!(inv.faults[0].error.kind, DeviceErrorKind::GpuLost);
        assert!(matches!(
            backend.probe("GPU-b"),
            ProbeOutcome::Unhealthy(DeviceError {
                kind: DeviceErrorKind::GpuLost,
                ..
            })
        ));
        assert!(backend.reset_evidence("GPU-b").reachable.is_err());
        assert!(matches!(
            backend.telemetry("GPU-b"),
            Err(BackendError::Device { .. })
        ));
        // The error clears but a row remapping waits for the reset.
        std::fs::write(
            &path,
            TWO.replace("    xid: 48\n", "    xid: 48\n    rowRemapPending: true\n"),
        )
        .unwrap();
        backend.reload().unwrap();
        assert_eq!(backend.inventory().unwrap().faults, vec![]);
        let evidence = backend.reset_evidence("GPU-b");
        assert_eq!(evidence.row_remap_pending, Some(true));
        assert_eq!(evidence.recovery_action, Some(RecoveryAction::None));
        assert_eq!(
            evidence.nvlink_lanes,
            Some(NvlinkLanes {
                active: 2,
                expected: 2
            })
        );
    }

    #[test]
    fn reset_fields_are_validated() {
        let (field, _) = invalid_field(
            "gpus:\n  - {uuid: GPU-a, name: x, memoryMiB: 1, nvlinks: {GPU-b: 2}, nvlinkLanesDown: 3}\n  - {uuid: GPU-b, name: x, memoryMiB: 1}\n",
        );
        assert_eq!(field, "gpus[0].nvlinkLanesDown");
        for text in [
            "gpus:\n  - {uuid: GPU-a, name: x, memoryMiB: 1, error: Exploded}\n",
            "gpus:\n  - {uuid: GPU-a, name: x, memoryMiB: 1, recoveryAction: pray}\n",
        ] {
            let err = parse(text).unwrap_err();
            assert!(matches!(err, BackendError::FakeFileParse { .. }), "{err:?}");
        }
        let node = parse(
            "gpus:\n  - {uuid: GPU-a, name: x, memoryMiB: 1, error: ResetRequired, recoveryAction: drain_and_reset}\n",
        )
        .unwrap();
        let a = &node.states["GPU-a"];
        assert_eq!(a.error, Some(DeviceErrorKind::ResetRequired));
        assert_eq!(a.reset.recovery_action, RecoveryAction::DrainAndReset);
    }

    #[test]
    fn probe_delay_is_validated_like_the_other_fields() {
        for bad in ["-1", "100000", ".nan", ".inf"] {
            let (field, problem) = invalid_field(&format!(
                "gpus:\n  - {{uuid: GPU-a, name: x, memoryMiB: 1, probeDelaySeconds: {bad}}}\n"
            ));
            assert_eq!(field, "gpus[0].probeDelaySeconds", "{bad}");
            assert!(problem.contains("0..="), "{problem}");
        }
        let node =
            parse("gpus:\n  - {uuid: GPU-a, name: x, memoryMiB: 1, probeDelaySeconds: 0.5}\n")
                .unwrap();
        assert_eq!(node.states["GPU-a"].probe_delay, Duration::from_millis(500));
    }

    #[test]
    fn a_delayed_probe_blocks_until_the_file_lowers_the_delay() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fake.yaml");
        let hung = "gpus:\n  - {uuid: GPU-a, name: x, memoryMiB: 1, probeDelaySeconds: 3600}\n";
        std::fs::write(&path, hung).unwrap();
        let backend = Arc::new(FakeBackend::open(&path).unwrap());
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        {
            let backend = Arc::clone(&backend);
            std::thread::spawn(move || {
                let _ = done_tx.send(backend.probe("GPU-a"));
            });
        }
        assert!(
            done_rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "the probe returned although the file delays it for an hour"
        );
        std::fs::write(&path, hung.replace("3600", "0")).unwrap();
        backend.reload().unwrap();
        let outcome = done_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the probe ends once the delay is lowered");
        assert_eq!(outcome, ProbeOutcome::Healthy);
    }
}
