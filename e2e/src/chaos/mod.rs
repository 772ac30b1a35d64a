//! The chaos run's pure parts: a seeded fault [`schedule`] and the [`invariants`] checked
//! over everything the run's watches saw. The driver that injects the faults into the local
//! cluster lives with the scenarios; nothing here touches a cluster, so both are unit-tested.

pub mod invariants;
pub mod schedule;
