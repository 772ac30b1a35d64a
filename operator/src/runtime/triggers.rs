//! Which jobs a change to a node, a PVC or a Service wakes. The pods a job owns wake it through
//! the Controller's owner mapping; everything else is mapped here.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeSet, HashMap};
use std::hash::{Hash, Hasher};

use futures::{Stream, StreamExt, future, stream};
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Service};
use kube::ResourceExt;
use kube::core::PartialObjectMeta;
use kube::core::error_boundary::DeserializeGuard;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

use crate::model::cached_pod::CachedPod;
use crate::model::condition::{self, condition_is_true};
use crate::model::crd::{LABEL_JOB, Phase, TrainingJob};
use crate::model::ownership::ObjectKind;
use crate::observe::SharedHeartbeats;
use crate::state::JobRef;

/// Tells that the watch of `what` failed: at warn, so that a watch the operator cannot keep
/// (RBAC, the API server away) is seen at the default log level, except the routine expiry of
/// a watch's resource version (410 Gone), which the watcher answers with a re-list.
pub(super) fn watch_failed(what: &str, e: &watcher::Error) {
    if is_routine(e) {
        tracing::debug!(error = %e, "{what} watch");
    } else {
        tracing::warn!(error = %e, "{what} watch");
    }
}

/// Whether a watch error is the routine expiry of its resource version (410 Gone).
fn is_routine(e: &watcher::Error) -> bool {
    matches!(e, watcher::Error::WatchError(status) if status.code == 410)
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
        let waiting = condition_is_true(&status.conditions, condition::UNSCHEDULABLE)
            || condition_is_true(&status.conditions, condition::INVALID_SPEC)
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
    (names_it && condition_is_true(&status.conditions, condition::NAME_CONFLICT))
        .then(|| ObjectRef::from_obj(entry.as_ref()))
}

/// The jobs to wake for node changes: only changes that matter ([`NodeFingerprints`]), and
/// only the jobs they concern ([`jobs_for_node`]).
pub(super) fn node_triggers(
    node_events: impl Stream<Item = Result<watcher::Event<Node>, watcher::Error>> + Send + 'static,
    pods: Store<CachedPod>,
    jobs: Store<DeserializeGuard<TrainingJob>>,
) -> impl Stream<Item = JobRef> + Send + 'static {
    let mut fingerprints = NodeFingerprints::default();
    node_events
        .map(move |ev| match ev {
            Ok(ev) => fingerprints.changed(&ev),
            Err(e) => {
                watch_failed("node", &e);
                Vec::new()
            }
        })
        .flat_map(stream::iter)
        .flat_map(move |name| stream::iter(jobs_for_node(&name, &pods, &jobs)))
}

/// How often the liveness index is judged for kubelets that went silent: no event
/// announces a renewal that does not come.
const SILENCE_TICK: std::time::Duration = std::time::Duration::from_secs(2);

/// The nodes whose kubelet went silent, tick by tick: which fell silent or came back since the
/// last tick (every job they concern is woken once), and which stay silent (the jobs whose
/// pods are still there are woken again: their workers are lost once their reports stop).
#[derive(Default)]
struct SilenceTracker {
    silent: BTreeSet<String>,
}

impl SilenceTracker {
    /// (changed, still silent).
    fn tick(&mut self, now: BTreeSet<String>) -> (Vec<String>, Vec<String>) {
        let changed = self.silent.symmetric_difference(&now).cloned().collect();
        let still = self.silent.intersection(&now).cloned().collect();
        self.silent = now;
        (changed, still)
    }
}

