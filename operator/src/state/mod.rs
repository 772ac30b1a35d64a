//! What the operator keeps per job between rounds, and the one forgetting of it.

use kube::core::error_boundary::DeserializeGuard;
use kube::runtime::reflector::ObjectRef;

use crate::model::crd::TrainingJob;

pub mod expectations;
pub mod job_memory;
pub mod reconcile_memory;
pub mod status_cache;
pub mod status_write;
pub mod write_memory;

/// A job to reconcile.
pub(crate) type JobRef = ObjectRef<DeserializeGuard<TrainingJob>>;
