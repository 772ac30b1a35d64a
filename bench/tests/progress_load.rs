//! The progress load test run tiny: counts only, never a time. Every valid report is accepted,
//! every flood request is refused (4xx or 503), and the store holds one entry per job.

use trainyard_bench::progress_load::{self, ProgressLoadParams};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_ranks_are_all_accepted_and_the_whole_flood_refused() {
    let params = ProgressLoadParams {
        ranks: 20,
        jobs: 5,
        seconds: 2.0,
        interval_ms: 250,
        flood_requests: 300,
        flood_connections: 16,
    };
    let report = progress_load::run(&params)
        .await
        .expect("the load test runs");
    println!("{}", progress_load::markdown(&report));

    let op = &report.operator;
    assert!(op.sent >= 20, "every rank reported at least once: {op:?}");
    assert_eq!(op.accepted, op.sent, "{op:?}");
    assert_eq!(op.unanswered, 0);
    assert_eq!(report.server_outcomes.get("accepted"), Some(&op.accepted));
    assert_eq!(report.distinct_tokens_reviewed, 20);

    let flood = &report.flood;
    assert_eq!(flood.sent, 300);
    assert_eq!(flood.unanswered, 0, "{flood:?}");
    assert_eq!(flood.refused(), 300, "{flood:?}");

    assert_eq!(report.store_entries, 5);
    assert_eq!(report.floor.accepted, report.floor.sent);
    assert!(report.problems().is_empty(), "{:?}", report.problems());
}
