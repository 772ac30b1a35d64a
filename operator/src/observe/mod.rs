//! What one reconcile reads, complete when [`Sources::observe`] returns: the reflector caches,
//! found by the job's deterministic names, the trainers' channel, what this replica's writes
//! left in `state/`, and the reads the caches cannot serve (a sibling's placement, GPUs in use).

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod, Service};
use kube::api::ListParams;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, ResourceExt};

use crate::config::OperatorConfig;
use crate::error::Error;
use crate::metrics::Metrics;
use crate::model::cached_pod::CachedPod;
use crate::model::crd::{MAX_WORKERS, TrainingJob, TrainingJobStatus};
use crate::model::kueue::{self, Queued, ResourceFlavor, Workload};
use crate::model::liveness::Heartbeats;
use crate::model::ownership::Kind;
use crate::model::ownership::{self, ObjectKind};
use crate::model::seal::SealKey;
use crate::model::validate::{ValidJob, worker_pod_names};
use crate::plan::{self, Observed, ObservedClaim, SiblingPlacement, UnseenWrite};
use crate::progress::store::ProgressStore;
use crate::state::expectations::Expectations;
use crate::state::status_cache::Known;
use crate::state::write_memory::WriteMemory;

pub mod recall;

/// The liveness index the Lease watch feeds and every reader judges.
pub(crate) type SharedHeartbeats = Arc<Mutex<Heartbeats>>;

/// Locks the index; a reader that panicked left it whole (every update is one call).
pub(crate) fn heartbeats(shared: &SharedHeartbeats) -> MutexGuard<'_, Heartbeats> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The watch caches a reconcile reads.
pub(crate) struct Caches {
    pub(crate) pods: Store<CachedPod>,
    pub(crate) nodes: Store<Node>,
    /// What the kubelets' Lease renewals say (the liveness index the Lease watch feeds).
    pub(crate) heartbeats: SharedHeartbeats,
    pub(crate) services: Store<PartialObjectMeta<Service>>,
    pub(crate) claims: Store<PartialObjectMeta<PersistentVolumeClaim>>,
    /// Kueue's Workloads and ResourceFlavors, where Kueue is installed.
    pub(crate) kueue: Option<KueueCaches>,
}

/// The caches of Kueue's objects ([`crate::model::kueue`]).
pub(crate) struct KueueCaches {
    pub(crate) workloads: Store<Workload>,
    pub(crate) flavors: Store<ResourceFlavor>,
}

/// Everything one reconcile reads, and the client for the reads the caches cannot serve.
pub(crate) struct Sources {
    client: Client,
    caches: Caches,
    /// Which objects this operator has just written (a missing rank that is on its way).
    expectations: Arc<Expectations>,
    /// What the trainers and supervisors report.
    progress: Arc<ProgressStore>,
    /// What this replica's writes left: the status cache, the attempt told, the last writes.
    writes: Arc<WriteMemory>,
    /// Where the step rate the reports imply is set.
    metrics: Arc<Metrics>,
    /// Whether every cache a decision reads has been listed once (see [`CacheReadiness`]).
    ready: CacheReadiness,
    /// Set once listing pods of every namespace was forbidden (an operator that watches one
    /// namespace): [`Sources::read_gpus_in_use`] lists the job's namespace from then on.
    cluster_pods_forbidden: std::sync::atomic::AtomicBool,
}

