//! The executor: carries out one round's decision against the API server.
//!
//! # Write order
//!
//! This is the one statement of the order in which a round writes; docs/operator.md points
//! here. In one round ([`Executor::carry_out`]):
//!
//! 1. Every action is recorded as expected ([`Expectations`]) *before* it is sent, so that its
//!    own watch event cannot arrive first. (The decision holds back actions on objects whose
//!    last write the caches do not show yet: [`plan::UnseenWrite`].)
//! 2. When the round decides a restart or deletes a pod (a restart, a failure, a suspend), the
//!    decided status is written first, and the deletes and creates are sent only once that
//!    write has succeeded; if it fails, nothing else is sent. Deleted workers must never look
//!    like preempted ones after a crash. The deletes are uid-preconditioned, so a pod replaced
//!    meanwhile is not deleted.
//! 3. Otherwise the status write and the creates are sent together (concurrently): a create is
//!    idempotent by name and derived again from status plus observation on every round, so
//!    persisting first would only cost a round trip.
//! 4. Then what the writes came to (accepted, rejected for good) is remembered for the next
//!    round, which shows it on the job (`WriteRejected`, [`rejection::after_writes`]); the
//!    round queues its Events for the publisher, and the first failed action fails the round
//!    (retried with the error backoff). Nothing is written a second time in a round.
//!
//! The status is written only when the status cache says so (a change other than per-worker
//! detail, or detail that has waited its batch). A round with nothing to write sends nothing.

use std::sync::Arc;

use futures::{FutureExt, future};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions,
};
use kube::core::error_boundary::InvalidObject;
use kube::runtime::controller::Action;
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use tokio::sync::mpsc;

use super::publisher::EventBatch;
use crate::error::Error;
use crate::metrics::{Metrics, RestartLabels};
use crate::model::condition::{self, condition_is_true};
use crate::model::crd::{RestartReason, TrainingJob, TrainingJobStatus};
use crate::model::events::JobEvent;
use crate::model::ownership::Kind;
use crate::model::podgroup::PodGroup;
use crate::model::rejection::{self, WriteOutcome};
use crate::plan::{self, Action as PlanAction};
use crate::progress::ProgressStore;
use crate::state::expectations::Expectations;
use crate::state::job_memory::Sweep;
use crate::state::write_memory::WriteMemory;
use crate::watchdog;

/// The one field manager for everything the operator writes.
pub const FIELD_MANAGER: &str = "trainyard-operator";

/// Writes what reconciles decide, in the order above, and queues their Events.
pub(super) struct Executor {
    client: Client,
    /// Writes the caches do not show yet, and that must not be repeated meanwhile.
    expectations: Arc<Expectations>,
    /// Events go to a publisher task ([`super::publisher`]).
    events: mpsc::Sender<EventBatch>,
    metrics: Arc<Metrics>,
    /// Where status writes, restarts and malformed reports are remembered.
    memory: Arc<WriteMemory>,
    /// The per-job state swept against the jobs that exist after each status write.
    sweep: Sweep,
    /// Where the trainers are asked for a checkpoint (through the progress channel).
    trainers: Arc<ProgressStore>,
}

impl Executor {
    pub(super) fn new(
        client: Client,
        expectations: Arc<Expectations>,
        events: mpsc::Sender<EventBatch>,
        metrics: Arc<Metrics>,
        memory: Arc<WriteMemory>,
        sweep: Sweep,
        trainers: Arc<ProgressStore>,
    ) -> Self {
        Self {
            client,
            expectations,
            events,
            metrics,
            memory,
            sweep,
            trainers,
        }
    }

