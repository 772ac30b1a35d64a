//! The operator's error type, counted by kind in `trainyard_operator_reconcile_errors_total`.

use crate::config::ConfigError;
use crate::model::validate::InvalidSpec;

/// Everything that can go wrong in the operator.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The spec cannot run as written; waits for the user to change it.
    #[error("invalid spec: {0}")]
    InvalidSpec(#[from] InvalidSpec),

    /// The object could not be parsed as a TrainingJob at all.
    #[error("malformed TrainingJob {name}: {message}")]
    Malformed {
        /// namespace/name.
        name: String,
        /// The parser's message.
        message: String,
    },

    /// A Kubernetes API call failed.
    #[error("{action}: {source}")]
    Kube {
        /// What was being done, naming the object.
        action: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },

    /// A watch-backed cache stopped before it was filled.
    #[error("the {0} cache was dropped before it was ready")]
    CacheGone(&'static str),

    /// The cache and the API server disagree about an object; the next round decides again.
    #[error("pod {0} was replaced while it was read; deciding again")]
    StaleCache(String),

    /// The CRD is not installed or not established.
    #[error("CRD trainingjobs.trainyard.dev is not established: {0}")]
    CrdNotEstablished(String),

    /// Leader election failed or leadership was lost.
    #[error("leader election: {0}")]
    LeaderElection(String),

    /// An HTTP server (metrics, progress) could not start.
    #[error("{what} server on {addr}: {source}")]
    Listen {
        /// Which server.
        what: &'static str,
        /// The address.
        addr: std::net::SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },

    /// A reconcile ran past its time limit and was abandoned; the next round decides again.
    #[error("the reconcile did not finish in {limit:?} (waiting at: {stage}); abandoned")]
    ReconcileTimedOut {
        /// The stage it waited in.
        stage: &'static str,
        /// The limit.
        limit: std::time::Duration,
    },

    /// The configuration file is unusable.
    #[error(transparent)]
    Config(#[from] ConfigError),

    /// The key that seals worker pods cannot be had.
    #[error("seal key: {0}")]
    SealKey(String),

    /// An object could not be serialized.
    #[error("serializing {what}: {source}")]
    Serialize {
        /// What.
        what: &'static str,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },
}

impl From<trainyard_listen::ListenError> for Error {
    fn from(e: trainyard_listen::ListenError) -> Self {
        let trainyard_listen::ListenError { what, addr, source } = e;
        Error::Listen { what, addr, source }
    }
}

impl Error {
    /// A low-cardinality label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::InvalidSpec(_) => "invalid_spec",
            Error::Malformed { .. } => "malformed",
            Error::Kube { source, .. } => match source {
                kube::Error::Api(s) if s.code == 409 => "kube_conflict",
                kube::Error::Api(s) if s.code == 403 => "kube_forbidden",
                kube::Error::Api(s) if s.code == 404 => "kube_not_found",
                kube::Error::Api(s) if s.code == 422 => "kube_invalid",
                kube::Error::Api(_) => "kube_api",
                _ => "kube_client",
            },
            Error::CacheGone(_) => "cache_gone",
            Error::StaleCache(_) => "stale_cache",
            Error::CrdNotEstablished(_) => "crd_not_established",
            Error::LeaderElection(_) => "leader_election",
            Error::Listen { .. } => "listen",
            Error::Config(_) => "config",
            Error::SealKey(_) => "seal_key",
            Error::Serialize { .. } => "serialize",
            Error::ReconcileTimedOut { .. } => "reconcile_timed_out",
        }
    }

    /// Whether retrying cannot help until the object changes.
    pub fn waits_for_change(&self) -> bool {
        matches!(self, Error::InvalidSpec(_) | Error::Malformed { .. })
    }

    /// Whether the API server refused a write because the object changed since it was read
    /// (409 Conflict): the next round decides on the newer object, with no backoff.
    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::Kube { source: kube::Error::Api(s), .. } if s.code == 409)
    }

    /// Wraps a client error with what was being done.
    pub fn kube(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Self {
        let action = action.into();
        move |source| Error::Kube { action, source }
    }
}
