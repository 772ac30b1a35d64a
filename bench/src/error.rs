//! The benchmark's error type: every failure names what was being done.

use std::time::Duration;

/// Everything that can stop a benchmark run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("{action}: {source}")]
    Kube {
        /// What was being done, naming the object.
        action: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },

    /// A local file or process operation failed.
    #[error("{action}: {source}")]
    Io {
        /// What was being done, naming the file or process.
        action: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },

    /// The cluster did not reach the expected state in time.
    #[error("timed out after {:.0} s waiting for {what} ({progress})", .after.as_secs_f64())]
    Timeout {
        /// The awaited state.
        what: String,
        /// How long we waited.
        after: Duration,
        /// How far it got, e.g. "2950 of 4000 pods created".
        progress: String,
    },

    /// The operator process misbehaved (did not start, exited early, ...).
    #[error("operator process: {0}")]
    Operator(String),

    /// The cluster lacks something the benchmark needs.
    #[error("cluster not ready for the benchmark: {0}")]
    Cluster(String),

    /// A benchmark parameter is out of range.
    #[error("parameter {name}: {message}")]
    Param {
        /// The flag or field.
        name: &'static str,
        /// What is wrong with it.
        message: String,
    },

    /// An object the benchmark builds could not be built.
    #[error("building {what}: {message}")]
    Build {
        /// The object.
        what: String,
        /// Why.
        message: String,
    },
}

impl Error {
    /// Wraps a kube error with what was being done.
    pub fn kube(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let action = action.into();
        move |source| Error::Kube { action, source }
    }

    /// Wraps an I/O error with what was being done.
    pub fn io(action: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let action = action.into();
        move |source| Error::Io { action, source }
    }
}

/// The benchmark's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
