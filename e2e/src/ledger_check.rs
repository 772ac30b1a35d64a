//! A job's goodput ledger (`status.ledger`) held against its pods' own timestamps.
//!
//! The ledger counts a job's life as a chain of stretches, each × the GPUs of its attempt:
//! pending from the first pods' creation to the last trainer's start, running from there to the
//! interruption (a trainer's end, or the loss of a node, which the ledger dates at the node's
//! last sign of life), then detection and restart up to the next attempt's last
//! trainer start, and running again to the last trainer's exit. Every one of those boundaries
//! but a node's loss is a pod timestamp, which the API server keeps to the whole second, so the
//! ledger and the pods must agree within a second per pod; a node's loss is the time the test
//! took the node away ([`Ended::NodeLost`]). The gang restart deletes the first attempt's pods
//! within a second of their stop: [`PodTimesRecorder`] keeps each pod's timestamps from a watch
//! opened while they run, and [`account`] compares them with the ledger.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client, ResourceExt};
use trainyard_api::crd::{GoodputLedger, LABEL_ATTEMPT, LABEL_JOB};

use crate::jobs::{gpus_asked, trainer_status};

/// One pod's timestamps, as the last watch event that carried each showed them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodTimes {
    /// The `trainyard.dev/job` label.
    pub job: String,
    pub name: String,
    /// The `trainyard.dev/attempt` label.
    pub attempt: u32,
    /// The GPUs the pod requests (`nvidia.com/gpu`).
    pub gpus: u64,
    /// The node it was bound to.
    pub node: String,
    /// `metadata.creationTimestamp`.
    pub created: Timestamp,
    /// The trainer container's `startedAt` (running or terminated).
    pub started: Option<Timestamp>,
    /// The trainer container's `finishedAt`; absent for a pod lost with its node.
    pub finished: Option<Timestamp>,
}

impl PodTimes {
    /// The timestamps `pod` shows; None for a pod without the operator's labels.
    fn of(pod: &Pod) -> Option<Self> {
        let attempt = pod.labels().get(LABEL_ATTEMPT)?.parse().ok()?;
        let job = pod.labels().get(LABEL_JOB)?.clone();
        let spec = pod.spec.as_ref()?;
        let gpus = gpus_asked(pod);
        let state = trainer_status(pod).and_then(|c| c.state.as_ref());
        let running = state.and_then(|s| s.running.as_ref());
        let terminated = state.and_then(|s| s.terminated.as_ref());
        Some(Self {
            job,
            name: pod.name_any(),
            attempt,
            gpus,
            node: spec.node_name.clone().unwrap_or_default(),
            created: pod.metadata.creation_timestamp.as_ref()?.0,
            started: running
                .and_then(|r| r.started_at.as_ref())
                .or_else(|| terminated.and_then(|t| t.started_at.as_ref()))
                .map(|t| t.0),
            finished: terminated.and_then(|t| t.finished_at.as_ref()).map(|t| t.0),
        })
    }

    /// `self` with what `later` adds: a watch event never takes back a time already seen. A
    /// pod the operator replaced while it waited (same attempt, same name) keeps the first
    /// one's creation: the slot has waited since then, as the ledger counts it.
    fn merged(self, later: Self) -> Self {
        Self {
            created: self.created.min(later.created),
            started: later.started.or(self.started),
            finished: later.finished.or(self.finished),
            node: if later.node.is_empty() {
                self.node
            } else {
                later.node
            },
            ..later
        }
    }
}

/// Every pod's timestamps by job, attempt and pod name.
type Recorded = BTreeMap<(String, u32, String), PodTimes>;

/// Keeps the timestamps of every job's pods in a namespace from a watch, deleted pods
/// included; started before a job is created, it sees every pod the job ever had. A pod is
/// known by its job, attempt and name: the next attempt's pods take the names of the last
/// one's.
pub struct PodTimesRecorder {
    pods: Arc<Mutex<Recorded>>,
    task: tokio::task::JoinHandle<()>,
}

