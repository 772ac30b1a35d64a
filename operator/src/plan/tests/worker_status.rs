//! `status.workers` within bounds for large gangs, and the worker summary.

use super::*;

/// Status is bounded by design: 10,000 workers that no node can take, each with the
/// scheduler's long message, give a status of a few KiB, with every worker counted and every
/// rank recorded.
#[test]
fn ten_thousand_unschedulable_workers_give_a_status_under_64_kib() {
    let mut w = World::new("workers: 10000\ngpusPerWorker: 16\n");
    w.step();
    assert_eq!(w.pods.len(), 10_000);
    let message = format!(
        "0/3 nodes are available: {}",
        "Insufficient nvidia.com/gpu. ".repeat(40)
    );
    for p in &mut w.pods {
        let mut pod = (**p).clone();
        pod.spec.as_mut().expect("spec").node_name = None;
        pod.status = serde_json::from_value(json!({"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "message": message}]}))
        .ok();
        *p = Arc::new(pod);
    }
    w.advance(60);
    let plan = w.step();
    let bytes = serde_json::to_vec(&plan.status).expect("status").len();
    assert!(bytes < 64 * 1024, "{bytes} bytes");
    assert_eq!(
        plan.status.workers.len(),
        crate::model::crd::MAX_WORKER_ENTRIES
    );
    let summary = plan.status.worker_summary.clone().expect("summary");
    assert_eq!((summary.pending, summary.running), (10_000, 0));
    assert_eq!(summary.seen_ranks, "0-9999");
    for w in &plan.status.workers {
        let reason = w.reason.as_deref().expect("reason");
        assert!(
            reason.chars().count() <= crate::model::crd::MAX_REASON_CHARS,
            "{reason}"
        );
    }
}

/// A gang larger than `status.workers` lists: a running rank that is not listed and
/// disappears is still a preemption, since the decision reads the recorded ranks.
#[test]
fn an_unlisted_rank_that_disappears_from_a_large_gang_was_preempted() {
    let mut w = World::new("workers: 100\ngpusPerWorker: 0\n");
    w.step();
    w.run_all();
    w.step();
    assert_eq!(w.status.phase, Some(Phase::Running));
    assert!(w.status.workers.iter().all(|x| x.rank != 77));
    w.pods
        .retain(|p| p.metadata.name.as_deref() != Some("train-worker-77"));
    let plan = w.step();
    assert_eq!(plan.restart, Some(RestartReason::Preemption));
    let detail = plan.status.last_restart.expect("restart").detail;
    assert!(detail.contains("train-worker-77"), "{detail}");
}

/// A restart written without clearing the worker summary (by hand, or by a tool that merges
/// status): the summary of attempt 0 says nothing of attempt 1, whose pods are created, not
/// taken for lost.
#[test]
fn a_worker_summary_of_another_attempt_is_not_read() {
    let mut w = World::running_world("workers: 2\n");
    assert_eq!(
        w.status
            .worker_summary
            .as_ref()
            .map(|s| (s.attempt, s.seen_ranks.as_str())),
        Some((0, "0-1"))
    );
    w.status.attempt = 1;
    w.status.workers.clear();
    w.status.phase = Some(Phase::Restarting);
    w.pods.clear();
    let plan = w.step();
    assert_eq!(plan.restart, None, "{:?}", plan.status.last_restart);
    assert_eq!(created_pods(&plan).len(), 2);
}
