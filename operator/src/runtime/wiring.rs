//! The watches, their reflector caches and the kube-runtime Controller built from them.
//!
//! Each kind is watched once: the stream that fills a cache is also the stream that triggers
//! reconciles ([`super::triggers`]) and marks expectations met. Cached objects keep only what
//! decisions read.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, Stream, StreamExt, TryStreamExt, future};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Service};
use kube::core::PartialObjectMeta;
use kube::core::error_boundary::DeserializeGuard;
use kube::runtime::controller::{self, Config as ControllerConfig, Controller};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use tokio::task::JoinHandle;

use super::context::{Context, RunConfig};
use super::pod_wakes::{self, PodWake};
use super::reconcile::{error_policy, reconcile};
use super::triggers::{claim_triggers, node_triggers, service_triggers, silence_triggers};
use crate::error::Error;
use crate::metrics::Metrics;
use crate::model::cached_pod::CachedPod;
use crate::model::crd::{LABEL_JOB, TrainingJob};
use crate::model::kueue::{self, ResourceFlavor, Workload};
use crate::model::liveness::Heartbeats;
use crate::model::ownership::{self, Kind};
use crate::observe::{Caches, KueueCaches, SharedHeartbeats, Sources, heartbeats};
use crate::progress::store::ProgressStore;
use crate::state::expectations::Expectations;
use crate::state::job_memory::JobMemory;
use crate::state::reconcile_memory::ReconcileMemory;
use crate::state::write_memory::WriteMemory;
use crate::writes::{self, EVENT_DRAIN, Writes};

/// How long a write is held back waiting for its watch event ([`Expectations`]).
const EXPECTATION_TTL: Duration = Duration::from_secs(15);
/// Where kubelets keep their heartbeat Leases.
const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// A watch's events, as the Controller takes them.
type WatchResult<K> = Result<K, watcher::Error>;

fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Objects per page of a (re)list.
const LIST_PAGE_SIZE: u32 = 250;

/// Every watch lists in pages of [`LIST_PAGE_SIZE`], from etcd (the default semantic), so that
/// a relist costs one page of whole objects at a time before the caches slim them. A list
/// served from the API server's watch cache (`resourceVersion=0`, `any_semantic`) ignores the
/// page size: every object comes in one response, and a relist of 8,000 pods while the API
/// server fails requests (watches restart, so they relist) held the whole list at once,
/// several times the operator's steady memory.
fn watch_config() -> watcher::Config {
    watcher::Config::default().page_size(LIST_PAGE_SIZE)
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

/// The job-labelled pods, stripped ([`CachedPod`]), as they change, and the jobs their
/// routine changes wake once settled ([`pod_wakes`]). A new version that only echoes a pod we
/// created or began to delete (its expectation is met, [`Expectations::met`]) updates the
/// cache but wakes no reconcile: the round that wrote it decided on everything it holds (when
/// a deletion may have to be forced included: it asked for that time itself). Any other new
/// version wakes its job as [`pod_wakes::wake_for`] judges it against the cached one. A pod
/// gone, and every pod of a relist, always wake its job at once.
fn watch_pods(
    client: &Client,
    ns: Option<&str>,
    expectations: &Arc<Expectations>,
    sealing: bool,
) -> (
    Store<CachedPod>,
    impl Stream<Item = WatchResult<CachedPod>> + Send + 'static,
    pod_wakes::Settled,
) {
    let (store, mut writer) = reflector::store();
    let cached = writer.as_reader();
    let cached_before = writer.as_reader();
    let (settle, settled) = pod_wakes::settling();
    let seen = seen_by::<CachedPod>(expectations.clone(), Kind::Pod);
    let expectations = expectations.clone();
    let stream = watcher(
        api::<CachedPod>(client, ns),
        watch_config().labels(LABEL_JOB),
    )
    .modify(CachedPod::strip)
    // A pod no worker could be (another name than its labels' worker) is never cached; one
    // cached before it changed so leaves the cache as if deleted.
    .try_filter_map(move |event| {
        let event = match event {
            watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)
                if !ownership::cacheable(&pod, sealing) =>
            {
                let known = cached_before.get(&reflector::ObjectRef::from_obj(&pod));
                known.map(|_| watcher::Event::Delete(pod))
            }
            event => Some(event),
        };
        std::future::ready(Ok(event))
    })
    .map_ok(move |event| {
        // Judged against the cached version before the cache takes the new one.
        let wake = match &event {
            watcher::Event::Apply(pod) => pod_wakes::wake_for(
                cached.get(&reflector::ObjectRef::from_obj(pod)).as_deref(),
                pod,
            ),
            _ => PodWake::Now,
        };
        writer.apply_watcher_event(&event);
        (event, wake)
    })
    .default_backoff()
    .try_filter_map(move |(event, wake)| {
        let woken = match event {
            watcher::Event::Apply(pod) => {
                let meta = &pod.metadata;
                let (ns, name) = (meta.namespace.as_deref(), meta.name.as_deref());
                let ours =
                    expectations.met(Kind::Pod, ns.unwrap_or_default(), name.unwrap_or_default());
                match wake {
                    _ if ours => None,
                    PodWake::Now => Some(pod),
                    PodWake::Soon => {
                        if let Some(job) = pod_wakes::owning_job(&pod) {
                            // The receiver lives as long as the Controller that polls it.
                            let _ = settle.send(job);
                        }
                        None
                    }
                    PodWake::Not => None,
                }
            }
            watcher::Event::Delete(pod) | watcher::Event::InitApply(pod) => {
                seen(&pod);
                Some(pod)
            }
            watcher::Event::Init | watcher::Event::InitDone => None,
        };
        std::future::ready(Ok(woken))
    });
    (store, stream, settled)
}