/// The jobs to wake as node kubelets fall silent, stay silent and come back.
pub(super) fn silence_triggers(
    heartbeats: SharedHeartbeats,
    pods: Store<CachedPod>,
    jobs: Store<DeserializeGuard<TrainingJob>>,
) -> impl Stream<Item = JobRef> + Send + 'static {
    let mut tracker = SilenceTracker::default();
    let ticks = stream::unfold(
        tokio::time::interval(SILENCE_TICK),
        |mut every| async move {
            every.tick().await;
            Some(((), every))
        },
    );
    ticks.flat_map(move |_| {
        let (silent, margin) = {
            let beats = crate::observe::heartbeats(&heartbeats);
            (beats.silent(jiff::Timestamp::now()), beats.margin())
        };
        let (changed, still) = tracker.tick(silent.keys().cloned().collect());
        for node in &changed {
            match silent.get(node) {
                Some(silence) => tracing::info!(
                    node = %node,
                    since_s = silence.since.as_secs(),
                    margin_s = margin.as_secs(),
                    "a node's kubelet fell silent"
                ),
                None => tracing::info!(node = %node, "a silent node's kubelet renews again"),
            }
        }
        let mut wake: Vec<JobRef> = changed
            .iter()
            .flat_map(|n| jobs_for_node(n, &pods, &jobs))
            .collect();
        for node in &still {
            wake.extend(
                pods.state()
                    .iter()
                    .filter(|p| p.node_name() == Some(node.as_str()))
                    .filter_map(|p| {
                        let job = p.labels().get(LABEL_JOB)?;
                        Some(
                            ObjectRef::new(job)
                                .within(p.namespace().as_deref().unwrap_or_default()),
                        )
                    }),
            );
        }
        wake.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        wake.dedup();
        stream::iter(wake)
    })
}

/// A job waiting for its existingClaim starts as soon as the claim appears; a job blocked
/// by a PVC of its name that is not its own, as soon as that one is gone.
pub(super) fn claim_triggers(
    claim_events: impl Stream<Item = Result<PartialObjectMeta<PersistentVolumeClaim>, watcher::Error>>
    + Send
    + 'static,
    jobs: Store<DeserializeGuard<TrainingJob>>,
) -> impl Stream<Item = JobRef> + Send + 'static {
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
                    watch_failed("persistentvolumeclaim", &e);
                    Vec::new()
                }
            };
            future::ready((!refs.is_empty()).then(|| stream::iter(refs)))
        })
        .flatten()
}

/// A job blocked by a Service of its name that is not its own starts as soon as that one is
/// gone.
pub(super) fn service_triggers(
    svc_events: impl Stream<Item = Result<PartialObjectMeta<Service>, watcher::Error>> + Send + 'static,
    jobs: Store<DeserializeGuard<TrainingJob>>,
) -> impl Stream<Item = JobRef> + Send + 'static {
    svc_events.filter_map(move |svc| {
        future::ready(match svc {
            Ok(svc) => job_in_conflict_over(
                ObjectKind::Service,
                &svc.name_any(),
                &svc.namespace().unwrap_or_default(),
                &jobs,
            ),
            Err(e) => {
                watch_failed("service", &e);
                None
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    #[test]
    fn only_a_watchs_expired_resource_version_is_routine_and_a_refused_watch_is_not() {
        let status = |code, reason| Status::failure("watch", reason).with_code(code).boxed();
        assert!(is_routine(&watcher::Error::WatchError(status(
            410, "Expired"
        ))));
        assert!(!is_routine(&watcher::Error::WatchError(status(
            403,
            "Forbidden"
        ))));
        assert!(!is_routine(&watcher::Error::InitialListFailed(
            kube::Error::Api(status(403, "Forbidden"))
        )));
        // A re-list refused with 410 is not the watch's expiry: the list itself failed.
        assert!(!is_routine(&watcher::Error::InitialListFailed(
            kube::Error::Api(status(410, "Expired"))
        )));
        assert!(!is_routine(&watcher::Error::NoResourceVersion));
    }

    #[test]
    fn a_node_that_falls_silent_or_comes_back_is_a_change_and_one_that_stays_is_still_silent() {
        let set = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect();
        let mut t = SilenceTracker::default();
        assert_eq!(t.tick(set(&["a"])), (vec!["a".to_owned()], vec![]));
        assert_eq!(
            t.tick(set(&["a", "b"])),
            (vec!["b".to_owned()], vec!["a".to_owned()])
        );
        assert_eq!(
            t.tick(set(&["b"])),
            (vec!["a".to_owned()], vec!["b".to_owned()])
        );
        assert_eq!(t.tick(set(&[])), (vec!["b".to_owned()], vec![]));
        assert_eq!(t.tick(set(&[])), (vec![], vec![]));
    }
    use serde_json::json;

    fn node(labels: serde_json::Value, ready: &str, heartbeat: &str) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "n", "labels": labels},
            "status": {
                "allocatable": {crate::model::crd::DEFAULT_GPU_RESOURCE: "8"},
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
}