    /// Carries out one round of `job`: `decided`, with its status written when `write_status`
    /// (see the module's write order). True when the job changed while its status was written
    /// ([`Executor::write_status`]).
    pub(super) async fn carry_out(
        &self,
        job: &TrainingJob,
        decided: plan::Plan,
        write_status: bool,
        now: Timestamp,
    ) -> Result<bool, Error> {
        let ns = job.namespace().unwrap_or_default();
        let uid = job.metadata.uid.clone().unwrap_or_default();
        let reference = job.object_ref(&());
        // First: it costs no request, and a notice leaves the trainers seconds.
        self.tell_trainers(job, &decided);
        if let Some(reason) = decided.restart {
            self.count_restart(job, &uid, reason, decided.status.attempt);
        }
        let actions = decided.actions;
        let write = async {
            if write_status {
                self.write_status(job, &decided.status).await
            } else {
                Ok(false)
            }
        };
        let (changed, (writes, acted)) = if ordered(decided.restart.is_some(), &actions) {
            watchdog::stage("carry out: status write");
            let changed = write.await?;
            watchdog::stage("carry out: actions");
            (changed, self.execute(&ns, actions).await)
        } else {
            watchdog::stage("carry out: status write and actions");
            let (wrote, done) = future::join(write, self.execute(&ns, actions)).await;
            (wrote?, done)
        };
        // The kept pods start only once their new label is written: a failed relabel leaves
        // them stopped, and the next round decides again.
        self.tell_supervisors(job, decided.supervise, acted.is_ok());
        let events = decided.events;
        // The Event that starts the attempt goes with this round's, or went before
        // (`Observed::told_attempt`).
        if decided.status.attempt > 0 {
            self.memory.told(&uid, decided.status.attempt);
        }
        // What the writes came to is shown on the job by the next round
        // (`Observed::last_writes`); the error below retries it with backoff. Kept only while
        // it is news: a rejection, or an accepted write while the job shows one.
        let shown = condition_is_true(&decided.status.conditions, condition::WRITE_REJECTED);
        if !writes.rejected.is_empty() || (shown && writes.accepted > 0) {
            self.memory.record_writes(&uid, writes);
        } else if !shown {
            self.memory.forget_writes(&uid);
        }
        self.publish(&reference, events).await;
        acted?;
        self.observe_recovery(&uid, &decided.status, decided.creates_attempt, now);
        if let Some(lost) = decided.steps_lost {
            // Steps are far below 2^53: exact as f64.
            self.metrics.steps_lost.observe(lost as f64);
        }
        // The status is the ledger's record: the metrics show what the round carried out.
        self.metrics
            .record_ledger(&ns, &job.name_any(), &uid, decided.status.ledger.as_ref());
        Ok(changed)
    }

    /// Asks the job's trainers for a checkpoint, or withdraws the request, as decided.
    fn tell_trainers(&self, job: &TrainingJob, decided: &plan::Plan) {
        let (ns, name) = (job.namespace().unwrap_or_default(), job.name_any());
        if let Some(attempt) = decided.checkpoint_withdrawal {
            self.trainers
                .withdraw_checkpoint_request(&ns, &name, attempt);
        }
        if let Some(attempt) = decided.checkpoint_request {
            self.trainers.request_checkpoint(&ns, &name, attempt);
        }
    }

    /// Publishes what the job's supervisors are told (in-place restarts); without `started`,
    /// none is told to start.
    fn tell_supervisors(
        &self,
        job: &TrainingJob,
        supervise: Option<plan::Supervise>,
        started: bool,
    ) {
        let Some(mut supervise) = supervise else {
            return;
        };
        if !started {
            supervise.directive.start.clear();
        }
        let (ns, name) = (job.namespace().unwrap_or_default(), job.name_any());
        let uid = job.metadata.uid.clone().unwrap_or_default();
        let pods: Vec<&str> = supervise.pods.iter().map(String::as_str).collect();
        self.trainers
            .supervisors
            .publish(&ns, &name, &uid, Some(supervise.directive), &pods);
    }

    /// Counts a gang restart decided now, and remembers when (for the recovery histogram).
    fn count_restart(&self, job: &TrainingJob, uid: &str, reason: RestartReason, attempt: u32) {
        self.metrics
            .restarts
            .get_or_create(&RestartLabels {
                reason: reason.as_str().to_owned(),
            })
            .inc();
        self.memory.restart_detected(uid, attempt);
        let ns = job.namespace().unwrap_or_default();
        tracing::info!(job = %format!("{ns}/{}", job.name_any()), attempt, reason = reason.as_str(), "gang restart");
    }

    /// The pods of a new attempt went out: how long the preemption that started it took to
    /// recover from. Taken whatever the restart's reason, so that a failure restart leaves
    /// nothing behind.
    fn observe_recovery(
        &self,
        uid: &str,
        status: &TrainingJobStatus,
        creates_attempt: Option<u32>,
        now: Timestamp,
    ) {
        let detected = creates_attempt.and_then(|_| self.memory.take_detected(uid));
        if let Some(attempt) = creates_attempt
            && attempt > 0
            && status.last_restart.as_ref().map(|l| l.reason) == Some(RestartReason::Preemption)
        {
            let since = match detected {
                Some((a, at)) if a == attempt => Some(at.elapsed().as_secs_f64()),
                _ => status
                    .last_restart
                    .as_ref()
                    .map(|l| now.duration_since(l.time.0).as_secs_f64()),
            };
            if let Some(seconds) = since {
                self.metrics.preemption_recovery.observe(seconds.max(0.0));
            }
        }
    }

    /// Writes `status`; true when the job changed meanwhile (a watch event of another version
    /// than ours came while the write was on its way: set aside then, so the job is to be
    /// decided again; see `WriteInFlight::end`).
    pub(super) async fn write_status(
        &self,
        job: &TrainingJob,
        status: &TrainingJobStatus,
    ) -> Result<bool, Error> {
        let ns = job.namespace().unwrap_or_default();
        let name = job.name_any();
        let uid = job.metadata.uid.clone().unwrap_or_default();
        let seen = self.memory.status.freshest_rv(job);
        let in_flight = self.memory.status.begin_write(&uid);
        let written = apply_status(&self.client, job, seen, status).await;
        let rv = written
            .as_ref()
            .ok()
            .and_then(|w| w.metadata.resource_version.as_deref());
        let changed = in_flight.end(rv.map(|rv| (rv, status)));
        written.map_err(Error::kube(format!(
            "writing status of TrainingJob {ns}/{name}"
        )))?;
        self.sweep.if_outgrown();
        Ok(changed)
    }