/// Every node (a cluster-scoped watch whatever the namespace).
fn watch_nodes(
    client: &Client,
) -> (
    Store<Node>,
    impl Stream<Item = WatchResult<watcher::Event<Node>>> + Send + 'static,
) {
    let (store, writer) = reflector::store();
    let events = watcher(Api::<Node>::all(client.clone()), watch_config())
        .modify(strip_node)
        .reflect(writer)
        .default_backoff();
    (store, events)
}

/// One event of the node Lease watch, seen at `now`, into the index: a renewal counts when it
/// is seen; an error or a re-list breaks the stream until events flow again.
pub(super) fn feed_heartbeats(
    beats: &mut Heartbeats,
    event: &Result<watcher::Event<Lease>, watcher::Error>,
    now: jiff::Timestamp,
) {
    match event {
        Err(e) => {
            super::triggers::watch_failed("node Lease", e);
            beats.interrupted();
        }
        Ok(watcher::Event::Init) => beats.interrupted(),
        Ok(watcher::Event::InitApply(lease)) => beats.observe(lease, now),
        Ok(watcher::Event::InitDone) => beats.resumed(now),
        Ok(watcher::Event::Apply(lease)) => {
            if beats.is_interrupted() {
                beats.resumed(now);
            }
            beats.observe(lease, now);
        }
        Ok(watcher::Event::Delete(lease)) => beats.forget(&lease.name_any()),
    }
}

/// Node heartbeats, watched by a task of their own into the liveness index: nothing
/// reconciles on them, and no Lease object is kept. Optional: without RBAC for Leases the
/// index stays empty and the lost peer rule falls back to node conditions and its window.
fn watch_node_leases(client: &Client) -> (SharedHeartbeats, JoinHandle<()>) {
    let beats = SharedHeartbeats::default();
    let feed = beats.clone();
    let task = tokio::spawn(
        watcher(
            Api::<Lease>::namespaced(client.clone(), NODE_LEASE_NAMESPACE),
            watch_config(),
        )
        .default_backoff()
        .for_each(move |ev| {
            feed_heartbeats(&mut heartbeats(&feed), &ev, jiff::Timestamp::now());
            future::ready(())
        }),
    );
    (beats, task)
}

