//! Background loops that keep the published device state and the telemetry
//! metrics current: backend events and periodic probes go through the health
//! state machine; samples are read on the metrics interval.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::allocator::{AllocationError, Topology};
use crate::backend::{BackendError, BackendEvent, GpuBackend, Inventory, ProbeOutcome, Telemetry};
use crate::devices::{DeviceState, StateReceiver};
use crate::health::{HealthTracker, Transition, XidVerdict};
use crate::metrics::Metrics;

/// Errors that stop the monitor from starting.
#[derive(Debug, thiserror::Error)]
pub enum MonitorError {
    /// The backend could not list GPUs.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The GPUs cannot be turned into a topology.
    #[error(transparent)]
    Topology(#[from] AllocationError),
    /// A blocking backend call panicked or was cancelled.
    #[error("backend task failed: {0}")]
    Join(String),
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, MonitorError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| MonitorError::Join(e.to_string()))
}

/// Keeps health and the published state current.
pub struct Monitor {
    backend: Arc<dyn GpuBackend>,
    tracker: HealthTracker,
    inventory: Inventory,
    topology: Arc<Topology>,
    state: watch::Sender<Arc<DeviceState>>,
    metrics: Arc<Metrics>,
    probe_interval: Duration,
}

impl Monitor {
    /// Reads the inventory, probes every GPU once and publishes the first state.
    pub async fn start(
        backend: Arc<dyn GpuBackend>,
        mut tracker: HealthTracker,
        metrics: Arc<Metrics>,
        probe_interval: Duration,
    ) -> Result<(Self, StateReceiver), MonitorError> {
        let inventory = {
            let backend = Arc::clone(&backend);
            blocking(move || backend.inventory()).await??
        };
        let topology = Arc::new(Topology::new(&inventory.gpus)?);
        tracker.sync(inventory.gpus.iter().map(|g| g.uuid.as_str()));
        let initial = Arc::new(DeviceState {
            inventory: inventory.clone(),
            health: Default::default(),
            topology: Arc::clone(&topology),
        });
        let (state, receiver) = watch::channel(initial);
        let mut monitor = Self {
            backend,
            tracker,
            inventory,
            topology,
            state,
            metrics,
            probe_interval,
        };
        monitor.probe_all().await;
        monitor.publish();
        Ok((monitor, receiver))
    }

    fn publish(&self) {
        let health = self
            .inventory
            .gpus
            .iter()
            .filter_map(|g| {
                self.tracker
                    .health(&g.uuid)
                    .map(|h| (g.uuid.clone(), h.clone()))
            })
            .collect();
        let state = Arc::new(DeviceState {
            inventory: self.inventory.clone(),
            health,
            topology: Arc::clone(&self.topology),
        });
        self.metrics.record_health(&state);
        self.state.send_replace(state);
    }

    fn log_transition(transition: &Transition) {
        match transition {
            Transition::BecameUnhealthy { uuid, reason } => {
                tracing::warn!(gpu = %uuid, %reason, "GPU is now unhealthy");
            }
            Transition::Recovered { uuid } => tracing::info!(gpu = %uuid, "GPU recovered"),
        }
    }

    /// Probes every GPU; returns whether any health changed.
    async fn probe_all(&mut self) -> bool {
        let uuids: Vec<String> = self.inventory.gpus.iter().map(|g| g.uuid.clone()).collect();
        let backend = Arc::clone(&self.backend);
        let outcomes = match blocking(move || {
            uuids
                .into_iter()
                .map(|uuid| {
                    let outcome = backend.probe(&uuid);
                    (uuid, outcome)
                })
                .collect::<Vec<_>>()
        })
        .await
        {
            Ok(outcomes) => outcomes,
            Err(e) => {
                tracing::warn!(error = %e, "probe failed; health unchanged");
                return false;
            }
        };
        let now = Instant::now();
        let mut changed = false;
        for (uuid, outcome) in outcomes {
            if let ProbeOutcome::Inconclusive(reason) = &outcome {
                tracing::debug!(gpu = %uuid, %reason, "inconclusive probe");
            }
            if let Some(t) = self.tracker.on_probe(&uuid, &outcome, now) {
                Self::log_transition(&t);
                changed = true;
            }
        }
        changed
    }

