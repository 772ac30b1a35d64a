//! Where the leader serves the progress channel (`crate::progress`), and the stream of jobs its
//! reports wake. What a reconcile reads of the reports is `crate::observe::recall`; what a round
//! tells the trainers back (a checkpoint request) is carried out by the write path's executor.

use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, Mutex, PoisonError};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Endpoints;
use k8s_openapi::api::discovery::v1::EndpointSlice;
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
/// EndpointSlice (or, where discovery.k8s.io/v1 is not served, its Endpoints) at it, so that
/// reports reach the leader only. The task returned keeps them pointed until `stop`, then hands
/// them back ([`LeaderEndpoints::lead`]); the controller awaits it before it gives up the Lease.
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
    let endpoints = LeaderEndpoints::new(client, ns, name, ip, local.port());
    Ok(Some(tokio::spawn(endpoints.lead(stop))))
}

/// How often the leader checks that the progress Service still routes to it (the object may be
/// created after the operator starts, or recreated by an upgrade).
const ENDPOINTS_RECHECK: std::time::Duration = std::time::Duration::from_secs(60);
/// How soon a failed attempt to point the Service (or to discover its API) is repeated.
const ENDPOINTS_RETRY: std::time::Duration = std::time::Duration::from_secs(5);
/// How long stepping down may spend handing the Service's endpoints back: the pod's termination grace
/// period is 30 s by default, and a new leader re-points them anyway.
const STEP_DOWN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The API whose EndpointSlices replace the deprecated Endpoints (GA in Kubernetes 1.21).
const SLICES_API: &str = "discovery.k8s.io/v1";

/// The object that routes the progress Service to the leader. Both are created by the chart
/// under the Service's name; the leader only patches them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    /// A discovery.k8s.io/v1 EndpointSlice labelled with the Service's name.
    Slice,
    /// The v1 Endpoints of the Service's name: where EndpointSlice v1 is not served, or the
    /// chart rendered no slice.
    Endpoints,
}

/// The routes the leader tries, in order: the first, and where that one is not there or not
/// its to write, the fallback.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Routes {
    first: Route,
    fallback: Option<Route>,
}

/// Where EndpointSlice v1 is served. The Endpoints come second for a release whose chart made
/// no slice: rendered for a cluster before 1.25, or offline without the API versions.
const SLICE_FIRST: Routes = Routes {
    first: Route::Slice,
    fallback: Some(Route::Endpoints),
};
/// Where it is not (Kubernetes 1.20): the Endpoints alone, as before EndpointSlices.
const ENDPOINTS_ONLY: Routes = Routes {
    first: Route::Endpoints,
    fallback: None,
};

impl Routes {
    /// The same routes with the one that pointed last tried first: a fallback that works is
    /// kept until it is refused, so that the route refused before is not asked every recheck.
    fn after(self, pointed: Option<Route>) -> Routes {
        match self.fallback {
            Some(fallback) if pointed == Some(fallback) => Routes {
                first: fallback,
                fallback: Some(self.first),
            },
            _ => self,
        }
    }
}

impl Route {
    fn kind(self) -> &'static str {
        match self {
            Route::Slice => "EndpointSlice",
            Route::Endpoints => "Endpoints",
        }
    }

    /// The merge patch that points the object at `ip:port` (its endpoint list replaced whole).
    fn pointing(self, ip: &str, port: u16) -> serde_json::Value {
        let ports = json!([{"name": "progress", "port": port, "protocol": "TCP"}]);
        match self {
            Route::Slice => json!({
                "endpoints": [{"addresses": [ip], "conditions": {"ready": true}}],
                "ports": ports,
            }),
            Route::Endpoints => json!({"subsets": [{"addresses": [{"ip": ip}], "ports": ports}]}),
        }
    }

    /// The JSON patch that removes the object's endpoints only while their one address is `ip`.
    fn hand_back(self, ip: &str) -> serde_json::Value {
        let (address, list) = match self {
            Route::Slice => ("/endpoints/0/addresses/0", "/endpoints"),
            Route::Endpoints => ("/subsets/0/addresses/0/ip", "/subsets"),
        };
        json!([
            {"op": "test", "path": address, "value": ip},
            {"op": "remove", "path": list},
        ])
    }
}

/// Whether a refused patch means the object is not there to point (not rendered by this
/// release's chart, or not yet) or not this replica's to write (RBAC rendered for the other).
fn absent_or_forbidden(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.is_not_found() || s.is_forbidden())
}

