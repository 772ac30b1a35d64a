//! The kubelets' part, which the benchmark plays where the operator depends on it: pods
//! reported Running, and spot preemptions (DisruptionTarget, then a deletion with grace
//! period 0).

use std::collections::HashMap;
use std::time::Instant;

use futures::{StreamExt, future, stream};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;
use trainyard_operator::surface::pod_name;

use super::objects::TRAINER_IMAGE;
use super::params::OperatorBenchParams;
use crate::error::{Error, Result};

/// Writes what a kubelet would once the containers run: phase Running, the trainer running.
/// A pod that is gone by then (the operator replaced it) is skipped: returns how many were.
pub(super) async fn report_running(
    client: &Client,
    ns: &str,
    pods: Vec<String>,
    concurrency: usize,
) -> Result<usize> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let now = Timestamp::now().to_string();
    let patch = json!({"status": {
        "phase": "Running",
        "startTime": now,
        "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": now},
            {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
        ],
        "containerStatuses": [{
            "name": "trainer", "ready": true, "restartCount": 0, "started": true,
            "image": TRAINER_IMAGE, "imageID": "",
            "state": {"running": {"startedAt": now}},
        }],
    }});
    let results: Vec<Result<bool>> = stream::iter(pods)
        .map(|name| {
            let (api, patch) = (api.clone(), &patch);
            async move {
                match api
                    .patch_status(&name, &PatchParams::default(), &Patch::Strategic(patch))
                    .await
                {
                    Ok(_) => Ok(true),
                    Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
                    Err(e) => Err(Error::kube(format!("reporting pod {ns}/{name} Running"))(e)),
                }
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let reported = results.into_iter().collect::<Result<Vec<bool>>>()?;
    Ok(reported.iter().filter(|r| !**r).count())
}

/// Preempts one worker of each of the first K jobs at once, as a kubelet's graceful node
/// shutdown does: DisruptionTarget, then deletion (grace 0: no kubelet would finish a graceful
/// one). Returns when each job was preempted.
pub(super) async fn preempt(
    client: &Client,
    ns: &str,
    params: &OperatorBenchParams,
    round: u32,
) -> Result<HashMap<String, Instant>> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let burst = (0..params.preempt).map(|i| {
        let api = api.clone();
        async move {
            let job = format!("job-{i:05}");
            let pod = pod_name(&job, preempted_rank(i, round, params.workers));
            let at = Instant::now();
            preempt_pod(&api, ns, &pod).await?;
            Ok((job, at))
        }
    });
    future::join_all(burst).await.into_iter().collect()
}

/// A spot preemption of one pod as a newer kubelet reports it: DisruptionTarget, then deleted
/// with grace period 0 (gone already is fine: the operator may have deleted it first).
pub(super) async fn preempt_pod(api: &Api<Pod>, ns: &str, pod: &str) -> Result<()> {
    let patch = json!({"status": {"conditions": [{
        "type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet",
        "message": "trainyard-bench: simulated spot preemption",
        "lastTransitionTime": Timestamp::now().to_string(),
    }]}});
    api.patch_status(pod, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .map_err(Error::kube(format!(
            "setting DisruptionTarget on pod {ns}/{pod}"
        )))?;
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    delete_pod(api, ns, pod, &dp).await
}

/// Deletes pod `ns/name` with `dp`. A pod already gone (404) is done, and so is one whose uid
/// precondition no longer holds (409: the name holds another pod now, the one meant is gone).
pub(super) async fn delete_pod(
    api: &Api<Pod>,
    ns: &str,
    name: &str,
    dp: &DeleteParams,
) -> Result<()> {
    match api.delete(name, dp).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 && dp.preconditions.is_some() => Ok(()),
        Err(e) => Err(Error::kube(format!("deleting pod {ns}/{name}"))(e)),
    }
}

/// The rank of job `i` preempted in round `round`: a different one each round.
pub(super) fn preempted_rank(i: u32, round: u32, workers: u32) -> u32 {
    (i + round) % workers
}