/// Every Service or PVC, not only those labelled for a job: an object of a job's name that is
/// not the job's must be seen, or it would be written over (ownership). Metadata only.
fn watch_metadata<K>(
    client: &Client,
    ns: Option<&str>,
    expectations: &Arc<Expectations>,
    kind: Kind,
) -> (
    Store<PartialObjectMeta<K>>,
    impl Stream<Item = WatchResult<PartialObjectMeta<K>>> + Send + 'static,
)
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store();
    let seen = seen_by::<PartialObjectMeta<K>>(expectations.clone(), kind);
    let stream = watcher(api::<PartialObjectMeta<K>>(client, ns), watch_config())
        .modify(strip_meta)
        .reflect(writer)
        .default_backoff()
        .touched_objects()
        .inspect_ok(move |object| seen(object));
    (store, stream)
}

/// Whether Kueue is installed: its Workload CRD exists (a GET that RBAC limits to that name).
/// Looked at once, when the operator starts: Kueue installed later needs an operator restart
/// (docs/install.md).
async fn kueue_installed(client: &Client) -> bool {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    match crds.get_opt(kueue::WORKLOAD_CRD).await {
        Ok(found) => found.is_some(),
        Err(e) => {
            tracing::warn!(crd = kueue::WORKLOAD_CRD, error = %e, "cannot tell whether Kueue is installed; jobs that name a queue wait");
            false
        }
    }
}

/// Kueue's Workloads (of the watched namespaces) and ResourceFlavors, where Kueue is
/// installed: the caches, and the Workload events, which wake the job that owns each.
async fn watch_kueue(
    client: &Client,
    ns: Option<&str>,
) -> Option<(
    KueueCaches,
    impl Stream<Item = WatchResult<Workload>> + Send + 'static,
    impl Stream<Item = WatchResult<ResourceFlavor>> + Send + 'static,
)> {
    if !kueue_installed(client).await {
        return None;
    }
    tracing::info!("Kueue is installed: jobs that name a LocalQueue are admitted by it");
    let (workloads, writer) = reflector::store();
    let workload_events = watcher(api::<Workload>(client, ns), watch_config())
        .modify(|w: &mut Workload| w.managed_fields_mut().clear())
        .reflect(writer)
        .default_backoff()
        .applied_objects();
    let (flavors, writer) = reflector::store();
    let flavor_events = watcher(Api::<ResourceFlavor>::all(client.clone()), watch_config())
        .reflect(writer)
        .default_backoff()
        .applied_objects();
    Some((
        KueueCaches { workloads, flavors },
        workload_events,
        flavor_events,
    ))
}

/// The Kueue caches and the Workload events (which wake the job that owns each), where Kueue
/// is installed. The flavor cache is kept current by a task of its own (aborted when the
/// controller stops): a flavor's change wakes no job, the next admission reads it.
async fn start_kueue(
    client: &Client,
    ns: Option<&str>,
) -> (
    Option<KueueCaches>,
    futures::stream::BoxStream<'static, WatchResult<Workload>>,
    Option<JoinHandle<()>>,
) {
    let Some((caches, workloads, flavors)) = watch_kueue(client, ns).await else {
        return (None, futures::stream::empty().boxed(), None);
    };
    let task = tokio::spawn(flavors.for_each(|_| std::future::ready(())));
    (Some(caches), workloads.boxed(), Some(task))
}

/// The TrainingJobs, malformed ones included ([`DeserializeGuard`]); each event also tells the
/// per-job memory which jobs are gone ([`JobMemory::on_job_event`]).
fn watch_jobs(
    client: &Client,
    ns: Option<&str>,
    memory: &Arc<JobMemory>,
    metrics: &Arc<Metrics>,
) -> (
    Store<DeserializeGuard<TrainingJob>>,
    impl Stream<Item = WatchResult<DeserializeGuard<TrainingJob>>> + Send + 'static,
) {
    let jobs_api: Api<DeserializeGuard<TrainingJob>> = api(client, ns);
    let (store, writer) = reflector::store();
    let forget = {
        let (memory, metrics, jobs) = (memory.clone(), metrics.clone(), store.clone());
        move |event: &watcher::Event<DeserializeGuard<TrainingJob>>| {
            memory.on_job_event(event, &jobs);
            if matches!(event, watcher::Event::Delete(_) | watcher::Event::InitDone) {
                metrics.set_state_sizes(&memory.sizes());
            }
        }
    };
    let stream = watcher(jobs_api, watch_config())
        .modify(strip_job)
        .reflect(writer)
        .default_backoff()
        .inspect_ok(forget)
        .applied_objects();
    (store, stream)
}

