//! trainyard device plugin: advertises every NVIDIA GPU of a node to the
//! kubelet over the device-plugin API (v1beta1), picks the best-connected
//! GPUs for multi-GPU containers, tracks health truthfully, stays registered
//! across kubelet restarts, labels the node with GPU facts and publishes
//! per-GPU telemetry as Prometheus metrics.
//!
//! The binary is a thin wrapper around [`run`] and [`discover`], so tests and
//! benchmarks can run the whole plugin in-process against a fake GPU file.
//!
//! Split by role, as NVIDIA's k8s-device-plugin is. Each layer imports only
//! the layers below it (`e2e/pytests/test_module_layers.py` checks):
//!
//! ```text
//! run          wiring: opens the backend, starts every loop, stops them on shutdown
//! config       the command line and the RunConfig it validates into
//! plugin/      the kubelet's side: DevicePlugin service, registration, socket gate, proto
//! monitor      loops that keep the device state and the telemetry current
//! labels       node labels with GPU facts
//! metrics/     Prometheus metrics and /healthz (liveness) on one port
//! rm/          resource manager: backend/ (nvml, fake), health, devices, allocator, owed
//! ```
//!
//! `monitor` is not in `rm/` because it records metrics, which read the device
//! state: `rm/` is the bottom and imports no other layer. Label keys, the
//! default resource name and versions come from the contract crate
//! `trainyard_api`; the metrics port serves through `trainyard_listen`.

#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

// What the binary, the integration tests, the benchmark and the e2e crate use.
pub mod config;
pub mod labels;
pub mod metrics;
pub mod plugin;
pub mod rm;

mod monitor;
mod run;

pub use config::RunConfig;
pub use run::{DiscoverReport, RunError, discover, run};