/// The progress Service's routing object, as this replica writes it while it leads.
struct LeaderEndpoints {
    client: Client,
    slices: Api<EndpointSlice>,
    endpoints: Api<Endpoints>,
    ns: String,
    name: String,
    /// This replica's pod IP.
    ip: String,
    /// The port it serves the progress channel on.
    port: u16,
    /// The routes a patch of this replica may have pointed here: handed back on step-down.
    may_point: Mutex<Vec<Route>>,
}

impl LeaderEndpoints {
    fn new(client: Client, ns: String, name: String, ip: String, port: u16) -> Self {
        LeaderEndpoints {
            slices: Api::namespaced(client.clone(), &ns),
            endpoints: Api::namespaced(client.clone(), &ns),
            client,
            ns,
            name,
            ip,
            port,
            may_point: Mutex::new(Vec::new()),
        }
    }

    /// Keeps the Service pointed at this replica until `stop`, then hands it back: while it
    /// still points here, its endpoints are removed, so that reports fail at once (connection
    /// refused) instead of going to a replica that no longer serves them, until the next
    /// leader points it at itself.
    async fn lead(self, stop: impl Future<Output = ()>) {
        let mut stop = pin!(stop);
        let routes = tokio::select! {
            routes = self.routes() => routes,
            () = &mut stop => return,
        };
        tokio::select! {
            () = self.keep_pointed(routes) => {}
            () = &mut stop => {}
        }
        let pointed = self
            .may_point
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let handing_back = async {
            for route in pointed {
                match self.hand_back(route).await {
                    Ok(()) => {
                        tracing::info!(object = %self.key(route), "handed the progress Service's endpoints back")
                    }
                    // A new leader pointed them at itself already, or they are gone: nothing of ours.
                    Err(e) => {
                        tracing::info!(error = %e, "left the progress Service's endpoints as they are")
                    }
                }
            }
        };
        if tokio::time::timeout(STEP_DOWN_TIMEOUT, handing_back)
            .await
            .is_err()
        {
            tracing::warn!(service = %format!("{}/{}", self.ns, self.name), "handing the progress Service's endpoints back timed out");
        }
    }

    fn key(&self, route: Route) -> String {
        format!("{} {}/{}", route.kind(), self.ns, self.name)
    }

    /// The routes to try, by API discovery: the EndpointSlice first where discovery.k8s.io/v1
    /// serves it, else the Endpoints alone. Asked again after a failure until it is answered.
    async fn routes(&self) -> Routes {
        loop {
            match self.client.list_api_group_resources(SLICES_API).await {
                Ok(served) if served.resources.iter().any(|r| r.name == "endpointslices") => {
                    return SLICE_FIRST;
                }
                Ok(_) => return ENDPOINTS_ONLY,
                Err(kube::Error::Api(s)) if s.is_not_found() => return ENDPOINTS_ONLY,
                Err(e) => {
                    tracing::warn!(error = %e, "discovering {SLICES_API} for the progress Service; retrying");
                    tokio::time::sleep(ENDPOINTS_RETRY).await;
                }
            }
        }
    }

    /// Points the Service at this replica, again after a failure and every
    /// [`ENDPOINTS_RECHECK`]; never returns.
    async fn keep_pointed(&self, routes: Routes) {
        let mut pointed = None;
        loop {
            let wait = match self.point(routes.after(pointed)).await {
                Ok(route) => {
                    if pointed != Some(route) {
                        tracing::info!(object = %self.key(route), ip = %self.ip, port = self.port, "progress Service routes to this replica");
                    }
                    pointed = Some(route);
                    ENDPOINTS_RECHECK
                }
                Err(e) => {
                    tracing::warn!(error = %e, "pointing the progress Service at this replica; retrying");
                    pointed = None;
                    ENDPOINTS_RETRY
                }
            };
            tokio::time::sleep(wait).await;
        }
    }

    /// Points the first of `routes` that is there to point, with a merge patch.
    async fn point(&self, routes: Routes) -> Result<Route, Error> {
        let refused = match self.point_at(routes.first).await {
            Ok(()) => return Ok(routes.first),
            Err(e) => e,
        };
        let (action, e) = match routes.fallback {
            Some(fallback) if absent_or_forbidden(&refused) => {
                match self.point_at(fallback).await {
                    Ok(()) => return Ok(fallback),
                    Err(e) => (
                        format!(
                            "pointing {} ({refused}), nor {},",
                            self.key(routes.first),
                            fallback.kind()
                        ),
                        e,
                    ),
                }
            }
            _ => (format!("pointing {}", self.key(routes.first)), refused),
        };
        Err(Error::kube(format!(
            "{action} at this leader ({}:{})",
            self.ip, self.port
        ))(e))
    }

