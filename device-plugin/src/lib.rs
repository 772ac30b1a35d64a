//! trainyard device plugin: advertises every NVIDIA GPU of a node to the
//! kubelet over the device-plugin API (v1beta1), picks the best-connected
//! GPUs for multi-GPU containers, tracks health truthfully, stays registered
//! across kubelet restarts, labels the node with GPU facts and publishes
//! per-GPU telemetry as Prometheus metrics.
//!
//! The binary is a thin wrapper around [`run`] and [`discover`], so tests and
//! benchmarks can run the whole plugin in-process against a fake GPU file.
//!
//! The label keys it writes, the default resource name and "major.minor"
//! parsing come from the contract crate `trainyard_api`, which the operator
//! reads them with.
//!
//! Its metrics and health port serves through `trainyard_listen`, the bounded
//! HTTP listener the operator's ports use too.

#![forbid(unsafe_code)]

// What the binary, the integration tests, the benchmark and the e2e crate
// use: the library's entry points, the kubelet API they play the kubelet
// with, and the parts they build a device state, a service or labels from.
pub mod allocator;
pub mod backend;
pub mod config;
pub mod devices;
pub mod health;
pub mod kubelet;
pub mod kubelet_api;
pub mod labels;
pub mod metrics;
pub mod owed;
pub mod service;
pub mod uds_authority;

// Internal: reached only through `run` and `discover`.
mod calls;
mod liveness;
mod monitor;
mod plugin;

pub use config::RunConfig;
pub use plugin::{DiscoverReport, RunError, discover, run};