impl PodTimesRecorder {
    /// Starts watching the jobs' pods in `namespace`; returns once the watch is open.
    pub async fn start(client: &Client, namespace: &str) -> Result<Self> {
        use futures::StreamExt;
        use kube::runtime::watcher::{self, Event};
        let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let config = watcher::Config::default().labels(LABEL_JOB);
        let pods = Arc::new(Mutex::new(
            BTreeMap::<(String, u32, String), PodTimes>::new(),
        ));
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let sink = pods.clone();
        let task = tokio::spawn(async move {
            let mut ready = Some(ready_tx);
            let mut stream = watcher::watcher(api, config).boxed();
            while let Some(event) = stream.next().await {
                let pod = match event {
                    Ok(Event::InitDone) => {
                        if let Some(tx) = ready.take() {
                            let _ = tx.send(());
                        }
                        continue;
                    }
                    Ok(Event::Apply(pod) | Event::InitApply(pod) | Event::Delete(pod)) => pod,
                    Ok(Event::Init) | Err(_) => continue,
                };
                let Some(times) = PodTimes::of(&pod) else {
                    continue;
                };
                let mut all = sink.lock().unwrap_or_else(PoisonError::into_inner);
                record(&mut all, times);
            }
        });
        tokio::time::timeout(Duration::from_secs(30), ready_rx)
            .await
            .context("the pod watch did not open within 30 s")?
            .context("the pod watch ended")?;
        Ok(Self { pods, task })
    }

    /// Every pod of `job` seen so far.
    pub fn pods(&self, job: &str) -> Vec<PodTimes> {
        let all = self.pods.lock().unwrap_or_else(PoisonError::into_inner);
        all.values().filter(|p| p.job == job).cloned().collect()
    }
}

/// Adds what a watch event showed of a pod to what is known of it.
fn record(all: &mut Recorded, times: PodTimes) {
    let key = (times.job.clone(), times.attempt, times.name.clone());
    let merged = match all.remove(&key) {
        Some(known) => known.merged(times),
        None => times,
    };
    all.insert(key, merged);
}

impl Drop for PodTimesRecorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// GPU-milliseconds the pods' timestamps give each part of a preempted job's ledger, and how
/// far the ledger may be from them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Account {
    /// Every bucket of both capacity types.
    pub total: u64,
    /// Of it, on spot nodes.
    pub spot: u64,
    /// First pods' creation to attempt 0's last trainer start.
    pub pending: u64,
    /// Attempt 0's last trainer start to its interruption, and attempt 1's run: useful work
    /// and the work the interruption lost (recompute, known or not).
    pub running: u64,
    /// The interruption to attempt 1's last trainer start: detection and restart.
    pub interruption: u64,
    /// How much earlier the ledger may date attempt 0's interruption, × its GPUs: a node lost
    /// without notice is dated at its last sign of life ([`Ended::NodeLost`]), which moves
    /// that much from running to detection.
    pub early: u64,
    /// 1 s × the GPUs of every pod of both attempts: each boundary is a pod timestamp, kept
    /// by the API server to the whole second.
    pub tolerance: u64,
}

/// Milliseconds from `a` to `b` (0 when `b` is earlier).
fn ms(a: Timestamp, b: Timestamp) -> u64 {
    u64::try_from(b.duration_since(a).as_millis()).unwrap_or(0)
}

/// What the pods of a job's attempt 0 and 1 (one preemption, then success) say each part of its
/// ledger holds; `is_spot` tells the spot nodes, `ended` how attempt 0's running stretch ended
/// ([`Ended::FirstExit`] or [`Ended::NodeLost`]).
pub fn account(pods: &[PodTimes], is_spot: impl Fn(&str) -> bool, ended: Ended) -> Result<Account> {
    let of = |a: u32| pods.iter().filter(move |p| p.attempt == a);
    ensure!(
        of(0).count() > 0 && of(1).count() > 0,
        "pods of both attempts: {pods:?}"
    );
    let created0 = of(0)
        .map(|p| p.created)
        .min()
        .context("attempt 0 created")?;
    let last_start = |a: u32| -> Result<Timestamp> {
        let starts: Option<Vec<Timestamp>> = of(a).map(|p| p.started).collect();
        let starts = starts.with_context(|| format!("a trainer of attempt {a} never started"))?;
        starts.into_iter().max().context("no pods")
    };
    let (run0, run1) = (last_start(0)?, last_start(1)?);
    let attempt0: Vec<&PodTimes> = of(0).collect();
    let (earliest, interrupted) = end_between(&attempt0, ended).context("attempt 0 has no end")?;
    let end1 = {
        let ends: Option<Vec<Timestamp>> = of(1).map(|p| p.finished).collect();
        let ends = ends.context("a trainer of attempt 1 has not ended")?;
        ends.into_iter().max().context("no pods")?
    };
    let gpus = |a: u32, spot_only: bool| -> u64 {
        of(a)
            .filter(|p| !spot_only || is_spot(&p.node))
            .map(|p| p.gpus)
            .sum()
    };
    let (g0, g1) = (gpus(0, false), gpus(1, false));
    // The restart stretch keeps attempt 0's GPUs until attempt 1 runs.
    Ok(Account {
        total: ms(created0, run1) * g0 + ms(run1, end1) * g1,
        spot: ms(created0, run1) * gpus(0, true) + ms(run1, end1) * gpus(1, true),
        pending: ms(created0, run0) * g0,
        running: ms(run0, interrupted) * g0 + ms(run1, end1) * g1,
        interruption: ms(interrupted, run1) * g0,
        early: ms(earliest, interrupted) * g0,
        tolerance: 1_000 * pods.iter().map(|p| p.gpus).sum::<u64>(),
    })
}

