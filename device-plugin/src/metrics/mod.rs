//! Prometheus metrics and the small HTTP server that exposes them.
//!
//! Two groups: `trainyard_device_plugin_*` describe the plugin itself
//! (devices by health, allocations, registrations, RPC latency), and
//! `trainyard_gpu_*` publish per-GPU telemetry with the labels `gpu` (UUID),
//! `index`, `product` and `node`, so dcgm-exporter is not needed for the
//! usual `nvidia-smi --query-gpu` facts.

pub(crate) mod liveness;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Metric, Registry};
use tokio_util::sync::CancellationToken;
use trainyard_listen::HttpLimits;

use crate::rm::backend::{GpuFault, GpuInfo, Telemetry, ThrottleReason};
use crate::rm::devices::DeviceState;
use liveness::{Liveness, LivenessLimits};

/// Errors of the metrics server.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The listen address is taken or not ours.
    #[error("cannot listen for metrics on {addr}: {source}")]
    Bind {
        /// The `--metrics-addr`.
        addr: SocketAddr,
        /// The socket error.
        #[source]
        source: std::io::Error,
    },
}

/// Labels of per-GPU series.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct GpuLabels {
    /// UUID.
    pub gpu: String,
    /// NVML index.
    pub index: String,
    /// Product name.
    pub product: String,
    /// Kubernetes node name (empty when not set).
    pub node: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ThrottleLabels {
    gpu: String,
    index: String,
    product: String,
    node: String,
    reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct XidLabels {
    gpu: String,
    index: String,
    product: String,
    node: String,
    xid: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct HealthLabels {
    health: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ResultLabels {
    result: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct MethodLabels {
    method: String,
}

type F64Gauge = Gauge<f64, AtomicU64>;

fn rpc_histogram() -> Histogram {
    // 10 µs .. ~2.4 s: preferred allocation is microseconds, a stuck NVML call is seconds.
    Histogram::new(exponential_buckets(0.000_01, 3.0, 12))
}

/// Per-GPU gauges, cleared and refilled on every sample so vanished GPUs vanish.
struct GpuFamilies {
    utilization: Family<GpuLabels, F64Gauge>,
    memory_utilization: Family<GpuLabels, F64Gauge>,
    memory_used: Family<GpuLabels, F64Gauge>,
    memory_total: Family<GpuLabels, F64Gauge>,
    temperature: Family<GpuLabels, F64Gauge>,
    power_draw: Family<GpuLabels, F64Gauge>,
    power_limit: Family<GpuLabels, F64Gauge>,
    sm_clock: Family<GpuLabels, F64Gauge>,
    memory_clock: Family<GpuLabels, F64Gauge>,
    throttle: Family<ThrottleLabels, Gauge>,
    health: Family<GpuLabels, Gauge>,
}

/// Registers `metric` under `name` and returns the handle that updates it.
fn registered<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M {
    registry.register(name, help, metric.clone());
    metric
}

impl GpuFamilies {
    /// Registers the per-GPU telemetry series, in the order they are rendered.
    fn register(registry: &mut Registry) -> Self {
        let mut gauge = |name: &str, help: &str| {
            registered(
                registry,
                name,
                help,
                Family::<GpuLabels, F64Gauge>::default(),
            )
        };
        let utilization = gauge(
            "trainyard_gpu_utilization_percent",
            "GPU utilization in percent",
        );
        let memory_utilization = gauge(
            "trainyard_gpu_memory_utilization_percent",
            "Memory controller utilization in percent",
        );
        let memory_used = gauge(
            "trainyard_gpu_memory_used_bytes",
            "Framebuffer memory in use",
        );
        let memory_total = gauge(
            "trainyard_gpu_memory_total_bytes",
            "Framebuffer memory in total",
        );
        let temperature = gauge("trainyard_gpu_temperature_celsius", "GPU die temperature");
        let power_draw = gauge("trainyard_gpu_power_draw_watts", "Power draw");
        let power_limit = gauge("trainyard_gpu_power_limit_watts", "Enforced power limit");
        let sm_clock = gauge("trainyard_gpu_sm_clock_hertz", "SM clock");
        let memory_clock = gauge("trainyard_gpu_memory_clock_hertz", "Memory clock");
        let throttle = registered(
            registry,
            "trainyard_gpu_throttle_reason",
            "1 while the clock-throttle reason is active",
            Family::<ThrottleLabels, Gauge>::default(),
        );
        let health = registered(
            registry,
            "trainyard_gpu_health",
            "1 when the GPU is advertised healthy, 0 otherwise",
            Family::<GpuLabels, Gauge>::default(),
        );
        Self {
            utilization,
            memory_utilization,
            memory_used,
            memory_total,
            temperature,
            power_draw,
            power_limit,
            sm_clock,
            memory_clock,
            throttle,
            health,
        }
    }

    fn clear(&self) {
        for family in [
            &self.utilization,
            &self.memory_utilization,
            &self.memory_used,
            &self.memory_total,
            &self.temperature,
            &self.power_draw,
            &self.power_limit,
            &self.sm_clock,
            &self.memory_clock,
        ] {
            family.clear();
        }
        self.throttle.clear();
        self.health.clear();
    }
}

/// How the periodic GPU checks go: rounds done, and calls that ran out their deadline.
struct CheckFamilies {
    rounds: Counter,
    call_timeouts: Family<GpuLabels, Counter>,
}

impl CheckFamilies {
    fn register(registry: &mut Registry) -> Self {
        let rounds = registered(
            registry,
            "trainyard_device_plugin_probe_rounds",
            "Probe rounds completed: every GPU answered or ran out its deadline",
            Counter::default(),
        );
        let call_timeouts = registered(
            registry,
            "trainyard_gpu_call_timeouts",
            "Checks of a GPU that did not return within --gpu-call-timeout",
            Family::<GpuLabels, Counter>::default(),
        );
        Self {
            rounds,
            call_timeouts,
        }
    }
}

/// All metrics of the plugin.
pub struct Metrics {
    registry: Registry,
    node: String,
    /// Held while a sample is written and while the registry is rendered, so
    /// a scrape never sees a half-refilled family.
    render_lock: Mutex<()>,
    devices: Family<HealthLabels, Gauge>,
    allocations: Family<ResultLabels, Counter>,
    allocated_devices: Counter,
    registrations: Family<ResultLabels, Counter>,
    rpc_duration: Family<MethodLabels, Histogram, fn() -> Histogram>,
    xid_events: Family<XidLabels, Counter>,
    checks: CheckFamilies,
    gpu: GpuFamilies,
    ready: AtomicBool,
    liveness: Liveness,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl Metrics {
    /// A fresh registry; `node` labels every per-GPU series.
    pub fn new(node: impl Into<String>) -> Self {
        let mut registry = Registry::default();
        // Registration order is the order of the rendered text: the plugin's series first.
        let devices = registered(
            &mut registry,
            "trainyard_device_plugin_devices",
            "GPUs advertised to the kubelet, by health",
            Family::<HealthLabels, Gauge>::default(),
        );
        let allocations = registered(
            &mut registry,
            "trainyard_device_plugin_allocations",
            "Allocate calls per container request, by result",
            Family::<ResultLabels, Counter>::default(),
        );
        let allocated_devices = registered(
            &mut registry,
            "trainyard_device_plugin_allocated_devices",
            "GPUs handed out by successful Allocate calls",
            Counter::default(),
        );
        let registrations = registered(
            &mut registry,
            "trainyard_device_plugin_registrations",
            "Registration attempts with the kubelet, by result",
            Family::<ResultLabels, Counter>::default(),
        );
        let rpc_duration = registered(
            &mut registry,
            "trainyard_device_plugin_rpc_duration_seconds",
            "Time to serve device-plugin gRPC calls, by method",
            Family::<MethodLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                rpc_histogram,
            ),
        );
        let xid_events = registered(
            &mut registry,
            "trainyard_gpu_xid_events",
            "XID errors seen, by GPU and XID (gpu is empty when not tied to one GPU)",
            Family::<XidLabels, Counter>::default(),
        );
        let checks = CheckFamilies::register(&mut registry);
        let gpu = GpuFamilies::register(&mut registry);
        Self {
            registry,
            node: node.into(),
            render_lock: Mutex::new(()),
            devices,
            allocations,
            allocated_devices,
            registrations,
            rpc_duration,
            xid_events,
            checks,
            gpu,
            ready: AtomicBool::new(false),
            liveness: Liveness::new(LivenessLimits::default(), Instant::now()),
        }
    }

    /// The same registry, with `/healthz` judged by `limits` from now on.
    pub(crate) fn with_liveness(mut self, limits: LivenessLimits) -> Self {
        self.liveness = Liveness::new(limits, Instant::now());
        self
    }

    /// What `/healthz` is decided from.
    pub(crate) fn liveness(&self) -> &Liveness {
        &self.liveness
    }

    fn gpu_labels(&self, gpu: &GpuInfo) -> GpuLabels {
        GpuLabels {
            gpu: gpu.uuid.clone(),
            index: gpu.index.to_string(),
            product: gpu.name.clone(),
            node: self.node.clone(),
        }
    }

    /// The labels of `gpu`, or empty GPU labels when the series is not tied to a known GPU.
    fn labels_or_unknown(&self, gpu: Option<&GpuInfo>) -> GpuLabels {
        gpu.map(|g| self.gpu_labels(g)).unwrap_or(GpuLabels {
            gpu: String::new(),
            index: String::new(),
            product: String::new(),
            node: self.node.clone(),
        })
    }

    fn fault_labels(&self, fault: &GpuFault) -> GpuLabels {
        GpuLabels {
            gpu: fault.device_id(),
            index: fault.index.to_string(),
            product: String::new(),
            node: self.node.clone(),
        }
    }

    /// Per-GPU health series, unreadable GPUs included.
    fn record_gpu_health(&self, state: &DeviceState) {
        for gpu in &state.inventory.gpus {
            self.gpu
                .health
                .get_or_create(&self.gpu_labels(gpu))
                .set(i64::from(state.is_healthy(&gpu.uuid)));
        }
        for fault in state.inventory.faults_without_facts() {
            self.gpu
                .health
                .get_or_create(&self.fault_labels(fault))
                .set(i64::from(state.is_healthy(&fault.device_id())));
        }
    }

    /// Records the devices-by-health gauge and per-GPU health for a snapshot.
    pub(crate) fn record_health(&self, state: &DeviceState) {
        let _guard = self
            .render_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (healthy, unhealthy) = state.health_counts();
        for (label, count) in [("healthy", healthy), ("unhealthy", unhealthy)] {
            self.devices
                .get_or_create(&HealthLabels {
                    health: label.into(),
                })
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
        self.gpu.health.clear();
        self.record_gpu_health(state);
    }

    /// Replaces all per-GPU telemetry series with one new sample.
    pub(crate) fn record_telemetry(&self, state: &DeviceState, samples: &[(String, Telemetry)]) {
        let _guard = self
            .render_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        self.gpu.clear();
        self.record_gpu_health(state);
        for gpu in &state.inventory.gpus {
            let labels = self.gpu_labels(gpu);
            let Some((_, t)) = samples.iter().find(|(uuid, _)| *uuid == gpu.uuid) else {
                continue;
            };
            let mhz_to_hz = |mhz: f64| mhz * 1_000_000.0;
            let gauges: [(&Family<GpuLabels, F64Gauge>, Option<f64>); 9] = [
                (&self.gpu.utilization, t.utilization_percent),
                (&self.gpu.memory_utilization, t.memory_utilization_percent),
                (&self.gpu.memory_used, t.memory_used_bytes.map(|b| b as f64)),
                (
                    &self.gpu.memory_total,
                    t.memory_total_bytes.map(|b| b as f64),
                ),
                (&self.gpu.temperature, t.temperature_celsius),
                (&self.gpu.power_draw, t.power_draw_watts),
                (&self.gpu.power_limit, t.power_limit_watts),
                (&self.gpu.sm_clock, t.sm_clock_mhz.map(mhz_to_hz)),
                (&self.gpu.memory_clock, t.memory_clock_mhz.map(mhz_to_hz)),
            ];
            for (family, value) in gauges {
                if let Some(value) = value {
                    family.get_or_create(&labels).set(value);
                }
            }
            if let Some(reasons) = &t.throttle_reasons {
                for reason in ThrottleReason::ALL {
                    self.gpu
                        .throttle
                        .get_or_create(&ThrottleLabels {
                            gpu: labels.gpu.clone(),
                            index: labels.index.clone(),
                            product: labels.product.clone(),
                            node: labels.node.clone(),
                            reason: reason.as_str().into(),
                        })
                        .set(i64::from(reasons.contains(&reason)));
                }
            }
        }
    }

    /// Counts one XID event; `gpu` is `None` when it is not tied to one GPU.
    pub(crate) fn record_xid(&self, gpu: Option<&GpuInfo>, xid: u64) {
        let labels = self.labels_or_unknown(gpu);
        self.xid_events
            .get_or_create(&XidLabels {
                gpu: labels.gpu,
                index: labels.index,
                product: labels.product,
                node: labels.node,
                xid: xid.to_string(),
            })
            .inc();
    }

    /// Counts one completed probe round.
    pub(crate) fn record_probe_round(&self) {
        self.checks.rounds.inc();
    }

    /// Counts one check of `gpu` that ran out its deadline (`None`: no known facts).
    pub(crate) fn record_call_timeout(&self, gpu: Option<&GpuInfo>) {
        let labels = self.labels_or_unknown(gpu);
        self.checks.call_timeouts.get_or_create(&labels).inc();
    }

    /// Counts one container allocation.
    pub(crate) fn record_allocation(&self, ok: bool, devices: usize) {
        let result = if ok { "success" } else { "invalid" };
        self.allocations
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .inc();
        if ok {
            self.allocated_devices.inc_by(devices as u64);
        }
    }

    /// Counts one registration attempt.
    pub(crate) fn record_registration(&self, ok: bool) {
        let result = if ok { "success" } else { "failure" };
        self.registrations
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .inc();
    }

    /// Observes the duration of one RPC that started at `started`.
    pub(crate) fn observe_rpc(&self, method: &str, started: Instant) {
        self.rpc_duration
            .get_or_create(&MethodLabels {
                method: method.into(),
            })
            .observe(started.elapsed().as_secs_f64());
    }

    /// Marks whether the plugin is registered with the kubelet (`/readyz`).
    pub(crate) fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
        self.liveness.set_registered(ready);
    }

    /// Whether the plugin is registered with the kubelet.
    pub(crate) fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// The OpenMetrics text exposition.
    pub(crate) fn render(&self) -> Result<String, std::fmt::Error> {
        let _guard = self
            .render_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut out = String::with_capacity(8 * 1024);
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

async fn metrics_handler(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    match metrics.render() {
        Ok(body) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "cannot encode metrics").into_response(),
    }
}

/// Answers from timestamps only: a hung NVML call or kubelet never blocks it.
async fn healthz_handler(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    let problems = metrics.liveness.check();
    if problems.is_empty() {
        return (StatusCode::OK, "ok\n".to_string());
    }
    let body: String = problems.iter().map(|p| format!("{p}\n")).collect();
    (StatusCode::SERVICE_UNAVAILABLE, body)
}

async fn readyz_handler(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    if metrics.is_ready() {
        (StatusCode::OK, "registered with the kubelet\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not registered with the kubelet\n",
        )
    }
}

/// Binds `addr` and serves `/metrics`, `/healthz` and `/readyz` until `shutdown`, within
/// [`HttpLimits::METRICS`]: this port is reachable from pods the plugin does not trust, so
/// the connections it holds, how long a request head may take and how large it may be are
/// bounded (see [`trainyard_listen`]).
///
/// Binding happens before this returns, so a taken port is a start-up error. Returns the
/// bound address (port 0 picks one) and the serving task.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), MetricsError> {
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(healthz_handler))
        .route("/readyz", get(readyz_handler))
        .with_state(metrics);
    let stopped = shutdown.cancelled_owned();
    let (local, serving) =
        trainyard_listen::serve("metrics", addr, app, HttpLimits::METRICS, stopped)
            .await
            .map_err(|e| MetricsError::Bind {
                addr: e.addr,
                source: e.source,
            })?;
    tracing::info!(addr = %local, "serving metrics");
    let task = tokio::spawn(async move {
        if let Err(e) = serving.await {
            tracing::error!(error = %e, "metrics server stopped");
        }
    });
    Ok((local, task))
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;
    use crate::rm::allocator::Topology;
    use crate::rm::backend::{ComputeCapability, DriverInfo, Inventory};
    use crate::rm::health::Health;

    fn state() -> DeviceState {
        let gpu = |i: u32| GpuInfo {
            uuid: format!("GPU-{i}"),
            index: i,
            minor_number: i,
            name: "NVIDIA A100-SXM4-80GB".into(),
            memory_mib: 81920,
            pci_bus_id: None,
            numa_node: Some(0),
            compute_capability: ComputeCapability { major: 8, minor: 0 },
            nvlinks: BTreeMap::new(),
        };
        let gpus = vec![gpu(0), gpu(1)];
        DeviceState {
            topology: Arc::new(Topology::new(&gpus).unwrap()),
            inventory: Inventory {
                driver: DriverInfo {
                    driver_version: "550.54.15".into(),
                    cuda_version: "12.4".into(),
                },
                gpus,
                faults: vec![],
            },
            health: BTreeMap::from([
                ("GPU-0".into(), Health::Healthy),
                (
                    "GPU-1".into(),
                    Health::Unhealthy {
                        reason: "x".into(),
                        last_bad: Instant::now(),
                        awaiting: Default::default(),
                    },
                ),
            ]),
        }
    }

    const LABELS0: &str = r#"gpu="GPU-0",index="0",product="NVIDIA A100-SXM4-80GB",node="node-a""#;

    #[test]
    fn telemetry_renders_every_gpu_family_with_its_labels() {
        let m = Metrics::new("node-a");
        let s = state();
        let t = Telemetry {
            utilization_percent: Some(87.0),
            memory_utilization_percent: Some(40.0),
            memory_used_bytes: Some(1024),
            memory_total_bytes: Some(2048),
            temperature_celsius: Some(64.0),
            power_draw_watts: Some(310.5),
            power_limit_watts: Some(400.0),
            sm_clock_mhz: Some(1410.0),
            memory_clock_mhz: Some(1593.0),
            throttle_reasons: Some(BTreeSet::from([ThrottleReason::Thermal])),
        };
        m.record_telemetry(&s, &[("GPU-0".into(), t)]);
        m.record_xid(s.gpu("GPU-0"), 79);
        m.record_xid(None, 13);
        let text = m.render().unwrap();
        for line in [
            format!("trainyard_gpu_utilization_percent{{{LABELS0}}} 87.0"),
            format!("trainyard_gpu_memory_utilization_percent{{{LABELS0}}} 40.0"),
            format!("trainyard_gpu_memory_used_bytes{{{LABELS0}}} 1024.0"),
            format!("trainyard_gpu_memory_total_bytes{{{LABELS0}}} 2048.0"),
            format!("trainyard_gpu_temperature_celsius{{{LABELS0}}} 64.0"),
            format!("trainyard_gpu_power_draw_watts{{{LABELS0}}} 310.5"),
            format!("trainyard_gpu_power_limit_watts{{{LABELS0}}} 400.0"),
            format!("trainyard_gpu_sm_clock_hertz{{{LABELS0}}} 1410000000.0"),
            format!("trainyard_gpu_memory_clock_hertz{{{LABELS0}}} 1593000000.0"),
            format!("trainyard_gpu_throttle_reason{{{LABELS0},reason=\"thermal\"}} 1"),
            format!("trainyard_gpu_throttle_reason{{{LABELS0},reason=\"power_cap\"}} 0"),
            format!("trainyard_gpu_health{{{LABELS0}}} 1"),
            r#"trainyard_gpu_health{gpu="GPU-1",index="1",product="NVIDIA A100-SXM4-80GB",node="node-a"} 0"#.to_string(),
            format!("trainyard_gpu_xid_events_total{{{LABELS0},xid=\"79\"}} 1"),
            r#"trainyard_gpu_xid_events_total{gpu="",index="",product="",node="node-a",xid="13"} 1"#.to_string(),
        ] {
            assert!(text.contains(&line), "missing {line}\n{text}");
        }
        // GPU-1 had no sample: no telemetry series for it.
        assert!(!text.contains(r#"trainyard_gpu_utilization_percent{gpu="GPU-1""#));
    }

    #[test]
    fn a_new_sample_drops_series_of_gpus_that_vanished() {
        let m = Metrics::new("n");
        let mut s = state();
        let t = Telemetry {
            utilization_percent: Some(1.0),
            ..Telemetry::default()
        };
        m.record_telemetry(&s, &[("GPU-0".into(), t.clone()), ("GPU-1".into(), t)]);
        assert!(m.render().unwrap().contains(r#"gpu="GPU-1""#));
        s.inventory.gpus.truncate(1);
        m.record_telemetry(&s, &[]);
        assert!(!m.render().unwrap().contains(r#"gpu="GPU-1""#));
    }

    #[test]
    fn plugin_metrics_render_counts_and_histograms() {
        let m = Metrics::new("n");
        m.record_health(&state());
        m.record_allocation(true, 2);
        m.record_allocation(false, 0);
        m.record_registration(true);
        m.observe_rpc("Allocate", Instant::now());
        m.record_probe_round();
        m.record_probe_round();
        m.record_call_timeout(state().gpu("GPU-1"));
        let text = m.render().unwrap();
        for line in [
            "trainyard_device_plugin_probe_rounds_total 2",
            r#"trainyard_gpu_call_timeouts_total{gpu="GPU-1",index="1",product="NVIDIA A100-SXM4-80GB",node="n"} 1"#,
            r#"trainyard_device_plugin_devices{health="healthy"} 1"#,
            r#"trainyard_device_plugin_devices{health="unhealthy"} 1"#,
            r#"trainyard_device_plugin_allocations_total{result="success"} 1"#,
            r#"trainyard_device_plugin_allocations_total{result="invalid"} 1"#,
            "trainyard_device_plugin_allocated_devices_total 2",
            r#"trainyard_device_plugin_registrations_total{result="success"} 1"#,
            r#"trainyard_device_plugin_rpc_duration_seconds_count{method="Allocate"} 1"#,
        ] {
            assert!(text.contains(line), "missing {line}\n{text}");
        }
        assert!(text.ends_with("# EOF\n"));
    }
}
