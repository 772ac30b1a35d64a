//! How soon a change to a worker pod wakes its job.
//!
//! A pod changes many times on its way to running (bound to a node, containers created,
//! started, ready), and most of those changes move only the job's routine status: the
//! per-worker detail, which waits to be written anyway (`crate::state::status_write`: until
//! the job runs, or for minutes before), and at last the phase Running. Waking the job on each
//! of them costs a reconcile each and decides nothing new. So a change is judged by what of
//! the pod it touches ([`wake_for`]):
//!
//! - **now**: anything a round may have to act on at once: the pod being deleted or gone, a
//!   container that ended or restarted or cannot start (its waiting reason), a disruption
//!   announced, a scheduling failure, the pod's own reason (evicted, preempted, ...);
//! - **soon** ([`SETTLE`] later, once per job however many of its pods change meanwhile):
//!   a change of phase, container state or readiness, conditions or labels;
//! - **not at all**: what no decision reads (addresses, start times, a new resourceVersion),
//!   and the pod being bound to a node: that shows in the worker detail, which waits for the
//!   pod's next change anyway (its containers being created, or running). A pod placed after
//!   it could not be is news, though (its scheduling failure clears): that wakes now.
//!
//! The rule reads only the pod itself, old and new, never its job's other pods: which change
//! completes a transition is the round's to decide.

use std::collections::HashSet;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use k8s_openapi::api::core::v1::PodCondition;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc;
use tokio_util::time::DelayQueue;

use crate::model::cached_pod::{CachedContainerStatus, CachedPod};
use crate::model::crd::TrainingJob;
use crate::state::JobRef;

/// How long a routine pod change waits before it wakes its job: long enough to gather the
/// changes of a job's pods that come together (a gang is bound and started together), short
/// next to the status detail's own batching (3 s once running).
pub(super) const SETTLE: Duration = Duration::from_secs(1);

/// How soon a pod's change wakes its job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PodWake {
    /// Nothing a decision reads changed.
    Not,
    /// Only routine status can follow: after [`SETTLE`], together with the job's other
    /// routine changes.
    Soon,
    /// A round may have to act: at once.
    Now,
}

/// How the change from `old` (None: not seen before) to `new` wakes the pod's job.
pub(super) fn wake_for(old: Option<&CachedPod>, new: &CachedPod) -> PodWake {
    let Some(old) = old else {
        return PodWake::Now;
    };
    if ActionKey::of(old) != ActionKey::of(new) {
        PodWake::Now
    } else if RoutineKey::of(old) != RoutineKey::of(new) {
        PodWake::Soon
    } else {
        PodWake::Not
    }
}

/// What of a pod a round may act on at once.
#[derive(PartialEq, Eq)]
struct ActionKey<'a> {
    deleting: bool,
    terminal: bool,
    reason: Option<&'a str>,
    /// Containers with news: name, restarts, how it ended, why it cannot start.
    containers: Vec<ContainerNews<'a>>,
    conditions: Vec<(&'a str, &'a str, Option<&'a str>)>,
}

type ContainerNews<'a> = (
    &'a str,
    i32,
    Option<(i32, Option<&'a str>)>,
    Option<&'a str>,
);

/// Waiting reasons of a container on its normal way to running: routine, not news.
const ROUTINE_WAITING: [&str; 2] = ["ContainerCreating", "PodInitializing"];

impl<'a> ActionKey<'a> {
    fn of(pod: &'a CachedPod) -> Self {
        let status = pod.status.as_ref();
        let phase = status.and_then(|s| s.phase.as_deref());
        let containers = status
            .into_iter()
            .flat_map(|s| {
                s.container_statuses
                    .iter()
                    .chain(s.init_container_statuses.iter())
            })
            .flatten()
            .filter_map(|c| {
                let state = c.state.as_ref();
                let ended = state
                    .and_then(|s| s.terminated.as_ref())
                    .map(|t| (t.exit_code, t.reason.as_deref()));
                let waiting = state
                    .and_then(|s| s.waiting.as_ref())
                    .and_then(|w| w.reason.as_deref())
                    .filter(|r| !ROUTINE_WAITING.contains(r));
                // A container on its normal way to running is routine, however it appears.
                let news = c.restart_count > 0 || ended.is_some() || waiting.is_some();
                news.then_some((c.name.as_str(), c.restart_count, ended, waiting))
            })
            .collect();
        // A disruption announced, or a pod that cannot be placed; a pod being placed or
        // becoming ready is routine.
        let conditions = conditions(pod)
            .filter(|c| c.type_ == "DisruptionTarget" || c.status != "True")
            .filter(|c| c.type_ == "DisruptionTarget" || c.type_ == "PodScheduled")
            .map(|c| (c.type_.as_str(), c.status.as_str(), c.reason.as_deref()))
            .collect();
        ActionKey {
            deleting: pod.metadata.deletion_timestamp.is_some(),
            terminal: matches!(phase, Some("Succeeded" | "Failed")),
            reason: status.and_then(|s| s.reason.as_deref()),
            containers,
            conditions,
        }
    }
}

