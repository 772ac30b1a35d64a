//! The chaos run: a seeded fault [`schedule`], the [`invariants`] checked over everything the
//! run's watches saw, and the [`checkpoint`] check of `latest.pt` (all pure, unit-tested); the
//! [`faults`] as real actions against the local cluster, and the [`run`] that plays a
//! schedule against a real PyTorch job.

pub mod checkpoint;
pub mod faults;
pub mod invariants;
pub mod run;
pub mod schedule;
