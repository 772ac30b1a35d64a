//! Wiring: opens the backend and runs every loop of the plugin until shutdown.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::config::{BackendChoice, RunConfig};
use crate::labels;
use crate::metrics::{self, Metrics, MetricsError};
use crate::monitor::{self, Monitor, MonitorError};
use crate::plugin::registration::{self, KubeletSettings};
use crate::plugin::service::AllocateOptions;
use crate::rm::allocator::{AllocationError, Topology};
use crate::rm::backend::fake::FakeBackend;
use crate::rm::backend::nvml::NvmlBackend;
use crate::rm::backend::{BackendError, GpuBackend, GpuInfo, ProbeOutcome};
use crate::rm::calls::BoundedCalls;
use crate::rm::devices::DeviceState;
use crate::rm::health::{HealthTracker, owed_reset};
use crate::rm::owed::OwedStore;

/// Why the plugin could not start.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The backend could not be opened or watched.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The first inventory could not be read.
    #[error(transparent)]
    Monitor(#[from] MonitorError),
    /// The metrics server could not start.
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    /// The GPUs cannot be turned into a topology.
    #[error(transparent)]
    Topology(#[from] AllocationError),
    /// The state directory (`--state-dir`) cannot be used.
    #[error("state directory {}: {source}", dir.display())]
    StateDir {
        /// The directory.
        dir: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Opens the backend the configuration names.
pub(crate) fn open_backend(choice: &BackendChoice) -> Result<Arc<dyn GpuBackend>, BackendError> {
    Ok(match choice {
        BackendChoice::Fake(path) => Arc::new(FakeBackend::open(path)?),
        BackendChoice::Nvml | BackendChoice::Auto => Arc::new(NvmlBackend::init()?),
    })
}

/// Logs what start-up found: the GPUs, how many are healthy, the driver.
fn log_discovered(backend: &str, snapshot: &DeviceState) {
    let (healthy, unhealthy) = snapshot.health_counts();
    tracing::info!(
        backend,
        gpus = snapshot.inventory.gpus.len(),
        healthy,
        unhealthy,
        driver = %snapshot.inventory.driver.driver_version,
        cuda = %snapshot.inventory.driver.cuda_version,
        "discovered GPUs"
    );
}

/// Runs the device plugin until `shutdown` is cancelled.
///
/// Start-up problems (bad fake file, no driver, metrics port taken) are
/// returned; everything after start-up is retried and logged instead.
pub async fn run(config: RunConfig, shutdown: CancellationToken) -> Result<(), RunError> {
    let backend = open_backend(&config.backend)?;
    let metrics = Arc::new(
        Metrics::new(config.node_name.clone().unwrap_or_default()).with_liveness(config.liveness),
    );
    let tracker = HealthTracker::new(config.health.clone());
    let calls = Arc::new(BoundedCalls::new(config.gpu_call_timeout));
    let owed = match &config.state_dir {
        Some(dir) => Some(OwedStore::open(dir).map_err(|source| RunError::StateDir {
            dir: dir.clone(),
            source,
        })?),
        None => None,
    };
    let (monitor, state) = Monitor::start(
        Arc::clone(&backend),
        tracker,
        Arc::clone(&metrics),
        config.probe_interval,
        Arc::clone(&calls),
        owed,
    )
    .await?;
    log_discovered(backend.name(), &state.borrow());
    let tasks = shutdown.child_token();
    let (events_tx, events_rx) = tokio::sync::mpsc::unbounded_channel();
    Arc::clone(&backend).watch(events_tx, tasks.clone())?;

    let mut handles = Vec::new();
    if let Some(addr) = config.metrics_addr {
        let (_, serving) = metrics::serve(addr, Arc::clone(&metrics), tasks.clone()).await?;
        handles.push(serving);
    }
    handles.push(tokio::spawn(monitor.run(events_rx, tasks.clone())));
    handles.push(tokio::spawn(monitor::run_telemetry(
        Arc::clone(&backend),
        state.clone(),
        Arc::clone(&metrics),
        config.metrics_interval,
        calls,
        tasks.clone(),
    )));
    if let Some(node) = config.node_name.clone() {
        handles.push(tokio::spawn(labels::run(
            node,
            config.label_writer.clone(),
            state.clone(),
            config.label_check_interval,
            tasks.clone(),
        )));
    }

    let settings = KubeletSettings {
        dir: config.device_plugin_dir.clone(),
        socket_name: config.socket_name(),
        resource_name: config.resource_name.clone(),
        clients: config.grpc_clients,
    };
    let options = AllocateOptions {
        strategy: config.device_list_strategy,
        pass_device_specs: config.pass_device_specs,
    };
    registration::run(
        settings,
        state,
        options,
        Arc::clone(&metrics),
        shutdown.clone(),
    )
    .await;

    tasks.cancel();
    for handle in handles {
        // A loop that does not stop promptly must not hold up the exit.
        let _ = tokio::time::timeout(Duration::from_secs(2), handle).await;
    }
    Ok(())
}

/// One GPU in the `discover` report.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveredGpu {
    /// What the backend reports.
    #[serde(flatten)]
    pub info: GpuInfo,
    /// `Healthy`, `Unhealthy` or `Unknown` (probe inconclusive).
    pub health: &'static str,
    /// Why, when not healthy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health_reason: Option<String>,
}

/// A GPU in the `discover` report that could not be read at all.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UnreadableGpu {
    /// The device ID it is advertised under: its UUID, or `unreadable-gpu-<index>`.
    pub id: String,
    /// The driver's index.
    pub index: u32,
    /// Always `Unhealthy`.
    pub health: &'static str,
    /// The error.
    pub health_reason: String,
}

/// The NVLink matrix in GPU index order.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveredTopology {
    /// UUIDs, in the order of the matrix rows.
    pub gpus: Vec<String>,
    /// `nvlinks[i][j]`: links between GPU i and GPU j.
    pub nvlinks: Vec<Vec<u32>>,
    /// NUMA node of each GPU.
    pub numa_nodes: Vec<Option<i64>>,
}

