//! Success, the deadline, and the pods a finished job stops.

use super::*;

#[test]
fn every_trainer_exiting_zero_succeeds_the_job() {
    let mut w = World::running_world("workers: 2\n");
    w.exit("train-worker-0", 0);
    let plan = w.step();
    assert_eq!(
        plan.status.phase,
        Some(Phase::Running),
        "one rank done is not the job done"
    );
    w.exit("train-worker-1", 0);
    let plan = w.step();
    assert_eq!(plan.status.phase, Some(Phase::Succeeded));
    assert!(plan.status.completion_time.is_some());
    assert!(
        plan.actions.is_empty(),
        "completed pods stay for their logs"
    );
    let again = w.step();
    assert_eq!(again.status, plan.status);
    assert_eq!(
        w.decided,
        [
            PhaseName::Running,
            PhaseName::Running,
            PhaseName::Running,
            PhaseName::Success,
            PhaseName::Terminal,
        ]
    );
}

#[test]
fn success_deletes_pods_whose_sidecar_still_runs_and_keeps_completed_ones() {
    let mut w = World::running_world(
        "workers: 2\ngpusPerWorker: 1\ntemplate:\n  spec:\n    containers:\n    - {name: trainer, image: t}\n    - {name: log-shipper, image: s}\n",
    );
    w.exit("train-worker-0", 0);
    // Rank 1's trainer exited 0, but its sidecar runs on and the pod keeps its GPU.
    w.set_status(
        "train-worker-1",
        json!({"phase": "Running", "startTime": T0, "containerStatuses": [
            {"name": "trainer", "ready": false, "restartCount": 0, "image": "t", "imageID": "",
             "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
            {"name": "log-shipper", "ready": true, "restartCount": 0, "image": "s", "imageID": "",
             "state": {"running": {"startedAt": T0}}}]}),
    );
    let decided = w.decide();
    assert_eq!(decided.status.phase, Some(Phase::Succeeded));
    assert_eq!(
        decided.actions,
        [Action::DeletePod {
            name: "train-worker-1".into(),
            uid: Some("train-worker-1-0".into()),
        }],
        "only the pod that still runs is stopped; the completed one stays for its logs"
    );
    // The controller crashed after writing Succeeded: the next round stops it all the same.
    w.status = decided.status.clone();
    let replay = w.step();
    assert_eq!(replay.actions, decided.actions);
    assert_eq!(replay.status, decided.status);
    let again = w.step();
    assert!(again.actions.is_empty(), "{:?}", again.actions);
    assert_eq!(
        w.decided,
        [
            PhaseName::Running,
            PhaseName::Running,
            PhaseName::Terminal,
            PhaseName::Terminal,
        ]
    );
}

#[test]
fn a_pod_is_finished_only_when_every_container_has_stopped() {
    let done = json!({"terminated": {"exitCode": 0}});
    let running = json!({"running": {"startedAt": T0}});
    let status = |name: &str, state: &serde_json::Value| json!({"name": name, "ready": false, "restartCount": 0, "image": "x", "imageID": "", "state": state});
    let pod = |phase: &str, containers: serde_json::Value, init: serde_json::Value| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "trainer"}, {"name": "sidecar"}]},
            "status": {"phase": phase, "containerStatuses": containers, "initContainerStatuses": init},
        }))
        .expect("pod")
    };
    let table = [
        ("final phase", pod("Succeeded", json!([]), json!([])), true),
        (
            "all stopped, phase not updated yet",
            pod(
                "Running",
                json!([status("trainer", &done), status("sidecar", &done)]),
                json!([]),
            ),
            true,
        ),
        (
            "sidecar runs",
            pod(
                "Running",
                json!([status("trainer", &done), status("sidecar", &running)]),
                json!([]),
            ),
            false,
        ),
        (
            "sidecar not reported",
            pod("Running", json!([status("trainer", &done)]), json!([])),
            false,
        ),
        (
            "native sidecar init container runs",
            pod(
                "Running",
                json!([status("trainer", &done), status("sidecar", &done)]),
                json!([status("proxy", &running)]),
            ),
            false,
        ),
        ("no status yet", pod("Pending", json!([]), json!([])), false),
    ];
    for (case, pod, finished) in table {
        assert_eq!(is_finished(&CachedPod::from(&pod)), finished, "{case}");
    }
}

#[test]
fn active_deadline_fails_the_job_and_stops_the_workers() {
    let mut w = World::running_world("workers: 2\nactiveDeadlineSeconds: 60\n");
    w.advance(30);
    let plan = w.step();
    assert_eq!(plan.status.phase, Some(Phase::Running));
    assert_eq!(plan.requeue_at, Some(ts("2026-01-01T00:01:00Z")));
    w.advance(30);
    let plan = w.step();
    assert_eq!(plan.status.phase, Some(Phase::Failed));
    assert_eq!(
        plan.status
            .conditions
            .iter()
            .find(|c| c.type_ == condition::FAILED)
            .expect("Failed")
            .reason,
        "DeadlineExceeded"
    );
    assert_eq!(World::deletes(&plan), 2);
    assert_eq!(
        w.decided,
        [
            PhaseName::Running,
            PhaseName::Running,
            PhaseName::Running,
            PhaseName::Deadline,
        ]
    );
}
