//! The thin layer between the pure pipeline and the API server, split by job:
//!
//! - `wiring`: the watches, their reflector caches, which jobs a change to a node, a PVC or
//!   a Service wakes (`triggers`), how soon a pod's change wakes its job (`pod_wakes`), and
//!   the kube-runtime Controller built from them;
//! - `progress_endpoint`: where the leader serves the progress channel;
//! - `leader`: the Lease that picks the one replica that reconciles;
//! - `reconcile`: one round of one job: observe ([`crate::observe`]), decide ([`crate::plan::decide`]) and hand the
//!   decision to the write path ([`crate::writes`]), which carries it out (and has a round that
//!   waited for its write slots decided again).
//!
//! One kube-runtime Controller on TrainingJobs. Pods (owned), Nodes, Services and PVCs are
//! each watched once into reflector caches that every reconcile reads, so a reconcile makes no
//! LIST calls and, when nothing changed, no API calls at all. Pods are found by their
//! deterministic names (`<job>-worker-<rank>`), so a reconcile costs O(workers), not O(pods).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, future};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{Api, Client};

use crate::error::Error;
use crate::metrics::Metrics;
use crate::runtime::leader::Leadership;

pub(crate) mod leader;

mod context;
mod pod_wakes;
mod progress_endpoint;
mod reconcile;
pub mod seal_secret;
mod triggers;
mod wiring;

pub use context::{DEFAULT_MAX_CONCURRENT_RECONCILES, ProgressServing, RunConfig};

/// Name of the CRD the operator waits for.
pub const CRD_NAME: &str = "trainingjobs.trainyard.dev";

/// Runs the operator until `shutdown` completes. With leader election, a replica that loses
/// the Lease (an API server away for longer than the Lease lasts) stops leading and campaigns
/// again in the same process: a restart would only cost it the kubelet's back-off, and a
/// control plane that flaps would leave every replica in CrashLoopBackOff.
pub async fn run(
    client: Client,
    config: RunConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let metrics = Arc::new(Metrics::new());
    let shutdown = shutdown.shared();
    if let Some(addr) = config.metrics_addr {
        let limits = config.metrics_limits;
        serve_metrics(addr, metrics.clone(), limits, shutdown.clone()).await?;
    }

    tokio::select! {
        r = wait_for_crd(client.clone()) => r?,
        () = shutdown.clone() => return Ok(()),
    }
    loop {
        match lead(&client, &config, &metrics, shutdown.clone()).await? {
            Term::Shutdown => return Ok(()),
            Term::LostLease => {
                tracing::warn!("lost the leader Lease: stopped leading, campaigning again");
            }
        }
    }
}

/// Why one term of leading ended.
enum Term {
    Shutdown,
    LostLease,
}

/// Waits for the Lease (with leader election), then runs the controller until `shutdown`
/// completes or the Lease is lost.
async fn lead(
    client: &Client,
    config: &RunConfig,
    metrics: &Arc<Metrics>,
    shutdown: future::Shared<impl Future<Output = ()> + Send + 'static>,
) -> Result<Term, Error> {
    let leadership = match &config.leader_election {
        None => None,
        Some(election) => {
            // A standby is healthy and ready: it serves metrics and waits.
            metrics.set_ready(true);
            tokio::select! {
                l = Leadership::acquire(client.clone(), election) => Some(l?),
                () = shutdown.clone() => return Ok(Term::Shutdown),
            }
        }
    };
    metrics.leader.set(1);

    // Resolves only when the Lease is actually lost (never without leader election).
    let (lost_tx, lost_rx) = tokio::sync::oneshot::channel::<()>();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let watcher_task = leadership.map(|mut l| {
        tokio::spawn(async move {
            tokio::select! {
                () = l.lost() => {
                    let _ = lost_tx.send(());
                }
                _ = done_rx => {}
            }
            l
        })
    });
    let lost = async move {
        if lost_rx.await.is_err() {
            future::pending::<()>().await;
        }
    }
    .shared();
    let stop = {
        let lost = lost.clone();
        async move {
            tokio::select! {
                () = shutdown => {},
                () = lost => {},
            }
        }
    };
    let result =
        wiring::run_controller(client.clone(), config, metrics.clone(), stop, lost.clone()).await;
    metrics.leader.set(0);
    metrics.forget_ledgers();
    if let Some(task) = watcher_task {
        if lost.clone().now_or_never().is_some() {
            // The Lease is someone else's: nothing to give back. The lease manager stops
            // once its receiver, in the dropped task's Leadership, is gone.
            drop(task);
            return result.map(|()| Term::LostLease);
        }
        let _ = done_tx.send(());
        if let Ok(l) = task.await {
            l.release().await;
        }
    }
    result.map(|()| Term::Shutdown)
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `addr` until `shutdown` completes.
async fn serve_metrics(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    limits: trainyard_listen::HttpLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let (local, server) = crate::metrics::serve(addr, metrics, limits, shutdown).await?;
    tracing::info!(%local, "serving /metrics, /healthz and /readyz");
    tokio::spawn(async move {
        if let Err(e) = server.await {
            tracing::error!(error = %e, "metrics server stopped");
        }
    });
    Ok(())
}

/// Polls the CRD with GET (which RBAC can restrict to this one name) until it is Established.
async fn wait_for_crd(client: Client) -> Result<(), Error> {
    let api: Api<CustomResourceDefinition> = Api::all(client);
    let mut logged = false;
    loop {
        let state = match api.get_opt(CRD_NAME).await {
            Ok(Some(crd)) => {
                let established = crd
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c.type_ == "Established" && c.status == "True")
                    });
                if established {
                    return Ok(());
                }
                "not established yet".to_owned()
            }
            Ok(None) => "not installed (kubectl apply -f crds/trainingjob.yaml)".to_owned(),
            Err(e) => e.to_string(),
        };
        if !logged {
            tracing::warn!(crd = CRD_NAME, %state, "waiting for the CRD");
            logged = true;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}
