//! Where the leader serves the progress channel (`crate::progress`), and the stream of jobs its
//! reports wake. What a reconcile reads of the reports is `crate::observe::recall`; what a round
//! tells the trainers back (a checkpoint request) is carried out by the write path's executor.

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
use tokio::task::JoinHandle;

use super::context::ProgressServing;
use crate::error::Error;
use crate::metrics::Metrics;
use crate::model::cached_pod::CachedPod;
use crate::model::crd::TrainingJob;
use crate::progress::auth::KubeTokenReviewer;
use crate::progress::server::{self, ProgressServer, WorkerPods};
use crate::progress::store::ProgressStore;
use crate::state::JobRef;
use crate::writes::FIELD_MANAGER;

/// Wakes queued by the endpoint before the controller takes them: beyond it a wake is
/// dropped, and the job's next reconcile reads the store anyway.
const WAKE_QUEUE: usize = 1024;

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
/// Endpoints at it, so that reports reach the leader only. The task returned (with Endpoints to
/// point) keeps them pointed until `stop`, then hands them back ([`LeaderEndpoints::lead`]);
/// the controller awaits it before it gives up the Lease.
#[allow(clippy::too_many_arguments)]
pub(super) async fn serve(
    client: Client,
    serving: &ProgressServing,
    progress: Arc<ProgressStore>,
    pods: Store<CachedPod>,
    jobs: Store<DeserializeGuard<TrainingJob>>,
    metrics: Arc<Metrics>,
    wake: mpsc::Sender<(String, String)>,
    stop: impl Future<Output = ()> + Clone + Send + 'static,
) -> Result<Option<JoinHandle<()>>, Error> {
    let reviewer = KubeTokenReviewer::new(client.clone(), &serving.audience)
        .checking_audiences(serving.audiences);
    let board = progress.clone();
    let endpoint = Arc::new(ProgressServer {
        store: progress,
        reviewer: Arc::new(reviewer),
        pods: Arc::new(WorkerPods {
            pods,
            jobs,
            seal: serving.seal.clone(),
        }),
        metrics,
        wake,
    });
    let (local, serving_future) =
        server::serve_within(serving.addr, endpoint, serving.limits, stop.clone()).await?;
    tracing::info!(%local, "serving the progress channel (POST /v1/progress)");
    board.supervisors.listen(jiff::Timestamp::now());
    tokio::spawn(async move {
        if let Err(e) = serving_future.await {
            tracing::error!(error = %e, "progress server stopped");
        }
    });
    let (Some((ns, name)), Some(ip)) = (serving.endpoints.clone(), serving.pod_ip.clone()) else {
        return Ok(None);
    };
    let endpoints = LeaderEndpoints {
        api: Api::namespaced(client, &ns),
        ns,
        name,
        ip,
        port: local.port(),
    };
    Ok(Some(tokio::spawn(endpoints.lead(stop))))
}

/// How often the leader checks that the progress Service still routes to it (the Endpoints
/// object may be created after the operator starts, or recreated by an upgrade).
const ENDPOINTS_RECHECK: std::time::Duration = std::time::Duration::from_secs(60);
/// How soon a failed attempt to point the Endpoints is repeated.
const ENDPOINTS_RETRY: std::time::Duration = std::time::Duration::from_secs(5);
/// How long stepping down may spend handing the Endpoints back: the pod's termination grace
/// period is 30 s by default, and a new leader re-points them anyway.
const STEP_DOWN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The progress Service's Endpoints object, as this replica writes it while it leads.
struct LeaderEndpoints {
    api: Api<Endpoints>,
    ns: String,
    name: String,
    /// This replica's pod IP.
    ip: String,
    /// The port it serves the progress channel on.
    port: u16,
}

impl LeaderEndpoints {
    /// Keeps the Endpoints pointed at this replica until `stop`, then hands them back: while
    /// they still point here, their addresses are removed, so that reports fail at once
    /// (connection refused) instead of going to a replica that no longer serves them, until
    /// the next leader points them at itself.
    async fn lead(self, stop: impl Future<Output = ()>) {
        tokio::select! {
            () = self.keep_pointed() => {}
            () = stop => {}
        }
        match tokio::time::timeout(STEP_DOWN_TIMEOUT, self.hand_back()).await {
            Ok(Ok(())) => {
                tracing::info!(endpoints = %self.key(), "handed the progress Service's Endpoints back")
            }
            // A new leader pointed them at itself already, or they are gone: nothing of ours.
            Ok(Err(e)) => {
                tracing::info!(error = %e, "left the progress Service's Endpoints as they are")
            }
            Err(_) => {
                tracing::warn!(endpoints = %self.key(), "handing the progress Service's Endpoints back timed out")
            }
        }
    }

    fn key(&self) -> String {
        format!("{}/{}", self.ns, self.name)
    }

