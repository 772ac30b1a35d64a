//! What the runtime's parts share: the run's configuration and every reconcile's context.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::config::OperatorConfig;
use crate::metrics::Metrics;
use crate::runtime::leader::LeaderElection;
use crate::state::job_memory::JobMemory;
use crate::state::reconcile_memory::ReconcileMemory;

/// Everything [`super::run`] needs.
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
    /// The key of the seal a worker pod must carry to report ([`crate::model::seal`]).
    pub seal: crate::model::seal::SealKey,
}

/// Default of [`RunConfig::max_concurrent_reconciles`]: twice the 16 jobs in flight of
/// `make bench`'s fair floor, the minimal client the operator's creation is measured against,
/// so that the operator, which also decides between its writes, keeps up with it; a round
/// sends at most a gang's creates at once, so the writes in flight stay within a few hundred
/// (docs/operator.md).
pub const DEFAULT_MAX_CONCURRENT_RECONCILES: u16 = 32;

/// What every reconcile shares.
pub(super) struct Context {
    pub(super) config: OperatorConfig,
    /// Everything a reconcile reads.
    pub(super) sources: crate::observe::Sources,
    /// Where a decided round is carried out ([`crate::writes`]).
    pub(super) writes: crate::writes::Writes,
    /// What reconciles keep per job between them (the error backoff, the last valid object).
    pub(super) memory: Arc<ReconcileMemory>,
    /// When every part's per-job state is forgotten, and its sizes.
    pub(super) forgetting: Arc<JobMemory>,
    pub(super) metrics: Arc<Metrics>,
}