    /// Queues Events for the publisher task (waiting only when its queue is full).
    pub(super) async fn publish(&self, reference: &ObjectReference, events: Vec<JobEvent>) {
        if events.is_empty() {
            return;
        }
        watchdog::stage("queueing Events");
        if self.events.send((reference.clone(), events)).await.is_err() {
            tracing::warn!("the Event publisher has stopped; dropping Events");
        }
    }

    /// Carries out the actions; says what the API server accepted and rejected, and the first
    /// error.
    ///
    /// Pods are deleted one by one, each with its uid precondition. One DeleteCollection per
    /// old attempt (by job uid and attempt labels) was tried and dropped: a 1.20 API server
    /// reads the list it deletes from etcd, every pod of the namespace decoded to filter by the
    /// selector, once per restart; and `resourceVersion=0`, which would let the watch cache
    /// serve it, is also read as a delete precondition and fails every delete with 409.
    async fn execute(
        &self,
        ns: &str,
        actions: Vec<PlanAction>,
    ) -> (WriteOutcome, Result<(), Error>) {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let mut ops = Vec::new();
        let mut targets = Vec::new();
        for action in actions {
            // Each write on its own line: what the operator did to whose pods is readable
            // from its log alone (the plan's Events say why).
            tracing::info!(namespace = ns, "{action}");
            // Expected before the write goes out, so that its watch event cannot arrive first
            // and leave the expectation waiting for an event that already came.
            let (kind, name) = action.target();
            // Neither the PodGroup nor the Workload is held back for its watch event: a create
            // sent again finds it there, and a status write carries its precondition.
            let unexpected = matches!(kind, Kind::PodGroup | Kind::Workload);
            if !unexpected {
                self.expectations.expect(kind, ns, name);
            }
            targets.push((kind, name.to_owned()));
            let client = self.client.clone();
            let op = match action {
                PlanAction::CreateService(svc) => create(client, ns, *svc).boxed(),
                PlanAction::CreatePvc(claim) => create(client, ns, *claim).boxed(),
                PlanAction::CreateWorkload(w) => create(client, ns, *w).boxed(),
                PlanAction::WriteWorkloadStatus {
                    name,
                    resource_version,
                    conditions,
                    release,
                } => write_workload_status(client, ns, name, resource_version, conditions, release)
                    .boxed(),
                PlanAction::CreatePodGroup(group) => match *group {
                    PodGroup::Volcano(g) => create(client, ns, g).boxed(),
                    PodGroup::Coscheduling(g) => create(client, ns, g).boxed(),
                },
                PlanAction::CreatePod(pod) => create(client, ns, *pod).boxed(),
                PlanAction::SetClaimOwners {
                    name,
                    owners,
                    resource_version,
                } => set_claim_owners(client, ns, name, owners, resource_version).boxed(),
                PlanAction::DeletePod { name, uid } => {
                    delete_pod(pods.clone(), ns, name, uid, None).boxed()
                }
                PlanAction::RelabelPod {
                    name,
                    uid,
                    attempt,
                    seal,
                } => relabel_pod(pods.clone(), ns, name, uid, attempt, seal).boxed(),
                // The plan says why (a lost node has its own Warning Event; a pod whose
                // containers have stopped needs no grace period).
                PlanAction::ForceDeletePod { name, uid } => {
                    delete_pod(pods.clone(), ns, name, uid, Some(0)).boxed()
                }
            };
            ops.push(op);
        }
        let mut writes = WriteOutcome::default();
        let mut result = Ok(());
        for (r, (kind, name)) in future::join_all(ops).await.into_iter().zip(targets) {
            // Nothing was written (already there, already gone, or failed): no event will come.
            if !matches!(r, Ok(true)) && !matches!(kind, Kind::PodGroup | Kind::Workload) {
                self.expectations.observed(kind, ns, &name);
            }
            match &r {
                Ok(true) => writes.accepted += 1,
                Err(Error::Kube { action, source }) => {
                    writes.rejected.extend(rejection::rejection(action, source));
                }
                _ => {}
            }
            if let Err(e) = r
                && result.is_ok()
            {
                result = Err(e);
            }
        }
        (writes, result)
    }