    /// Points the Endpoints at this replica, again after a failure and every
    /// [`ENDPOINTS_RECHECK`]; never returns.
    async fn keep_pointed(&self) {
        let mut pointed = false;
        loop {
            let wait = match self.point().await {
                Ok(()) => {
                    if !pointed {
                        tracing::info!(endpoints = %self.key(), ip = %self.ip, port = self.port, "progress Service routes to this replica");
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

    /// Points the Endpoints at this replica (a merge patch: `subsets` replaced whole).
    async fn point(&self) -> Result<(), Error> {
        let patch = json!({"subsets": [{
            "addresses": [{"ip": self.ip}],
            "ports": [{"name": "progress", "port": self.port, "protocol": "TCP"}],
        }]});
        self.api
            .patch(&self.name, &patch_params(), &Patch::Merge(&patch))
            .await
            .map_err(Error::kube(format!(
                "pointing Endpoints {} at this leader ({}:{})",
                self.key(),
                self.ip,
                self.port
            )))?;
        Ok(())
    }

    /// Removes the Endpoints' subsets if they still point at this replica: one JSON patch whose
    /// `test` makes the API server refuse it when another replica has pointed them at itself.
    async fn hand_back(&self) -> Result<(), Error> {
        let patch = serde_json::from_value(hand_back_patch(&self.ip)).map_err(|source| {
            Error::Serialize {
                what: "the Endpoints step-down patch",
                source,
            }
        })?;
        self.api
            .patch(&self.name, &patch_params(), &Patch::<()>::Json(patch))
            .await
            .map_err(Error::kube(format!(
                "handing Endpoints {} back (if they still point at {})",
                self.key(),
                self.ip
            )))?;
        Ok(())
    }
}

fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    }
}

/// The JSON patch that removes the Endpoints' subsets only while their one address is `ip`.
fn hand_back_patch(ip: &str) -> serde_json::Value {
    json!([
        {"op": "test", "path": "/subsets/0/addresses/0/ip", "value": ip},
        {"op": "remove", "path": "/subsets"},
    ])
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use futures::FutureExt;
    use kube::runtime::reflector;
    use serde_json::Value;
    use trainyard_listen::HttpLimits;

    use super::*;
    use crate::progress::auth::AudienceCheck;

    /// A request as the fake API server saw it: method, path, content type, body.
    type SeenRequest = (String, String, String, Value);

    /// A client whose every request is answered 200 with an empty Endpoints object, and recorded.
    fn recording_client() -> (Client, Arc<Mutex<Vec<SeenRequest>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let recorder = seen.clone();
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let recorder = recorder.clone();
            async move {
                let (parts, body) = request.into_parts();
                let content_type = parts
                    .headers
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned();
                let body: Value =
                    serde_json::from_slice(&body.collect_bytes().await?).unwrap_or(Value::Null);
                recorder.lock().expect("seen").push((
                    parts.method.to_string(),
                    parts.uri.path().to_owned(),
                    content_type,
                    body,
                ));
                let endpoints = json!({"apiVersion": "v1", "kind": "Endpoints",
                                       "metadata": {"name": "trainyard-progress"}});
                Ok::<_, kube::Error>(
                    http::Response::builder()
                        .status(200)
                        .header("content-type", "application/json")
                        .body(kube::client::Body::from(
                            serde_json::to_vec(&endpoints).expect("json"),
                        ))
                        .expect("response"),
                )
            }
        });
        (Client::new(service, "default"), seen)
    }

    #[tokio::test]
    async fn the_leader_points_the_endpoints_at_itself_and_hands_them_back_when_it_steps_down() {
        let (client, seen) = recording_client();
        let serving = ProgressServing {
            addr: "127.0.0.1:0".parse().expect("addr"),
            audience: "trainyard-progress".to_owned(),
            endpoints: Some((
                "trainyard-system".to_owned(),
                "trainyard-progress".to_owned(),
            )),
            pod_ip: Some("10.0.0.7".to_owned()),
            limits: HttpLimits::PROGRESS,
            audiences: AudienceCheck::Listed,
            seal: crate::model::seal::SealKey::default(),
        };
        let (step_down, stepped_down) = tokio::sync::oneshot::channel::<()>();
        let stop = async move {
            let _ = stepped_down.await;
        }
        .shared();
        let (wake, _woken) = mpsc::channel(1);
        let leading = serve(
            client,
            &serving,
            Arc::new(ProgressStore::default()),
            reflector::store().0,
            reflector::store().0,
            Arc::new(Metrics::new()),
            wake,
            stop,
        )
        .await
        .expect("serving")
        .expect("Endpoints to point");
        while seen.lock().expect("seen").is_empty() {
            tokio::task::yield_now().await;
        }
        let _ = step_down.send(());
        leading.await.expect("stepped down");

        let seen = seen.lock().expect("seen");
        assert_eq!(seen.len(), 2, "pointed once, then handed back: {seen:?}");
        let path = "/api/v1/namespaces/trainyard-system/endpoints/trainyard-progress";
        let pointed = json!({"subsets": [{"addresses": [{"ip": "10.0.0.7"}],
            "ports": [{"name": "progress", "port": seen[0].3["subsets"][0]["ports"][0]["port"], "protocol": "TCP"}]}]});
        assert_eq!(
            seen[0],
            (
                "PATCH".to_owned(),
                path.to_owned(),
                "application/merge-patch+json".to_owned(),
                pointed
            )
        );
        assert_eq!(
            seen[1],
            (
                "PATCH".to_owned(),
                path.to_owned(),
                "application/json-patch+json".to_owned(),
                json!([
                    {"op": "test", "path": "/subsets/0/addresses/0/ip", "value": "10.0.0.7"},
                    {"op": "remove", "path": "/subsets"},
                ])
            ),
            "handed back only while they still point at this replica"
        );
    }
}
