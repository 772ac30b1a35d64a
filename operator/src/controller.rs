//! The thin layer between the pure pipeline and the API server.
//!
//! One kube-runtime Controller on TrainingJobs. Pods (owned), Nodes, Services and PVCs are
//! each watched once into reflector caches that every reconcile reads, so a reconcile makes no
//! LIST calls and, when nothing changed, no API calls at all. Pods are found by their
//! deterministic names (`<job>-worker-<rank>`), so a reconcile costs O(workers), not O(pods).

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt, TryStreamExt, future, stream};
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod, Service};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions,
};
use kube::core::PartialObjectMeta;
use kube::core::error_boundary::{DeserializeGuard, InvalidObject};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;

use crate::cached_pod::CachedPod;
use crate::config::OperatorConfig;
use crate::crd::{
    LABEL_ATTEMPT, LABEL_JOB, LABEL_RANK, MAX_WORKERS, Phase, RestartReason, TrainingJob,
    TrainingJobStatus,
};
use crate::error::Error;
use crate::expectations::{Expectations, Kind};
use crate::job_memory::{JobMemory, StateSizes, error_key};
use crate::leader::{LeaderElection, Leadership};
use crate::metrics::{Metrics, RestartLabels};
use crate::ownership::{self, ObjectKind};
use crate::plan::{self, Action as PlanAction, EventKind, JobEvent, Observed, condition};
use crate::rejection::{self, Writes};
use crate::validate::{ValidJob, pod_name, validate};

/// The one field manager for everything the operator writes.
pub const FIELD_MANAGER: &str = "trainyard-operator";
/// Name of the CRD the operator waits for.
pub const CRD_NAME: &str = "trainingjobs.trainyard.dev";
/// How often a quiet job is looked at again, to heal drift (a deleted Service, ...).
const RESYNC: Duration = Duration::from_secs(300);
/// How long per-worker status detail may wait to be written with other changes
/// ([`plan::status_write`]).
const WORKER_DETAIL_BATCH: Duration = Duration::from_secs(3);
/// Event batches (one per reconcile) waiting to be published.
const EVENT_QUEUE: usize = 1024;
/// Event batches published at once.
const EVENT_PUBLISHERS: usize = 8;
/// How long a stopping operator keeps publishing the Events it has queued.
const EVENT_DRAIN: Duration = Duration::from_secs(1);

/// How long a write is held back waiting for its watch event ([`Expectations`]).
const EXPECTATION_TTL: Duration = Duration::from_secs(15);

/// One reconcile's Events, for the publisher task.
type EventBatch = (k8s_openapi::api::core::v1::ObjectReference, Vec<JobEvent>);

/// Everything [`run`] needs.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// Watch only this namespace; None watches all.
    pub namespace: Option<String>,
    /// Price and spot tables, timeouts.
    pub operator: OperatorConfig,
    /// Serve `/metrics`, `/healthz` and `/readyz` here.
    pub metrics_addr: Option<SocketAddr>,
    /// Take a Lease before reconciling; None reconciles at once.
    pub leader_election: Option<LeaderElection>,
    /// Name of this replica in Events (`reportingInstance`).
    pub instance: String,
    /// Reconciles in flight at once. Unbounded, a burst of jobs puts
    /// thousands of requests in front of the API server at the same time:
    /// every reconcile gets slower and the operator's memory grows with the
    /// queue (measured: 1,637 requests waiting and 268 MiB at 1,000 jobs).
    pub max_concurrent_reconciles: u16,
}

/// Where kubelets keep their heartbeat Leases.
const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// Default for [`RunConfig::max_concurrent_reconciles`].
pub const DEFAULT_MAX_CONCURRENT_RECONCILES: u16 = 16;

struct Context {
    client: Client,
    config: OperatorConfig,
    pods: Store<CachedPod>,
    nodes: Store<Node>,
    /// The kubelets' Leases: a node whose Lease stops renewing is being lost (lost_peer).
    leases: Store<Lease>,
    services: Store<PartialObjectMeta<Service>>,
    claims: Store<PartialObjectMeta<PersistentVolumeClaim>>,
    jobs: Store<DeserializeGuard<TrainingJob>>,
    /// Events go to a publisher task: they are API writes too, and a reconcile should not wait
    /// for them before it frees its slot.
    events: tokio::sync::mpsc::Sender<EventBatch>,
    /// Writes the caches do not show yet, and that must not be repeated meanwhile.
    expectations: Arc<Expectations>,
    metrics: Arc<Metrics>,
    /// What is kept per job between reconciles, forgotten when the job goes.
    memory: Arc<JobMemory>,
}

fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Runs the operator until `shutdown` completes (or leadership is lost, which is an error so
/// that the process restarts and queues for the Lease again).
pub async fn run(
    client: Client,
    config: RunConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let metrics = Arc::new(Metrics::new());
    let shutdown = shutdown.shared();
    if let Some(addr) = config.metrics_addr {
        let (local, server) =
            crate::metrics::serve(addr, metrics.clone(), shutdown.clone()).await?;
        tracing::info!(%local, "serving /metrics, /healthz and /readyz");
        tokio::spawn(async move {
            if let Err(e) = server.await {
                tracing::error!(error = %e, "metrics server stopped");
            }
        });
    }

    tokio::select! {
        r = wait_for_crd(client.clone()) => r?,
        () = shutdown.clone() => return Ok(()),
    }

    let leadership = match &config.leader_election {
        None => None,
        Some(election) => {
            // A standby is healthy and ready: it serves metrics and waits.
            metrics.set_ready(true);
            tokio::select! {
                l = Leadership::acquire(client.clone(), election) => Some(l?),
                () = shutdown.clone() => return Ok(()),
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
        let shutdown = shutdown.clone();
        let lost = lost.clone();
        async move {
            tokio::select! {
                () = shutdown => {},
                () = lost => {},
            }
        }
    };
    let result = run_controller(client, &config, metrics.clone(), stop).await;
    metrics.leader.set(0);
    if let Some(task) = watcher_task {
        if lost.clone().now_or_never().is_some() {
            return Err(Error::LeaderElection("lost the leader Lease".to_owned()));
        }
        let _ = done_tx.send(());
        if let Ok(l) = task.await {
            l.release().await;
        }
    }
    result
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

/// Cached TrainingJobs keep what decisions read: managedFields and kubectl's
/// last-applied-configuration (a second copy of the spec) are dropped.
fn strip_job(job: &mut DeserializeGuard<TrainingJob>) {
    job.managed_fields_mut().clear();
    job.annotations_mut()
        .remove("kubectl.kubernetes.io/last-applied-configuration");
}

/// Cached Services and PVCs keep their name, labels and owners: what ownership is judged by.
fn strip_meta<K>(object: &mut PartialObjectMeta<K>) {
    object.metadata.managed_fields = None;
    object.metadata.annotations = None;
}

fn strip_node(node: &mut Node) {
    node.managed_fields_mut().clear();
    // Image lists are the bulk of a Node object and the operator never reads them.
    if let Some(status) = node.status.as_mut() {
        status.images = None;
    }
}

/// The pod whose placement a missing rank of the current attempt would copy (the lowest rank
/// present, as [`plan::decide`] picks it), when some missing rank is not one this operator has
/// just created (`held`): only then do the cached pods, stripped of their placement, not
/// suffice. Normally every rank is created in one round and the rest of a round's missing
/// ranks are still on their way into the cache.
fn sibling_to_read(
    pods: &[Arc<Pod>],
    attempt: u32,
    workers: u32,
    held: impl Fn(u32) -> bool,
) -> Option<String> {
    let mut present: Vec<(u32, &Arc<Pod>)> = pods
        .iter()
        .filter(|p| plan::label_u32(p, LABEL_ATTEMPT) == Some(attempt))
        .filter_map(|p| Some((plan::label_u32(p, LABEL_RANK)?, p)))
        .filter(|(rank, _)| *rank < workers)
        .collect();
    present.sort_by_key(|(rank, _)| *rank);
    let (_, sibling) = present.first()?;
    let unheld_gap = (0..workers)
        .filter(|r| present.iter().all(|(rank, _)| rank != r))
        .any(|r| !held(r));
    unheld_gap.then(|| sibling.name_any())
}

/// The ranks whose pods one reconcile looks up: every rank of the spec, then each recorded
/// rank beyond it once (a pod left over from a larger `workers`, to be deleted). Never a range
/// up to a recorded rank: status is input, and a rank near 2^32 must not cost four billion
/// lookups. A recorded rank no spec can have (≥ [`MAX_WORKERS`]) is ignored.
fn ranks_to_observe(workers: u32, current: &TrainingJobStatus) -> impl Iterator<Item = u32> {
    let beyond: BTreeSet<u32> = current
        .workers
        .iter()
        .map(|w| w.rank)
        .filter(|rank| (workers..MAX_WORKERS).contains(rank))
        .collect();
    (0..workers).chain(beyond)
}

/// Marks an object's expectation met when a watch event for it arrives.
fn seen_by<K: Resource>(expectations: Arc<Expectations>, kind: Kind) -> impl Fn(&K) {
    move |object| {
        let meta = object.meta();
        expectations.observed(
            kind,
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default(),
        );
    }
}

/// What about a node can change placement or classification.
fn node_fingerprint(node: &Node) -> u64 {
    let mut h = DefaultHasher::new();
    node.metadata.labels.hash(&mut h);
    if let Some(spec) = &node.spec {
        format!("{:?}", spec.taints).hash(&mut h);
        spec.unschedulable.hash(&mut h);
    }
    if let Some(status) = &node.status {
        format!("{:?}", status.allocatable).hash(&mut h);
        let ready = status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "Ready")
            .map(|c| c.status.clone());
        ready.hash(&mut h);
    }
    h.finish()
}

/// The last fingerprint of every node, to wake jobs only when a node changed in a way that
/// matters. Keyed by node, so it follows the nodes: a node deleted while the watch was down
/// (autoscalers remove nodes all the time) is forgotten, and reported, at the end of the re-list.
#[derive(Debug, Default)]
struct NodeFingerprints {
    known: HashMap<String, u64>,
    /// The nodes of a re-list under way.
    relisted: Option<BTreeSet<String>>,
}

impl NodeFingerprints {
    /// The nodes whose change a watch event reports.
    fn changed(&mut self, ev: &watcher::Event<Node>) -> Vec<String> {
        match ev {
            watcher::Event::Apply(n) => {
                let name = n.name_any();
                let new = node_fingerprint(n);
                if self.known.insert(name.clone(), new) == Some(new) {
                    return Vec::new();
                }
                vec![name]
            }
            watcher::Event::Init => {
                self.relisted = Some(BTreeSet::new());
                Vec::new()
            }
            watcher::Event::InitApply(n) => {
                let name = n.name_any();
                let new = node_fingerprint(n);
                if let Some(relisted) = self.relisted.as_mut() {
                    relisted.insert(name.clone());
                }
                // The first list needs no triggers (every job reconciles at start);
                // a re-list after a watch gap reports what changed meanwhile.
                match self.known.insert(name.clone(), new) {
                    Some(old) if old != new => vec![name],
                    _ => Vec::new(),
                }
            }
            watcher::Event::InitDone => {
                let Some(relisted) = self.relisted.take() else {
                    return Vec::new();
                };
                let gone: Vec<String> = self
                    .known
                    .keys()
                    .filter(|n| !relisted.contains(*n))
                    .cloned()
                    .collect();
                for n in &gone {
                    self.known.remove(n);
                }
                gone
            }
            watcher::Event::Delete(n) => {
                let name = n.name_any();
                self.known.remove(&name);
                vec![name]
            }
        }
    }
}

/// The jobs a node change concerns: those with pods on it, and those waiting for nodes.
fn jobs_for_node(
    node: &str,
    pods: &Store<CachedPod>,
    jobs: &Store<DeserializeGuard<TrainingJob>>,
) -> Vec<ObjectRef<DeserializeGuard<TrainingJob>>> {
    let mut refs: Vec<ObjectRef<DeserializeGuard<TrainingJob>>> = pods
        .state()
        .iter()
        .filter(|p| p.node_name() == Some(node))
        .filter_map(|p| {
            let job = p.labels().get(LABEL_JOB)?;
            Some(ObjectRef::new(job).within(p.namespace().as_deref().unwrap_or_default()))
        })
        .collect();
    for j in jobs.state() {
        let Ok(job) = &j.0 else { continue };
        let Some(status) = job.status.as_ref() else {
            refs.push(ObjectRef::from_obj(j.as_ref()));
            continue;
        };
        let waiting = plan::condition_is_true(&status.conditions, condition::UNSCHEDULABLE)
            || plan::condition_is_true(&status.conditions, condition::INVALID_SPEC)
            || matches!(status.phase, None | Some(Phase::Pending));
        if waiting {
            refs.push(ObjectRef::from_obj(j.as_ref()));
        }
    }
    refs.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    refs.dedup();
    refs
}

/// The job a Service or PVC event concerns because the object holds that job's name and the
/// job waits with NameConflict: a lookup by name, not a scan of every job.
fn job_in_conflict_over(
    kind: ObjectKind,
    name: &str,
    ns: &str,
    jobs: &Store<DeserializeGuard<TrainingJob>>,
) -> Option<ObjectRef<DeserializeGuard<TrainingJob>>> {
    let job_name = match kind {
        ObjectKind::Claim => name.strip_suffix("-checkpoints")?,
        ObjectKind::Service | ObjectKind::Pod => name,
    };
    let entry = jobs.get(&ObjectRef::new(job_name).within(ns))?;
    let status = entry.0.as_ref().ok()?.status.as_ref()?;
    let names_it = kind != ObjectKind::Claim || status.checkpoint_claim.as_deref() == Some(name);
    (names_it && plan::condition_is_true(&status.conditions, condition::NAME_CONFLICT))
        .then(|| ObjectRef::from_obj(entry.as_ref()))
}

async fn run_controller(
    client: Client,
    config: &RunConfig,
    metrics: Arc<Metrics>,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), Error> {
    let ns = config.namespace.as_deref();
    let wc = || watcher::Config::default().any_semantic();

    let expectations = Arc::new(Expectations::new(EXPECTATION_TTL));

    let (pod_store, pod_writer) = reflector::store();
    let seen = seen_by::<CachedPod>(expectations.clone(), Kind::Pod);
    let pod_stream = watcher(api::<CachedPod>(&client, ns), wc().labels(LABEL_JOB))
        .modify(CachedPod::strip)
        .reflect(pod_writer)
        .default_backoff()
        .touched_objects()
        .inspect_ok(move |pod| seen(pod));

    let (node_store, node_writer) = reflector::store();
    let node_events = watcher(Api::<Node>::all(client.clone()), wc())
        .modify(strip_node)
        .reflect(node_writer)
        .default_backoff();

    // Node heartbeats. Optional: without RBAC for Leases the store stays empty and the lost
    // peer rule falls back to node conditions and its window.
    let (lease_store, lease_writer) = reflector::store();
    let lease_task = tokio::spawn(
        watcher(
            Api::<Lease>::namespaced(client.clone(), NODE_LEASE_NAMESPACE),
            wc(),
        )
        .reflect(lease_writer)
        .default_backoff()
        .for_each(|ev| {
            if let Err(e) = ev {
                tracing::debug!(error = %e, "node Lease watch");
            }
            future::ready(())
        }),
    );

    // Every Service, not only those labelled for a job: a Service of a job's name that is not
    // the job's must be seen, or it would be written over (ownership).
    let (svc_store, svc_writer) = reflector::store();
    let seen = seen_by::<PartialObjectMeta<Service>>(expectations.clone(), Kind::Service);
    let svc_events = watcher(api::<PartialObjectMeta<Service>>(&client, ns), wc())
        .modify(strip_meta)
        .reflect(svc_writer)
        .default_backoff()
        .touched_objects()
        .inspect_ok(move |svc| seen(svc));
    let (claim_store, claim_writer) = reflector::store();
    let seen =
        seen_by::<PartialObjectMeta<PersistentVolumeClaim>>(expectations.clone(), Kind::Claim);
    let claim_events = watcher(
        api::<PartialObjectMeta<PersistentVolumeClaim>>(&client, ns),
        wc(),
    )
    .modify(strip_meta)
    .reflect(claim_writer)
    .default_backoff()
    .touched_objects()
    .inspect_ok(move |claim| seen(claim));

    let jobs_api: Api<DeserializeGuard<TrainingJob>> = api(&client, ns);
    let (job_store, job_writer) = reflector::store();
    let memory = Arc::new(JobMemory::default());
    let forget = {
        let (memory, expectations, jobs) =
            (memory.clone(), expectations.clone(), job_store.clone());
        let metrics = metrics.clone();
        move |event: &watcher::Event<DeserializeGuard<TrainingJob>>| {
            memory.on_job_event(&expectations, event, &jobs);
            if matches!(event, watcher::Event::Delete(_) | watcher::Event::InitDone) {
                metrics.set_state_sizes(&StateSizes::of(&memory, &expectations));
            }
        }
    };
    let job_stream = watcher(jobs_api, wc())
        .modify(strip_job)
        .reflect(job_writer)
        .default_backoff()
        .inspect_ok(forget)
        .applied_objects();
    let controller = Controller::for_stream(job_stream, job_store.clone()).with_config(
        ControllerConfig::default()
            .debounce(Duration::from_millis(50))
            .concurrency(config.max_concurrent_reconciles),
    );

    let mut fingerprints = NodeFingerprints::default();
    let node_triggers = {
        let pods = pod_store.clone();
        let jobs = job_store.clone();
        node_events
            .map(move |ev| match ev {
                Ok(ev) => fingerprints.changed(&ev),
                Err(e) => {
                    tracing::warn!(error = %e, "node watch");
                    Vec::new()
                }
            })
            .flat_map(stream::iter)
            .flat_map(move |name| stream::iter(jobs_for_node(&name, &pods, &jobs)))
    };

    // A job waiting for its existingClaim starts as soon as the claim appears; a job blocked
    // by a PVC or Service of its name that is not its own, as soon as that one is gone.
    let claim_triggers = {
        let jobs = job_store.clone();
        claim_events
            .filter_map(move |claim| {
                let refs: Vec<_> = match claim {
                    Ok(claim) => {
                        let (name, ns) = (claim.name_any(), claim.namespace().unwrap_or_default());
                        let mut refs: Vec<_> = jobs
                            .state()
                            .iter()
                            .filter(|j| {
                                j.0.as_ref().is_ok_and(|job| {
                                    job.namespace().as_deref() == Some(ns.as_str())
                                        && job.spec.checkpoint.existing_claim == name
                                })
                            })
                            .map(|j| ObjectRef::from_obj(j.as_ref()))
                            .collect();
                        refs.extend(job_in_conflict_over(ObjectKind::Claim, &name, &ns, &jobs));
                        refs
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "persistentvolumeclaim watch");
                        Vec::new()
                    }
                };
                future::ready((!refs.is_empty()).then(|| stream::iter(refs)))
            })
            .flatten()
    };
    let service_triggers = {
        let jobs = job_store.clone();
        svc_events.filter_map(move |svc| {
            future::ready(match svc {
                Ok(svc) => job_in_conflict_over(
                    ObjectKind::Service,
                    &svc.name_any(),
                    &svc.namespace().unwrap_or_default(),
                    &jobs,
                ),
                Err(e) => {
                    tracing::warn!(error = %e, "service watch");
                    None
                }
            })
        })
    };

    let reporter = Reporter {
        controller: FIELD_MANAGER.to_owned(),
        instance: Some(config.instance.clone()),
    };
    let (events_tx, events_rx) = tokio::sync::mpsc::channel(EVENT_QUEUE);
    let publisher = tokio::spawn(publish_events(client.clone(), reporter, events_rx));
    let ctx = Arc::new(Context {
        client: client.clone(),
        config: config.operator.clone(),
        pods: pod_store,
        nodes: node_store,
        leases: lease_store,
        services: svc_store,
        claims: claim_store,
        jobs: job_store,
        events: events_tx,
        expectations,
        metrics: metrics.clone(),
        memory,
    });

    metrics.set_ready(true);
    tracing::info!(
        namespace = ns.unwrap_or("(all)"),
        "reconciling TrainingJobs"
    );
    controller
        .owns_stream(pod_stream)
        .reconcile_on(node_triggers)
        .reconcile_on(claim_triggers)
        .reconcile_on(service_triggers)
        .graceful_shutdown_on(stop)
        .run(reconcile, error_policy, ctx)
        .for_each(|res| {
            if let Err(e) = res {
                tracing::debug!(error = %e, "controller");
            }
            future::ready(())
        })
        .await;
    lease_task.abort();
    // The controller has dropped the last Context, and with it the Events' sender: the publisher
    // ends once it has published what is queued, or is cut short.
    if tokio::time::timeout(EVENT_DRAIN, publisher).await.is_err() {
        tracing::warn!("stopping with Events not yet published");
    }
    tracing::info!("controller stopped");
    Ok(())
}

/// Publishes queued Events, a few batches at once, each batch in order.
///
/// Each batch gets a Recorder of its own. A shared one keeps every Event it published for six
/// minutes, to turn a repeat into a series: 9 MB of the operator's peak heap at 1,000 jobs
/// (heaptrack), and a repeat of one of our Events would keep the first one's note. The
/// operator publishes an Event per transition, never the same one again, so it needs no series.
async fn publish_events(
    client: Client,
    reporter: Reporter,
    mut batches: tokio::sync::mpsc::Receiver<EventBatch>,
) {
    let batches = stream::poll_fn(move |cx| batches.poll_recv(cx));
    batches
        .for_each_concurrent(EVENT_PUBLISHERS, |(reference, events)| {
            let recorder = Recorder::new(client.clone(), reporter.clone());
            async move {
                for e in events {
                    let event = Event {
                        type_: match e.kind {
                            EventKind::Normal => EventType::Normal,
                            EventKind::Warning => EventType::Warning,
                        },
                        reason: e.reason.clone(),
                        note: Some(truncate_note(e.note)),
                        action: "Reconcile".to_owned(),
                        secondary: None,
                    };
                    if let Err(err) = recorder.publish(&event, &reference).await {
                        tracing::warn!(error = %err, reason = %e.reason, "publishing an Event");
                    }
                }
            }
        })
        .await;
}

/// Event notes are limited to 1 kB by the API server.
fn truncate_note(mut note: String) -> String {
    if note.len() > 1000 {
        let mut cut = 1000;
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
    }
    note
}

fn error_policy(obj: Arc<DeserializeGuard<TrainingJob>>, err: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.count_error(err);
    let key = error_key(&obj.namespace().unwrap_or_default(), &obj.name_any());
    if err.waits_for_change() {
        tracing::info!(job = %key, error = %err, "waiting for the TrainingJob to change");
        return Action::await_change();
    }
    let n = ctx.memory.count_error(&key);
    ctx.export_state_sizes();
    let delay = Duration::from_secs((1u64 << n.min(9)).min(300));
    tracing::warn!(job = %key, error = %err, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

async fn reconcile(
    obj: Arc<DeserializeGuard<TrainingJob>>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    ctx.metrics.reconciles.inc();
    let started = Instant::now();
    let result = reconcile_inner(&obj, &ctx).await;
    ctx.metrics
        .reconcile_duration
        .observe(started.elapsed().as_secs_f64());
    if result.is_ok() {
        ctx.memory.clear_errors(&error_key(
            &obj.namespace().unwrap_or_default(),
            &obj.name_any(),
        ));
    }
    ctx.export_state_sizes();
    result
}

impl Context {
    async fn caches_ready(&self) -> Result<(), Error> {
        self.pods
            .wait_until_ready()
            .await
            .map_err(|_| Error::CacheGone("pods"))?;
        self.nodes
            .wait_until_ready()
            .await
            .map_err(|_| Error::CacheGone("nodes"))?;
        self.services
            .wait_until_ready()
            .await
            .map_err(|_| Error::CacheGone("services"))?;
        self.claims
            .wait_until_ready()
            .await
            .map_err(|_| Error::CacheGone("persistentvolumeclaims"))
    }

    /// Sets the `trainyard_operator_state_entries` gauges.
    fn export_state_sizes(&self) {
        self.metrics
            .set_state_sizes(&StateSizes::of(&self.memory, &self.expectations));
    }

    fn observe(&self, job: &ValidJob, current: &TrainingJobStatus, now: Timestamp) -> Observed {
        let ns = job.namespace.as_str();
        let mut pods = Vec::new();
        let mut foreign = Vec::new();
        for rank in ranks_to_observe(job.spec.workers, current) {
            let name = pod_name(&job.name, rank);
            if let Some(pod) = self.pods.get(&ObjectRef::new(&name).within(ns))
                && ownership::present(ObjectKind::Pod, Some(&pod.metadata), job, &mut foreign)
            {
                pods.push(Arc::new(pod.to_pod()));
            }
        }
        let service = self.services.get(&ObjectRef::new(&job.name).within(ns));
        let service_exists = ownership::present(
            ObjectKind::Service,
            service.as_ref().map(|s| &s.metadata),
            job,
            &mut foreign,
        );
        let claim = self.claims.get(&ObjectRef::new(&job.claim_name).within(ns));
        let claim_exists = ownership::present(
            ObjectKind::Claim,
            claim.as_ref().map(|c| &c.metadata),
            job,
            &mut foreign,
        );
        Observed {
            pods,
            foreign,
            nodes: self.nodes.state(),
            node_leases: self.leases.state(),
            claim_exists,
            service_exists,
            now,
        }
    }

    async fn write_status(
        &self,
        job: &TrainingJob,
        status: &TrainingJobStatus,
    ) -> Result<(), Error> {
        let ns = job.namespace().unwrap_or_default();
        let name = job.name_any();
        let api: Api<TrainingJob> = Api::namespaced(self.client.clone(), &ns);
        let patch = json!({
            "apiVersion": TrainingJob::api_version(&()),
            "kind": TrainingJob::kind(&()),
            "status": status,
        });
        let written = api
            .patch_status(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
            .map_err(Error::kube(format!(
                "writing status of TrainingJob {ns}/{name}"
            )))?;
        self.memory.remember_written(
            &job.metadata.uid.clone().unwrap_or_default(),
            written.metadata.resource_version.as_deref(),
            status,
        );
        self.memory.sweep_if_outgrown(&self.jobs);
        Ok(())
    }

    /// Queues Events for the publisher task (waiting only when its queue is full).
    async fn publish(
        &self,
        reference: &k8s_openapi::api::core::v1::ObjectReference,
        events: Vec<JobEvent>,
    ) {
        if events.is_empty() {
            return;
        }
        if self.events.send((reference.clone(), events)).await.is_err() {
            tracing::warn!("the Event publisher has stopped; dropping Events");
        }
    }

    /// Replaces the cached (stripped) sibling a missing rank copies its placement from with the
    /// whole pod read from the API server, when [`sibling_to_read`] says one is needed; says
    /// whether it did.
    async fn read_sibling_whole(
        &self,
        job: &ValidJob,
        attempt: u32,
        observed: &mut Observed,
    ) -> Result<bool, Error> {
        let ns = job.namespace.as_str();
        let held = |rank| {
            self.expectations
                .holds(Kind::Pod, ns, &pod_name(&job.name, rank))
                .is_some()
        };
        let Some(name) = sibling_to_read(&observed.pods, attempt, job.spec.workers, held) else {
            return Ok(false);
        };
        let whole = Api::<Pod>::namespaced(self.client.clone(), ns)
            .get(&name)
            .await
            .map_err(Error::kube(format!(
                "reading pod {ns}/{name} for its placement"
            )))?;
        let cached = observed
            .pods
            .iter_mut()
            .find(|p| p.metadata.name.as_deref() == Some(name.as_str()) && p.uid() == whole.uid())
            .ok_or_else(|| Error::StaleCache(format!("{ns}/{name}")))?;
        *cached = Arc::new(whole);
        Ok(true)
    }

    /// Drops the actions on objects whose last write the caches do not show yet, and says how
    /// long the first of those is held back at most.
    fn hold_back_unobserved(
        &self,
        ns: &str,
        actions: Vec<PlanAction>,
    ) -> (Vec<PlanAction>, Option<Duration>) {
        let mut held: Option<Duration> = None;
        let kept = actions
            .into_iter()
            .filter(|action| {
                let (kind, name) = action_target(action);
                match self.expectations.holds(kind, ns, name) {
                    Some(left) => {
                        tracing::debug!(
                            namespace = ns,
                            name,
                            ?kind,
                            "waiting for the watch to show the last write"
                        );
                        held = Some(held.map_or(left, |h| h.min(left)));
                        false
                    }
                    None => true,
                }
            })
            .collect();
        (kept, held)
    }

    /// Carries out the actions; says what the API server accepted and rejected, and the first
    /// error.
    async fn execute(&self, ns: &str, actions: Vec<PlanAction>) -> (Writes, Result<(), Error>) {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let mut ops = Vec::new();
        let mut targets = Vec::new();
        for action in actions {
            // Expected before the write goes out, so that its watch event cannot arrive first
            // and leave the expectation waiting for an event that already came.
            let (kind, name) = action_target(&action);
            self.expectations.expect(kind, ns, name);
            targets.push((kind, name.to_owned()));
            let client = self.client.clone();
            match action {
                PlanAction::CreateService(svc) => ops.push(create(client, ns, *svc).boxed()),
                PlanAction::CreatePvc(claim) => ops.push(create(client, ns, *claim).boxed()),
                PlanAction::CreatePod(pod) => ops.push(create(client, ns, *pod).boxed()),
                PlanAction::DeletePod { name, uid } => {
                    ops.push(delete_pod(pods.clone(), ns, name, uid, None).boxed());
                }
                PlanAction::ForceDeletePod { name, uid } => {
                    // The plan says why (a lost node has its own Warning Event; a pod whose
                    // containers have stopped needs no grace period).
                    tracing::info!(pod = %name, namespace = ns, "deleting a pod without a grace period");
                    ops.push(delete_pod(pods.clone(), ns, name, uid, Some(0)).boxed());
                }
            }
        }
        let mut writes = Writes::default();
        let mut result = Ok(());
        for (r, (kind, name)) in future::join_all(ops).await.into_iter().zip(targets) {
            // Nothing was written (already there, already gone, or failed): no event will come.
            if !matches!(r, Ok(true)) {
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
}

/// The object an action writes.
fn action_target(action: &PlanAction) -> (Kind, &str) {
    fn name(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> &str {
        meta.name.as_deref().unwrap_or_default()
    }
    match action {
        PlanAction::CreateService(svc) => (Kind::Service, name(&svc.metadata)),
        PlanAction::CreatePvc(claim) => (Kind::Claim, name(&claim.metadata)),
        PlanAction::CreatePod(pod) => (Kind::Pod, name(&pod.metadata)),
        PlanAction::DeletePod { name, .. } | PlanAction::ForceDeletePod { name, .. } => {
            (Kind::Pod, name)
        }
    }
}

/// Creates an object of the job; true once created, false when an object of that name exists
/// already. Create, never apply: an apply writes into whatever holds the name, so a forced one
/// would take over a user's Service and give it an owner reference through which the garbage
/// collector deletes it with the job; a pod must never be mutated into a new attempt. An
/// AlreadyExists means an earlier round created it, or that it is someone else's, which the
/// caches then show ([`ownership`]).
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

/// Deletes a pod (this incarnation only, when `uid` is given); true once it was deleted.
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

async fn report_malformed(invalid: &InvalidObject, ctx: &Context) -> Result<Action, Error> {
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
    if ctx.memory.malformed_reported(&uid, &generation) {
        return Err(error);
    }
    let message = format!(
        "the object does not parse as a TrainingJob: {}",
        invalid.error
    );
    let resource = ApiResource::erase::<TrainingJob>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ns, &resource);
    // A merge patch keeps whatever else the status holds; the object cannot be decoded to rebuild it.
    let patch = json!({"status": {"conditions": [{
        "type": condition::INVALID_SPEC, "status": "True", "reason": "MalformedObject",
        "message": message, "lastTransitionTime": Time(Timestamp::now()),
        "observedGeneration": meta.generation,
    }]}});
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
    ctx.publish(
        &reference,
        vec![JobEvent {
            kind: EventKind::Warning,
            reason: "InvalidSpec".to_owned(),
            note: message,
        }],
    )
    .await;
    ctx.memory.remember_malformed(&uid, &generation);
    Err(error)
}

async fn reconcile_inner(
    obj: &DeserializeGuard<TrainingJob>,
    ctx: &Context,
) -> Result<Action, Error> {
    ctx.caches_ready().await?;
    let job = match &obj.0 {
        Ok(job) => job,
        Err(invalid) => return report_malformed(invalid, ctx).await,
    };
    if job.metadata.deletion_timestamp.is_some() {
        // Owner references let the garbage collector remove pods, Service and (unless retained) the PVC.
        return Ok(Action::await_change());
    }
    let uid = job.metadata.uid.clone().unwrap_or_default();
    // It may have been malformed before, and reported.
    ctx.memory.forget_malformed(&uid);
    let ns = job.namespace().unwrap_or_default();
    let reference = job.object_ref(&());
    let written = ctx.memory.freshest_status(job);
    let (current, detail_waiting) = ctx.memory.with_deferred_detail(&uid, &written);
    let now = Timestamp::now();

    let valid = match validate(job) {
        Ok(v) => v,
        Err(e) => {
            let (status, events) = plan::invalid_status(&current, &e, job.metadata.generation, now);
            if status != written {
                ctx.write_status(job, &status).await?;
            }
            ctx.publish(&reference, events).await;
            return Err(Error::InvalidSpec(e));
        }
    };

    let mut observed = ctx.observe(&valid, &current, now);
    let mut decided = plan::decide(&valid, &observed, &current, &ctx.config);
    // Pods to create that copy a sibling's placement need the sibling whole; decided again
    // with it (rare: see sibling_to_read).
    let creates = decided
        .actions
        .iter()
        .any(|a| matches!(a, PlanAction::CreatePod(_)));
    if creates
        && ctx
            .read_sibling_whole(&valid, decided.status.attempt, &mut observed)
            .await?
    {
        decided = plan::decide(&valid, &observed, &current, &ctx.config);
    }

    let mut write_later = None;
    let write_now = match plan::status_write(
        &written,
        &decided.status,
        detail_waiting,
        WORKER_DETAIL_BATCH,
    ) {
        plan::StatusWrite::Unchanged => {
            ctx.memory.drop_deferred(&uid);
            false
        }
        plan::StatusWrite::Now => true,
        plan::StatusWrite::Later(after) => {
            ctx.memory.defer_detail(&uid, &decided.status);
            write_later = Some(after);
            false
        }
    };
    if let Some(reason) = decided.restart {
        ctx.metrics
            .restarts
            .get_or_create(&RestartLabels {
                reason: reason.as_str().to_owned(),
            })
            .inc();
        ctx.memory.restart_detected(&uid, decided.status.attempt);
        tracing::info!(job = %format!("{ns}/{}", valid.name), attempt = decided.status.attempt, reason = reason.as_str(), "gang restart");
    }
    let (actions, held_for) = ctx.hold_back_unobserved(&ns, decided.actions);
    if let Some(held) = held_for {
        write_later = Some(write_later.map_or(held, |w: Duration| w.min(held)));
    }
    let write = async {
        if write_now {
            ctx.write_status(job, &decided.status).await
        } else {
            Ok(())
        }
    };
    // A decision that deletes (a restart, a failure, a suspend) is persisted before anything acts
    // on it: deleted workers must never look like preempted ones after a crash. Creating is
    // idempotent by pod name and re-derived from what exists, so creates go out together with
    // the status write instead of a round trip after it.
    let (writes, acted) = if decided.restart.is_some() || actions.iter().any(PlanAction::deletes) {
        write.await?;
        ctx.execute(&ns, actions).await
    } else {
        let (wrote, acted) = future::join(write, ctx.execute(&ns, actions)).await;
        wrote?;
        acted
    };
    ctx.publish(&reference, decided.events).await;
    // A rejected write is shown on the job; the error below retries it with backoff.
    let (after, events) =
        rejection::after_writes(&decided.status, &writes, job.metadata.generation, now);
    if after != decided.status {
        ctx.write_status(job, &after).await?;
    }
    ctx.publish(&reference, events).await;
    acted?;

    // Taken whatever the restart's reason, so that a failure restart leaves nothing behind.
    let detected = decided
        .creates_attempt
        .and_then(|_| ctx.memory.take_detected(&uid));
    if let Some(attempt) = decided.creates_attempt
        && attempt > 0
        && decided.status.last_restart.as_ref().map(|l| l.reason) == Some(RestartReason::Preemption)
    {
        let since = match detected {
            Some((a, at)) if a == attempt => Some(at.elapsed().as_secs_f64()),
            _ => decided
                .status
                .last_restart
                .as_ref()
                .map(|l| now.duration_since(l.time.0).as_secs_f64()),
        };
        if let Some(seconds) = since {
            ctx.metrics.preemption_recovery.observe(seconds.max(0.0));
        }
    }

    let after = decided
        .requeue_at
        .map(|at| {
            let wait = at.duration_since(Timestamp::now()).as_secs_f64().max(0.5);
            Duration::from_secs_f64(wait).min(RESYNC)
        })
        .unwrap_or(RESYNC);
    let after = write_later.map_or(after, |later| after.min(later));
    Ok(Action::requeue(after))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::WorkerStatus;
    use serde_json::json;

    fn worker(rank: u32, attempt: u32) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(json!({"metadata": {
                "name": format!("j-worker-{rank}"),
                "labels": {"trainyard.dev/rank": rank.to_string(), "trainyard.dev/attempt": attempt.to_string()},
            }}))
            .expect("pod"),
        )
    }

    #[test]
    fn a_sibling_is_read_whole_only_for_a_missing_rank_not_just_created() {
        let pods = [worker(1, 2), worker(3, 2), worker(0, 1)];
        let nothing_held = |_| false;
        // Ranks 0 and 2 of attempt 2 are missing: copy the lowest present rank of attempt 2.
        assert_eq!(
            sibling_to_read(&pods, 2, 4, nothing_held).as_deref(),
            Some("j-worker-1")
        );
        // Both missing ranks were just created by this operator: the cache will show them.
        assert_eq!(sibling_to_read(&pods, 2, 4, |r| r == 0 || r == 2), None);
        assert_eq!(
            sibling_to_read(&pods, 2, 4, |r| r == 0).as_deref(),
            Some("j-worker-1")
        );
        // Nothing of the attempt exists (a fresh attempt is placed from the job), or nothing is missing.
        assert_eq!(sibling_to_read(&pods, 3, 4, nothing_held), None);
        let all = [worker(0, 0), worker(1, 0)];
        assert_eq!(sibling_to_read(&all, 0, 2, nothing_held), None);
    }

    #[test]
    fn a_huge_rank_in_status_costs_one_lookup_at_most_never_a_loop_up_to_it() {
        let recorded = |ranks: &[u32]| TrainingJobStatus {
            workers: ranks
                .iter()
                .map(|&rank| WorkerStatus {
                    rank,
                    pod: pod_name("j", rank),
                    node: None,
                    phase: "Running".to_owned(),
                    reason: None,
                })
                .collect(),
            ..TrainingJobStatus::default()
        };
        // Bounded by take(): the old code walked 0..=u32::MAX - 1 here.
        let looked_up = |workers, ranks: &[u32]| {
            ranks_to_observe(workers, &recorded(ranks))
                .take(100)
                .collect::<Vec<_>>()
        };
        assert_eq!(looked_up(2, &[0, 1, u32::MAX - 1]), [0, 1]);
        assert_eq!(looked_up(2, &[u32::MAX]), [0, 1]);
        // Ranks left over from a larger `workers` are looked up (to be deleted), each once.
        assert_eq!(looked_up(2, &[0, 1, 3, 3, 7]), [0, 1, 3, 7]);
        assert_eq!(looked_up(3, &[]), [0, 1, 2]);
    }

    fn node(labels: serde_json::Value, ready: &str, heartbeat: &str) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "n", "labels": labels},
            "status": {
                "allocatable": {"nvidia.com/gpu": "8"},
                "conditions": [{"type": "Ready", "status": ready, "lastHeartbeatTime": heartbeat}],
                "images": [{"names": ["big/image:1"], "sizeBytes": 1}],
            }
        }))
        .expect("node")
    }

    #[test]
    fn heartbeats_do_not_change_a_node_fingerprint() {
        let a = node(json!({"x": "1"}), "True", "2026-01-01T00:00:00Z");
        let b = node(json!({"x": "1"}), "True", "2026-01-01T00:00:10Z");
        assert_eq!(node_fingerprint(&a), node_fingerprint(&b));
    }

    #[test]
    fn readiness_and_labels_change_a_node_fingerprint() {
        let base = node(json!({"x": "1"}), "True", "2026-01-01T00:00:00Z");
        let not_ready = node(json!({"x": "1"}), "False", "2026-01-01T00:00:00Z");
        let relabelled = node(json!({"x": "2"}), "True", "2026-01-01T00:00:00Z");
        assert_ne!(node_fingerprint(&base), node_fingerprint(&not_ready));
        assert_ne!(node_fingerprint(&base), node_fingerprint(&relabelled));
    }

    #[test]
    fn node_fingerprints_forget_nodes_deleted_while_the_watch_was_down() {
        let named = |name: &str, labels| {
            let mut n = node(labels, "True", "2026-01-01T00:00:00Z");
            n.metadata.name = Some(name.to_owned());
            n
        };
        let mut fp = NodeFingerprints::default();
        let feed = |fp: &mut NodeFingerprints, events: Vec<watcher::Event<Node>>| {
            events
                .iter()
                .flat_map(|ev| fp.changed(ev))
                .collect::<Vec<_>>()
        };
        // The first list wakes nothing.
        let first =
            (0..100).map(|i| watcher::Event::InitApply(named(&format!("n-{i}"), json!({}))));
        let woken = feed(
            &mut fp,
            std::iter::once(watcher::Event::Init)
                .chain(first)
                .chain([watcher::Event::InitDone])
                .collect(),
        );
        assert!(woken.is_empty(), "{woken:?}");
        // The watch breaks; meanwhile n-2.. are deleted and n-1 is relabelled.
        let woken = feed(
            &mut fp,
            vec![
                watcher::Event::Init,
                watcher::Event::InitApply(named("n-0", json!({}))),
                watcher::Event::InitApply(named("n-1", json!({"x": "1"}))),
                watcher::Event::InitDone,
            ],
        );
        assert_eq!(woken.len(), 99, "n-1 changed, 98 nodes went");
        assert!(woken.contains(&"n-1".to_owned()) && woken.contains(&"n-99".to_owned()));
        assert_eq!(fp.known.len(), 2);
        let woken = feed(
            &mut fp,
            vec![
                watcher::Event::Delete(named("n-0", json!({}))),
                watcher::Event::Delete(named("n-1", json!({}))),
            ],
        );
        assert_eq!(woken, ["n-0", "n-1"]);
        assert!(fp.known.is_empty() && fp.relisted.is_none());
    }

    #[test]
    fn cached_nodes_drop_image_lists_and_managed_fields() {
        let mut n = node(json!({}), "True", "2026-01-01T00:00:00Z");
        n.metadata.managed_fields = Some(vec![Default::default()]);
        strip_node(&mut n);
        assert!(n.status.as_ref().expect("status").images.is_none());
        assert!(n.metadata.managed_fields.as_ref().is_none_or(Vec::is_empty));
    }
}
