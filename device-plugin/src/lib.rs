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

#![forbid(unsafe_code)]

/// Generated kubelet device-plugin API (v1beta1).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod api {
    tonic::include_proto!("v1beta1");
}

pub mod allocator;
pub mod backend;
pub mod calls;
pub mod config;
pub mod devices;
pub mod health;
pub mod kubelet;
pub mod labels;
pub mod liveness;
pub mod metrics;
pub mod monitor;
pub mod plugin;
pub mod service;
pub mod uds_authority;

pub use config::RunConfig;
pub use plugin::{DiscoverReport, RunError, discover, run};
