//! trainyard-operator: reconciles `TrainingJob` resources into gang-scheduled GPU worker pods
//! that run on cheap spot nodes and survive preemption by restarting from their latest
//! checkpoint.
//!
//! Folders are layers; a module imports only from layers below it, and no two modules import
//! each other:
//!
//! ```text
//! runtime/   run, watches, triggers, wiring, reconcile, leader election, the progress endpoint
//!   │
//!   ├─▶ observe/   what one reconcile reads: caches, the liveness index, the progress recall
//!   └─▶ writes/    the write path: executor (the write order), routine slots, Event publisher
//!         │
//!         ├─▶ state/     per-job memory and its one forgetting, expectations, the status cache
//!         ├─▶ progress/  the channel: server, TokenReview auth, report store, supervisors
//!         └─▶ plan/      decide(&Observed) -> Plan: PHASES, decided_by, the World tests
//!               └─▶ build/   desired objects: pods, Service, PVC, the CRD
//!                     └─▶ model/   pure rules: validate, placement, preemption, liveness, ...
//! ```
//!
//! The root holds what every layer shares: `config` (read by the rules, so below `model`),
//! `error`, `metrics` and `watchdog` (used by every layer above `plan`). They stay at the root,
//! not in `runtime/`, because `writes/`, `observe/`, `state/` and `progress/` use them and arrows
//! only point down. `progress/` sits below `observe/` and `writes/`, not beside `runtime/`: a
//! reconcile reads its store and a round's effects reach its supervisors.
//!
//! What it shares with the device plugin and the trainer (the `TrainingJob` types that
//! `model::crd` re-exports, the GPU label keys, the env names, the spot table) comes from the
//! contract crate `trainyard_api`.
//!
//! The crate's face is small on purpose: the root exports what a process needs to run the
//! operator ([`run`] and its [`RunConfig`]); tests and benchmarks use [`surface`]. Every other
//! module is private and may change without notice.
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
pub use model::seal::SealKey;
pub use progress::AudienceCheck;
pub use runtime::leader::LeaderElection;
pub use runtime::seal_secret;
pub use runtime::{DEFAULT_MAX_CONCURRENT_RECONCILES, ProgressServing, RunConfig, run};
pub use trainyard_listen::HttpLimits;
