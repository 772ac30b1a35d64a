//! Where the machine's CPU goes during a phase: the control plane's processes (found by their
//! PID files under `$TRAINYARD_E2E_STATE/pids`: the local cluster's, or the fresh control
//! plane's that bench/run.sh starts for each run), the operator and the benchmark itself, from
//! /proc.
//!
//! On a 2-CPU machine that also runs the API server, etcd and the scheduler, this is the
//! profile that explains a time ratio: which process was busy while the clock ran.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::operator_process::{clock_ticks, parse_stat_cpu_ticks};

/// Control-plane processes, by PID file name (up.sh and control-plane.sh name them alike).
const CONTROL_PLANE: [&str; 4] = [
    "kube-apiserver",
    "etcd",
    "kube-scheduler",
    "kube-controller-manager",
];

/// CPU seconds per process over one phase, and the phase's wall time.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuProfile {
    /// Wall-clock seconds of the phase.
    pub wall_seconds: f64,
    /// CPU seconds (user + system) per process.
    pub cpu_seconds: BTreeMap<String, f64>,
}

impl CpuProfile {
    /// CPU seconds of all measured processes.
    pub fn total(&self) -> f64 {
        self.cpu_seconds.values().sum()
    }
}

/// Samples the CPU time of a fixed set of processes.
#[derive(Clone, Debug)]
pub struct CpuSampler {
    procs: Vec<(String, u32)>,
    ticks: f64,
}

/// A point-in-time reading.
#[derive(Clone, Debug)]
pub struct CpuSample {
    at: Instant,
    ticks: BTreeMap<String, u64>,
}

impl CpuSampler {
    /// The control plane (PID files under `pid_dir`, those alive) and this process.
    pub fn new(pid_dir: &Path) -> Self {
        let mut procs: Vec<(String, u32)> = CONTROL_PLANE
            .iter()
            .filter_map(|name| {
                let pid = std::fs::read_to_string(pid_dir.join(format!("{name}.pid"))).ok()?;
                let pid: u32 = pid.trim().parse().ok()?;
                Path::new(&format!("/proc/{pid}"))
                    .exists()
                    .then(|| ((*name).to_owned(), pid))
            })
            .collect();
        procs.push(("trainyard-bench".to_owned(), std::process::id()));
        CpuSampler {
            procs,
            ticks: clock_ticks(),
        }
    }

    /// Adds a process (the operator once it runs).
    pub fn with(mut self, name: &str, pid: u32) -> Self {
        self.procs.push((name.to_owned(), pid));
        self
    }

    /// Reads every process's CPU ticks now (processes that are gone are left out).
    pub fn sample(&self) -> CpuSample {
        let ticks = self
            .procs
            .iter()
            .filter_map(|(name, pid)| {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
                Some((name.clone(), parse_stat_cpu_ticks(&stat)?))
            })
            .collect();
        CpuSample {
            at: Instant::now(),
            ticks,
        }
    }

    /// The profile between two samples.
    pub fn between(&self, start: &CpuSample, end: &CpuSample) -> CpuProfile {
        CpuProfile {
            wall_seconds: end.at.saturating_duration_since(start.at).as_secs_f64(),
            cpu_seconds: end
                .ticks
                .iter()
                .filter_map(|(name, t)| {
                    let before = start.ticks.get(name)?;
                    Some((name.clone(), t.saturating_sub(*before) as f64 / self.ticks))
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_always_sampled() {
        let sampler = CpuSampler::new(Path::new("/nonexistent"));
        let a = sampler.sample();
        // Burn a little CPU so the difference can be non-zero; only its sign is asserted.
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let b = sampler.sample();
        let p = sampler.between(&a, &b);
        assert!(p.cpu_seconds.contains_key("trainyard-bench"));
        assert!(p.total() >= 0.0);
        assert!(p.wall_seconds >= 0.0);
    }
}