/// The job events minus those of a version that is exactly our own last status write: it
/// holds nothing the round that wrote it has not decided on (`StatusCache::caught_up`), so it
/// wakes no reconcile. The cache holds it all the same, and the last valid object the
/// reconciles remember follows it while the spec is unchanged
/// ([`ReconcileMemory::follow_cache`]).
fn without_own_writes(
    jobs: impl Stream<Item = WatchResult<DeserializeGuard<TrainingJob>>> + Send + 'static,
    cache: Store<DeserializeGuard<TrainingJob>>,
    own_writes: Arc<WriteMemory>,
    reconciles: Arc<ReconcileMemory>,
) -> impl Stream<Item = WatchResult<DeserializeGuard<TrainingJob>>> + Send + 'static {
    jobs.try_filter(move |job| {
        if let Some(current) = cache.get(&reflector::ObjectRef::from_obj(job)) {
            reconciles.follow_cache(&job.uid().unwrap_or_default(), &current);
        }
        let ours = job.0.as_ref().is_ok_and(|j| own_writes.status.caught_up(j));
        std::future::ready(!ours)
    })
}

/// The Controller over the TrainingJob watch, with `concurrency` reconciles in flight.
fn job_controller(
    job_stream: impl Stream<Item = WatchResult<DeserializeGuard<TrainingJob>>> + Send + 'static,
    jobs: Store<DeserializeGuard<TrainingJob>>,
    concurrency: u16,
) -> Controller<DeserializeGuard<TrainingJob>> {
    // Each reconcile decides and carries out its round at once; a round that writes status
    // alone and finds no routine slot parks its job instead of holding a reconcile
    // (`crate::writes`). Further triggered jobs wait in kube-runtime's queue, which costs no
    // more than their name.
    Controller::for_stream(job_stream, jobs).with_config(
        ControllerConfig::default()
            .debounce(Duration::from_millis(50))
            .concurrency(concurrency),
    )
}

/// Marks the operator ready and runs the Controller until it stops, then ends the Lease watch
/// and drains the Events.
async fn run_until_stopped(
    controller: Controller<DeserializeGuard<TrainingJob>>,
    ctx: Arc<Context>,
    ns: Option<&str>,
    lease_task: JoinHandle<()>,
    publisher: JoinHandle<()>,
    lost: impl Future<Output = ()>,
) {
    ctx.metrics.set_ready(true);
    tracing::info!(
        namespace = ns.unwrap_or("(all)"),
        "reconciling TrainingJobs"
    );
    let running = controller
        .run(reconcile, error_policy, ctx)
        .for_each(|res| {
            match res {
                // The TrainingJob watch or a watch that triggers reconciles failed.
                Err(controller::Error::QueueError(e)) => {
                    super::triggers::watch_failed("TrainingJob or trigger", &e);
                }
                // A failed reconcile is told by `error_policy`; a job deleted before its queued
                // reconcile ran is expected.
                Err(e) => tracing::debug!(error = %e, "controller"),
                Ok(_) => {}
            }
            future::ready(())
        });
    tokio::select! {
        () = running => {}
        () = lost => {
            // Another replica may lead now: no decision of this one may reach the API server,
            // so the reconciles in flight are dropped with the controller. The Events queued
            // still go out: each tells of a write this replica made, which the next leader
            // will not tell again.
            tracing::warn!("the Lease was lost: the reconciles in flight are cancelled");
        }
    }
    lease_task.abort();
    // The controller has dropped the last Context, and with it the Events' sender: the publisher
    // ends once it has published what is queued, or is cut short.
    if tokio::time::timeout(EVENT_DRAIN, publisher).await.is_err() {
        tracing::warn!("stopping with Events not yet published");
    }
    tracing::info!("controller stopped");
}