/// What of a pod moves its job's routine status.
#[derive(PartialEq, Eq)]
struct RoutineKey<'a> {
    phase: Option<&'a str>,
    labels: &'a std::collections::BTreeMap<String, String>,
    containers: Vec<(&'a str, bool, Option<bool>, [bool; 3])>,
    conditions: Vec<(&'a str, &'a str)>,
}

impl<'a> RoutineKey<'a> {
    fn of(pod: &'a CachedPod) -> Self {
        let status = pod.status.as_ref();
        let state = |c: &CachedContainerStatus| {
            let s = c.state.as_ref();
            [
                s.is_some_and(|s| s.waiting.is_some()),
                s.is_some_and(|s| s.running.is_some()),
                s.is_some_and(|s| s.terminated.is_some()),
            ]
        };
        RoutineKey {
            phase: status.and_then(|s| s.phase.as_deref()),
            labels: pod.labels(),
            containers: status
                .and_then(|s| s.container_statuses.as_ref())
                .into_iter()
                .flatten()
                .map(|c| (c.name.as_str(), c.ready, c.started, state(c)))
                .collect(),
            conditions: conditions(pod)
                .filter(|c| c.type_ != "PodScheduled")
                .map(|c| (c.type_.as_str(), c.status.as_str()))
                .collect(),
        }
    }
}

fn conditions(pod: &CachedPod) -> impl Iterator<Item = &PodCondition> {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
}

/// The job a pod belongs to: its controlling owner, as the Controller's owner mapping finds it.
pub(super) fn owning_job(pod: &CachedPod) -> Option<JobRef> {
    let owner = pod
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == "TrainingJob")?;
    let api_version = <TrainingJob as kube::Resource>::api_version(&());
    (owner.api_version == api_version)
        .then(|| ObjectRef::new(&owner.name).within(pod.namespace().as_deref().unwrap_or_default()))
}

/// The sender of routine wakes, and the stream that gives each job back once, [`SETTLE`]
/// after its first routine change since it was last given back.
pub(super) fn settling() -> (mpsc::UnboundedSender<JobRef>, Settled) {
    let (tx, rx) = mpsc::unbounded_channel();
    (
        tx,
        Settled {
            incoming: rx,
            waiting: DelayQueue::new(),
            queued: HashSet::new(),
            closed: false,
        },
    )
}

/// Jobs whose routine pod changes have settled (see [`settling`]). Holds each job at most
/// once: bounded by the number of jobs.
pub(super) struct Settled {
    incoming: mpsc::UnboundedReceiver<JobRef>,
    waiting: DelayQueue<JobRef>,
    queued: HashSet<JobRef>,
    closed: bool,
}

