//! Background loops that keep the published device state and the telemetry
//! metrics current: backend events and periodic probes go through the health
//! state machine; samples are read on the metrics interval.
//!
//! Every backend call after start-up goes through [`BoundedCalls`]: each GPU
//! is checked on its own thread under the call deadline, so a call that
//! blocks marks its GPU Unhealthy and every other GPU is still checked in
//! the same round.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::rm::allocator::{AllocationError, Topology};
use crate::rm::backend::{
    BackendError, BackendEvent, DeviceError, DeviceErrorKind, GpuBackend, Inventory, ProbeOutcome,
    ResetEvidence, Telemetry,
};
use crate::rm::calls::{BoundedCalls, CallError};
use crate::rm::devices::{DeviceState, StateReceiver};
use crate::rm::health::{HealthTracker, ResetVerdict, Transition, XidVerdict};
use crate::rm::owed::OwedStore;

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

/// Devices first advertised under a stand-in ID (no UUID could be read)
/// whose UUID `new` now knows, as `(stand-in, uuid)` pairs.
pub(crate) fn renamed_devices(old: &Inventory, new: &Inventory) -> Vec<(String, String)> {
    old.faults
        .iter()
        .filter(|f| f.uuid.is_none())
        .filter_map(|stand_in| {
            let uuid = new
                .gpus
                .iter()
                .find(|g| g.index == stand_in.index)
                .map(|g| g.uuid.clone())
                .or_else(|| {
                    new.faults
                        .iter()
                        .find(|f| f.index == stand_in.index)
                        .and_then(|f| f.uuid.clone())
                })?;
            Some((stand_in.device_id(), uuid))
        })
        .collect()
}

/// Keeps health and the published state current.
pub(crate) struct Monitor {
    backend: Arc<dyn GpuBackend>,
    tracker: HealthTracker,
    inventory: Inventory,
    topology: Arc<Topology>,
    state: watch::Sender<Arc<DeviceState>>,
    metrics: Arc<Metrics>,
    probe_interval: Duration,
    calls: Arc<BoundedCalls>,
    /// Where the resets still owed are kept on the node, if anywhere.
    owed: Option<OwedStore>,
}

/// Key of the inventory read among the bounded calls.
const INVENTORY_CALL: &str = "inventory";

/// Key of the check (reset evidence and probe) of one GPU among the bounded calls.
fn check_call(uuid: &str) -> String {
    format!("check {uuid}")
}

/// Key of the telemetry sample of one GPU among the bounded calls.
fn telemetry_call(uuid: &str) -> String {
    format!("telemetry {uuid}")
}