/// Checks that `ledger` accounts for every GPU-second `expected` found in the pods, each part
/// within `expected.tolerance`.
pub fn check(ledger: &GoodputLedger, expected: &Account) -> Result<()> {
    let (s, d) = (&ledger.spot, &ledger.on_demand);
    let both = |f: fn(&trainyard_api::crd::GpuMillis) -> u64| f(s) + f(d);
    let got = Account {
        total: s.total() + d.total(),
        spot: s.total(),
        pending: both(|m| m.pending),
        running: both(|m| m.useful + m.lost_to_recompute + m.recompute_unknown),
        interruption: both(|m| m.lost_to_detection + m.lost_to_restart),
        early: 0,
        tolerance: expected.tolerance,
    };
    ensure!(ledger.open.is_none(), "a stretch is still open: {ledger:?}");
    let (e, tol) = (expected.early, expected.tolerance);
    for (part, (low, high), have) in [
        ("total", (expected.total, expected.total), got.total),
        ("spot", (expected.spot, expected.spot), got.spot),
        ("pending", (expected.pending, expected.pending), got.pending),
        (
            "running",
            (expected.running.saturating_sub(e), expected.running),
            got.running,
        ),
        (
            "detection + restart",
            (expected.interruption, expected.interruption + e),
            got.interruption,
        ),
    ] {
        ensure!(
            have + tol >= low && have <= high + tol,
            "{part}: the ledger has {have} GPU-ms, the pods' timestamps {low} to {high} \
             (± {tol}); ledger {ledger:?}, from the pods {expected:?}"
        );
    }
    Ok(())
}

/// How an elastic job's attempts ran, for [`check_sizes`]: each attempt that ran whole, its
/// workers, and how its running stretch ended.
#[derive(Clone, Copy, Debug)]
pub struct SizedAttempt {
    pub attempt: u32,
    pub workers: u32,
    pub ended: Ended,
}

/// How an attempt's running stretch ended, as its pods show it.
#[derive(Clone, Copy, Debug)]
pub enum Ended {
    /// A trainer ended first (a failure): its `finishedAt`.
    FirstExit,
    /// A node was lost at this time without notice: the ledger ends the stretch at the node's
    /// last sign of life (its ranks' last progress report, or its kubelet's last Lease renewal
    /// when they report none), up to `heard_before` before the loss (or at a trainer's end, if
    /// one came first).
    NodeLost {
        at: Timestamp,
        heard_before: std::time::Duration,
    },
    /// The gang was restarted while every trainer ran, decided at this time (a grow).
    DecidedAt(Timestamp),
    /// Every trainer exited 0: the last one's `finishedAt`.
    LastExit,
}

/// The earliest and latest time an attempt's running stretch may end, as its pods (`of`) and
/// the way it `ended` tell.
fn end_between(of: &[&PodTimes], ended: Ended) -> Option<(Timestamp, Timestamp)> {
    let finished = of.iter().filter_map(|p| p.finished);
    match ended {
        Ended::FirstExit => finished.min().map(|t| (t, t)),
        Ended::LastExit => finished.max().map(|t| (t, t)),
        Ended::DecidedAt(at) => Some((at, at)),
        Ended::NodeLost { at, heard_before } => {
            let latest = finished.min().map_or(at, |t| t.min(at));
            let earliest = jiff::SignedDuration::try_from(heard_before)
                .ok()
                .and_then(|d| at.checked_sub(d).ok())
                .unwrap_or(at);
            Some((earliest.min(latest), latest))
        }
    }
}

