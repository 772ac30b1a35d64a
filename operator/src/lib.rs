//! trainyard-operator: reconciles `TrainingJob` resources into gang-scheduled GPU worker pods
//! that run on cheap spot nodes and survive preemption by restarting from their latest
//! checkpoint.
//!
//! The reconcile is a pipeline of pure steps, each unit-tested without a cluster:
//! [`validate::validate`] → [`plan::decide`] (an ordered table of named phases over a read-only
//! view of the job; it uses [`placement`], [`preemption`] and the
//! [`lost_peer`] rule and the [`pods`], [`service`] and [`pvc`] builders, and creates nothing
//! where [`ownership`] finds an object of the job's names that is not its own) → the thin
//! [`controller`] that writes the status, carries out the actions, and shows the writes the API
//! server rejects on the job ([`rejection`]).
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
pub mod job_memory;
pub mod leader;
pub mod lost_peer;
pub mod metrics;
pub mod nodes;
pub mod ownership;
pub mod placement;
pub mod plan;
pub mod pods;
pub mod preemption;
pub mod pvc;
pub mod rejection;
pub mod service;
pub mod status_write;
pub mod trainer;
pub mod validate;
pub mod version;

pub use controller::{DEFAULT_MAX_CONCURRENT_RECONCILES, RunConfig, run};
