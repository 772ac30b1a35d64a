//! Watches the pods of one namespace and notes when each was first seen, first seen scheduled
//! and seen deleted, so that the floor and the operator are timed by the same observer.
//!
//! The fake nodes have no kubelet, so the tracker can also play the kubelet's part in pod
//! deletion: a pod that gets a deletionTimestamp is deleted at once with grace period 0 (the
//! kubelet would do so once its containers stopped; the benchmark does not count the old
//! pods' grace periods).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Preconditions};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use trainyard_operator::surface::{LABEL_ATTEMPT, LABEL_JOB};

use crate::error::{Error, Result};

/// How often waiters look at the records.
const POLL: Duration = Duration::from_millis(25);

/// What the tracker knows of one pod (one incarnation: pods are keyed by uid, since a new
/// attempt reuses the names).
#[derive(Clone, Debug)]
pub struct PodRecord {
    /// metadata.name.
    pub name: String,
    /// metadata.uid.
    pub uid: String,
    /// `trainyard.dev/job`, if any.
    pub job: Option<String>,
    /// `trainyard.dev/attempt`, if any.
    pub attempt: Option<u32>,
    /// When the watch first reported the pod.
    pub seen: Instant,
    /// When the watch first reported it with spec.nodeName set.
    pub scheduled: Option<Instant>,
    /// When the watch reported its deletion.
    pub deleted: Option<Instant>,
}

#[derive(Default)]
struct State {
    pods: HashMap<String, PodRecord>,
    synced: bool,
    force_deleting: HashSet<String>,
    /// Who waits for the pod of each uid to be deleted ([`PodTracker::gone`]).
    on_gone: HashMap<String, Vec<oneshot::Sender<()>>>,
    /// The uids a (re)list in progress returned.
    relisted: Option<HashSet<String>>,
}

impl State {
    /// Records one watch event seen at `now`; returns the pod to finish deleting, if any
    /// ([`observe`]).
    fn on_event(
        &mut self,
        ev: watcher::Event<Pod>,
        now: Instant,
        finish_deletions: bool,
    ) -> Option<(String, String)> {
        match ev {
            watcher::Event::Apply(p) => observe(self, &p, now, finish_deletions),
            watcher::Event::InitApply(p) => {
                if let (Some(listed), Some(uid)) = (self.relisted.as_mut(), p.uid()) {
                    listed.insert(uid);
                }
                observe(self, &p, now, finish_deletions)
            }
            watcher::Event::Delete(p) => {
                observe(self, &p, now, false);
                if let Some(uid) = p.uid() {
                    self.gone(&uid, now);
                }
                None
            }
            watcher::Event::Init => {
                self.relisted = Some(HashSet::new());
                None
            }
            watcher::Event::InitDone => {
                self.synced = true;
                self.missing_from_relist(now);
                None
            }
        }
    }

    /// The watch showed the pod of `uid` gone at `now`.
    fn gone(&mut self, uid: &str, now: Instant) {
        if let Some(r) = self.pods.get_mut(uid) {
            r.deleted.get_or_insert(now);
        }
        for waiter in self.on_gone.remove(uid).unwrap_or_default() {
            let _ = waiter.send(());
        }
    }

    /// A relist (after the watch fell too far behind) is complete: a pod it did not return was
    /// deleted meanwhile, though no Delete event said so.
    fn missing_from_relist(&mut self, now: Instant) {
        let Some(listed) = self.relisted.take() else {
            return;
        };
        let missing: Vec<String> = self
            .pods
            .iter()
            .filter(|(uid, r)| r.deleted.is_none() && !listed.contains(*uid))
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in missing {
            self.gone(&uid, now);
        }
    }
}

/// A running tracker; stops when dropped.
pub struct PodTracker {
    state: Arc<Mutex<State>>,
    task: JoinHandle<()>,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

impl PodTracker {
    /// Starts watching `namespace` and waits for the initial list. With `finish_deletions`,
    /// pods being deleted are force-deleted as their (absent) kubelet would.
    pub async fn start(client: &Client, namespace: &str, finish_deletions: bool) -> Result<Self> {
        let state: Arc<Mutex<State>> = Arc::default();
        let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let task = {
            let (state, api) = (state.clone(), api.clone());
            tokio::spawn(async move {
                let mut events = watcher(api.clone(), watcher::Config::default())
                    .default_backoff()
                    .boxed();
                while let Some(ev) = events.next().await {
                    let now = Instant::now();
                    let ev = match ev {
                        Ok(ev) => ev,
                        Err(e) => {
                            tracing::warn!(error = %e, "pod watch");
                            continue;
                        }
                    };
                    let to_delete = lock(&state).on_event(ev, now, finish_deletions);
                    if let Some((name, uid)) = to_delete {
                        let api = api.clone();
                        tokio::spawn(async move { force_delete(api, name, uid).await });
                    }
                }
            })
        };
        let tracker = PodTracker { state, task };
        tracker
            .wait("the pod watch to sync", Duration::from_secs(60), |st| {
                st.synced
                    .then_some(())
                    .ok_or_else(|| "not synced".to_owned())
            })
            .await?;
        Ok(tracker)
    }

    /// A copy of every record.
    pub fn records(&self) -> Vec<PodRecord> {
        lock(&self.state).pods.values().cloned().collect()
    }