impl Stream for Settled {
    type Item = JobRef;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<JobRef>> {
        let this = self.get_mut();
        while !this.closed {
            match this.incoming.poll_recv(cx) {
                Poll::Ready(Some(job)) => {
                    if this.queued.insert(job.clone()) {
                        this.waiting.insert(job, SETTLE);
                    }
                }
                Poll::Ready(None) => this.closed = true,
                Poll::Pending => break,
            }
        }
        match this.waiting.poll_expired(cx) {
            Poll::Ready(Some(expired)) => {
                let job = expired.into_inner();
                this.queued.remove(&job);
                Poll::Ready(Some(job))
            }
            Poll::Ready(None) if this.closed => Poll::Ready(None),
            Poll::Ready(None) | Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use serde_json::json;

    fn pod(status: serde_json::Value) -> CachedPod {
        let mut p: CachedPod = serde_json::from_value(json!({
            "metadata": {
                "name": "j-worker-0", "namespace": "ns", "labels": {"trainyard.dev/job": "j"},
                "ownerReferences": [{"apiVersion": "trainyard.dev/v1alpha1", "kind": "TrainingJob",
                    "name": "j", "uid": "u", "controller": true}],
            },
            "spec": {"containers": [{"name": "trainer"}]},
            "status": status,
        }))
        .expect("pod");
        p.strip();
        p
    }

    fn pending() -> CachedPod {
        pod(json!({"phase": "Pending"}))
    }

    fn bound() -> CachedPod {
        let mut p = pod(json!({"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "True"}]}));
        p.spec.node_name = Some("n-1".into());
        p
    }

    fn running() -> CachedPod {
        let mut p = pod(
            json!({"phase": "Running", "podIP": "10.0.0.5", "conditions": [
                {"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "trainer", "ready": true, "restartCount": 0,
                "image": "i", "imageID": "", "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}),
        );
        p.spec.node_name = Some("n-1".into());
        p
    }

    fn with_container(p: &mut CachedPod, state: serde_json::Value, restarts: i32) {
        let status = p.status.as_mut().expect("status");
        status.container_statuses = Some(vec![
            serde_json::from_value(json!({"name": "trainer", "ready": false,
                "restartCount": restarts, "image": "i", "imageID": "", "state": state}))
            .expect("container status"),
        ]);
    }

    #[test]
    fn a_pod_not_seen_before_wakes_its_job_now() {
        assert_eq!(wake_for(None, &pending()), PodWake::Now);
    }

    #[test]
    fn being_started_or_made_ready_is_routine() {
        assert_eq!(wake_for(Some(&bound()), &running()), PodWake::Soon);
        let mut creating = bound();
        with_container(
            &mut creating,
            json!({"waiting": {"reason": "ContainerCreating"}}),
            0,
        );
        assert_eq!(wake_for(Some(&bound()), &creating), PodWake::Soon);
        assert_eq!(wake_for(Some(&creating), &running()), PodWake::Soon);
    }

    #[test]
    fn what_no_decision_reads_wakes_nothing() {
        let mut moved = running();
        // (Addresses are not even cached.)
        let status = moved.status.as_mut().expect("status");
        status.start_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2026-01-01T00:01:00Z".parse().expect("time"),
        ));
        moved.metadata.resource_version = Some("99".into());
        assert_eq!(wake_for(Some(&running()), &moved), PodWake::Not);
        // Bound: the node waits in the worker detail for the pod's next change.
        assert_eq!(wake_for(Some(&pending()), &bound()), PodWake::Not);
    }

    #[test]
    fn what_a_round_may_act_on_wakes_now() {
        let mut deleting = running();
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                "2026-01-01T00:02:00Z".parse().expect("time"),
            ));
        assert_eq!(wake_for(Some(&running()), &deleting), PodWake::Now);

        let mut ended = running();
        with_container(
            &mut ended,
            json!({"terminated": {"exitCode": 1, "reason": "Error"}}),
            0,
        );
        assert_eq!(wake_for(Some(&running()), &ended), PodWake::Now);

        let mut restarted = running();
        with_container(
            &mut restarted,
            json!({"running": {"startedAt": "2026-01-01T00:03:00Z"}}),
            1,
        );
        assert_eq!(wake_for(Some(&running()), &restarted), PodWake::Now);

        let mut pulling = bound();
        with_container(
            &mut pulling,
            json!({"waiting": {"reason": "ImagePullBackOff"}}),
            0,
        );
        assert_eq!(wake_for(Some(&bound()), &pulling), PodWake::Now);

        let mut disrupted = running();
        let st = disrupted.status.as_mut().expect("status");
        st.conditions.get_or_insert_default().push(
            serde_json::from_value(json!({"type": "DisruptionTarget", "status": "True",
                "reason": "PreemptionByScheduler"}))
            .expect("condition"),
        );
        assert_eq!(wake_for(Some(&running()), &disrupted), PodWake::Now);

        let unschedulable = pod(json!({"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}));
        assert_eq!(wake_for(Some(&pending()), &unschedulable), PodWake::Now);
        // Placed at last after a scheduling failure: the failure's condition clears at once.
        assert_eq!(wake_for(Some(&unschedulable), &bound()), PodWake::Now);

        let mut evicted = running();
        let st = evicted.status.as_mut().expect("status");
        st.phase = Some("Failed".into());
        st.reason = Some("Evicted".into());
        assert_eq!(wake_for(Some(&running()), &evicted), PodWake::Now);
    }

    #[test]
    fn a_pod_s_job_is_its_controlling_training_job() {
        let job = owning_job(&pending()).expect("owned");
        assert_eq!(
            (job.name.as_str(), job.namespace.as_deref()),
            ("j", Some("ns"))
        );
        let mut orphan = pending();
        orphan.metadata.owner_references = None;
        assert!(owning_job(&orphan).is_none());
    }

    /// Many routine changes of one job within the settling time wake it once, after it.
    #[tokio::test(start_paused = true)]
    async fn routine_changes_of_a_job_settle_into_one_wake() {
        let (tx, mut settled) = settling();
        let a = ObjectRef::new("a").within("ns");
        let b = ObjectRef::new("b").within("ns");
        let start = tokio::time::Instant::now();
        for _ in 0..4 {
            tx.send(a.clone()).expect("send");
        }
        tx.send(b.clone()).expect("send");
        assert_eq!(settled.next().await, Some(a.clone()));
        assert_eq!(settled.next().await, Some(b));
        assert_eq!(start.elapsed(), SETTLE);
        // Given back, the job settles afresh.
        tx.send(a.clone()).expect("send");
        drop(tx);
        assert_eq!(settled.next().await, Some(a));
        assert_eq!(start.elapsed(), SETTLE * 2);
        assert_eq!(settled.next().await, None);
    }
}
