//! Regression guard for the operator benchmark: a seconds-long run of the same harness as
//! `make bench`, at a small size, that fails only when the operator's cost relative to the
//! floors of the same run gets 3× worse than recorded: its time to every pod created against
//! the fair floor (the TrainingJobs and what a controller must write for them, made directly;
//! the pods-only floor in reports that lack it), its API requests against the pods-only floor
//! (the same pods created directly).
//! Absolute times are never asserted, but a time ratio still moves with the machine's load
//! (a cold CI run once measured 6.79 against a limit of 6.6), so this guard runs in
//! `make bench` only (`--features timing-guards`). `make test` runs the count guard in
//! `operator_count_guard.rs`, whose verdict does not depend on load.

mod common;

use trainyard_bench::scenario;

/// operator / floor, time to every pod created, at 10 jobs × 2 workers on 5 fake nodes with
/// debug builds. Recorded on 2026-11-21 on the 2-CPU development machine (shared with other
/// work, load average 3-7) with
/// `cargo test -p trainyard-bench --test operator_ratio_guard -- --ignored --nocapture`:
/// five runs printed created ratios 2.21, 2.51, 1.55, 2.09, 3.05; this is their median.
/// Recorded against the pods-only floor; the fair floor does more per job (the TrainingJob,
/// its Service and a status write besides the pods), so against it the ratio can only be
/// lower: the bound stays safe, only looser, until it is recorded again against the fair floor.
const BASELINE_CREATED_RATIO: f64 = 2.2;
/// operator / floor API requests in the same five runs (2.35, 2.70, 2.85, 2.60, 3.35; the
/// floor makes exactly one request per pod): their median.
const BASELINE_REQUEST_RATIO: f64 = 2.7;
/// How much worse than the baseline a ratio may get before the guard fails.
const REGRESSION_FACTOR: f64 = 3.0;

#[tokio::test]
#[ignore = "needs the local cluster (make test)"]
async fn operator_to_floor_ratios_stay_within_3x_of_the_baseline() {
    let client = trainyard_e2e::client()
        .await
        .expect("a client for the local cluster");
    let params = common::small_run(10, 0, "target/bench-guard");
    let report = scenario::run(&client, &params, std::future::pending()).await;
    assert!(
        report.error.is_none(),
        "the benchmark run failed: {:?}",
        report.error
    );
    let (created, against) = match report.fair_created_ratio() {
        Some(r) => (r, "fair floor"),
        None => (
            report
                .created_ratio()
                .expect("both floor and operator were timed"),
            "pods-only floor",
        ),
    };
    let floor_requests = report
        .floor
        .as_ref()
        .map(|f| f.requests.total())
        .unwrap_or(0);
    let operator_requests = report
        .operator
        .as_ref()
        .map(|o| o.requests.total())
        .unwrap_or(0);
    assert!(floor_requests > 0, "the floor's requests were counted");
    let requests = operator_requests as f64 / floor_requests as f64;
    println!("ratios: created {created:.2} (against the {against}), requests {requests:.2}");
    assert!(
        created <= BASELINE_CREATED_RATIO * REGRESSION_FACTOR,
        "operator / {against} time to create every pod is {created:.2}, more than {REGRESSION_FACTOR}× the baseline {BASELINE_CREATED_RATIO}"
    );
    assert!(
        requests <= BASELINE_REQUEST_RATIO * REGRESSION_FACTOR,
        "operator/floor API requests are {requests:.2}, more than {REGRESSION_FACTOR}× the baseline {BASELINE_REQUEST_RATIO}"
    );
}