impl Monitor {
    /// Reads the inventory, checks every GPU once (so a GPU whose evidence
    /// says it still owes a reset starts Unhealthy) and publishes the first
    /// state. Checks, and every backend call after start-up, run under `calls`.
    pub(crate) async fn start(
        backend: Arc<dyn GpuBackend>,
        mut tracker: HealthTracker,
        metrics: Arc<Metrics>,
        probe_interval: Duration,
        calls: Arc<BoundedCalls>,
        mut owed: Option<OwedStore>,
    ) -> Result<(Self, StateReceiver), MonitorError> {
        let inventory = {
            let backend = Arc::clone(&backend);
            blocking(move || backend.inventory()).await??
        };
        let topology = Arc::new(Topology::new(&inventory.gpus)?);
        tracker.sync(inventory.device_ids().iter().map(String::as_str));
        // The resets a previous run left owed: their GPUs are never advertised before the
        // reset, even where the evidence reads clean.
        if let Some(store) = owed.as_mut() {
            for transition in tracker.restore_owed(&store.load(), Instant::now()) {
                Self::log_transition(&transition);
            }
        }
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
            calls,
            owed,
        };
        monitor.apply_faults(Instant::now());
        monitor.probe_all().await;
        monitor.publish();
        Ok((monitor, receiver))
    }

    fn publish(&mut self) {
        if let Some(store) = self.owed.as_mut() {
            store.save(&self.tracker.owed_resets());
        }
        let health = self
            .inventory
            .device_ids()
            .into_iter()
            .filter_map(|id| self.tracker.health(&id).cloned().map(|h| (id, h)))
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

    /// Marks every GPU that could not be read this round Unhealthy; returns
    /// whether any health changed.
    fn apply_faults(&mut self, now: Instant) -> bool {
        let mut changed = false;
        for fault in &self.inventory.faults {
            let id = fault.device_id();
            match self.tracker.on_fault(&id, &fault.error, now) {
                Some(t) => {
                    Self::log_transition(&t);
                    changed = true;
                }
                None => {
                    tracing::debug!(gpu = %id, error = %fault.error, "GPU still cannot be read");
                }
            }
        }
        changed
    }

    /// One periodic round: GPUs that could not be read are read again (NVML
    /// sends no event when one comes back), then every GPU is probed.
    async fn health_round(&mut self) -> bool {
        let reloaded = !self.inventory.faults.is_empty() && self.reload_inventory().await;
        self.probe_all().await || reloaded
    }

    /// Checks every readable GPU at once, each on its own thread under the
    /// call deadline: its reset evidence (does it owe a reset, or show the
    /// one it waits for) and a probe. Returns whether any health changed.
    async fn probe_all(&mut self) -> bool {
        let readable: Vec<String> = self
            .inventory
            .gpus
            .iter()
            .filter(|g| self.inventory.fault(&g.uuid).is_none())
            .map(|g| g.uuid.clone())
            .collect();
        let checks = readable.into_iter().map(|uuid| {
            let backend = Arc::clone(&self.backend);
            let calls = Arc::clone(&self.calls);
            async move {
                let id = uuid.clone();
                let checked = calls
                    .call(&check_call(&uuid), move || {
                        (backend.reset_evidence(&id), backend.probe(&id))
                    })
                    .await;
                (uuid, checked)
            }
        });
        let checked = futures::future::join_all(checks).await;
        // Every GPU answered or ran out its deadline: the round is done.
        self.metrics.liveness().probe_round_done();
        self.metrics.record_probe_round();
        let now = Instant::now();
        let mut changed = false;
        for (uuid, result) in checked {
            let gpu_changed = match result {
                Ok((evidence, outcome)) => {
                    let owed = self.apply_evidence(&uuid, &evidence, now);
                    self.apply_probe(&uuid, &outcome, now) || owed
                }
                Err(error) => self.apply_failed_check(&uuid, &error, now),
            };
            changed |= gpu_changed;
        }
        changed
    }

    /// Applies one GPU's reset evidence; returns whether its health changed.
    fn apply_evidence(&mut self, uuid: &str, evidence: &ResetEvidence, now: Instant) -> bool {
        match self.tracker.on_reset_evidence(uuid, evidence, now) {
            ResetVerdict::Owed(t) => {
                Self::log_transition(&t);
                true
            }
            ResetVerdict::Shown => {
                tracing::info!(gpu = %uuid, "GPU shows the reset it waited for");
                false
            }
            ResetVerdict::Pending(unmet) => {
                for (check, why) in unmet {
                    tracing::debug!(gpu = %uuid, %check, %why, "GPU still waits for a reset");
                }
                false
            }
            ResetVerdict::NotAwaiting => false,
        }
    }

    /// Applies one GPU's probe outcome; returns whether its health changed.
    fn apply_probe(&mut self, uuid: &str, outcome: &ProbeOutcome, now: Instant) -> bool {
        if let ProbeOutcome::Inconclusive(reason) = outcome {
            tracing::debug!(gpu = %uuid, %reason, "inconclusive probe");
        }
        match self.tracker.on_probe(uuid, outcome, now) {
            Some(t) => {
                Self::log_transition(&t);
                true
            }
            None => false,
        }
    }

    /// Applies a check that gave no answer: a GPU whose call blocks past the
    /// deadline (or still blocks from an earlier round) cannot be vouched
    /// for and is Unhealthy; any other failure says nothing about the GPU.
    fn apply_failed_check(&mut self, uuid: &str, error: &CallError, now: Instant) -> bool {
        if !error.is_blocked() {
            tracing::warn!(gpu = %uuid, %error, "GPU check failed; health unchanged");
            return false;
        }
        if matches!(error, CallError::TimedOut(_)) {
            let gpu = self.inventory.gpus.iter().find(|g| g.uuid == uuid);
            self.metrics.record_call_timeout(gpu);
        }
        let outcome = ProbeOutcome::Unhealthy(DeviceError {
            kind: DeviceErrorKind::Other,
            detail: format!(
                "the {} check of this GPU {error} (--gpu-call-timeout)",
                self.backend.name()
            ),
        });
        self.apply_probe(uuid, &outcome, now)
    }

    /// Reads the inventory again; returns whether anything published changed.
    async fn reload_inventory(&mut self) -> bool {
        let backend = Arc::clone(&self.backend);
        let read = self.calls.call(INVENTORY_CALL, move || backend.inventory());
        let inventory = match read.await {
            Ok(Ok(inventory)) => inventory,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot re-read GPUs; keeping the last inventory");
                return false;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot re-read GPUs; keeping the last inventory");
                return false;
            }
        };
        if inventory.gpus != self.inventory.gpus {
            match Topology::new(&inventory.gpus) {
                Ok(topology) => self.topology = Arc::new(topology),
                Err(e) => {
                    tracing::error!(error = %e, "ignoring new inventory");
                    return false;
                }
            }
            tracing::info!(gpus = inventory.gpus.len(), "GPU inventory changed");
        }
        for (stand_in, uuid) in renamed_devices(&self.inventory, &inventory) {
            tracing::info!(gpu = %uuid, was = %stand_in, "unreadable GPU now has a UUID");
            self.tracker.rename(&stand_in, &uuid);
        }
        let changed = inventory != self.inventory;
        self.inventory = inventory;
        self.tracker
            .sync(self.inventory.device_ids().iter().map(String::as_str));
        self.apply_faults(Instant::now()) || changed
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
    pub(crate) async fn run(
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
                _ = probe.tick() => self.health_round().await,
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
/// into the per-GPU metrics, until `shutdown`. Each GPU is sampled on its
/// own thread under `calls`, so a GPU whose call blocks only misses its sample.
pub(crate) async fn run_telemetry(
    backend: Arc<dyn GpuBackend>,
    mut state: StateReceiver,
    metrics: Arc<Metrics>,
    interval: Duration,
    calls: Arc<BoundedCalls>,
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
        // A GPU that cannot be read has no sample to give.
        let uuids: Vec<String> = snapshot
            .inventory
            .gpus
            .iter()
            .filter(|g| snapshot.inventory.fault(&g.uuid).is_none())
            .map(|g| g.uuid.clone())
            .collect();
        let samples = uuids.into_iter().map(|uuid| {
            let backend = Arc::clone(&backend);
            let calls = Arc::clone(&calls);
            async move {
                let id = uuid.clone();
                let sampled = calls
                    .call(&telemetry_call(&uuid), move || backend.telemetry(&id))
                    .await;
                match sampled {
                    Ok(Ok(t)) => Some((uuid, t)),
                    Ok(Err(e)) => {
                        tracing::debug!(gpu = %uuid, error = %e, "no telemetry sample");
                        None
                    }
                    Err(e) => {
                        tracing::debug!(gpu = %uuid, error = %e, "no telemetry sample");
                        None
                    }
                }
            }
        });
        let samples: Vec<(String, Telemetry)> = futures::future::join_all(samples)
            .await
            .into_iter()
            .flatten()
            .collect();
        metrics.record_telemetry(&snapshot, &samples);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::Mutex;

    use tokio::sync::mpsc::UnboundedSender;

    use super::*;
    use crate::rm::backend::{
        ComputeCapability, DeviceError, DeviceErrorKind, DriverInfo, FailedRead, GpuInfo,
        KnownGpus, RecoveryAction,
    };
    use crate::rm::health::{HealthPolicy, HealthTracker};

    /// How long a test waits for the monitor: a bound on a hang, not a latency claim.
    const HANG_LIMIT: Duration = Duration::from_secs(30);
    /// The deadline of each check where a test hangs a GPU: short, so the
    /// test is quick, and still far above what a scripted call that is not
    /// hung takes. Elsewhere the deadline is `HANG_LIMIT`.
    const HUNG_CALL_DEADLINE: Duration = Duration::from_secs(1);

    fn error(kind: DeviceErrorKind) -> DeviceError {
        DeviceError {
            kind,
            detail: format!("scripted {kind:?}"),
        }
    }

    fn gpu(i: u32) -> GpuInfo {
        GpuInfo {
            uuid: format!("GPU-{i}"),
            index: i,
            minor_number: i,
            name: "NVIDIA Test".into(),
            memory_mib: 1,
            pci_bus_id: None,
            numa_node: None,
            compute_capability: ComputeCapability { major: 8, minor: 0 },
            nvlinks: BTreeMap::new(),
        }
    }

    /// A backend whose probe answers, per-GPU read errors and reset
    /// evidence are set by the test.
    struct ScriptedBackend {
        gpus: u32,
        probes: Mutex<BTreeMap<String, ProbeOutcome>>,
        /// Read errors by index, and whether the UUID can still be read.
        faults: Mutex<BTreeMap<u32, (DeviceError, bool)>>,
        /// Reset evidence of every GPU not in `evidence_of`.
        evidence: Mutex<ResetEvidence>,
        evidence_of: Mutex<BTreeMap<String, ResetEvidence>>,
        evidence_asked: Mutex<BTreeMap<String, usize>>,
        /// GPUs whose probe blocks, as a hung NVML call does, until removed.
        hung: Mutex<BTreeSet<String>>,
        known: Mutex<KnownGpus>,
    }

    /// Evidence of a GPU of a driver without the recovery-action field
    /// (before R555) on which nothing is pending: what a GPU shows after
    /// XID 62, 119 or 120 whether or not it has been reset.
    fn clean() -> ResetEvidence {
        ResetEvidence {
            reachable: Ok(()),
            recovery_action: None,
            retired_pages_pending: None,
            row_remap_pending: Some(false),
            row_remap_failed: Some(false),
            nvlink_lanes: None,
            resets: Some(0),
        }
    }

    impl ScriptedBackend {
        fn new(gpus: u32, probes: BTreeMap<String, ProbeOutcome>) -> Self {
            Self {
                gpus,
                probes: Mutex::new(probes),
                faults: Mutex::default(),
                evidence: Mutex::new(clean()),
                evidence_of: Mutex::default(),
                evidence_asked: Mutex::default(),
                hung: Mutex::default(),
                known: Mutex::default(),
            }
        }

        fn asked(&self, uuid: &str) -> usize {
            self.evidence_asked
                .lock()
                .unwrap()
                .get(uuid)
                .copied()
                .unwrap_or(0)
        }

        /// Waits until `uuid` has been checked `rounds` more times.
        async fn checked_again(&self, uuid: &str, rounds: usize) {
            let target = self.asked(uuid) + rounds;
            let wait = tokio::time::timeout(HANG_LIMIT, async {
                while self.asked(uuid) < target {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            });
            wait.await
                .unwrap_or_else(|_| panic!("{uuid} was not checked {rounds} more times"));
        }
    }

    impl GpuBackend for ScriptedBackend {
        fn name(&self) -> &'static str {
            "scripted"
        }

        fn inventory(&self) -> Result<Inventory, BackendError> {
            let faults = self.faults.lock().unwrap();
            let reads = (0..self.gpus)
                .map(|i| match faults.get(&i) {
                    Some((error, uuid_readable)) => Err(FailedRead {
                        index: i,
                        uuid: uuid_readable.then(|| format!("GPU-{i}")),
                        error: error.clone(),
                    }),
                    None => Ok(gpu(i)),
                })
                .collect();
            Ok(self.known.lock().unwrap().assemble(
                DriverInfo {
                    driver_version: "550.54.15".into(),
                    cuda_version: "12.4".into(),
                },
                reads,
            ))
        }

        fn probe(&self, uuid: &str) -> ProbeOutcome {
            while self.hung.lock().unwrap().contains(uuid) {
                std::thread::sleep(Duration::from_millis(5));
            }
            self.probes
                .lock()
                .unwrap()
                .get(uuid)
                .cloned()
                .unwrap_or(ProbeOutcome::Healthy)
        }

        fn reset_evidence(&self, uuid: &str) -> ResetEvidence {
            *self
                .evidence_asked
                .lock()
                .unwrap()
                .entry(uuid.to_string())
                .or_default() += 1;
            match self.evidence_of.lock().unwrap().get(uuid) {
                Some(evidence) => evidence.clone(),
                None => self.evidence.lock().unwrap().clone(),
            }
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

    async fn start_with(
        backend: ScriptedBackend,
        probe_interval: Duration,
    ) -> (
        Arc<ScriptedBackend>,
        StateReceiver,
        UnboundedSender<BackendEvent>,
        Arc<Metrics>,
        CancellationToken,
    ) {
        start_with_deadline(backend, probe_interval, HANG_LIMIT).await
    }

    async fn start_with_deadline(
        backend: ScriptedBackend,
        probe_interval: Duration,
        call_deadline: Duration,
    ) -> (
        Arc<ScriptedBackend>,
        StateReceiver,
        UnboundedSender<BackendEvent>,
        Arc<Metrics>,
        CancellationToken,
    ) {
        start_keeping(backend, probe_interval, call_deadline, None).await
    }

    async fn start_keeping(
        backend: ScriptedBackend,
        probe_interval: Duration,
        call_deadline: Duration,
        owed: Option<OwedStore>,
    ) -> (
        Arc<ScriptedBackend>,
        StateReceiver,
        UnboundedSender<BackendEvent>,
        Arc<Metrics>,
        CancellationToken,
    ) {
        let backend = Arc::new(backend);
        let metrics = Arc::new(Metrics::new("n"));
        let tracker = HealthTracker::new(HealthPolicy {
            recovery_quiet_period: Duration::ZERO,
            ..HealthPolicy::default()
        });
        let (monitor, state) = Monitor::start(
            Arc::clone(&backend) as Arc<dyn GpuBackend>,
            tracker,
            Arc::clone(&metrics),
            probe_interval,
            Arc::new(BoundedCalls::new(call_deadline)),
            owed,
        )
        .await
        .unwrap();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let shutdown = CancellationToken::new();
        tokio::spawn(monitor.run(rx, shutdown.clone()));
        (backend, state, tx, metrics, shutdown)
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
        start_with(ScriptedBackend::new(2, probes), Duration::from_secs(3600)).await
    }

    #[tokio::test]
    async fn first_state_reflects_the_first_probe() {
        let probes = BTreeMap::from([(
            "GPU-1".to_string(),
            ProbeOutcome::Unhealthy(error(DeviceErrorKind::NotFound)),
        )]);
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
        let snapshot = tokio::time::timeout(HANG_LIMIT, state.wait_for(|s| !s.is_healthy("GPU-1")))
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
        let (backend, mut state, tx, metrics, shutdown) = started(BTreeMap::new()).await;
        // A critical XID that needs no reset: quiet and a good probe recover.
        tx.send(BackendEvent::Xid {
            uuid: Some("GPU-0".into()),
            xid: 61,
        })
        .unwrap();
        tokio::time::timeout(HANG_LIMIT, state.wait_for(|s| !s.is_healthy("GPU-0")))
            .await
            .unwrap()
            .unwrap();
        // An inventory change re-probes: inconclusive keeps it unhealthy...
        backend.probes.lock().unwrap().insert(
            "GPU-0".into(),
            ProbeOutcome::Inconclusive("NVML busy".into()),
        );
        tx.send(BackendEvent::InventoryChanged).unwrap();
        // An application XID changes no health but is counted when handled.
        // Events are handled in order, so once it is counted the re-probe
        // before it has been applied and its state published.
        tx.send(BackendEvent::Xid {
            uuid: Some("GPU-1".into()),
            xid: 13,
        })
        .unwrap();
        metrics_show(&metrics, r#"xid="13"} 1"#).await;
        assert!(!state.borrow().is_healthy("GPU-0"));
        // ...and a good probe after the (zero) quiet period recovers it.
        backend.probes.lock().unwrap().remove("GPU-0");
        tx.send(BackendEvent::InventoryChanged).unwrap();
        tokio::time::timeout(HANG_LIMIT, state.wait_for(|s| s.is_healthy("GPU-0")))
            .await
            .unwrap()
            .unwrap();
        shutdown.cancel();
    }

    /// Waits until the rendered metrics contain `series`.
    async fn metrics_show(metrics: &Metrics, series: &str) {
        let shown = tokio::time::timeout(HANG_LIMIT, async {
            while !metrics.render().unwrap().contains(series) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        shown
            .await
            .unwrap_or_else(|_| panic!("the metrics never showed {series}"));
    }

    async fn wait(state: &mut StateReceiver, what: &str, check: impl Fn(&DeviceState) -> bool) {
        tokio::time::timeout(HANG_LIMIT, state.wait_for(|s| check(s)))
            .await
            .unwrap_or_else(|_| panic!("timed out waiting until {what}"))
            .unwrap();
    }

    #[tokio::test]
    async fn a_gpu_that_cannot_be_read_is_served_as_unhealthy_and_read_again_every_round() {
        let backend = ScriptedBackend::new(4, BTreeMap::new());
        backend
            .faults
            .lock()
            .unwrap()
            .insert(2, (error(DeviceErrorKind::Other), true));
        let (backend, mut state, _tx, _metrics, shutdown) =
            start_with(backend, Duration::from_millis(20)).await;
        {
            let snapshot = state.borrow();
            assert_eq!(snapshot.health_counts(), (3, 1));
            assert!(!snapshot.is_healthy("GPU-2"));
            let listed: Vec<_> = snapshot.devices().into_iter().map(|d| d.id).collect();
            assert_eq!(listed, ["GPU-0", "GPU-1", "GPU-2", "GPU-3"]);
        }
        // The error clears: a later round reads the GPU and it recovers.
        backend.faults.lock().unwrap().clear();
        wait(&mut state, "GPU-2 recovers", |s| {
            s.health_counts() == (4, 0)
        })
        .await;
        assert_eq!(state.borrow().inventory.gpus.len(), 4);
        shutdown.cancel();
    }

    #[tokio::test]
    async fn a_lost_gpu_recovers_only_once_reset_evidence_shows_the_reset() {
        let backend = ScriptedBackend::new(3, BTreeMap::new());
        // Lost at start-up with not even its UUID readable: a stand-in ID.
        backend
            .faults
            .lock()
            .unwrap()
            .insert(1, (error(DeviceErrorKind::GpuLost), false));
        let pending = ResetEvidence {
            row_remap_pending: Some(true),
            ..clean()
        };
        backend
            .evidence_of
            .lock()
            .unwrap()
            .insert("GPU-1".into(), pending);
        let (backend, mut state, _tx, _metrics, shutdown) =
            start_with(backend, Duration::from_millis(20)).await;
        {
            let snapshot = state.borrow();
            assert_eq!(snapshot.health_counts(), (2, 1));
            assert!(!snapshot.is_healthy("unreadable-gpu-1"));
        }
        // It answers again, under its UUID, but the row remapping a reset
        // carries out is still pending: no recovery, however many rounds.
        backend.faults.lock().unwrap().clear();
        wait(&mut state, "GPU-1 is listed under its UUID", |s| {
            s.inventory.device_ids() == ["GPU-0", "GPU-1", "GPU-2"]
        })
        .await;
        backend.checked_again("GPU-1", 3).await;
        assert!(!state.borrow().is_healthy("GPU-1"));
        assert_eq!(state.borrow().health_counts(), (2, 1));
        // The reset happened: nothing pending any more.
        backend.evidence_of.lock().unwrap().remove("GPU-1");
        wait(&mut state, "GPU-1 recovers", |s| {
            s.health_counts() == (3, 0)
        })
        .await;
        shutdown.cancel();
    }

    #[tokio::test]
    async fn a_gpu_that_owes_a_reset_at_start_up_is_never_advertised_healthy() {
        // A restarted plugin on a node where GPU 1's row remap waits for a
        // reset and the driver asks GPU 2 for one: the XIDs were seen by the
        // plugin before this one, never by this one.
        let backend = ScriptedBackend::new(3, BTreeMap::new());
        backend.evidence_of.lock().unwrap().extend([
            (
                "GPU-1".to_string(),
                ResetEvidence {
                    row_remap_pending: Some(true),
                    ..clean()
                },
            ),
            (
                "GPU-2".to_string(),
                ResetEvidence {
                    recovery_action: Some(RecoveryAction::GpuReset),
                    ..clean()
                },
            ),
        ]);
        let (backend, mut state, _tx, _metrics, shutdown) =
            start_with(backend, Duration::from_millis(20)).await;
        {
            let first = state.borrow();
            assert!(first.is_healthy("GPU-0"));
            assert!(
                !first.is_healthy("GPU-1"),
                "the first state already says so"
            );
            assert!(!first.is_healthy("GPU-2"));
        }
        // Good probes and rounds do not bring them back while the reset is owed.
        backend.checked_again("GPU-1", 3).await;
        assert_eq!(state.borrow().health_counts(), (1, 2));
        // Reset: nothing owed any more, and that is a change from start-up.
        backend.evidence_of.lock().unwrap().clear();
        wait(&mut state, "both recover", |s| s.health_counts() == (3, 0)).await;
        shutdown.cancel();
    }

    #[tokio::test]
    async fn a_reset_owed_before_the_plugin_restarts_is_still_owed_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = || Some(OwedStore::open(dir.path()).unwrap());
        let fast = Duration::from_millis(20);
        let two = || ScriptedBackend::new(2, BTreeMap::new());
        let (_backend, mut state, tx, _metrics, shutdown) =
            start_keeping(two(), fast, HANG_LIMIT, store()).await;
        // XID 62 on a driver without the recovery-action field: only this run saw it.
        tx.send(BackendEvent::Xid {
            uuid: Some("GPU-0".into()),
            xid: 62,
        })
        .unwrap();
        wait(&mut state, "GPU-0 is unhealthy", |s| !s.is_healthy("GPU-0")).await;
        shutdown.cancel();
        let file = dir.path().join(crate::rm::owed::FILE_NAME);
        assert!(std::fs::read_to_string(&file).unwrap().contains("GPU-0"));

        // The next run sees clean evidence and no XID, and still waits for the reset.
        let (backend, mut state, _tx, _metrics, shutdown) =
            start_keeping(two(), fast, HANG_LIMIT, store()).await;
        assert!(!state.borrow().is_healthy("GPU-0"), "from the first state");
        assert!(state.borrow().is_healthy("GPU-1"));
        backend.checked_again("GPU-0", 3).await;
        assert!(!state.borrow().is_healthy("GPU-0"));
        backend.evidence_of.lock().unwrap().insert(
            "GPU-0".into(),
            ResetEvidence {
                resets: Some(1),
                ..clean()
            },
        );
        wait(&mut state, "GPU-0 recovers", |s| {
            s.health_counts() == (2, 0)
        })
        .await;
        shutdown.cancel();
        assert!(!std::fs::read_to_string(&file).unwrap().contains("GPU-0"));
    }

    #[tokio::test]
    async fn a_reset_xid_with_nothing_pending_recovers_only_when_a_reset_is_counted() {
        let (backend, mut state, tx, _metrics, shutdown) = start_with(
            ScriptedBackend::new(2, BTreeMap::new()),
            Duration::from_millis(20),
        )
        .await;
        // XID 62 on a driver without the recovery-action field: the evidence
        // reads as clean as it did before the fault.
        tx.send(BackendEvent::Xid {
            uuid: Some("GPU-0".into()),
            xid: 62,
        })
        .unwrap();
        wait(&mut state, "GPU-0 is unhealthy", |s| !s.is_healthy("GPU-0")).await;
        backend.checked_again("GPU-0", 3).await;
        assert!(
            !state.borrow().is_healthy("GPU-0"),
            "clean evidence that never changed is no reset"
        );
        // The GPU is reset: the backend counts it.
        backend.evidence_of.lock().unwrap().insert(
            "GPU-0".into(),
            ResetEvidence {
                resets: Some(1),
                ..clean()
            },
        );
        wait(&mut state, "GPU-0 recovers", |s| {
            s.health_counts() == (2, 0)
        })
        .await;
        shutdown.cancel();
    }

    #[tokio::test]
    async fn a_probe_that_blocks_costs_only_its_gpu_and_rounds_go_on() {
        let backend = ScriptedBackend::new(3, BTreeMap::new());
        let (backend, mut state, _tx, metrics, shutdown) =
            start_with_deadline(backend, Duration::from_millis(20), HUNG_CALL_DEADLINE).await;
        backend.hung.lock().unwrap().insert("GPU-1".into());
        wait(&mut state, "GPU-1 is unhealthy", |s| !s.is_healthy("GPU-1")).await;
        // Rounds keep completing, every other GPU is still checked and healthy.
        backend.checked_again("GPU-0", 3).await;
        backend.checked_again("GPU-2", 3).await;
        assert_eq!(state.borrow().health_counts(), (2, 1));
        assert!(
            metrics.liveness().check().is_empty(),
            "the plugin stays live"
        );
        let text = metrics.render().unwrap();
        assert!(
            text.contains(r#"trainyard_gpu_call_timeouts_total{gpu="GPU-1""#),
            "{text}"
        );
        // The call returns: the GPU answers again and recovers.
        backend.hung.lock().unwrap().clear();
        wait(&mut state, "GPU-1 recovers", |s| {
            s.health_counts() == (3, 0)
        })
        .await;
        shutdown.cancel();
    }

    #[test]
    fn a_stand_in_id_is_renamed_to_the_uuid_read_later_at_the_same_index() {
        let driver = DriverInfo {
            driver_version: "550.54.15".into(),
            cuda_version: "12.4".into(),
        };
        let lost = |uuid: Option<&str>| FailedRead {
            index: 1,
            uuid: uuid.map(str::to_string),
            error: error(DeviceErrorKind::GpuLost),
        };
        let mut known = KnownGpus::default();
        let old = known.assemble(driver.clone(), vec![Ok(gpu(0)), Err(lost(None))]);
        let new = known.assemble(driver.clone(), vec![Ok(gpu(0)), Err(lost(Some("GPU-1")))]);
        assert_eq!(
            renamed_devices(&old, &new),
            vec![("unreadable-gpu-1".to_string(), "GPU-1".to_string())]
        );
        let read = known.assemble(driver, vec![Ok(gpu(0)), Ok(gpu(1))]);
        assert!(renamed_devices(&new, &read).is_empty());
        assert_eq!(
            renamed_devices(&old, &read),
            vec![("unreadable-gpu-1".to_string(), "GPU-1".to_string())]
        );
    }
}