    /// Points one object at this replica: a merge patch that replaces its endpoints whole.
    async fn point_at(&self, route: Route) -> Result<(), kube::Error> {
        // Remembered before it is sent: a patch cut short by the step-down may still apply.
        self.remember(route);
        let result = self
            .patch(route, &Patch::Merge(route.pointing(&self.ip, self.port)))
            .await;
        if result.as_ref().is_err_and(absent_or_forbidden) {
            self.forget(route);
        }
        result
    }

    /// Removes the object's endpoints if they still point at this replica: one JSON patch whose
    /// `test` makes the API server refuse it when another replica has pointed it at itself.
    async fn hand_back(&self, route: Route) -> Result<(), Error> {
        let patch = serde_json::from_value(route.hand_back(&self.ip)).map_err(|source| {
            Error::Serialize {
                what: "the progress Service's step-down patch",
                source,
            }
        })?;
        self.patch(route, &Patch::Json(patch))
            .await
            .map_err(Error::kube(format!(
                "handing {} back (if it still points at {})",
                self.key(route),
                self.ip
            )))
    }

    async fn patch(
        &self,
        route: Route,
        patch: &Patch<serde_json::Value>,
    ) -> Result<(), kube::Error> {
        let params = patch_params();
        match route {
            Route::Slice => self
                .slices
                .patch(&self.name, &params, patch)
                .await
                .map(drop),
            Route::Endpoints => self
                .endpoints
                .patch(&self.name, &params, patch)
                .await
                .map(drop),
        }
    }

    fn remember(&self, route: Route) {
        let mut may_point = self
            .may_point
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if !may_point.contains(&route) {
            may_point.push(route);
        }
    }

    fn forget(&self, route: Route) {
        self.may_point
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|&r| r != route);
    }
}

fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    }
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
    /// How the fake API server answers a request (method, path): a status and a body.
    type Answer = fn(&str, &str) -> (u16, Value);

    const NS: &str = "trainyard-system";
    const NAME: &str = "trainyard-progress";
    const IP: &str = "10.0.0.7";
    const ENDPOINTS_PATH: &str = "/api/v1/namespaces/trainyard-system/endpoints/trainyard-progress";
    const SLICE_PATH: &str =
        "/apis/discovery.k8s.io/v1/namespaces/trainyard-system/endpointslices/trainyard-progress";
    const DISCOVERY_PATH: &str = "/apis/discovery.k8s.io/v1";

    fn not_found() -> (u16, Value) {
        let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                            "reason": "NotFound", "code": 404});
        (404, status)
    }

    /// The object a patch answers with: its kind matters to the client only as JSON.
    fn patched(path: &str) -> (u16, Value) {
        let kind = if path.contains("endpointslices") {
            "EndpointSlice"
        } else {
            "Endpoints"
        };
        (
            200,
            json!({"kind": kind, "metadata": {"name": NAME}, "addressType": "IPv4", "endpoints": null}),
        )
    }

    /// Kubernetes 1.20: discovery.k8s.io/v1 is not served (v1beta1 is); patches succeed.
    fn kubernetes_1_20(_: &str, path: &str) -> (u16, Value) {
        if path == DISCOVERY_PATH {
            not_found()
        } else {
            patched(path)
        }
    }

    fn slices_served() -> (u16, Value) {
        (
            200,
            json!({"kind": "APIResourceList", "groupVersion": "discovery.k8s.io/v1", "resources": [
            {"name": "endpointslices", "singularName": "", "namespaced": true, "kind": "EndpointSlice",
             "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}]}),
        )
    }

    /// Kubernetes 1.21 or later, with the slice the chart renders there.
    fn slices_rendered(_: &str, path: &str) -> (u16, Value) {
        if path == DISCOVERY_PATH {
            slices_served()
        } else {
            patched(path)
        }
    }

    /// Kubernetes 1.21 or later under a release rendered without the slice: its Endpoints only.
    fn endpoints_rendered(_: &str, path: &str) -> (u16, Value) {
        match path {
            DISCOVERY_PATH => slices_served(),
            SLICE_PATH => not_found(),
            _ => patched(path),
        }
    }

    /// A client whose every request is answered by `answer`, and recorded.
    fn recording_client(answer: Answer) -> (Client, Arc<Mutex<Vec<SeenRequest>>>) {
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
                let (status, answered) = answer(parts.method.as_str(), parts.uri.path());
                recorder.lock().expect("seen").push((
                    parts.method.to_string(),
                    parts.uri.path().to_owned(),
                    content_type,
                    body,
                ));
                Ok::<_, kube::Error>(
                    http::Response::builder()
                        .status(status)
                        .header("content-type", "application/json")
                        .body(kube::client::Body::from(
                            serde_json::to_vec(&answered).expect("json"),
                        ))
                        .expect("response"),
                )
            }
        });
        (Client::new(service, "default"), seen)
    }

    /// Serves the progress channel as a leader against `answer` until the Service has been
    /// pointed at it, steps down, and returns every request the API server saw.
    async fn lead_then_step_down(answer: Answer) -> Vec<SeenRequest> {
        let (client, seen) = recording_client(answer);
        let serving = ProgressServing {
            addr: "127.0.0.1:0".parse().expect("addr"),
            audience: "trainyard-progress".to_owned(),
            endpoints: Some((NS.to_owned(), NAME.to_owned())),
            pod_ip: Some(IP.to_owned()),
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
        .expect("a Service to point");
        let pointed = |seen: &[SeenRequest]| {
            seen.iter()
                .any(|(_, _, content, _)| content == "application/merge-patch+json")
        };
        while !pointed(&seen.lock().expect("seen")) {
            tokio::task::yield_now().await;
        }
        let _ = step_down.send(());
        leading.await.expect("stepped down");
        seen.lock().expect("seen").clone()
    }

    fn discovery() -> SeenRequest {
        (
            "GET".to_owned(),
            DISCOVERY_PATH.to_owned(),
            String::new(),
            Value::Null,
        )
    }

    fn merge_patch(path: &str, body: Value) -> SeenRequest {
        let content = "application/merge-patch+json".to_owned();
        ("PATCH".to_owned(), path.to_owned(), content, body)
    }

    fn json_patch(path: &str, body: Value) -> SeenRequest {
        let content = "application/json-patch+json".to_owned();
        ("PATCH".to_owned(), path.to_owned(), content, body)
    }

    /// The port the leader serves on (the listener's own), as a pointing patch names it.
    fn served_port(pointing: &SeenRequest) -> Value {
        let body = &pointing.3;
        let ports = body.get("ports").unwrap_or(&body["subsets"][0]["ports"]);
        ports[0]["port"].clone()
    }

    fn endpoints_pointed(port: &Value) -> Value {
        json!({"subsets": [{"addresses": [{"ip": IP}],
            "ports": [{"name": "progress", "port": port, "protocol": "TCP"}]}]})
    }

    fn endpoints_handed_back() -> Value {
        json!([
            {"op": "test", "path": "/subsets/0/addresses/0/ip", "value": IP},
            {"op": "remove", "path": "/subsets"},
        ])
    }

    #[tokio::test]
    async fn where_endpoint_slices_are_not_served_the_leader_points_the_endpoints_and_hands_them_back()
     {
        let seen = lead_then_step_down(kubernetes_1_20).await;
        let port = served_port(&seen[1]);
        assert_eq!(
            seen,
            [
                discovery(),
                merge_patch(ENDPOINTS_PATH, endpoints_pointed(&port)),
                // Handed back only while they still point at this replica.
                json_patch(ENDPOINTS_PATH, endpoints_handed_back()),
            ],
            "one discovery, then the Endpoints patches as before EndpointSlices: no slice touched"
        );
    }

    #[tokio::test]
    async fn where_endpoint_slices_are_served_the_leader_points_the_slice_and_hands_it_back() {
        let seen = lead_then_step_down(slices_rendered).await;
        let port = served_port(&seen[1]);
        let pointed = json!({
            "endpoints": [{"addresses": [IP], "conditions": {"ready": true}}],
            "ports": [{"name": "progress", "port": port, "protocol": "TCP"}],
        });
        let handed_back = json!([
            {"op": "test", "path": "/endpoints/0/addresses/0", "value": IP},
            {"op": "remove", "path": "/endpoints"},
        ]);
        assert_eq!(
            seen,
            [
                discovery(),
                merge_patch(SLICE_PATH, pointed),
                json_patch(SLICE_PATH, handed_back),
            ],
            "the deprecated Endpoints are never touched where the slice is there"
        );
    }

    #[tokio::test]
    async fn a_release_rendered_without_the_slice_is_routed_by_its_endpoints_where_slices_are_served()
     {
        let seen = lead_then_step_down(endpoints_rendered).await;
        let port = served_port(&seen[2]);
        assert_eq!(seen[0], discovery());
        assert_eq!(seen[1].1, SLICE_PATH, "the slice is tried first");
        assert_eq!(
            seen[2..],
            [
                merge_patch(ENDPOINTS_PATH, endpoints_pointed(&port)),
                // The slice that was not there is not handed back.
                json_patch(ENDPOINTS_PATH, endpoints_handed_back()),
            ]
        );
    }

    #[test]
    fn a_fallback_that_pointed_is_tried_first_until_it_is_refused() {
        assert_eq!(SLICE_FIRST.after(None), SLICE_FIRST);
        assert_eq!(SLICE_FIRST.after(Some(Route::Slice)), SLICE_FIRST);
        let kept = Routes {
            first: Route::Endpoints,
            fallback: Some(Route::Slice),
        };
        assert_eq!(SLICE_FIRST.after(Some(Route::Endpoints)), kept);
        assert_eq!(ENDPOINTS_ONLY.after(Some(Route::Endpoints)), ENDPOINTS_ONLY);
    }

    #[tokio::test]
    async fn once_the_endpoints_are_gone_the_leader_moves_to_the_slice_and_hands_back_only_that() {
        fn upgraded(_: &str, path: &str) -> (u16, Value) {
            if path == ENDPOINTS_PATH {
                not_found()
            } else {
                patched(path)
            }
        }
        let (client, seen) = recording_client(upgraded);
        let leader =
            LeaderEndpoints::new(client, NS.to_owned(), NAME.to_owned(), IP.to_owned(), 8082);
        let moved = leader
            .point(SLICE_FIRST.after(Some(Route::Endpoints)))
            .await
            .expect("pointed");
        assert_eq!(moved, Route::Slice);
        let paths: Vec<_> = seen
            .lock()
            .expect("seen")
            .iter()
            .map(|r| r.1.clone())
            .collect();
        assert_eq!(
            paths,
            [ENDPOINTS_PATH, SLICE_PATH],
            "the kept Endpoints first, then the slice"
        );
        assert_eq!(
            *leader.may_point.lock().expect("may_point"),
            [Route::Slice],
            "a step-down hands back the slice alone: the Endpoints' refused patch changed nothing"
        );
    }

    #[tokio::test]
    async fn where_neither_object_is_there_the_error_names_both() {
        fn neither(_: &str, path: &str) -> (u16, Value) {
            if path == DISCOVERY_PATH {
                slices_served()
            } else {
                not_found()
            }
        }
        let (client, _seen) = recording_client(neither);
        let leader =
            LeaderEndpoints::new(client, NS.to_owned(), NAME.to_owned(), IP.to_owned(), 8082);
        let e = leader
            .point(SLICE_FIRST)
            .await
            .expect_err("nothing to point");
        let message = e.to_string();
        assert!(
            message.starts_with("pointing EndpointSlice trainyard-system/trainyard-progress (")
                && message.contains("nor Endpoints, at this leader (10.0.0.7:8082)"),
            "{message}"
        );
        assert!(leader.may_point.lock().expect("may_point").is_empty());
    }

    #[tokio::test]
    async fn a_failed_discovery_is_asked_again_before_any_object_is_patched() {
        fn flaky(_: &str, path: &str) -> (u16, Value) {
            static ASKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
            if path == DISCOVERY_PATH && !ASKED.swap(true, std::sync::atomic::Ordering::SeqCst) {
                return (
                    503,
                    json!({"kind": "Status", "code": 503, "reason": "ServiceUnavailable"}),
                );
            }
            slices_rendered("GET", path)
        }
        tokio::time::pause();
        let (client, seen) = recording_client(flaky);
        let leader =
            LeaderEndpoints::new(client, NS.to_owned(), NAME.to_owned(), IP.to_owned(), 8082);
        assert_eq!(leader.routes().await, SLICE_FIRST);
        let seen = seen.lock().expect("seen").clone();
        assert_eq!(
            seen,
            [discovery(), discovery()],
            "a 503 is not taken for \"not served\""
        );
    }
}