    async fn reload_inventory(&mut self) {
        let backend = Arc::clone(&self.backend);
        let inventory = match blocking(move || backend.inventory()).await {
            Ok(Ok(inventory)) => inventory,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot re-read GPUs; keeping the last inventory");
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot re-read GPUs; keeping the last inventory");
                return;
            }
        };
        if inventory.gpus != self.inventory.gpus {
            match Topology::new(&inventory.gpus) {
                Ok(topology) => self.topology = Arc::new(topology),
                Err(e) => {
                    tracing::error!(error = %e, "ignoring new inventory");
                    return;
                }
            }
            tracing::info!(gpus = inventory.gpus.len(), "GPU inventory changed");
        }
        self.inventory = inventory;
        self.tracker
            .sync(self.inventory.gpus.iter().map(|g| g.uuid.as_str()));
    }

    fn on_xid(&mut self, uuid: Option<String>, xid: u64) -> bool {
        let gpu = uuid
            .as_deref()
            .and_then(|u| self.inventory.gpus.iter().find(|g| g.uuid == u));
        self.metrics.record_xid(gpu, xid);
        match self.tracker.on_xid(uuid.as_deref(), xid, Instant::now()) {
            XidVerdict::Critical(Some(t)) => {
                Self::log_transition(&t);
                true
            }
            XidVerdict::Critical(None) => false,
            XidVerdict::Ignored => {
                tracing::info!(gpu = ?uuid, xid, "ignoring application XID");
                false
            }
            XidVerdict::Unattributed => {
                tracing::warn!(gpu = ?uuid, xid, "XID not tied to a known GPU; no GPU marked unhealthy");
                false
            }
        }
    }

    /// Runs until `shutdown` or until the backend's event channel closes.
    pub async fn run(
        mut self,
        mut events: UnboundedReceiver<BackendEvent>,
        shutdown: CancellationToken,
    ) {
        let mut probe = tokio::time::interval(self.probe_interval);
        probe.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        probe.tick().await;
        let mut events_open = true;
        loop {
            let changed = tokio::select! {
                () = shutdown.cancelled() => return,
                _ = probe.tick() => self.probe_all().await,
                event = events.recv(), if events_open => match event {
                    None => {
                        // No watcher any more: probes still keep health current.
                        tracing::debug!("backend event channel closed");
                        events_open = false;
                        false
                    }
                    Some(BackendEvent::InventoryChanged) => {
                        self.reload_inventory().await;
                        self.probe_all().await;
                        true
                    }
                    Some(BackendEvent::Xid { uuid, xid }) => self.on_xid(uuid, xid),
                    Some(BackendEvent::Unattributed(message)) => {
                        tracing::warn!(%message, "backend error not tied to a GPU; no GPU marked unhealthy");
                        false
                    }
                },
            };
            if changed {
                self.publish();
            }
        }
    }
}

