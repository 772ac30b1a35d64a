//! What the operator guards share.

use std::path::PathBuf;
use std::time::Duration;

use trainyard_bench::scenario::OperatorBenchParams;

/// trainyard-operator of the same build profile: tests run from target/<profile>/deps/.
pub fn operator_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary has a path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test binary lives in target/<profile>/deps");
    let bin = profile_dir.join("trainyard-operator");
    assert!(
        bin.is_file(),
        "{} is missing: build it first (`cargo build -p trainyard-operator`; `make test` does)",
        bin.display()
    );
    bin
}

/// A small run of the benchmark harness: `jobs` × 2 workers on 5 fake nodes.
pub fn small_run(jobs: u32, preempt: u32, work_dir: &str) -> OperatorBenchParams {
    OperatorBenchParams {
        jobs,
        workers: 2,
        nodes: 5,
        gpus_per_worker: 1,
        preempt,
        concurrency: 16,
        // One of each: the count guards divide by the jobs of one burst.
        rounds: 1,
        operator_bin: operator_binary(),
        phase_timeout: Duration::from_secs(120),
        work_dir: trainyard_e2e::repo_root().join(work_dir),
        leader_elect: false,
        perf_record: None,
        max_concurrent_reconciles: None,
    }
}
