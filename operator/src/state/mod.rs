//! What the operator keeps per job between rounds, and the one forgetting of it.
//!
//! Every per-job map is registered with [`job_memory::JobMemory`], the only place that
//! forgets a job: on its Delete event, on a re-list without it, and in the sweep.
//! The operator's own maps key by uid; the channel's and the metrics' by the namespace and name
//! that trainers and labels use (an entry remembers its uid); expectations by object.
//!
//! | owner | map | key | holds | also dropped |
//! |---|---|---|---|---|
//! | `StatusCache` | written | uid | status we wrote, with its resourceVersion | once the cache shows it |
//! | `StatusCache` | deferred | uid | worker detail not written yet | once written |
//! | `WriteMemory` | detected | uid | when a restart was decided | once its pods are created |
//! | `WriteMemory` | told | uid | the attempt whose Event was told | |
//! | `WriteMemory` | reported_malformed | uid | the malformed generation reported | once it parses |
//! | `WriteMemory` | last_writes | uid | what the last writes came to | once shown |
//! | `ReconcileMemory` | error_counts | uid | consecutive failed reconciles | on success |
//! | `ReconcileMemory` | last_valid | uid | the object last seen valid | |
//! | `Expectations` | pending | kind, namespace, object name | writes the caches do not show | when seen, or lapsed |
//! | `ProgressStore` | jobs | namespace, name | the trainers' reports | a new uid starts over |
//! | `SupervisorBoard` | jobs | namespace, name | supervisors heard, the directive | a new uid starts over |
//! | `Metrics` | job series | namespace, name | ledger totals, step rate | ledgers when leadership ends |
//!
//! The progress store also keeps the last 1,024 deleted uids, to drop their late reports.

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
