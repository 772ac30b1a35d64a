//! The operator's face for tests and benchmarks: what they may use of the operator, in one
//! place. Everything else in this crate may change without notice.
//!
//! A benchmark reuses the operator's own pure builders ([`validate()`], [`place`],
//! [`desired_pod`], [`desired_service`]) to write what the operator would write, so that its
//! floors never copy the operator's protocol; it installs the generated CRD ([`crd`]) under the
//! operator's [`FIELD_MANAGER`] and loads the real progress endpoint in-process
//! ([`progress`]).

pub use crate::build::crdgen::crd;
pub use crate::build::pods::{AttemptStart, Seat, desired_pod};
pub use crate::build::service::desired_service;
pub use crate::config::OperatorConfig;
pub use crate::metrics::Metrics;
pub use crate::model::crd::{
    JobCondition, LABEL_ATTEMPT, LABEL_JOB, Phase, RestartReason, TrainingJob, TrainingJobSpec,
    TrainingJobStatus,
};
pub use crate::model::events::attempt_event_name;
pub use crate::model::placement::{Placement, place};
pub use crate::model::validate::{InvalidSpec, ValidJob, pod_name, validate};
pub use crate::runtime::CRD_NAME;
pub use crate::writes::{FIELD_MANAGER, apply_status};

/// The progress endpoint: its router on a listener ([`serve`](progress::serve)), what it
/// serves from ([`ProgressServer`](progress::ProgressServer)), and the two ports a test fakes
/// (a [`TokenReviewer`](progress::TokenReviewer) and a [`PodLookup`](progress::PodLookup)).
pub mod progress {
    pub use crate::config::PROGRESS_PATH as PATH;
    pub use crate::progress::server::{MAX_BODY_BYTES, serve_within};
    pub use crate::progress::{
        AuthError, Identity, PodLookup, ProgressServer, ProgressStore, TokenReviewer,
        WorkerIdentity, serve,
    };
}

/// Kueue's Workload and ResourceFlavor as the operator reads and writes them
/// ([`crate::model::kueue`]), and the name of a job's Workload.
pub mod kueue {
    pub use crate::build::workload::workload_name;
    pub use crate::model::kueue::*;
}

/// The gang schedulers' PodGroups the operator creates ([`crate::model::podgroup`]).
pub mod podgroup {
    pub use crate::model::podgroup::*;
}

/// The reasons of the operator's Events and conditions (`Preempted`, `WorkerFailed`, `Hang`,
/// `Resumed`, ...), as typed constants.
pub mod reason {
    pub use crate::model::reason::*;
}