/// Checks `ledger.elastic.byWorkers` against the pods' own timestamps: for each size, the wall
/// time its attempts ran (from the last trainer's start to the stretch's end, which a lost node
/// puts up to [`Ended::NodeLost`]'s `heard_before` before the loss) within a second per boundary, and GPU time =
/// wall × the attempt's GPUs. Returns the wall seconds by size.
pub fn check_sizes(
    ledger: &GoodputLedger,
    pods: &[PodTimes],
    attempts: &[SizedAttempt],
) -> Result<BTreeMap<u32, f64>> {
    let elastic = ledger
        .elastic
        .as_ref()
        .context("no status.ledger.elastic")?;
    // By size: the shortest and longest wall time, the GPUs per worker, the tolerance.
    let mut want: BTreeMap<u32, (u64, u64, u64, u64)> = BTreeMap::new();
    // Each attempt's stretch as its pods bound it, for the error: which boundary is off.
    let mut bounds = Vec::new();
    for a in attempts {
        let of: Vec<&PodTimes> = pods.iter().filter(|p| p.attempt == a.attempt).collect();
        ensure!(
            of.len() == a.workers as usize,
            "attempt {} has {} pods, not {}: {of:?}",
            a.attempt,
            of.len(),
            a.workers
        );
        let start = of
            .iter()
            .map(|p| p.started)
            .collect::<Option<Vec<_>>>()
            .and_then(|s| s.into_iter().max())
            .with_context(|| format!("a trainer of attempt {} never started", a.attempt))?;
        let (earliest, latest) = end_between(&of, a.ended)
            .with_context(|| format!("attempt {} has no end", a.attempt))?;
        let gpus: u64 = of.iter().map(|p| p.gpus).sum::<u64>() / u64::from(a.workers.max(1));
        bounds.push(format!(
            "attempt {} ({} workers): from {start} to between {earliest} and {latest}",
            a.attempt, a.workers
        ));
        let entry = want.entry(a.workers).or_insert((0, 0, 0, 0));
        entry.0 += ms(start, earliest);
        entry.1 += ms(start, latest);
        entry.2 = gpus;
        entry.3 += 2_000;
    }
    let mut seconds = BTreeMap::new();
    for (workers, (shortest, longest, per_worker, tolerance)) in want {
        let have = elastic
            .by_workers
            .iter()
            .find(|s| s.workers == workers)
            .with_context(|| format!("no entry for {workers} workers: {elastic:?}"))?;
        ensure!(
            have.wall_millis + tolerance >= shortest && have.wall_millis <= longest + tolerance,
            "{workers} workers: the ledger ran {} ms, the pods' timestamps {shortest} to \
             {longest} ms (± {tolerance}): {elastic:?}; by the pods, {}",
            have.wall_millis,
            bounds.join("; ")
        );
        let gpus = per_worker * u64::from(workers);
        ensure!(
            have.gpu_millis == have.wall_millis * gpus,
            "{workers} workers: {} GPU-ms is not {} ms × {gpus} GPUs",
            have.gpu_millis,
            have.wall_millis
        );
        seconds.insert(workers, have.wall_millis as f64 / 1000.0);
    }
    Ok(seconds)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + s).expect("time")
    }

    /// Attempt 0: rank 0 on spot (lost with its node: no finish), rank 1 on-demand failing at
    /// 40 s; attempt 1: both on-demand, 2 GPUs each.
    fn preempted() -> Vec<PodTimes> {
        let pod = |name: &str, attempt, node: &str, c, s, f: Option<i64>| PodTimes {
            job: "j".into(),
            name: name.into(),
            attempt,
            gpus: 2,
            node: node.into(),
            created: at(c),
            started: Some(at(s)),
            finished: f.map(at),
        };
        vec![
            pod("w0-a0", 0, "spot", 0, 5, None),
            pod("w1-a0", 0, "od", 0, 4, Some(40)),
            pod("w0-a1", 1, "od", 45, 50, Some(100)),
            pod("w1-a1", 1, "od", 45, 51, Some(99)),
        ]
    }

    /// The ledger the operator folds for [`preempted`]: decided at 42 s, 10 s of the 35 s
    /// run lost to recompute.
    fn folded() -> GoodputLedger {
        let mut l = GoodputLedger::default();
        // Per GPU: pending 5, running 35 (25 useful, 10 lost), detection 2, restart 9, run 49.
        for (m, gpus) in [(&mut l.spot, 2), (&mut l.on_demand, 2)] {
            m.pending = 5_000 * gpus;
            m.useful = 25_000 * gpus;
            m.lost_to_recompute = 10_000 * gpus;
            m.lost_to_detection = 2_000 * gpus;
            m.lost_to_restart = 9_000 * gpus;
        }
        l.on_demand.useful += 49_000 * 4;
        l
    }

    #[test]
    fn the_pods_of_a_preempted_job_account_for_each_part_of_its_ledger() -> Result<()> {
        let a = account(&preempted(), |n| n == "spot", Ended::FirstExit)?;
        assert_eq!(a.total, 51_000 * 4 + 49_000 * 4);
        assert_eq!(a.spot, 51_000 * 2);
        assert_eq!(a.pending, 5_000 * 4);
        assert_eq!(a.running, 35_000 * 4 + 49_000 * 4);
        assert_eq!(a.interruption, 11_000 * 4);
        assert_eq!(a.tolerance, 8_000);
        check(&folded(), &a)
    }

    #[test]
    fn a_ledger_off_by_more_than_a_second_per_pod_fails_naming_the_part() -> Result<()> {
        let a = account(&preempted(), |n| n == "spot", Ended::FirstExit)?;
        let mut within = folded();
        within.on_demand.lost_to_restart += 4_000;
        within.on_demand.useful -= 4_000;
        check(&within, &a)?;
        let mut off = folded();
        off.on_demand.lost_to_restart += 9_000;
        let err = check(&off, &a).expect_err("9 GPU-seconds too many");
        assert!(err.to_string().starts_with("total:"), "{err}");
        let mut moved = folded();
        moved.spot.pending -= 9_000;
        moved.spot.useful += 9_000;
        let err = check(&moved, &a).expect_err("pending moved into running");
        assert!(err.to_string().starts_with("pending:"), "{err}");
        Ok(())
    }

    /// [`preempted`] with node "spot" lost at 38 s, its rank's last report at 36 s: the
    /// ledger dates the interruption there, 4 s before rank 1's exit. Held against the loss
    /// it passes; held against the exit, or dated at a renewal 8 s before the loss, it fails.
    #[test]
    fn a_lost_node_is_held_against_the_loss_not_the_survivors_exit() -> Result<()> {
        let dated_at = |interrupted: u64| {
            let mut l = folded();
            for m in [&mut l.spot, &mut l.on_demand] {
                m.lost_to_recompute -= (40 - interrupted) * 2_000;
                m.lost_to_detection += (40 - interrupted) * 2_000;
            }
            l
        };
        let lost = Ended::NodeLost {
            at: at(38),
            heard_before: Duration::from_secs(3),
        };
        let a = account(&preempted(), |n| n == "spot", lost)?;
        assert_eq!(a.early, 3_000 * 4);
        check(&dated_at(36), &a)?;
        let exit = account(&preempted(), |n| n == "spot", Ended::FirstExit)?;
        let err = check(&dated_at(36), &exit).expect_err("4 s before the exit");
        assert!(err.to_string().starts_with("running:"), "{err}");
        let err = check(&dated_at(30), &a).expect_err("8 s before the loss");
        assert!(err.to_string().starts_with("running:"), "{err}");
        Ok(())
    }

    #[test]
    fn an_attempt_whose_trainer_never_started_is_an_error_not_a_zero() {
        let mut pods = preempted();
        pods[2].started = None;
        assert!(account(&pods, |n| n == "spot", Ended::FirstExit).is_err());
    }

    #[test]
    fn a_later_event_never_takes_back_a_time_already_seen() {
        let mut first = preempted().remove(1);
        first.finished = None;
        let mut gone = preempted().remove(1);
        gone.started = None;
        gone.node = String::new();
        let merged = first.clone().merged(gone);
        assert_eq!(merged.started, first.started);
        assert_eq!(merged.finished, Some(at(40)));
        assert_eq!(merged.node, "od");
    }

    /// A pod the operator replaced while it waited (a node avoided, then no longer): the
    /// replacement's creation is later, and the ledger counts the wait from the first one.
    #[test]
    fn a_pod_replaced_while_it_waited_keeps_the_first_ones_creation() {
        let mut all = BTreeMap::new();
        let first = preempted().remove(0);
        let replacement = PodTimes {
            created: at(6),
            started: None,
            ..first.clone()
        };
        record(
            &mut all,
            PodTimes {
                started: None,
                ..first
            },
        );
        record(&mut all, replacement);
        let kept: Vec<PodTimes> = all.into_values().collect();
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].created, at(0));
    }

    /// CI run at d2f1c65: the next attempt's pods take the last one's names, and keying by name
    /// merged attempt 1's pods over attempt 0's ("pods of both attempts" failed).
    #[test]
    fn pods_of_two_attempts_under_the_same_names_are_kept_apart() {
        let mut all = BTreeMap::new();
        for p in preempted() {
            let name = p.name.split('-').next().unwrap_or_default().to_owned();
            record(&mut all, PodTimes { name, ..p });
        }
        let kept: Vec<PodTimes> = all.into_values().collect();
        assert_eq!(kept.len(), 4);
        let spot = |n: &str| n == "spot";
        assert_eq!(
            account(&kept, spot, Ended::FirstExit).expect("account"),
            account(&preempted(), spot, Ended::FirstExit).expect("account")
        );
    }

    /// An elastic job: 4 workers from 10 s until node 2 is lost at 60 s (the survivors' trainers
    /// stopped at 75 s, after the decision), 2 workers from 100 s until the grow decided at
    /// 150 s, 4 workers from 170 s to 200 s.
    #[test]
    fn the_running_time_by_size_is_held_against_the_pods_and_a_lost_nodes_renewal() {
        let pod = |attempt, rank: u32, started, finished: Option<i64>| PodTimes {
            job: "j".into(),
            name: format!("w{rank}"),
            attempt,
            gpus: 1,
            node: "n".into(),
            created: at(0),
            started: Some(at(started)),
            finished: finished.map(at),
        };
        let mut pods: Vec<PodTimes> = (0..4)
            .map(|r| pod(0, r, 10, (r >= 2).then_some(75)))
            .collect();
        pods.extend((0..2).map(|r| pod(2, r, 100, Some(152))));
        pods.extend((0..4).map(|r| pod(3, r, 170, Some(200))));
        let attempts = [
            SizedAttempt {
                attempt: 0,
                workers: 4,
                ended: Ended::NodeLost {
                    at: at(60),
                    heard_before: Duration::from_secs(10),
                },
            },
            SizedAttempt {
                attempt: 2,
                workers: 2,
                ended: Ended::DecidedAt(at(150)),
            },
            SizedAttempt {
                attempt: 3,
                workers: 4,
                ended: Ended::LastExit,
            },
        ];
        let ledger = |four: u64| GoodputLedger {
            elastic: Some(trainyard_api::crd::ElasticLedger {
                by_workers: vec![
                    trainyard_api::crd::SizeMillis {
                        workers: 2,
                        of: 4,
                        wall_millis: 50_000,
                        gpu_millis: 100_000,
                    },
                    trainyard_api::crd::SizeMillis {
                        workers: 4,
                        of: 4,
                        wall_millis: four,
                        gpu_millis: four * 4,
                    },
                ],
                ..Default::default()
            }),
            ..GoodputLedger::default()
        };
        // The last renewal at 52 s: 42 s + 30 s at 4 workers.
        let sizes = check_sizes(&ledger(72_000), &pods, &attempts).expect("within the renewal");
        assert_eq!(sizes[&2], 50.0);
        // Counted to the survivors' stop (65 s + 30 s), or far too short: not what happened.
        let err = check_sizes(&ledger(95_000), &pods, &attempts).expect_err("too long");
        // It names the pods' bounds of each attempt, so a failure shows which one is off.
        let err = err.to_string();
        assert!(
            err.contains(&format!(
                "attempt 0 (4 workers): from {} to between {} and {}",
                at(10),
                at(50),
                at(60)
            )) && err.contains("attempt 3 (4 workers)"),
            "{err}"
        );
        assert!(check_sizes(&ledger(60_000), &pods, &attempts).is_err());
    }
}
