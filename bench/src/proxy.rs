//! A counting reverse proxy in front of the API server.
//!
//! The operator (and the floor client, so that both pay the same extra hop) talk plain HTTP to
//! this proxy on loopback; it forwards every request with the benchmark's own credentials and
//! counts it by verb and resource. This attributes API requests to one client exactly, which
//! `apiserver_request_total` cannot: the scheduler, the controller-manager, the fake nodes'
//! heartbeats and other users of the cluster all add to it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body as AxumBody;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use kube::{Client, Config};
use serde::Serialize;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::error::{Error, Result};

/// Largest request body forwarded (the API server's own limit is 3 MiB for most objects).
const MAX_BODY: usize = 16 * 1024 * 1024;

/// Requests by "verb resource" (e.g. "create pods", "patch trainingjobs/status").
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct RequestCounts(pub BTreeMap<String, u64>);

impl RequestCounts {
    /// All requests.
    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }

    /// The requests counted since `earlier`.
    pub fn since(&self, earlier: &RequestCounts) -> RequestCounts {
        RequestCounts(
            self.0
                .iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        v - earlier.0.get(k).copied().unwrap_or(0).min(*v),
                    )
                })
                .filter(|(_, v)| *v > 0)
                .collect(),
        )
    }

    /// Requests of one verb and resource.
    pub fn get(&self, verb: &str, resource: &str) -> u64 {
        self.0
            .get(&format!("{verb} {resource}"))
            .copied()
            .unwrap_or(0)
    }
}

/// The Kubernetes verb and resource of a request, as the API server's metrics name them.
pub fn classify(
    method: &Method,
    path: &str,
    query: Option<&str>,
    content_type: Option<&str>,
) -> (String, String) {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    // /api/v1/... or /apis/<group>/<version>/...
    let rest: &[&str] = match segments.as_slice() {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => return (method.as_str().to_lowercase(), path.to_owned()),
    };
    let (resource, name, sub) = match rest {
        ["namespaces", _ns, resource, tail @ ..] => (*resource, tail.first(), tail.get(1)),
        ["namespaces", ns @ ..] => ("namespaces", ns.first(), None),
        [resource, tail @ ..] => (*resource, tail.first(), tail.get(1)),
        [] => ("(discovery)", None, None),
    };
    let resource = match sub {
        Some(s) => format!("{resource}/{s}"),
        None => resource.to_owned(),
    };
    let watch = query.is_some_and(|q| q.split('&').any(|kv| kv == "watch=1" || kv == "watch=true"));
    let verb = match *method {
        Method::GET if watch => "watch",
        Method::GET if name.is_some() => "get",
        Method::GET => "list",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH if content_type.is_some_and(|c| c.starts_with("application/apply-patch")) => {
            "apply"
        }
        Method::PATCH => "patch",
        Method::DELETE if name.is_some() => "delete",
        Method::DELETE => "deletecollection",
        _ => return (method.as_str().to_lowercase(), resource),
    };
    (verb.to_owned(), resource)
}

struct ProxyState {
    client: Client,
    counts: Mutex<RequestCounts>,
    /// Requests sent upstream and waiting for their response headers.
    in_flight: AtomicUsize,
    /// The most of them at once since the last [`CountingProxy::take_peak_in_flight`].
    peak_in_flight: AtomicUsize,
}