/// What `discover` prints.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DiscoverReport {
    /// Backend name.
    pub backend: &'static str,
    /// Driver version.
    pub driver_version: String,
    /// Highest CUDA version the driver supports.
    pub cuda_version: String,
    /// Every GPU with its probed health.
    pub gpus: Vec<DiscoveredGpu>,
    /// GPUs the driver counts but whose facts could not be read.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unreadable_gpus: Vec<UnreadableGpu>,
    /// Link matrix.
    pub topology: DiscoveredTopology,
    /// The node labels `run` would apply.
    pub labels: std::collections::BTreeMap<String, String>,
}

/// Builds the `discover` report: inventory, one probe per GPU, topology, labels.
pub fn discover(choice: &BackendChoice) -> Result<DiscoverReport, RunError> {
    let backend = open_backend(choice)?;
    let inventory = backend.inventory()?;
    let topology = Topology::new(&inventory.gpus)?;
    let gpus = inventory
        .gpus
        .iter()
        .map(|gpu| {
            let probed = match inventory.fault(&gpu.uuid) {
                Some(fault) => ProbeOutcome::Unhealthy(fault.error.clone()),
                None => backend.probe(&gpu.uuid),
            };
            // As `run` starts: a GPU that owes a reset is not usable, whatever the probe says.
            let owed = owed_reset(&backend.reset_evidence(&gpu.uuid));
            let (health, health_reason) = match (probed, owed) {
                (ProbeOutcome::Unhealthy(error), _) => ("Unhealthy", Some(error.to_string())),
                (_, Some(owed)) => (
                    "Unhealthy",
                    Some(format!("{owed}; waiting for a GPU reset")),
                ),
                (ProbeOutcome::Healthy, None) => ("Healthy", None),
                (ProbeOutcome::Inconclusive(reason), None) => ("Unknown", Some(reason)),
            };
            DiscoveredGpu {
                info: gpu.clone(),
                health,
                health_reason,
            }
        })
        .collect();
    Ok(DiscoverReport {
        backend: backend.name(),
        driver_version: inventory.driver.driver_version.clone(),
        cuda_version: inventory.driver.cuda_version.clone(),
        labels: labels::node_labels(&inventory),
        topology: DiscoveredTopology {
            gpus: topology.ids().to_vec(),
            nvlinks: topology.link_matrix(),
            numa_nodes: (0..topology.len()).map(|i| topology.numa(i)).collect(),
        },
        gpus,
        unreadable_gpus: inventory
            .faults_without_facts()
            .map(|fault| UnreadableGpu {
                id: fault.device_id(),
                index: fault.index,
                health: "Unhealthy",
                health_reason: fault.error.to_string(),
            })
            .collect(),
    })
}
