//! The chaos run on the local cluster: a real PyTorch DDP job across both nodes while a seeded
//! schedule of faults runs, every invariant of `trainyard_e2e::chaos::invariants` checked
//! throughout. The seed is printed first; `TRAINYARD_CHAOS_SEED` replays it and
//! `TRAINYARD_CHAOS_FAULTS` sets how many faults (`make test`: one fixed seed, 6 faults of
//! 6 kinds, a genuine trainer failure among them; `make chaos`: many seeds of 12).
//! `KUBECONFIG=/var/lib/trainyard-e2e/kubeconfig cargo test -p trainyard-e2e --test chaos -- --ignored`

use std::io::Write;

use anyhow::{Context, Result, ensure};
use trainyard_e2e::chaos::run::run;
use trainyard_e2e::chaos::schedule::{MAKE_TEST_SEED, Schedule, ScheduleConfig};
use trainyard_e2e::jobs::{install_chart, with_spot_node};
use trainyard_e2e::repo_root;

fn env_number(name: &str, default: u64) -> Result<u64> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .with_context(|| format!("{name}={v} is not a number")),
        Err(_) => Ok(default),
    }
}

#[tokio::test]
#[ignore = "needs the local cluster (make test)"]
async fn a_seeded_chaos_run_keeps_every_invariant() -> Result<()> {
    let seed = env_number("TRAINYARD_CHAOS_SEED", MAKE_TEST_SEED)?;
    let faults = usize::try_from(env_number("TRAINYARD_CHAOS_FAULTS", 6)?)?;
    // `make test`'s seed draws as its unit test pins it (no `ForgedWorker`); others from every kind.
    let base = if seed == MAKE_TEST_SEED {
        ScheduleConfig::make_test()
    } else {
        ScheduleConfig::default()
    };
    let config = ScheduleConfig { faults, ..base };
    let schedule = Schedule::generate(seed, &config);
    println!("{schedule}");
    let dir = repo_root().join("target/chaos");
    std::fs::create_dir_all(&dir)?;
    let mut results = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("results.jsonl"))?;
    let report = match run_on_the_cluster(&schedule).await {
        Ok(report) => report,
        Err(e) => {
            // A run the harness could not finish is a result too: the table shows it failed.
            let kinds: Vec<String> = schedule.faults.iter().map(|f| f.kind.to_string()).collect();
            writeln!(
                results,
                "{}",
                serde_json::json!({"seed": seed, "faults": kinds, "error": format!("{e:#}")})
            )?;
            return Err(e.context(format!("chaos seed {seed}: the run did not finish")));
        }
    };
    println!("{report:#?}");
    writeln!(
        results,
        "{}",
        serde_json::json!({
            "seed": report.seed, "faults": report.kinds_injected(),
            "not_injected": report.not_injected, "skipped": report.skipped(),
            "attempt": report.attempt, "preemptions": report.preemptions,
            "failures": report.failures, "hangs": report.hangs,
            "steps_lost": report.steps_lost, "checkpoints_read": report.checkpoints_read,
            "steps_read": report.steps_read, "proc_scans": report.proc_scans,
            "in_place": report.in_place,
            "standbys_ready": report.standbys.ready,
            "standbys_given_up": report.standbys.given_up,
            "standbys_withdrawn": report.standbys.withdrawn,
            "wall_seconds": report.wall.as_secs(),
            "violations": report.violations.iter().map(ToString::to_string).collect::<Vec<_>>(),
        })
    )?;
    ensure!(
        report.violations.is_empty(),
        "chaos seed {seed}: {} invariant(s) broken:\n{}",
        report.violations.len(),
        report
            .violations
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    );
    Ok(())
}

/// Installs the chart and plays `schedule` with the spot node schedulable.
async fn run_on_the_cluster(schedule: &Schedule) -> Result<trainyard_e2e::chaos::run::RunReport> {
    let client = trainyard_e2e::client().await?;
    install_chart(&client).await?;
    let mut report = None;
    with_spot_node(&client, || async {
        report = Some(run(&client, schedule).await?);
        Ok(())
    })
    .await?;
    report.context("the run ended without a report")
}