/// Samples telemetry every `interval` (and when the device state changes)
/// into the per-GPU metrics, until `shutdown`.
pub async fn run_telemetry(
    backend: Arc<dyn GpuBackend>,
    mut state: StateReceiver,
    metrics: Arc<Metrics>,
    interval: Duration,
    shutdown: CancellationToken,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = ticker.tick() => {}
            changed = state.changed() => if changed.is_err() { return },
        }
        let snapshot = Arc::clone(&state.borrow_and_update());
        let uuids: Vec<String> = snapshot
            .inventory
            .gpus
            .iter()
            .map(|g| g.uuid.clone())
            .collect();
        let backend = Arc::clone(&backend);
        let samples = tokio::task::spawn_blocking(move || {
            uuids
                .into_iter()
                .filter_map(|uuid| match backend.telemetry(&uuid) {
                    Ok(t) => Some((uuid, t)),
                    Err(e) => {
                        tracing::debug!(gpu = %uuid, error = %e, "no telemetry sample");
                        None
                    }
                })
                .collect::<Vec<(String, Telemetry)>>()
        })
        .await;
        match samples {
            Ok(samples) => metrics.record_telemetry(&snapshot, &samples),
            Err(e) => tracing::warn!(error = %e, "telemetry sample failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use tokio::sync::mpsc::UnboundedSender;

    use super::*;
    use crate::backend::{ComputeCapability, DriverInfo, GpuInfo};
    use crate::health::{HealthPolicy, HealthTracker};

    /// A backend whose probe answers are set by the test.
    struct ScriptedBackend {
        probes: Mutex<BTreeMap<String, ProbeOutcome>>,
    }

    impl GpuBackend for ScriptedBackend {
        fn name(&self) -> &'static str {
            "scripted"
        }

        fn inventory(&self) -> Result<Inventory, BackendError> {
            let gpus = (0..2)
                .map(|i| GpuInfo {
                    uuid: format!("GPU-{i}"),
                    index: i,
                    minor_number: i,
                    name: "NVIDIA Test".into(),
                    memory_mib: 1,
                    pci_bus_id: None,
                    numa_node: None,
                    compute_capability: ComputeCapability { major: 8, minor: 0 },
                    nvlinks: BTreeMap::new(),
                })
                .collect();
            Ok(Inventory {
                driver: DriverInfo {
                    driver_version: "550.54.15".into(),
                    cuda_version: "12.4".into(),
                },
                gpus,
            })
        }

        fn probe(&self, uuid: &str) -> ProbeOutcome {
            self.probes
                .lock()
                .unwrap()
                .get(uuid)
                .cloned()
                .unwrap_or(ProbeOutcome::Healthy)
        }

        fn telemetry(&self, _uuid: &str) -> Result<Telemetry, BackendError> {
            Ok(Telemetry::default())
        }

        fn watch(
            self: Arc<Self>,
            _events: UnboundedSender<BackendEvent>,
            _shutdown: CancellationToken,
        ) -> Result<(), BackendError> {
            Ok(())
        }
    }

    async fn started(
        probes: BTreeMap<String, ProbeOutcome>,
    ) -> (
        Arc<ScriptedBackend>,
        StateReceiver,
        UnboundedSender<BackendEvent>,
        Arc<Metrics>,
        CancellationToken,
    ) {
        let backend = Arc::new(ScriptedBackend {
            probes: Mutex::new(probes),
        });
        let metrics = Arc::new(Metrics::new("n"));
        let tracker = HealthTracker::new(HealthPolicy {
            recovery_quiet_period: Duration::ZERO,
            ..HealthPolicy::default()
        });
        let (monitor, state) = Monitor::start(
            Arc::clone(&backend) as Arc<dyn GpuBackend>,
            tracker,
            Arc::clone(&metrics),
            Duration::from_secs(3600),
        )
        .await
        .unwrap();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let shutdown = CancellationToken::new();
        tokio::spawn(monitor.run(rx, shutdown.clone()));
        (backend, state, tx, metrics, shutdown)
    }

    #[tokio::test]
    async fn first_state_reflects_the_first_probe() {
        let probes =
            BTreeMap::from([("GPU-1".to_string(), ProbeOutcome::Unhealthy("lost".into()))]);
        let (_backend, state, _tx, _metrics, shutdown) = started(probes).await;
        assert_eq!(state.borrow().health_counts(), (1, 1));
        assert!(!state.borrow().is_healthy("GPU-1"));
        shutdown.cancel();
    }

    #[tokio::test]
    async fn unattributed_and_ignored_xids_change_nothing_but_are_counted() {
        let (_backend, mut state, tx, metrics, shutdown) = started(BTreeMap::new()).await;
        tx.send(BackendEvent::Xid {
            uuid: None,
            xid: 79,
        })
        .unwrap();
        tx.send(BackendEvent::Xid {
            uuid: Some("GPU-unknown".into()),
            xid: 79,
        })
        .unwrap();
        tx.send(BackendEvent::Xid {
            uuid: Some("GPU-0".into()),
            xid: 13,
        })
        .unwrap();
        tx.send(BackendEvent::Unattributed("event wait failed".into()))
            .unwrap();
        // A critical XID afterwards proves the earlier events were processed.
        tx.send(BackendEvent::Xid {
            uuid: Some("GPU-1".into()),
            xid: 48,
        })
        .unwrap();
        let snapshot = tokio::time::timeout(
            Duration::from_secs(5),
            state.wait_for(|s| !s.is_healthy("GPU-1")),
        )
        .await
        .unwrap()
        .unwrap()
        .clone();
        assert!(snapshot.is_healthy("GPU-0"));
        assert_eq!(snapshot.health_counts(), (1, 1));
        let text = metrics.render().unwrap();
        assert!(text.contains(r#"xid="13"} 1"#), "{text}");
        assert!(
            text.contains(
                r#"trainyard_gpu_xid_events_total{gpu="",index="",product="",node="n",xid="79"} 2"#
            ),
            "{text}"
        );
        shutdown.cancel();
    }

    #[tokio::test]
    async fn inconclusive_probes_keep_health_and_good_probes_recover() {
        let (backend, mut state, tx, _metrics, shutdown) = started(BTreeMap::new()).await;
        tx.send(BackendEvent::Xid {
            uuid: Some("GPU-0".into()),
            xid: 79,
        })
        .unwrap();
        tokio::time::timeout(
            Duration::from_secs(5),
            state.wait_for(|s| !s.is_healthy("GPU-0")),
        )
        .await
        .unwrap()
        .unwrap();
        // An inventory change re-probes: inconclusive keeps it unhealthy...
        backend.probes.lock().unwrap().insert(
            "GPU-0".into(),
            ProbeOutcome::Inconclusive("NVML busy".into()),
        );
        tx.send(BackendEvent::InventoryChanged).unwrap();
        tx.send(BackendEvent::Xid {
            uuid: Some("GPU-1".into()),
            xid: 13,
        })
        .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!state.borrow().is_healthy("GPU-0"));
        // ...and a good probe after the (zero) quiet period recovers it.
        backend.probes.lock().unwrap().remove("GPU-0");
        tx.send(BackendEvent::InventoryChanged).unwrap();
        tokio::time::timeout(
            Duration::from_secs(5),
            state.wait_for(|s| s.is_healthy("GPU-0")),
        )
        .await
        .unwrap()
        .unwrap();
        shutdown.cancel();
    }
}