/// A running proxy; stops when dropped.
pub struct CountingProxy {
    addr: SocketAddr,
    state: Arc<ProxyState>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl CountingProxy {
    /// Starts a proxy on a free loopback port that forwards with `client`.
    pub async fn start(client: Client) -> Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(Error::io("binding the counting proxy on 127.0.0.1"))?;
        let addr = listener
            .local_addr()
            .map_err(Error::io("reading the counting proxy's address"))?;
        let state = Arc::new(ProxyState {
            client,
            counts: Mutex::default(),
            in_flight: AtomicUsize::new(0),
            peak_in_flight: AtomicUsize::new(0),
        });
        let app = Router::new().fallback(forward).with_state(state.clone());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
                let _ = stopped.await;
            });
            if let Err(e) = serve.await {
                tracing::error!(error = %e, "counting proxy stopped");
            }
        });
        Ok(CountingProxy {
            addr,
            state,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// Where the proxy listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The requests forwarded so far.
    pub fn counts(&self) -> RequestCounts {
        self.state
            .counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The most requests waiting for the API server at once since the last call (the
    /// client's effective concurrency), and starts counting anew.
    pub fn take_peak_in_flight(&self) -> usize {
        self.state.peak_in_flight.swap(
            self.state.in_flight.load(Ordering::Relaxed),
            Ordering::Relaxed,
        )
    }

    /// A client that talks through the proxy.
    pub fn client(&self, namespace: &str) -> Result<Client> {
        let uri = format!("http://{}", self.addr)
            .parse()
            .map_err(|e| Error::Build {
                what: "the proxy's URL".to_owned(),
                message: format!("{e}"),
            })?;
        let mut config = Config::new(uri);
        config.default_namespace = namespace.to_owned();
        Client::try_from(config).map_err(Error::kube("building a client for the counting proxy"))
    }

    /// Writes a kubeconfig that points at the proxy, for a child process.
    pub fn write_kubeconfig(&self, path: &Path, namespace: &str) -> Result<()> {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: bench-proxy\n  cluster:\n    server: http://{addr}\nusers:\n- name: bench\n  user: {{}}\ncontexts:\n- name: bench\n  context: {{cluster: bench-proxy, user: bench, namespace: {namespace}}}\ncurrent-context: bench\n",
            addr = self.addr
        );
        std::fs::write(path, text).map_err(Error::io(format!("writing {}", path.display())))
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

async fn forward(State(state): State<Arc<ProxyState>>, req: Request) -> Response {
    let (mut parts, body) = req.into_parts();
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let (verb, resource) = classify(
        &parts.method,
        parts.uri.path(),
        parts.uri.query(),
        content_type,
    );
    {
        let mut counts = state.counts.lock().unwrap_or_else(|e| e.into_inner());
        *counts.0.entry(format!("{verb} {resource}")).or_insert(0) += 1;
    }
    let bytes = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("reading the request body: {e}"),
            )
                .into_response();
        }
    };
    // The client sets the API server's authority itself.
    parts.headers.remove(header::HOST);
    let upstream = axum::http::Request::from_parts(parts, kube::client::Body::from(bytes));
    let now = state.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
    state.peak_in_flight.fetch_max(now, Ordering::Relaxed);
    let response = state.client.send(upstream).await;
    state.in_flight.fetch_sub(1, Ordering::Relaxed);
    match response {
        Ok(resp) => {
            let (parts, body) = resp.into_parts();
            Response::from_parts(parts, AxumBody::new(body))
        }
        Err(e) => (
            StatusCode::BAD_GATEWAY,
            format!("trainyard-bench proxy: {e}"),
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(method: Method, path: &str, query: Option<&str>, ct: Option<&str>) -> String {
        let (v, r) = classify(&method, path, query, ct);
        format!("{v} {r}")
    }

    #[test]
    fn classifies_requests_like_the_api_server_metrics() {
        assert_eq!(
            c(Method::POST, "/api/v1/namespaces/a/pods", None, None),
            "create pods"
        );
        assert_eq!(
            c(
                Method::GET,
                "/api/v1/namespaces/a/pods",
                Some("labelSelector=x&watch=true"),
                None
            ),
            "watch pods"
        );
        assert_eq!(
            c(Method::GET, "/api/v1/pods", Some("limit=500"), None),
            "list pods"
        );
        assert_eq!(c(Method::GET, "/api/v1/nodes/n1", None, None), "get nodes");
        assert_eq!(
            c(
                Method::PATCH,
                "/apis/trainyard.dev/v1alpha1/namespaces/a/trainingjobs/j/status",
                None,
                Some("application/apply-patch+yaml")
            ),
            "apply trainingjobs/status"
        );
        assert_eq!(
            c(
                Method::PATCH,
                "/api/v1/namespaces/a/pods/p/status",
                None,
                Some("application/merge-patch+json")
            ),
            "patch pods/status"
        );
        assert_eq!(
            c(Method::DELETE, "/api/v1/namespaces/a/pods/p", None, None),
            "delete pods"
        );
        assert_eq!(
            c(Method::DELETE, "/api/v1/namespaces/a/pods", None, None),
            "deletecollection pods"
        );
        assert_eq!(
            c(Method::GET, "/api/v1/namespaces/a", None, None),
            "get namespaces"
        );
        assert_eq!(
            c(
                Method::POST,
                "/apis/events.k8s.io/v1/namespaces/a/events",
                None,
                None
            ),
            "create events"
        );
    }

    #[test]
    fn counts_since_a_snapshot_are_the_difference() {
        let before = RequestCounts([("create pods".to_owned(), 3)].into());
        let after =
            RequestCounts([("create pods".to_owned(), 10), ("get nodes".to_owned(), 1)].into());
        let d = after.since(&before);
        assert_eq!(d.get("create", "pods"), 7);
        assert_eq!(d.total(), 8);
    }
}
