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

use crate::config::OperatorConfig;
use crate::error::Error;
use crate::metrics::Metrics;
use crate::runtime::leader::{LeaderElection, Leadership};
use crate::state::job_memory::JobMemory;
use crate::state::reconcile_memory::ReconcileMemory;

use crate::progress::store::ProgressStore;

pub(crate) mod leader;

mod pod_wakes;
mod progress_endpoint;
mod reconcile;
mod triggers;
mod wiring;

/// Name of the CRD the operator waits for.
pub const CRD_NAME: &str = "trainingjobs.trainyard.dev";

/// Everything [`run`] needs.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// Watch only this namespace; None watches all.
    pub namespace: Option<String>,
    /// Price and spot tables, timeouts.
    pub operator: OperatorConfig,
    /// Serve `/metrics`, `/healthz` and `/readyz` here.
    pub metrics_addr: Option<SocketAddr>,
    /// What the metrics port allows a connection ([`trainyard_listen`]).
    pub metrics_limits: trainyard_listen::HttpLimits,
    /// Take a Lease before reconciling; None reconciles at once.
    pub leader_election: Option<LeaderElection>,
    /// Name of this replica in Events (`reportingInstance`).
    pub instance: String,
    /// Serve the progress channel (`crate::progress`); None: trainers get no progress URL.
    pub progress: Option<ProgressServing>,
    /// Reconciles in flight at once (kube-runtime's bound), and so the writes: each reconcile
    /// carries out its own round, a few requests ([`crate::writes`]). Half of them may write
    /// status alone. Unbounded, a burst of jobs puts thousands of requests in front of the API
    /// server at the same time: every write gets slower and the operator's memory grows with
    /// the requests in flight.
    pub max_concurrent_reconciles: u16,
}

/// How the leader serves the progress channel.
#[derive(Clone, Debug)]
pub struct ProgressServing {
    /// Where to listen.
    pub addr: SocketAddr,
    /// The audience of the tokens trainers report with (checked with a TokenReview).
    pub audience: String,
    /// The Endpoints object (namespace, name) that the progress Service routes by: the leader
    /// points it at `pod_ip` while it leads, so that only the leader receives reports.
    pub endpoints: Option<(String, String)>,
    /// This replica's pod IP.
    pub pod_ip: Option<String>,
    /// What the progress port allows a connection ([`trainyard_listen`]).
    pub limits: trainyard_listen::HttpLimits,
    /// Whether a TokenReview answer that lists no audiences is taken as checked
    /// ([`crate::progress::auth::AudienceCheck`]).
    pub audiences: crate::progress::auth::AudienceCheck,
}

/// Default of [`RunConfig::max_concurrent_reconciles`]: twice the 16 jobs in flight of
/// `make bench`'s fair floor, the minimal client the operator's creation is measured against,
/// so that the operator, which also decides between its writes, keeps up with it; a round
/// sends at most a gang's creates at once, so the writes in flight stay within a few hundred
/// (docs/operator.md).
pub const DEFAULT_MAX_CONCURRENT_RECONCILES: u16 = 32;

/// What every reconcile shares.
struct Context {
    config: OperatorConfig,
    /// What a reconcile reads.
    caches: crate::observe::Caches,
    /// Where a decided round is carried out ([`crate::writes`]).
    writes: crate::writes::Writes,
    /// What reconciles keep per job between them (the error backoff, the last valid object).
    memory: Arc<ReconcileMemory>,
    /// When every part's per-job state is forgotten, and its sizes.
    forgetting: Arc<JobMemory>,
    metrics: Arc<Metrics>,
    /// What the trainers report through the progress channel (empty without it).
    progress: Arc<ProgressStore>,
}

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