/// Every owner of per-job state, each registered with the one forgetting ([`JobMemory`]).
struct Memories {
    writes: Arc<WriteMemory>,
    reconciles: Arc<ReconcileMemory>,
    expectations: Arc<Expectations>,
    progress: Arc<ProgressStore>,
    all: Arc<JobMemory>,
}

fn memories(metrics: &Arc<Metrics>) -> Memories {
    let writes = Arc::new(WriteMemory::default());
    let reconciles = Arc::new(ReconcileMemory::default());
    let expectations = Arc::new(Expectations::new(EXPECTATION_TTL));
    let progress = Arc::new(ProgressStore::default());
    let all = Arc::new(JobMemory::new(vec![
        writes.clone(),
        reconciles.clone(),
        expectations.clone(),
        progress.clone(),
        metrics.clone(),
    ]));
    Memories {
        writes,
        reconciles,
        expectations,
        progress,
        all,
    }
}

/// Every reconcile's context: what it reads, where it writes, what it remembers.
fn context(
    config: &RunConfig,
    client: Client,
    caches: Caches,
    memory: Memories,
    writes: Writes,
    metrics: Arc<Metrics>,
) -> Arc<Context> {
    let sources = Sources::new(
        client,
        caches,
        memory.expectations,
        memory.progress,
        memory.writes,
        metrics.clone(),
    );
    Arc::new(Context {
        config: config.operator.clone(),
        sources,
        writes,
        memory: memory.reconciles,
        forgetting: memory.all,
        metrics,
    })
}