    /// Shows on an object that does not parse as a TrainingJob why (the `InvalidSpec`
    /// condition, by a merge patch, and a Warning Event), once per generation.
    pub(super) async fn report_malformed(&self, invalid: &InvalidObject) -> Result<Action, Error> {
        let meta = &invalid.metadata;
        let ns = meta.namespace.clone().unwrap_or_default();
        let name = meta.name.clone().unwrap_or_default();
        let uid = meta.uid.clone().unwrap_or_default();
        let rv = meta.resource_version.clone().unwrap_or_default();
        // Reported once per generation: the status patch below changes the resourceVersion, so
        // keying on it would report (and patch) again and again.
        let generation = meta.generation.unwrap_or_default().to_string();
        let error = Error::Malformed {
            name: format!("{ns}/{name}"),
            message: invalid.error.clone(),
        };
        if self.memory.malformed_reported(&uid, &generation) {
            return Err(error);
        }
        let (condition, event) =
            plan::malformed_report(&invalid.error, meta.generation, Timestamp::now());
        let resource = ApiResource::erase::<TrainingJob>(&());
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), &ns, &resource);
        // A merge patch keeps whatever else the status holds; the object cannot be decoded to rebuild it.
        let patch = json!({"status": {"conditions": [condition]}});
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        if let Err(e) = api
            .patch_status(&name, &params, &Patch::Merge(&patch))
            .await
        {
            tracing::warn!(job = %format!("{ns}/{name}"), error = %e, "reporting a malformed TrainingJob");
        }
        let reference = k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some(resource.api_version.clone()),
            kind: Some(resource.kind.clone()),
            name: Some(name),
            namespace: Some(ns),
            uid: Some(uid.clone()),
            resource_version: Some(rv.clone()),
            field_path: None,
        };
        self.publish(&reference, vec![event]).await;
        self.memory.remember_malformed(&uid, &generation);
        Err(error)
    }
}

/// Creates an object of the job; true once created, false when an object of that name exists
/// already. Create, never apply: an apply writes into whatever holds the name, so a forced one
/// would take over a user's Service and give it an owner reference through which the garbage
/// collector deletes it with the job; a pod must never be mutated into a new attempt. An
/// AlreadyExists means an earlier round created it, or that it is someone else's, which the
/// caches then show ([`crate::model::ownership`]).
async fn create<K>(client: Client, ns: &str, object: K) -> Result<bool, Error>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let name = object.name_any();
    let pp = PostParams {
        dry_run: false,
        field_manager: Some(FIELD_MANAGER.to_owned()),
    };
    match Api::<K>::namespaced(client, ns).create(&pp, &object).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(Error::kube(format!(
            "creating {} {ns}/{name}",
            K::kind(&())
        ))(e)),
    }
}

/// Writes a Workload's status by a merge patch under `resource_version`: `conditions` whole,
/// and `admission: null` when `release`. A conflict (the Workload changed since it was read)
/// writes nothing: its watch event wakes the job, whose next round decides again.
async fn write_workload_status(
    client: Client,
    ns: &str,
    name: String,
    resource_version: Option<String>,
    conditions: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
    release: bool,
) -> Result<bool, Error> {
    let mut status = json!({ "conditions": conditions });
    if release {
        status["admission"] = serde_json::Value::Null;
    }
    let patch = json!({
        "metadata": { "resourceVersion": resource_version },
        "status": status,
    });
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    let api = Api::<crate::model::kueue::Workload>::namespaced(client, ns);
    match api
        .patch_status(&name, &params, &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => Ok(false),
        Err(e) => Err(Error::kube(format!(
            "writing the status of workload {ns}/{name}"
        ))(e)),
    }
}

/// Whether a round writes its status before its actions (the write order above): it
/// restarts the gang or deletes a pod.
fn ordered(restarts: bool, actions: &[PlanAction]) -> bool {
    restarts || actions.iter().any(PlanAction::deletes)
}

/// Writes `status` to `job` with server-side apply, conditioned on `seen`, the
/// resourceVersion the writer decided on: if anyone wrote the job since (a successor that took
/// over while a deposed leader's write was on its way), the API server refuses the write with
/// a conflict (409) and the writer's next round decides on the newer job. `None` writes
/// unconditionally.
pub async fn apply_status(
    client: &Client,
    job: &TrainingJob,
    seen: Option<String>,
    status: &TrainingJobStatus,
) -> Result<TrainingJob, kube::Error> {
    let api: Api<TrainingJob> =
        Api::namespaced(client.clone(), &job.namespace().unwrap_or_default());
    let mut patch = json!({
        "apiVersion": TrainingJob::api_version(&()),
        "kind": TrainingJob::kind(&()),
        "status": status,
    });
    if let Some(seen) = seen {
        patch["metadata"] = json!({ "resourceVersion": seen });
    }
    api.patch_status(
        &job.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
}

/// Deletes a pod (this incarnation only, when `uid` is given); true once it was deleted.
/// Sets the checkpoint claim's owner references (`checkpoint.retainOnDelete` edited): a merge
/// patch replaces the whole list, and the resourceVersion makes it fail (409, false) when the
/// claim changed since the round observed it; the next round decides again from the watch.
async fn set_claim_owners(
    client: Client,
    ns: &str,
    name: String,
    owners: Vec<OwnerReference>,
    resource_version: Option<String>,
) -> Result<bool, Error> {
    let patch =
        json!({"metadata": {"ownerReferences": owners, "resourceVersion": resource_version}});
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client, ns);
    match claims.patch(&name, &params, &Patch::Merge(&patch)).await {
        Ok(_) => {
            let kept = if owners.is_empty() { "kept" } else { "deleted" };
            tracing::info!(claim = %name, namespace = ns, "the checkpoint claim is {kept} when its job is deleted");
            Ok(true)
        }
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(false),
        Err(e) => Err(Error::kube(format!(
            "setting the owner of PersistentVolumeClaim {ns}/{name}"
        ))(e)),
    }
}

