//! trainyard-operator: reconciles `TrainingJob` resources into gang-scheduled GPU worker pods
//! that run on cheap spot nodes and survive preemption by restarting from their latest
//! checkpoint.
//!
//! The reconcile is a pipeline of pure steps, each unit-tested without a cluster:
//! [`validate::validate`] → [`plan::decide`] (an ordered table of named phases over a read-only
//! view of the job; it uses [`placement`], [`preemption`] and the
//! [`lost_peer`] rule and the [`pods`], [`service`] and [`pvc`] builders, and creates nothing
//! where [`ownership`] finds an object of the job's names that is not its own) → the thin
//! [`controller`]: wiring, a status cache and an executor that writes the status and carries
//! out the actions in one stated order, and shows the writes the API server rejects on the job
//! ([`rejection`]).
//!
//! What it shares with the device plugin and the trainer (the `TrainingJob` types that [`crd`]
//! re-exports, the GPU label keys, the env names, version parsing, the spot provider table)
//! comes from the contract crate `trainyard_api`.
//!
//! Tests and benchmarks use the operator through [`surface`].
#![forbid(unsafe_code)]

pub mod cached_pod;
pub mod condition;
pub mod config;
pub mod controller;
pub mod crd;
pub mod crdgen;
pub mod error;
pub mod events;
pub mod expectations;
#[cfg(test)]
pub(crate) mod fixtures;
pub mod heartbeat;
pub mod leader;
pub mod ledger;
pub mod listen;
pub mod lost_peer;
pub mod metrics;
pub mod nodes;
pub mod ownership;
pub mod placement;
pub mod plan;
pub mod pods;
pub mod preemption;
pub mod progress;
pub mod pvc;
pub mod reason;
pub mod rejection;
pub mod service;
pub mod surface;
pub mod trainer;
pub mod validate;
pub mod write_limit;

pub use controller::{
    DEFAULT_MAX_CONCURRENT_WRITES, DEFAULT_MEMORY_BUDGET_MIB, ProgressServing, RunConfig, run,
};
