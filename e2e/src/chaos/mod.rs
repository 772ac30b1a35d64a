//! The chaos run: a seeded fault [`schedule`] and the [`invariants`] checked over everything
//! the run saw (pure, unit-tested); the [`checkpoint`] checks of `latest.pt` (whole, and the
//! step stored in it) and the job's processes as `/proc` shows them ([`procs`]); the
//! [`faults`] as real actions against the local cluster (those on a node's plumbing in
//! [`noise`]), and the [`run`] that plays a schedule against a real PyTorch job.

pub mod checkpoint;
pub mod faults;
pub mod invariants;
pub mod noise;
pub mod procs;
pub mod run;
pub mod schedule;