    /// Waits until the watch saw the pods of `uids` deleted (a uid it never saw counts as
    /// gone). Each waiter is woken by the deletion itself, not by polling: a burst of a
    /// thousand restarts, each waiting for its old pods, costs no CPU while it waits.
    pub async fn gone(&self, what: &str, uids: &[String], timeout: Duration) -> Result<()> {
        let waits: Vec<oneshot::Receiver<()>> = {
            let mut st = lock(&self.state);
            let live: Vec<&String> = uids
                .iter()
                .filter(|u| st.pods.get(*u).is_some_and(|p| p.deleted.is_none()))
                .collect();
            live.into_iter()
                .map(|uid| {
                    let (tx, rx) = oneshot::channel();
                    st.on_gone.entry(uid.clone()).or_default().push(tx);
                    rx
                })
                .collect()
        };
        let left = waits.len();
        tokio::time::timeout(timeout, futures::future::join_all(waits))
            .await
            .map(|_| ())
            .map_err(|_| Error::Timeout {
                what: what.to_owned(),
                after: timeout,
                progress: format!("{left} pod(s) were there when the wait began"),
            })
    }

    /// Waits until `ready` returns Ok over the records; its Err is the progress shown on
    /// timeout. The records carry the watch's own timestamps, so how often this polls does not
    /// change the measurement; it polls every 25 ms to stay off the CPU the operator needs.
    pub async fn wait_until<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut ready: impl FnMut(&mut dyn Iterator<Item = &PodRecord>) -> Result<T, String>,
    ) -> Result<T> {
        self.wait(what, timeout, |st| ready(&mut st.pods.values()))
            .await
    }

    async fn wait<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut ready: impl FnMut(&State) -> Result<T, String>,
    ) -> Result<T> {
        let deadline = Instant::now() + timeout;
        loop {
            let progress = match ready(&lock(&self.state)) {
                Ok(v) => return Ok(v),
                Err(p) => p,
            };
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    what: what.to_owned(),
                    after: timeout,
                    progress,
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

impl Drop for PodTracker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn observe(
    st: &mut State,
    pod: &Pod,
    now: Instant,
    finish_deletions: bool,
) -> Option<(String, String)> {
    let uid = pod.uid()?;
    let scheduled = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_ref())
        .is_some();
    let record = st.pods.entry(uid.clone()).or_insert_with(|| PodRecord {
        name: pod.name_any(),
        uid: uid.clone(),
        job: pod.labels().get(LABEL_JOB).cloned(),
        attempt: pod.labels().get(LABEL_ATTEMPT).and_then(|a| a.parse().ok()),
        seen: now,
        scheduled: None,
        deleted: None,
    });
    if scheduled && record.scheduled.is_none() {
        record.scheduled = Some(now);
    }
    if finish_deletions
        && pod.metadata.deletion_timestamp.is_some()
        && st.force_deleting.insert(uid.clone())
    {
        return Some((pod.name_any(), uid));
    }
    None
}

async fn force_delete(api: Api<Pod>, name: String, uid: String) {
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&name, &dp).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
        Err(e) => tracing::warn!(pod = %name, error = %e, "force-deleting a pod on a fake node"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, uid: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.to_owned());
        p.metadata.uid = Some(uid.to_owned());
        p
    }

    #[test]
    fn a_pod_a_relist_no_longer_returns_is_gone_and_its_waiters_are_woken() {
        use watcher::Event::{Init, InitApply, InitDone};
        let mut st = State::default();
        let t0 = Instant::now();
        for ev in [
            Init,
            InitApply(pod("a", "u-a")),
            InitApply(pod("b", "u-b")),
            InitDone,
        ] {
            assert_eq!(st.on_event(ev, t0, true), None);
        }
        assert!(st.synced);
        assert_eq!(st.pods.len(), 2, "the first list leaves both there");
        assert!(st.pods.values().all(|r| r.deleted.is_none()));
        let (tx, mut rx) = oneshot::channel();
        st.on_gone.entry("u-a".to_owned()).or_default().push(tx);
        // The watch fell behind and listed again: only b is still there.
        let t1 = t0 + Duration::from_secs(1);
        for ev in [Init, InitApply(pod("b", "u-b")), InitDone] {
            st.on_event(ev, t1, true);
        }
        assert_eq!(st.pods["u-a"].deleted, Some(t1));
        assert_eq!(st.pods["u-b"].deleted, None);
        assert_eq!(rx.try_recv(), Ok(()), "the waiter for a is woken");
    }

    #[test]
    fn a_delete_event_wakes_who_waits_for_that_pod_only() {
        let mut st = State::default();
        let t0 = Instant::now();
        st.on_event(watcher::Event::Apply(pod("a", "u-a")), t0, false);
        st.on_event(watcher::Event::Apply(pod("b", "u-b")), t0, false);
        let (tx_a, mut rx_a) = oneshot::channel();
        let (tx_b, mut rx_b) = oneshot::channel();
        st.on_gone.entry("u-a".to_owned()).or_default().push(tx_a);
        st.on_gone.entry("u-b".to_owned()).or_default().push(tx_b);
        st.on_event(watcher::Event::Delete(pod("a", "u-a")), t0, false);
        assert_eq!(rx_a.try_recv(), Ok(()));
        assert!(rx_b.try_recv().is_err(), "b is still there");
    }
}
