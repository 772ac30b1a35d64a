//! trainyard-operator: reconciles `TrainingJob` resources into gang-scheduled GPU worker pods
//! that run on cheap spot nodes and survive preemption by restarting from their latest
//! checkpoint.
//!
//! The reconcile is a pipeline of pure steps, each unit-tested without a cluster:
//! [`validate::validate`] → [`plan::decide`] (an ordered table of named phases over a read-only
//! view of the job; it uses [`placement`], [`preemption`] and the
//! [`lost_peer`] rule (both judged on the one [`liveness`] index) and the [`pods`], [`service`] and [`pvc`] builders, and creates nothing
//! where [`ownership`] finds an object of the job's names that is not its own) → the thin
//! [`controller`]: wiring, a status cache and an executor that writes the status and carries
//! out the actions in one stated order, and shows the writes the API server rejects on the job
//! ([`rejection`]).
//!
//! What it shares with the device plugin and the trainer (the `TrainingJob` types that [`crd`]
//! re-exports, the GPU label keys, the env names, version parsing, the spot provider table)
//! comes from the contract crate `trainyard_api`.
//!
//! The crate's face is small on purpose: the crate root exports what a process needs to run
//! the operator ([`run`] and its [`RunConfig`]), and tests and benchmarks use the operator
//! through [`surface`]. Every other module is private and may change without notice.
#![forbid(unsafe_code)]

mod build;
mod config;
mod error;
#[cfg(test)]
pub(crate) mod fixtures;
mod metrics;
mod model;
mod observe;
mod plan;
mod progress;
mod runtime;
mod state;
pub mod surface;
mod watchdog;
mod writes;

// What a process needs to run the operator: the binary, and the tests that run it in-process.
pub use build::crdgen::crd_yaml;
pub use config::{OperatorConfig, PriceEntry, ProgressChannel};
pub use error::Error;
pub use progress::AudienceCheck;
pub use runtime::leader::LeaderElection;
pub use runtime::{DEFAULT_MAX_CONCURRENT_RECONCILES, ProgressServing, RunConfig, run};
pub use trainyard_listen::HttpLimits;