/// Whether the caches a decision reads have been listed once: one task waits for each
/// store's first list and tells every reconcile through a `watch` channel.
///
/// A reflector `Store`'s own `wait_until_ready` keeps the waker of only the last task that
/// polled it (a oneshot receiver behind a lock), so of several reconciles that wait at once
/// when the operator starts (or takes over as leader) only one is ever woken, and each other
/// job's first reconcile hangs for good: the job is never reconciled again
/// (`several_waiters_are_all_woken_when_the_caches_are_listed`).
#[derive(Clone)]
pub(crate) struct CacheReadiness(tokio::sync::watch::Receiver<Option<Result<(), &'static str>>>);

impl CacheReadiness {
    /// Starts the one task that waits for `first_lists` (each the name of its cache, on error).
    pub(crate) fn spawn(
        first_lists: Vec<futures::future::BoxFuture<'static, Result<(), &'static str>>>,
    ) -> Self {
        let (tx, rx) = tokio::sync::watch::channel(None);
        tokio::spawn(async move {
            let mut outcome = Ok(());
            for list in first_lists {
                if let Err(cache) = list.await {
                    outcome = Err(cache);
                    break;
                }
            }
            let _ = tx.send(Some(outcome));
        });
        Self(rx)
    }

    /// Waits until every cache has been listed once.
    pub(crate) async fn wait(&self) -> Result<(), Error> {
        let mut rx = self.0.clone();
        let outcome = *rx
            .wait_for(Option::is_some)
            .await
            .map_err(|_| Error::CacheGone("caches"))?;
        match outcome {
            Some(Err(cache)) => Err(Error::CacheGone(cache)),
            _ => Ok(()),
        }
    }

    /// The first lists of these caches.
    fn of(caches: &Caches) -> Self {
        use futures::FutureExt;
        let (pods, nodes, services, claims) = (
            caches.pods.clone(),
            caches.nodes.clone(),
            caches.services.clone(),
            caches.claims.clone(),
        );
        let mut lists = vec![
            async move { pods.wait_until_ready().await.map_err(|_| "pods") }.boxed(),
            async move { nodes.wait_until_ready().await.map_err(|_| "nodes") }.boxed(),
            async move { services.wait_until_ready().await.map_err(|_| "services") }.boxed(),
            async move {
                claims
                    .wait_until_ready()
                    .await
                    .map_err(|_| "persistentvolumeclaims")
            }
            .boxed(),
        ];
        if let Some(kueue) = &caches.kueue {
            let (workloads, flavors) = (kueue.workloads.clone(), kueue.flavors.clone());
            lists.push(
                async move { workloads.wait_until_ready().await.map_err(|_| "workloads") }.boxed(),
            );
            lists.push(
                async move {
                    flavors
                        .wait_until_ready()
                        .await
                        .map_err(|_| "resourceflavors")
                }
                .boxed(),
            );
        }
        Self::spawn(lists)
    }
}

impl Sources {
    pub(crate) fn new(
        client: Client,
        caches: Caches,
        expectations: Arc<Expectations>,
        progress: Arc<ProgressStore>,
        writes: Arc<WriteMemory>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            client,
            ready: CacheReadiness::of(&caches),
            caches,
            expectations,
            progress,
            writes,
            metrics,
            cluster_pods_forbidden: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Waits until every cache a decision reads has been listed once.
    pub(crate) async fn ready(&self) -> Result<(), Error> {
        self.ready.wait().await
    }

    /// What a round of `job` decides on: its status as written last (the cache, or our newer
    /// write), with the worker detail not written yet.
    pub(crate) fn known(&self, job: &TrainingJob) -> Known {
        self.writes.status.current(job)
    }

    /// Everything a round of `job` decides on, `current` its status as known.
    pub(crate) async fn observe(
        &self,
        job: &ValidJob,
        current: &TrainingJobStatus,
        config: &OperatorConfig,
        now: Timestamp,
    ) -> Result<Observed, Error> {
        let seal = config.progress_channel.as_ref().map(|c| &c.seal);
        let mut observed = self.read_local(job, current, seal, now);
        observed.sibling_placement = self.read_sibling_placement(job, current, &observed).await?;
        observed.gpus_in_use = self
            .read_gpus_in_use(job, current, &observed, config)
            .await?;
        Ok(observed)
    }

    /// What this replica holds of `job` (caches, reports, its memory), without a request.
    fn read_local(
        &self,
        job: &ValidJob,
        current: &TrainingJobStatus,
        seal: Option<&SealKey>,
        now: Timestamp,
    ) -> Observed {
        let (ns, caches) = (job.namespace.as_str(), &self.caches);
        let mut pods = Vec::new();
        let mut foreign = Vec::new();
        let names = ranks_to_observe(job.spec.workers, current)
            .flat_map(|rank| worker_pod_names(&job.name, rank).map(|name| (rank, name)));
        for (rank, name) in names {
            let Some(pod) = caches.pods.get(&ObjectRef::new(&name).within(ns)) else {
                continue;
            };
            if !ownership::present(ObjectKind::Pod, Some(&pod.metadata), job, &mut foreign) {
                continue;
            }
            // With the channel on, a pod the operator did not seal is not its worker.
            let key = |k| ownership::unsealed_worker(&pod.metadata, job, rank, k);
            match seal.and_then(key) {
                Some(squatter) => foreign.push(squatter),
                None => pods.push(pod),
            }
        }
        let service = caches.services.get(&ObjectRef::new(&job.name).within(ns));
        let service_exists = ownership::present(
            ObjectKind::Service,
            service.as_ref().map(|s| &s.metadata),
            job,
            &mut foreign,
        );
        let claim = caches
            .claims
            .get(&ObjectRef::new(&job.claim_name).within(ns));
        let claim = claim
            .filter(|c| ownership::present(ObjectKind::Claim, Some(&c.metadata), job, &mut foreign))
            .map(|c| ObservedClaim::of(&c.metadata, job));
        let liveness =
            heartbeats(&caches.heartbeats).view(pods.iter().filter_map(|p| p.node_name()), now);
        let supervisors = &self.progress.supervisors;
        Observed {
            pods,
            sibling_placement: None,
            gpus_in_use: None,
            progress: recall::observe_progress(&self.progress, &self.metrics, job),
            foreign,
            nodes: caches.nodes.state(),
            liveness,
            claim,
            service_exists,
            told_attempt: self.writes.told_attempt(&job.uid),
            last_writes: self.writes.last_writes(&job.uid),
            unseen_writes: self.unseen_writes(job, current),
            queue: self.queued(job),
            supervisors: supervisors.snapshot(ns, &job.name, &job.uid),
            supervisors_since: supervisors.listening_since(),
            now,
        }
    }

    /// Where the Workload of a job that names a LocalQueue stands; `None` for other jobs. A
    /// Workload of the job's name that the job does not own is not its own: the job waits, and
    /// its create finds the name taken.
    fn queued(&self, job: &ValidJob) -> Option<Queued> {
        job.queue.as_ref()?;
        let Some(caches) = &self.caches.kueue else {
            return Some(Queued::NoKueue);
        };
        let name = crate::build::workload::workload_name(&job.name);
        let Some(workload) = caches
            .workloads
            .get(&ObjectRef::new(&name).within(&job.namespace))
            .filter(|w| w.owner_references().iter().any(|o| o.uid == job.uid))
        else {
            return Some(Queued::NoWorkload);
        };
        let flavor = |f: &str| {
            caches
                .flavors
                .get(&ObjectRef::new(f))
                .map(|r| r.spec.clone())
        };
        Some(Queued::Workload(Box::new(kueue::seen(&workload, flavor))))
    }

    /// The writes to the job's objects (its pods, Service and claim) that the caches do not
    /// show yet.
    fn unseen_writes(&self, job: &ValidJob, current: &TrainingJobStatus) -> Vec<UnseenWrite> {
        let ns = job.namespace.as_str();
        let pods = ranks_to_observe(job.spec.workers, current)
            .flat_map(|rank| worker_pod_names(&job.name, rank))
            .map(|name| (Kind::Pod, name));
        let others = [
            (Kind::Service, job.name.clone()),
            (Kind::Claim, job.claim_name.clone()),
        ];
        pods.chain(others)
            .filter_map(|(kind, name)| {
                let left = self.expectations.holds(kind, ns, &name)?;
                Some(UnseenWrite {
                    kind,
                    name,
                    lapses_in: SignedDuration::try_from(left).unwrap_or(SignedDuration::MAX),
                })
            })
            .collect()
    }

    /// Reads the placement a missing rank of the current attempt copies from its sibling
    /// (the cache does not hold placement), when [`plan::sibling_to_read`] says one is needed.
    async fn read_sibling_placement(
        &self,
        job: &ValidJob,
        current: &TrainingJobStatus,
        observed: &Observed,
    ) -> Result<Option<SiblingPlacement>, Error> {
        let ns = job.namespace.as_str();
        let held = |rank| {
            worker_pod_names(&job.name, rank)
                .iter()
                .any(|name| observed.is_unseen(Kind::Pod, name))
        };
        let workers = plan::attempt_workers(job, current);
        let Some(cached) = plan::sibling_to_read(&observed.pods, current, workers, held) else {
            return Ok(None);
        };
        let name = cached.name_any();
        crate::watchdog::stage("reading a sibling pod's placement");
        let whole = Api::<Pod>::namespaced(self.client.clone(), ns)
            .get(&name)
            .await
            .map_err(Error::kube(format!(
                "reading pod {ns}/{name} for its placement"
            )))?;
        if whole.uid() != cached.uid() {
            return Err(Error::StaleCache(format!("{ns}/{name}")));
        }
        Ok(Some(SiblingPlacement::of(&whole)))
    }

    /// Reads the GPUs in use on each node an elastic job that runs shrunk could grow onto
    /// ([`plan::nodes_to_weigh`]): the requests of the
    /// unfinished pods bound there, of every namespace when the operator may list them, else
    /// of the job's namespace (an operator that watches one namespace: pods of other
    /// namespaces are not seen, and a grow that finds no room waits for the next shrink).
    async fn read_gpus_in_use(
        &self,
        job: &ValidJob,
        current: &TrainingJobStatus,
        observed: &Observed,
        config: &OperatorConfig,
    ) -> Result<Option<std::collections::BTreeMap<String, u64>>, Error> {
        let node_refs = observed.node_refs();
        let silent: Vec<String> = observed.liveness.silent.keys().cloned().collect();
        let names = plan::nodes_to_weigh(job, current, &node_refs, &silent, config);
        if names.is_empty() {
            return Ok(None);
        }
        crate::watchdog::stage("reading the GPUs in use on nodes an elastic job could grow onto");
        let resource = &job.spec.gpu.resource_name;
        let mut in_use = std::collections::BTreeMap::new();
        let namespaced = Api::<Pod>::namespaced(self.client.clone(), &job.namespace);
        let all = Api::<Pod>::all(self.client.clone());
        for name in names {
            let params = ListParams::default().fields(&format!("spec.nodeName={name}"));
            let pods = if self.cluster_pods_forbidden.load(Ordering::Relaxed) {
                namespaced.list(&params).await
            } else {
                match all.list(&params).await {
                    Err(kube::Error::Api(e)) if e.code == 403 => {
                        self.cluster_pods_forbidden.store(true, Ordering::Relaxed);
                        namespaced.list(&params).await
                    }
                    listed => listed,
                }
            }
            .map_err(Error::kube(format!("listing the pods on node {name}")))?;
            let used: u64 = pods.items.iter().map(|p| gpus_requested(p, resource)).sum();
            in_use.insert(name, used);
        }
        Ok(Some(in_use))
    }
}

/// The GPUs `resource` an unfinished pod holds: its containers' limits (extended resources
/// have requests equal to limits), or the largest init container's if more.
fn gpus_requested(pod: &Pod, resource: &str) -> u64 {
    let finished = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "Succeeded" || p == "Failed");
    let Some(spec) = pod.spec.as_ref().filter(|_| !finished) else {
        return 0;
    };
    let of = |c: &k8s_openapi::api::core::v1::Container| -> u64 {
        let r = c.resources.as_ref();
        r.and_then(|r| r.limits.as_ref())
            .and_then(|l| l.get(resource))
            .or_else(|| {
                r.and_then(|r| r.requests.as_ref())
                    .and_then(|q| q.get(resource))
            })
            .and_then(|q| q.0.parse().ok())
            .unwrap_or(0)
    };
    let main: u64 = spec.containers.iter().map(of).sum();
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .map(of)
        .max()
        .unwrap_or(0);
    main.max(init)
}

/// The ranks whose pods one reconcile looks up: every rank of the spec, then each recorded
/// rank beyond it once (a pod left over from a larger `workers`, to be deleted). Never a range
/// up to a recorded rank: status is input, and a rank near 2^32 must not cost four billion
/// lookups. A recorded rank no spec can have (≥ [`MAX_WORKERS`]) is ignored.
fn ranks_to_observe(workers: u32, current: &TrainingJobStatus) -> impl Iterator<Item = u32> {
    let beyond: BTreeSet<u32> = current
        .recorded_ranks()
        .iter()
        .filter(|rank| (workers..MAX_WORKERS).contains(rank))
        .collect();
    (0..workers).chain(beyond)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::crd::WorkerStatus;
    use futures::FutureExt;
    use kube::runtime::{reflector, watcher};
    use std::time::Duration;

    /// Found by the chaos run (seed 1): the operator restarted with two jobs; the second
    /// job's first reconcile waited on the stores beside the first one's and was never woken.
    #[tokio::test]
    async fn several_waiters_are_all_woken_when_the_caches_are_listed() {
        // The reflector store alone: of two tasks waiting at once, one is never woken.
        let (store, mut writer) = reflector::store::<Node>();
        let waiting: Vec<_> = (0..2)
            .map(|_| {
                let s = store.clone();
                tokio::spawn(async move { s.wait_until_ready().await.is_ok() })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        writer.apply_watcher_event(&watcher::Event::InitDone);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let woken = waiting.iter().filter(|t| t.is_finished()).count();
        assert_eq!(
            woken, 1,
            "upstream now wakes every waiter: CacheReadiness may go"
        );
        waiting.iter().for_each(tokio::task::JoinHandle::abort);

        // CacheReadiness: every waiter is woken.
        let (store, mut writer) = reflector::store::<Node>();
        let ready = CacheReadiness::spawn(vec![
            async move { store.wait_until_ready().await.map_err(|_| "nodes") }.boxed(),
        ]);
        let waiting: Vec<_> = (0..3)
            .map(|_| {
                let r = ready.clone();
                tokio::spawn(async move { r.wait().await.is_ok() })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        writer.apply_watcher_event(&watcher::Event::InitDone);
        for w in waiting {
            let ok = tokio::time::timeout(Duration::from_secs(5), w)
                .await
                .expect("woken")
                .expect("task");
            assert!(ok);
        }
    }

    #[test]
    fn a_huge_rank_in_status_costs_one_lookup_at_most_never_a_loop_up_to_it() {
        let recorded = |ranks: &[u32]| TrainingJobStatus {
            workers: ranks
                .iter()
                .map(|&rank| WorkerStatus {
                    rank,
                    pod: crate::model::validate::pod_name("j", rank),
                    node: None,
                    phase: "Running".to_owned(),
                    reason: None,
                })
                .collect(),
            ..TrainingJobStatus::default()
        };
        // Bounded by take(): a loop up to the recorded rank would walk 0..=u32::MAX - 1 here.
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
}
