//! trainyard-bench: the operator at scale against a real API server (in `make bench`, a fresh
//! control plane for each run).
//!
//! [`scenario::run`] creates fake GPU nodes ([`fake_nodes`]), measures the floor (the same pods
//! created directly) and the operator (the real binary, [`operator_process`]) with one pod
//! watch ([`pod_tracker`]), counts each client's API requests through a reverse proxy
//! ([`proxy`]), preempts a burst of workers (each job's recovery split into stages by
//! [`recovery_stages`]), and cleans everything up. [`report`] and [`doc`] turn the results into
//! `docs/benchmarks.md`, judging each run by [`limits`] and each size by its worst run
//! ([`by_size`]). [`progress_load`] loads the operator's progress endpoint in-process
//! with simulated reporting ranks (no cluster). The `trainyard-bench` binary and the ratio
//! regression test in `tests/` both drive it.
#![forbid(unsafe_code)]

pub mod by_size;
pub mod cpu_profile;
pub mod doc;
pub mod error;
pub mod fake_nodes;
pub mod limits;
pub mod operator_process;
pub mod pod_tracker;
pub mod progress_load;
pub mod proxy;
pub mod recovery_stages;
pub mod report;
pub mod scenario;
pub mod stats;

pub use error::{Error, Result};
pub use scenario::{OperatorBenchParams, OperatorBenchReport, run};
