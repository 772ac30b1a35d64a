//! The reasons the operator gives on its conditions and Events: the words `kubectl
//! describe`, alerts and the Argo CD health script match on, named once.
//!
//! A reason is part of the operator's interface: changing one breaks whoever matches on it.

/// A worker pod on a lost node was force-deleted (Event).
pub const FORCE_DELETED: &str = "ForceDeleted";
/// A gang restart keeps the pods of healthy workers and restarts them in place (Event).
pub const RESTARTING_IN_PLACE: &str = "RestartingInPlace";
/// A worker kept for an in-place restart is replaced after all (Event).
pub const IN_PLACE_FALLBACK: &str = "InPlaceFallback";
/// The job failed for good (Event).
pub const FAILED: &str = "Failed";
/// `attempt` reached its ceiling (condition Failed).
pub const ATTEMPT_LIMIT_REACHED: &str = "AttemptLimitReached";
/// `activeDeadlineSeconds` passed (condition Failed).
pub const DEADLINE_EXCEEDED: &str = "DeadlineExceeded";

/// A gang restart after a preemption (Event) and its budget spent (condition Failed).
pub const PREEMPTED: &str = "Preempted";
pub const PREEMPTION_BUDGET_EXCEEDED: &str = "PreemptionBudgetExceeded";
/// A gang restart after a failure (Event) and its budget spent (condition Failed).
pub const WORKER_FAILED: &str = "WorkerFailed";
pub const FAILURE_BUDGET_EXCEEDED: &str = "FailureBudgetExceeded";
/// A gang restart after a hang (Event) and its budget spent (condition Failed).
pub const HANG: &str = "Hang";
pub const HANG_BUDGET_EXCEEDED: &str = "HangBudgetExceeded";
/// The next attempt leaves spot for on-demand (Event).
pub const SPOT_FALLBACK: &str = "SpotFallback";
/// `fallback: Cost`: spot no longer pays, later attempts leave it (Event, and condition
/// SpotFallback True); it still pays, or the product has no price to judge it by (condition
/// SpotFallback False).
pub const SPOT_NO_LONGER_PAYS: &str = "SpotNoLongerPays";
pub const SPOT_PAYS: &str = "SpotPays";
pub const SPOT_UNPRICED: &str = "SpotUnpriced";

/// Progress reports arrive, or stopped while every worker runs (condition ProgressChannel).
pub const REPORTS_ARRIVING: &str = "ReportsArriving";
pub const REPORTS_STOPPED: &str = "ReportsStopped";
/// Progress reports stopped (Event).
pub const PROGRESS_REPORTS_STOPPED: &str = "ProgressReportsStopped";
/// The operator asked the trainers for a checkpoint (Event).
pub const CHECKPOINT_REQUESTED: &str = "CheckpointRequested";

/// The object cannot be read as a TrainingJob (condition InvalidSpec).
pub const MALFORMED_OBJECT: &str = "MalformedObject";
/// The spec is valid again (condition InvalidSpec False).
pub const VALID: &str = "Valid";
/// The spec cannot run as written (condition InvalidSpec True, and its Event).
pub const INVALID_SPEC: &str = "InvalidSpec";

/// The job was suspended or resumed (conditions and Events).
pub const SUSPENDED: &str = "Suspended";
pub const RESUMED: &str = "Resumed";
/// Every worker exited 0 (conditions and Event).
pub const SUCCEEDED: &str = "Succeeded";
pub const ALL_WORKERS_SUCCEEDED: &str = "AllWorkersSucceeded";
/// The job's names are free again, or one is held by an object not the job's.
pub const NAMES_FREE: &str = "NamesFree";
pub const NAME_TAKEN: &str = "NameTaken";
pub const NAME_CONFLICT: &str = "NameConflict";
/// The API server refused a write of the job's objects for good (`WriteRejected` condition).
pub const WRITE_REJECTED: &str = "WriteRejected";
/// The API server accepts the job's writes again.
pub const WRITE_ACCEPTED: &str = "WriteAccepted";
/// Replacements created ahead of a termination notice, beside the pods they replace (Event).
pub const STANDBY_CREATED: &str = "StandbyCreated";
/// Every replacement created ahead waits: the notice's checkpoint and switch follow (Event).
pub const STANDBY_READY: &str = "StandbyReady";
/// A replacement created ahead did not wait in time (no room): deleted (Warning Event).
pub const STANDBY_GIVEN_UP: &str = "StandbyGivenUp";
/// The notice went before the switch: the replacements created ahead are deleted (Event).
pub const STANDBY_WITHDRAWN: &str = "StandbyWithdrawn";
/// Unscheduled workers avoided a node whose termination notice is withdrawn: replaced (Event).
pub const NOTICE_WITHDRAWN: &str = "NoticeWithdrawn";
/// The workers of an attempt are being created (Event).
pub const CREATING_WORKERS: &str = "CreatingWorkers";
/// No node matches the workers' placement, or the scheduler says none fits.
pub const NO_MATCHING_NODE: &str = "NoMatchingNode";
pub const SCHEDULER_UNSCHEDULABLE: &str = "SchedulerUnschedulable";
pub const SCHEDULABLE: &str = "Schedulable";
pub const UNSCHEDULABLE: &str = "Unschedulable";
/// Every worker runs (condition Running, and its Event), and a restart is over.
pub const RUNNING: &str = "Running";
pub const ALL_WORKERS_RUNNING: &str = "AllWorkersRunning";
pub const RESTARTED: &str = "Restarted";
/// `spec.elastic`: the gang restarts with fewer workers (Event, restart reason `Shrink`).
pub const SHRINKING: &str = "Shrinking";
/// `spec.elastic`: the gang restarts with more workers (Event, restart reason `Grow`).
pub const GROWING: &str = "Growing";
/// Event and condition reason: the gang could not be placed whole within
/// `scheduling.placementTimeoutSeconds`; every pod was released for a later try.
pub const REQUEUED: &str = "Requeued";
/// Condition `Admitted` (Kueue): the Workload waits for Kueue to admit it.
pub const WAITING_FOR_ADMISSION: &str = "WaitingForAdmission";
/// Condition `Admitted` and Event (Kueue): admitted by a ClusterQueue.
pub const ADMITTED: &str = "Admitted";
/// Condition `Admitted` (Kueue): Kueue evicted the Workload; the workers are stopped.
pub const EVICTED: &str = "Evicted";
/// Condition `Admitted` (Kueue): the job names a LocalQueue and no Kueue is installed.
pub const KUEUE_NOT_INSTALLED: &str = "KueueNotInstalled";
/// Event reason: a requeued gang's backoff is over and its workers are created again.
pub const RETRYING: &str = "Retrying";
/// The condition `Shrunk`: the attempt runs fewer workers than `spec.workers`, or all of them.
pub const CAPACITY_GONE: &str = "CapacityGone";
pub const FULL_SIZE: &str = "FullSize";
