//! The controller's side of the progress channel (`crate::progress`): what a reconcile reads
//! of the trainers' reports, what it tells them back (a checkpoint request), the metrics it
//! derives, and where the leader serves the endpoint.

use std::future::Future;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Endpoints;
use kube::api::{Patch, PatchParams};
use kube::core::error_boundary::DeserializeGuard;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::mpsc;

use super::triggers::JobRef;
use super::{Context, FIELD_MANAGER, ProgressServing};
use crate::cached_pod::CachedPod;
use crate::crd::TrainingJob;
use crate::error::Error;
use crate::metrics::{JobLabels, Metrics};
use crate::plan::{self, ObservedProgress, RankProgress};
use crate::progress::auth::KubeTokenReviewer;
use crate::progress::server::{self, ProgressServer, WorkerPods};
use crate::progress::store::{JobProgress, ProgressStore};
use crate::validate::ValidJob;

/// Wakes queued by the endpoint before the controller takes them: beyond it a wake is
/// dropped, and the job's next reconcile reads the store anyway.
const WAKE_QUEUE: usize = 1024;

/// What a round measured of the trainers, counted after its writes.
pub(super) struct FollowUp {
    steps_lost: Option<u64>,
}

impl FollowUp {
    pub(super) fn of(plan: &plan::Plan) -> Self {
        Self {
            steps_lost: plan.steps_lost,
        }
    }
}

/// The store's reports as the decision reads them.
fn as_observed(p: JobProgress) -> ObservedProgress {
    ObservedProgress {
        attempt: p.attempt,
        ranks: p
            .ranks
            .iter()
            .map(|(&rank, r)| RankProgress {
                rank,
                step: r.step,
                advanced_at: r.advanced_at,
                reported_at: r.reported_at,
            })
            .collect(),
        checkpoint: p.checkpoint_step.zip(p.checkpoint_at),
        resumed_from: p.resumed_from,
        previous_attempt_step: p.previous_attempt_step,
        checkpoint_requested: p.checkpoint_requested,
        checkpoint_saved_on_request: p.checkpoint_saved_on_request,
    }
}

impl Context {
    /// What the job's trainers have reported, and its step rate on the gauge.
    pub(super) fn observe_progress(&self, job: &ValidJob) -> Option<ObservedProgress> {
        // Reports of an earlier job of the same name are not this job's.
        let progress = self
            .progress
            .snapshot(&job.namespace, &job.name)
            .filter(|p| p.job_uid == job.uid)?;
        if let Some(rate) = progress.steps_per_second {
            self.metrics
                .steps_per_second
                .get_or_create(&job_labels(&job.namespace, &job.name))
                .set(rate);
        }
        Some(as_observed(progress))
    }

    /// Asks the trainers for a checkpoint, or withdraws the request, as `plan` decided: at
    /// once, as soon as it is decided. It costs no request to the API server, so it never
    /// waits for a write slot: a reclaim wave fills the write gate with restarts exactly when
    /// termination notices come, and a notice leaves the trainers seconds.
    pub(super) fn tell_trainers(&self, job: &ValidJob, plan: &plan::Plan) {
        if let Some(attempt) = plan.checkpoint_withdrawal {
            self.progress
                .withdraw_checkpoint_request(&job.namespace, &job.name, attempt);
        }
        if let Some(attempt) = plan.checkpoint_request {
            self.progress
                .request_checkpoint(&job.namespace, &job.name, attempt);
        }
    }

    /// Counts the steps a preemption lost.
    pub(super) fn follow_progress(&self, follow_up: FollowUp) {
        if let Some(lost) = follow_up.steps_lost {
            // Steps are far below 2^53: exact as f64.
            self.metrics.steps_lost.observe(lost as f64);
        }
    }
}

fn job_labels(namespace: &str, job: &str) -> JobLabels {
    JobLabels {
        namespace: namespace.to_owned(),
        job: job.to_owned(),
    }
}

/// Forgets a deleted job's reports (and its workers' late ones) and its gauge.
pub(super) fn forget_job(
    progress: &ProgressStore,
    metrics: &Metrics,
    namespace: &str,
    job: &str,
    uid: &str,
) {
    progress.forget(namespace, job, uid);
    metrics.steps_per_second.remove(&job_labels(namespace, job));
}