/// Builds every watch, trigger and the write path, and runs the job Controller until `stop`.
pub(super) async fn run_controller(
    client: Client,
    config: &RunConfig,
    metrics: Arc<Metrics>,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
    lost: impl Future<Output = ()>,
) -> Result<(), Error> {
    let ns = config.namespace.as_deref();
    let memory = memories(&metrics);
    let (expectations, progress) = (&memory.expectations, &memory.progress);
    let sealing = config.operator.progress_channel.is_some();
    let (pods, pod_stream, settled_pods) = watch_pods(&client, ns, expectations, sealing);
    let (nodes, node_events) = watch_nodes(&client);
    let (heartbeats, lease_task) = watch_node_leases(&client);
    let (services, svc_events) =
        watch_metadata::<Service>(&client, ns, expectations, Kind::Service);
    let (claims, claim_events) =
        watch_metadata::<PersistentVolumeClaim>(&client, ns, expectations, Kind::Claim);
    let (jobs, job_stream) = watch_jobs(&client, ns, &memory.all, &metrics);
    let job_stream = without_own_writes(
        job_stream,
        jobs.clone(),
        memory.writes.clone(),
        memory.reconciles.clone(),
    );
    let controller = job_controller(job_stream, jobs.clone(), config.max_concurrent_reconciles);
    let node_triggers = node_triggers(node_events, pods.clone(), jobs.clone());
    let silence_triggers = silence_triggers(heartbeats.clone(), pods.clone(), jobs.clone());
    let claim_triggers = claim_triggers(claim_events, jobs.clone());
    let service_triggers = service_triggers(svc_events, jobs.clone());
    let (wake, progress_triggers) = super::progress_endpoint::wake_channel();
    let stop = stop.shared();
    let mut progress_endpoints = None;
    if let Some(serving) = &config.progress {
        progress_endpoints = super::progress_endpoint::serve(
            client.clone(),
            serving,
            progress.clone(),
            pods.clone(),
            jobs.clone(),
            metrics.clone(),
            wake,
            stop.clone(),
        )
        .await?;
    }

    let (writes, parked_wakes, publisher) = Writes::start(writes::Shared {
        client: client.clone(),
        instance: config.instance.clone(),
        reconciles: config.max_concurrent_reconciles,
        metrics: metrics.clone(),
        expectations: expectations.clone(),
        memory: memory.writes.clone(),
        sweep: memory.all.sweep(jobs.clone()),
        trainers: progress.clone(),
    });
    let (kueue, workload_events, flavor_task) = start_kueue(&client, ns).await;
    let caches = Caches {
        pods,
        nodes,
        heartbeats,
        services,
        claims,
        kueue,
    };
    let ctx = context(config, client, caches, memory, writes, metrics);

    let controller = controller
        .owns_stream(pod_stream)
        .owns_stream(workload_events)
        .reconcile_on(settled_pods)
        .reconcile_on(node_triggers)
        .reconcile_on(silence_triggers)
        .reconcile_on(claim_triggers)
        .reconcile_on(service_triggers)
        .reconcile_on(progress_triggers)
        .reconcile_on(parked_wakes)
        .graceful_shutdown_on(stop);
    run_until_stopped(controller, ctx, ns, lease_task, publisher, lost).await;
    flavor_task.iter().for_each(JoinHandle::abort);
    // The progress Endpoints are handed back before the Lease is.
    if let Some(stepping_down) = progress_endpoints {
        let _ = stepping_down.await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lease(node: &str, renewed: &str) -> Lease {
        serde_json::from_value(json!({
            "metadata": {"name": node, "namespace": NODE_LEASE_NAMESPACE},
            "spec": {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": renewed},
        }))
        .expect("Lease")
    }

    /// A Lease watch that breaks makes no node silent until it works again, and then gives
    /// every node an interval and the margin from then.
    #[test]
    fn a_broken_lease_watch_makes_no_node_silent() {
        let t = |s: &str| s.parse::<jiff::Timestamp>().expect("time");
        let mut beats = Heartbeats::default();
        for i in 0..6 {
            let at = format!("2026-01-01T00:00:{i}0Z");
            for n in ["a", "b"] {
                feed_heartbeats(
                    &mut beats,
                    &Ok(watcher::Event::Apply(lease(n, &at))),
                    t(&at),
                );
            }
        }
        let at = "2026-01-01T00:01:00Z";
        feed_heartbeats(
            &mut beats,
            &Ok(watcher::Event::Apply(lease("b", at))),
            t(at),
        );
        let err = Err(watcher::Error::NoResourceVersion);
        feed_heartbeats(&mut beats, &err, t("2026-01-01T00:01:01Z"));
        assert!(
            beats.silent(t("2026-01-01T00:01:30Z")).is_empty(),
            "judgment waits"
        );
        // The watch works again at 1:40 with b's renewal; a gets an interval and the margin.
        let at = "2026-01-01T00:01:40Z";
        feed_heartbeats(
            &mut beats,
            &Ok(watcher::Event::Apply(lease("b", at))),
            t(at),
        );
        assert!(beats.silent(t("2026-01-01T00:01:52Z")).is_empty());
        let at = "2026-01-01T00:01:50Z";
        feed_heartbeats(
            &mut beats,
            &Ok(watcher::Event::Apply(lease("b", at))),
            t(at),
        );
        assert_eq!(
            beats
                .silent(t("2026-01-01T00:01:54Z"))
                .into_keys()
                .collect::<Vec<_>>(),
            ["a"]
        );
        // A re-list repeats what is known: no renewal; a deleted Lease is forgotten.
        feed_heartbeats(&mut beats, &Ok(watcher::Event::Init), t(at));
        feed_heartbeats(
            &mut beats,
            &Ok(watcher::Event::InitApply(lease("b", at))),
            t(at),
        );
        feed_heartbeats(&mut beats, &Ok(watcher::Event::InitDone), t(at));
        feed_heartbeats(
            &mut beats,
            &Ok(watcher::Event::Delete(lease("a", at))),
            t(at),
        );
        assert!(beats.silent(t("2026-01-01T00:03:00Z")).is_empty());
    }

    #[test]
    fn cached_nodes_drop_image_lists_and_managed_fields() {
        let mut n: Node = serde_json::from_value(json!({
            "metadata": {"name": "n"},
            "status": {
                "allocatable": {crate::model::crd::DEFAULT_GPU_RESOURCE: "8"},
                "images": [{"names": ["big/image:1"], "sizeBytes": 1}],
            }
        }))
        .expect("node");
        n.metadata.managed_fields = Some(vec![Default::default()]);
        strip_node(&mut n);
        assert!(n.status.as_ref().expect("status").images.is_none());
        assert!(n.metadata.managed_fields.as_ref().is_none_or(Vec::is_empty));
    }
}
