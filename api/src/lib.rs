//! trainyard-api: the cross-component contract of trainyard, in one place.
//!
//! The operator, the device plugin, the benchmarks and the tests all meet on a few names and
//! formats: the `TrainingJob` resource ([`crd`]), the GPU node labels the device plugin writes
//! and the operator's placement reads ([`gpu_labels`]), the environment the operator gives the
//! trainer ([`env`](mod@env), documented in docs/env-contract.md), "major.minor" versions
//! ([`Version`]) and how each cloud marks its spot nodes ([`spot`]). Each is written once here,
//! so a writer and its reader cannot drift apart. No logic beyond parsing lives here.
#![forbid(unsafe_code)]

pub mod crd;
pub mod env;
pub mod gpu_labels;
pub mod ranks;
pub mod spot;
pub mod version;

pub use version::{Version, VersionError};