/// Moves a kept pod to `attempt` (its attempt label) by a merge patch that carries the pod's
/// uid: the API server refuses it (422, the uid is immutable) for another incarnation of the
/// name; true once it was written.
async fn relabel_pod(
    pods: Api<Pod>,
    ns: &str,
    name: String,
    uid: Option<String>,
    attempt: u32,
    seal: Option<String>,
) -> Result<bool, Error> {
    let mut patch = json!({"metadata": {
        "uid": uid,
        "labels": {crate::model::crd::LABEL_ATTEMPT: attempt.to_string()},
    }});
    if let Some(seal) = seal {
        patch["metadata"]["annotations"] = json!({ crate::model::seal::SEAL_ANNOTATION: seal });
    }
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    match pods.patch(&name, &params, &Patch::Merge(&patch)).await {
        Ok(_) => {
            tracing::info!(pod = %name, namespace = ns, attempt, "kept for an in-place restart");
            Ok(true)
        }
        // Gone, or a different incarnation: the next round decides again.
        Err(kube::Error::Api(s)) if matches!(s.code, 404 | 409 | 422) => Ok(false),
        Err(e) => Err(Error::kube(format!("relabelling pod {ns}/{name}"))(e)),
    }
}

async fn delete_pod(
    pods: Api<Pod>,
    ns: &str,
    name: String,
    uid: Option<String>,
    grace: Option<u32>,
) -> Result<bool, Error> {
    let dp = DeleteParams {
        grace_period_seconds: grace,
        preconditions: uid.map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match pods.delete(&name, &dp).await {
        Ok(_) => Ok(true),
        // Gone already, or a different incarnation: nothing of ours to delete.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(false),
        Err(e) => Err(Error::kube(format!("deleting pod {ns}/{name}"))(e)),
    }
}

#[cfg(test)]
mod tests {
    //! The executor against a recorded client: a `kube::Client` over a tower service that
    //! records every request and answers from a script, no cluster.

    use std::sync::Mutex;

    use k8s_openapi::api::core::v1::Service;
    use kube::runtime::reflector;
    use serde_json::Value;

    use super::*;
    use crate::fixtures::job_yaml;
    use crate::model::ownership::Kind;
    use std::time::Duration;

    /// One request as the API server would see it.
    #[derive(Clone, Debug, PartialEq)]
    struct Sent {
        method: String,
        path: String,
        /// The body, when it is JSON.
        body: Value,
    }

    impl Sent {
        fn is(&self, method: &str, path: &str) -> bool {
            self.method == method && self.path == path
        }
    }

    type Script = fn(&Sent) -> (u16, Value);

    const STATUS: &str = "/apis/trainyard.dev/v1alpha1/namespaces/ml/trainingjobs/train/status";
    const PODS: &str = "/api/v1/namespaces/ml/pods";
    const SERVICES: &str = "/api/v1/namespaces/ml/services";

    fn job() -> TrainingJob {
        let mut job = job_yaml("workers: 2\n");
        job.metadata.resource_version = Some("1".to_owned());
        job
    }

    fn api_status(code: u16, reason: &str, message: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Status", "status": "Failure",
               "code": code, "reason": reason, "message": message})
    }

    /// What an API server answers that accepts everything: the job with a new
    /// resourceVersion to a status write, the object to a create or a delete.
    fn accept(sent: &Sent) -> (u16, Value) {
        match sent.method.as_str() {
            "PATCH" => {
                let mut written = serde_json::to_value(job()).expect("job");
                written["metadata"]["resourceVersion"] = json!("2");
                written["status"] = sent.body["status"].clone();
                (200, written)
            }
            "POST" => (201, sent.body.clone()),
            _ => {
                let name = sent.path.rsplit('/').next().unwrap_or_default();
                (
                    200,
                    json!({"apiVersion": "v1", "kind": "Pod",
                             "metadata": {"name": name, "namespace": "ml"}}),
                )
            }
        }
    }

    /// A client whose requests are recorded in the returned log, and answered by `script`.
    fn recorded_client(script: Script) -> (Client, Arc<Mutex<Vec<Sent>>>) {
        let log = Arc::new(Mutex::new(Vec::new()));
        let recorder = log.clone();
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let log = recorder.clone();
            async move {
                let (parts, body) = request.into_parts();
                let bytes = body.collect_bytes().await?;
                let sent = Sent {
                    method: parts.method.to_string(),
                    path: parts.uri.path().to_owned(),
                    body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
                };
                log.lock().expect("log").push(sent.clone());
                let (code, answer) = script(&sent);
                Ok::<_, kube::Error>(crate::fixtures::json_response(code, &answer))
            }
        });
        (Client::new(service, "default"), log)
    }

    struct Harness {
        executor: Executor,
        log: Arc<Mutex<Vec<Sent>>>,
        events: mpsc::Receiver<EventBatch>,
    }

    /// The harness's Event queue holds this many batches.
    const EVENTS_QUEUED: usize = 16;

    impl Harness {
        fn new(script: Script) -> Self {
            let (events_tx, events) = mpsc::channel(EVENTS_QUEUED);
            let metrics = Arc::new(Metrics::new());
            let (client, log) = recorded_client(script);
            let executor = Executor::new(
                client,
                Arc::new(Expectations::new(Duration::from_secs(15))),
                events_tx,
                metrics,
                Arc::new(WriteMemory::default()),
                Arc::new(crate::state::job_memory::JobMemory::new(Vec::new()))
                    .sweep(reflector::store().0),
                Arc::new(ProgressStore::default()),
            );
            Self {
                executor,
                log,
                events,
            }
        }

        fn sent(&self) -> Vec<Sent> {
            self.log.lock().expect("log").clone()
        }

        fn queued_events(&mut self) -> Vec<JobEvent> {
            let mut all = Vec::new();
            while let Ok((_, events)) = self.events.try_recv() {
                all.extend(events);
            }
            all
        }

        /// Carries `plan` out as a reconcile does.
        async fn carry_out(&self, plan: plan::Plan, write_status: bool) -> Result<(), Error> {
            self.executor
                .carry_out(&job(), plan, write_status, Timestamp::now())
                .await
                .map(drop)
        }
    }

    fn round(actions: Vec<PlanAction>) -> plan::Plan {
        plan::Plan {
            status: TrainingJobStatus {
                attempt: 1,
                ..TrainingJobStatus::default()
            },
            actions,
            events: Vec::new(),
            requeue_at: None,
            restart: None,
            creates_attempt: None,
            checkpoint_request: None,
            checkpoint_withdrawal: None,
            steps_lost: None,
            supervise: None,
            decided_by: plan::outcome::PhaseName::Running,
        }
    }

    fn create_pod(rank: u32) -> PlanAction {
        PlanAction::CreatePod(Box::new(
            serde_json::from_value(json!({"metadata": {"name": format!("train-worker-{rank}")}}))
                .expect("pod"),
        ))
    }

    fn delete_pod(rank: u32) -> PlanAction {
        PlanAction::DeletePod {
            name: format!("train-worker-{rank}"),
            uid: Some(format!("uid-{rank}")),
        }
    }

    #[tokio::test]
    async fn a_restart_round_writes_the_status_before_any_delete() {
        let h = Harness::new(accept);
        let mut plan = round(vec![delete_pod(0), delete_pod(1)]);
        plan.restart = Some(RestartReason::Preemption);
        h.carry_out(plan, true).await.expect("round");
        let sent = h.sent();
        assert_eq!(sent.len(), 3, "{sent:#?}");
        assert!(sent[0].is("PATCH", STATUS), "{sent:#?}");
        assert_eq!(sent[0].body["status"]["attempt"], json!(1));
        let mut deleted: Vec<&str> = sent[1..]
            .iter()
            .filter(|s| s.method == "DELETE")
            .map(|s| s.path.as_str())
            .collect();
        deleted.sort_unstable();
        assert_eq!(
            deleted,
            [
                "/api/v1/namespaces/ml/pods/train-worker-0",
                "/api/v1/namespaces/ml/pods/train-worker-1"
            ]
        );
    }

    fn restart_of_three() -> plan::Plan {
        let mut restart = round(vec![delete_pod(0), delete_pod(1), delete_pod(2)]);
        restart.restart = Some(RestartReason::Preemption);
        restart
    }

    #[tokio::test]
    async fn a_round_that_deletes_or_restarts_sends_nothing_else_when_its_status_write_fails() {
        let mut restart_without_deletes = round(vec![create_pod(0)]);
        restart_without_deletes.restart = Some(RestartReason::Failure);
        for plan in [
            round(vec![delete_pod(0), create_pod(1)]),
            restart_without_deletes,
        ] {
            let h = Harness::new(|sent| match sent.method.as_str() {
                "PATCH" => (500, api_status(500, "InternalError", "etcd is down")),
                _ => accept(sent),
            });
            let err = h
                .carry_out(plan, true)
                .await
                .expect_err("the status write failed");
            assert!(matches!(err, Error::Kube { .. }), "{err}");
            let sent = h.sent();
            assert_eq!(sent.len(), 1, "{sent:#?}");
            assert!(sent[0].is("PATCH", STATUS));
        }
    }

    /// A replica that decided a restart on the job at version 1, while its successor has
    /// written version 2 (the deposed leader's write arrives late): the API server refuses the
    /// write conditioned on version 1 as it refuses any stale update, and the round deletes
    /// nothing. The fake answers as a 1.20 API server does (checked on the local cluster).
    #[tokio::test]
    async fn a_deposed_leaders_restart_is_conditioned_on_what_it_read_and_deletes_nothing() {
        let h = Harness::new(|sent| match sent.method.as_str() {
            "PATCH" if sent.body["metadata"]["resourceVersion"] != json!("2") => (
                409,
                api_status(409, "Conflict", "the object has been modified"),
            ),
            _ => accept(sent),
        });
        let err = h
            .carry_out(restart_of_three(), true)
            .await
            .expect_err("a stale write lands");
        assert_eq!(err.metric_label(), "kube_conflict", "{err}");
        assert!(
            err.is_conflict(),
            "decided again at once, not backed off: {err}"
        );
        let sent = h.sent();
        assert_eq!(sent.len(), 1, "{sent:#?}");
        assert_eq!(sent[0].body["metadata"]["resourceVersion"], json!("1"));
        // The same round on the job as it is now goes through, deletes and all.
        let mut current = job();
        current.metadata.resource_version = Some("2".to_owned());
        h.executor
            .carry_out(&current, restart_of_three(), true, Timestamp::now())
            .await
            .expect("round on the current job");
        assert_eq!(h.sent().len(), 1 + 1 + 3);
    }

    #[tokio::test]
    async fn a_create_round_sends_its_creates_and_the_status_write() {
        let h = Harness::new(accept);
        let service: Service =
            serde_json::from_value(json!({"metadata": {"name": "train"}})).expect("service");
        let plan = round(vec![
            create_pod(0),
            create_pod(1),
            PlanAction::CreateService(Box::new(service)),
        ]);
        h.carry_out(plan, true).await.expect("round");
        let sent = h.sent();
        assert_eq!(sent.len(), 4, "{sent:#?}");
        assert_eq!(sent.iter().filter(|s| s.is("PATCH", STATUS)).count(), 1);
        let pods: Vec<_> = sent.iter().filter(|s| s.is("POST", PODS)).collect();
        assert_eq!(pods.len(), 2, "{sent:#?}");
        assert!(pods.iter().all(|p| p.body["kind"] == json!("Pod")));
        assert_eq!(sent.iter().filter(|s| s.is("POST", SERVICES)).count(), 1);
        // Created: held back until the watch shows them.
        let expectations = &h.executor.expectations;
        assert!(
            expectations
                .holds(Kind::Pod, "ml", "train-worker-0")
                .is_some()
        );
        assert!(expectations.holds(Kind::Service, "ml", "train").is_some());
    }

    #[tokio::test]
    async fn an_already_exists_create_counts_as_not_written() {
        let h = Harness::new(|sent| match sent.method.as_str() {
            "POST" => (
                409,
                api_status(
                    409,
                    "AlreadyExists",
                    "pods \"train-worker-0\" already exists",
                ),
            ),
            _ => accept(sent),
        });
        h.carry_out(round(vec![create_pod(0)]), false)
            .await
            .expect("AlreadyExists is no error");
        let sent = h.sent();
        assert_eq!(
            sent.len(),
            1,
            "nothing accepted, nothing rejected: {sent:#?}"
        );
        assert!(sent[0].is("POST", PODS));
        // No watch event will come for a write that did not happen.
        let expectations = &h.executor.expectations;
        assert_eq!(expectations.holds(Kind::Pod, "ml", "train-worker-0"), None);
        assert!(expectations.is_empty());
    }

    #[tokio::test]
    async fn a_rejected_pod_create_fails_the_round_and_is_remembered_for_the_next_one() {
        let h = Harness::new(|sent| match sent.method.as_str() {
            "POST" => (
                422,
                api_status(
                    422,
                    "Invalid",
                    "Pod \"train-worker-0\" is invalid: spec.containers[0].env[0].name: Invalid value: \"1BAD\"",
                ),
            ),
            _ => accept(sent),
        });
        let uid = job().metadata.uid.clone().unwrap_or_default();
        let err = h
            .carry_out(round(vec![create_pod(0)]), false)
            .await
            .expect_err("a rejected write fails the round");
        assert!(matches!(err, Error::Kube { .. }), "{err}");
        let sent = h.sent();
        assert_eq!(sent.len(), 1, "nothing is written a second time: {sent:#?}");
        assert!(sent[0].is("POST", PODS));
        let remembered = h.executor.memory.last_writes(&uid).expect("remembered");
        assert_eq!(remembered.accepted, 0);
        assert_eq!(remembered.rejected.len(), 1);
        assert_eq!(remembered.rejected[0].reason, "Invalid");
        assert!(remembered.rejected[0].message.contains("1BAD"));
        assert_eq!(
            h.executor
                .expectations
                .holds(Kind::Pod, "ml", "train-worker-0"),
            None,
            "no watch event will come for it"
        );
        // A later round that writes while the job shows no rejection leaves nothing behind.
        h.carry_out(
            round(vec![PlanAction::DeletePod {
                name: "x".to_owned(),
                uid: None,
            }]),
            false,
        )
        .await
        .expect("round");
        assert_eq!(h.executor.memory.last_writes(&uid), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_round_sends_its_writes_before_it_waits_for_room_in_the_event_queue() {
        let mut h = Harness::new(accept);
        // The publisher is behind: its queue is full.
        for _ in 0..EVENTS_QUEUED {
            h.executor
                .publish(
                    &job().object_ref(&()),
                    vec![JobEvent::normal("Backlog", "")],
                )
                .await;
        }
        let (_, idle) = mpsc::channel(1);
        let mut publisher = std::mem::replace(&mut h.events, idle);
        let mut plan = round(vec![create_pod(0), create_pod(1)]);
        plan.events = vec![JobEvent::normal("Created", "")];
        let mut creating = std::pin::pin!(h.carry_out(plan, true));
        tokio::select! {
            _ = &mut creating => panic!("the Event queue had no room"),
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        assert_eq!(
            h.sent().len(),
            3,
            "the creates and the status write went out"
        );
        // The publisher takes a batch: the round queues its Event and ends.
        assert_eq!(
            publisher.recv().await.expect("a batch").1[0].reason,
            "Backlog"
        );
        creating.await.expect("round");
        let mut last = None;
        while let Ok((_, events)) = publisher.try_recv() {
            last = events.last().map(|e| e.reason.clone());
        }
        assert_eq!(last.as_deref(), Some("Created"));
    }

    #[tokio::test]
    async fn a_round_with_nothing_to_write_sends_no_request() {
        let mut h = Harness::new(accept);
        h.carry_out(round(Vec::new()), false).await.expect("round");
        assert_eq!(h.sent(), []);
        assert_eq!(h.queued_events(), []);
    }

    /// What the next round observes as told ([`plan::Observed::told_attempt`]): the attempt
    /// of every round carried out.
    #[tokio::test]
    async fn a_round_carried_out_marks_its_attempt_told() {
        let h = Harness::new(accept);
        let uid = job().metadata.uid.clone().unwrap_or_default();
        h.carry_out(round(Vec::new()), false).await.expect("round");
        assert_eq!(h.executor.memory.told_attempt(&uid), Some(1));
    }

    /// Rounds carried through [`crate::writes::Writes`] while another job holds the one
    /// routine slot.
    #[tokio::test]
    async fn a_status_only_round_with_every_routine_slot_taken_parks_and_an_urgent_one_does_not() {
        use crate::writes::routine::RoutineSlots;
        use crate::writes::{Carried, DecidedRound, Writes, job_ref};
        let Harness { executor, log, .. } = Harness::new(accept);
        let (routine, _wakes) = RoutineSlots::new(1, Arc::new(Metrics::new()));
        let writes = Writes {
            executor,
            routine: routine.clone(),
            memory: Arc::new(WriteMemory::default()),
        };
        let job = job();
        let other = job_ref(&job_yaml("workers: 1\n"));
        let taken = routine.take_or_park(&other).expect("the one routine slot");
        let decided = |plan: plan::Plan| DecidedRound {
            known: crate::state::status_cache::Known {
                written: TrainingJobStatus::default(),
                current: TrainingJobStatus::default(),
                detail_waiting: None,
            },
            plan,
            now: Timestamp::now(),
        };
        // A transition recorded, nothing else: routine.
        let mut status_only = round(Vec::new());
        status_only.status.phase = Some(crate::model::crd::Phase::Running);
        let carried = writes.carry_out(&job, decided(status_only.clone())).await;
        assert_eq!(carried.expect("round"), Carried::Parked);
        assert_eq!(
            log.lock().expect("log").clone(),
            [],
            "a parked round sends nothing"
        );
        // A create is urgent: carried out at once, whatever the routine slots.
        let mut creating = status_only;
        creating.actions = vec![create_pod(0)];
        let carried = writes.carry_out(&job, decided(creating)).await;
        assert_eq!(carried.expect("round"), Carried::Done(None));
        let sent = log.lock().expect("log").clone();
        assert_eq!(sent.len(), 2, "the create and the status write: {sent:#?}");
        drop(taken);
    }
}