/// The wake channel of the endpoint, and the stream of jobs it wakes for the controller.
pub(super) fn wake_channel() -> (
    mpsc::Sender<(String, String)>,
    impl Stream<Item = JobRef> + Send + 'static,
) {
    let (tx, mut rx) = mpsc::channel::<(String, String)>(WAKE_QUEUE);
    let stream = futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
        .map(|(ns, job)| ObjectRef::new(&job).within(&ns));
    (tx, stream)
}

/// Serves the progress endpoint while this replica leads, and points the progress Service's
/// Endpoints at it, so that reports reach the leader only. A report is taken from a pod of a
/// job in `jobs` only ([`WorkerPods`]).
#[allow(clippy::too_many_arguments)]
pub(super) async fn serve(
    client: Client,
    serving: &ProgressServing,
    progress: Arc<ProgressStore>,
    pods: Store<CachedPod>,
    jobs: Store<DeserializeGuard<TrainingJob>>,
    metrics: Arc<Metrics>,
    wake: mpsc::Sender<(String, String)>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let endpoint = Arc::new(ProgressServer {
        store: progress,
        reviewer: Arc::new(
            KubeTokenReviewer::new(client.clone(), &serving.audience)
                .checking_audiences(serving.audiences),
        ),
        pods: Arc::new(WorkerPods { pods, jobs }),
        metrics,
        wake,
    });
    let (local, serving_future) =
        server::serve_within(serving.addr, endpoint, serving.limits, stop).await?;
    tracing::info!(%local, "serving the progress channel (POST /v1/progress)");
    tokio::spawn(async move {
        if let Err(e) = serving_future.await {
            tracing::error!(error = %e, "progress server stopped");
        }
    });
    if let (Some((ns, name)), Some(ip)) = (serving.endpoints.clone(), serving.pod_ip.clone()) {
        let port = local.port();
        tokio::spawn(keep_endpoints_pointed(client, ns, name, ip, port));
    }
    Ok(())
}

/// How often the leader checks that the progress Service still routes to it (the Endpoints
/// object may be created after the operator starts, or recreated by an upgrade).
const ENDPOINTS_RECHECK: std::time::Duration = std::time::Duration::from_secs(60);
/// How soon a failed attempt to point the Endpoints is repeated.
const ENDPOINTS_RETRY: std::time::Duration = std::time::Duration::from_secs(5);

/// Points the progress Service's Endpoints at this replica, again after a failure and every
/// [`ENDPOINTS_RECHECK`], for as long as this replica leads (the task ends with the process,
/// which exits when it loses the Lease).
async fn keep_endpoints_pointed(client: Client, ns: String, name: String, ip: String, port: u16) {
    let mut pointed = false;
    loop {
        let wait = match point_endpoints(client.clone(), &ns, &name, &ip, port).await {
            Ok(()) => {
                if !pointed {
                    tracing::info!(endpoints = %format!("{ns}/{name}"), %ip, port, "progress Service routes to this replica");
                }
                pointed = true;
                ENDPOINTS_RECHECK
            }
            Err(e) => {
                tracing::warn!(error = %e, "pointing the progress Service at this replica; retrying");
                pointed = false;
                ENDPOINTS_RETRY
            }
        };
        tokio::time::sleep(wait).await;
    }
}

/// Points the progress Service's Endpoints at this replica.
async fn point_endpoints(
    client: Client,
    ns: &str,
    name: &str,
    ip: &str,
    port: u16,
) -> Result<(), Error> {
    let patch = json!({"subsets": [{
        "addresses": [{"ip": ip}],
        "ports": [{"name": "progress", "port": port, "protocol": "TCP"}],
    }]});
    Api::<Endpoints>::namespaced(client, ns)
        .patch(
            name,
            &PatchParams {
                field_manager: Some(FIELD_MANAGER.to_owned()),
                ..PatchParams::default()
            },
            &Patch::Merge(&patch),
        )
        .await
        .map_err(Error::kube(format!(
            "pointing Endpoints {ns}/{name} at this leader ({ip}:{port})"
        )))?;
    Ok(())
}
