//! The restart state machine, driven round by round as the controller would: the `World`
//! simulator and the helpers the test files share. The tests sit in one file per phase or topic.

use std::sync::Arc;

use jiff::SignedDuration;
use k8s_openapi::api::core::v1::{Node, Pod};

use super::observed::is_finished;
use super::outcome::{PhaseName, failure_backoff};
use super::*;
use crate::fixtures::{job_yaml, node, ts};
use crate::model::cached_pod::CachedPod;
use crate::model::condition::condition_is_true;
use crate::model::crd::{LABEL_ATTEMPT, LABEL_JOB_UID, StretchUse, WorkerStatus};
use crate::model::crd::{Phase, RestartReason};
use crate::model::events::EventKind;
use crate::model::liveness::Heartbeats;
use crate::model::ownership::{Foreign, Kind};
use crate::model::validate::validate;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde_json::json;
use trainyard_api::env::{RESUME_FROM, TRAINYARD_ATTEMPT, TRAINYARD_RESTART_REASON};

mod claim;
mod create;
mod early_warning;
mod elastic;
mod fallback;
mod finish;
mod foreign;
mod hang;
mod in_place;
mod invalid_spec;
mod kueue;
mod ledger;
mod liveness;
mod lost_peer;
mod notice;
mod progress;
mod removal;
mod requeue;
mod restart;
mod standby;
mod suspend;
mod terminal;
mod unschedulable;
mod worker_status;

const T0: &str = "2026-01-01T00:00:00Z";

struct World {
    job: ValidJob,
    config: OperatorConfig,
    status: TrainingJobStatus,
    pods: Vec<Arc<Pod>>,
    nodes: Vec<Arc<Node>>,
    /// What the operator saw of the kubelets' Lease renewals.
    beats: Heartbeats,
    claim: Option<ObservedClaim>,
    service_exists: bool,
    now: Timestamp,
    /// The phase that decided each round [`World::step`] took, in order.
    decided: Vec<PhaseName>,
    /// What the trainers reported through the progress channel.
    progress: Option<ObservedProgress>,
    /// The attempt whose starting Event the operator has told (as the executor records it
    /// for every round [`World::step`] carries out).
    told: Option<u32>,
    /// What the workers' in-place restart supervisors last said.
    supervisors: Vec<crate::model::supervision::SupervisorSeen>,
    /// When the operator began listening to them (it became the leader).
    supervisors_since: Option<Timestamp>,
    /// The GPUs in use per node, as the controller reads them for an elastic job.
    gpus_in_use: Option<std::collections::BTreeMap<String, u64>>,
    /// Kueue, where installed: the job's Workload (once created) and the ResourceFlavors.
    kueue: Option<(
        Option<crate::model::kueue::Workload>,
        std::collections::BTreeMap<String, crate::model::kueue::ResourceFlavorSpec>,
    )>,
    /// How far the API server's clock (pods' `creationTimestamp`) is ahead of the operator's.
    api_clock_ahead: jiff::SignedDuration,
}

impl World {
    fn new(yaml: &str) -> Self {
        Self {
            job: validate(&job_yaml(yaml)).expect("valid"),
            config: OperatorConfig::default(),
            status: TrainingJobStatus::default(),
            pods: Vec::new(),
            nodes: vec![Arc::new(node("n-1").gpus(8).product("Tesla-T4").build())],
            beats: Heartbeats::default(),
            claim: None,
            service_exists: false,
            now: ts(T0),
            decided: Vec::new(),
            progress: None,
            told: None,
            supervisors: Vec::new(),
            supervisors_since: Some(ts(T0)),
            gpus_in_use: None,
            kueue: None,
            api_clock_ahead: jiff::SignedDuration::ZERO,
        }
    }

    /// Where the job's Workload stands, as the controller would observe it.
    fn queued(&self) -> Option<crate::model::kueue::Queued> {
        use crate::model::kueue::{Queued, seen};
        self.job.queue.as_ref()?;
        let Some((workload, flavors)) = &self.kueue else {
            return Some(Queued::NoKueue);
        };
        Some(match workload {
            None => Queued::NoWorkload,
            Some(w) => Queued::Workload(Box::new(seen(w, |f| flavors.get(f).cloned()))),
        })
    }

    fn observed(&self) -> Observed {
        Observed {
            pods: self
                .pods
                .iter()
                .map(|p| Arc::new(CachedPod::from(p.as_ref())))
                .collect(),
            sibling_placement: self.sibling_placement(),
            gpus_in_use: self.gpus_in_use.clone(),
            progress: self.progress.clone(),
            foreign: Vec::new(),
            nodes: self.nodes.clone(),
            liveness: self.beats.view(
                self.pods
                    .iter()
                    .filter_map(|p| p.spec.as_ref()?.node_name.as_deref()),
                self.now,
            ),
            claim: self.claim.clone(),
            service_exists: self.service_exists,
            told_attempt: self.told,
            last_writes: None,
            unseen_writes: Vec::new(),
            queue: self.queued(),
            supervisors: self.supervisors.clone(),
            supervisors_since: self.supervisors_since,
            now: self.now,
        }
    }

    /// What the controller reads whole for a half-created attempt (it reads it only when a
    /// missing rank was not just created; here nothing is held back, so always).
    fn sibling_placement(&self) -> Option<SiblingPlacement> {
        let of_attempt = |p: &&Arc<Pod>| {
            crate::build::pods::label_u32(p.as_ref(), LABEL_ATTEMPT) == Some(self.status.attempt)
        };
        let present: Vec<&Arc<Pod>> = self.pods.iter().filter(of_attempt).collect();
        if present.is_empty() || present.len() >= self.job.spec.workers as usize {
            return None;
        }
        let first = present.iter().min_by_key(|p| {
            crate::build::pods::label_u32(p.as_ref(), crate::model::crd::LABEL_RANK)
        })?;
        Some(SiblingPlacement::of(first))
    }

    fn decide(&self) -> Plan {
        decide(&self.job, &self.observed(), &self.status, &self.config)
    }

    /// Decides, persists the status and carries out the actions like the API server would
    /// (created pods appear Pending on n-1; deleted ones get a deletionTimestamp).
    fn step(&mut self) -> Plan {
        let plan = self.decide();
        self.decided.push(plan.decided_by);
        self.status = plan.status.clone();
        if plan.status.attempt > 0 {
            self.told = Some(plan.status.attempt);
        }
        for a in &plan.actions {
            match a {
                Action::CreateService(_) => self.service_exists = true,
                Action::CreatePodGroup(_) => {}
                Action::CreateWorkload(w) => {
                    if let Some((workload @ None, _)) = self.kueue.as_mut() {
                        *workload = Some((**w).clone());
                    }
                }
                Action::WriteWorkloadStatus {
                    conditions,
                    release,
                    ..
                } => {
                    if let Some((Some(w), _)) = self.kueue.as_mut() {
                        let status = w.status.get_or_insert_with(Default::default);
                        status.conditions = conditions.clone();
                        if *release {
                            status.admission = None;
                        }
                    }
                }
                Action::CreatePvc(c) => {
                    self.claim = Some(ObservedClaim::of(&c.metadata, &self.job));
                }
                Action::SetClaimOwners { owners, .. } => {
                    if let Some(c) = self.claim.as_mut() {
                        c.owners = owners.clone();
                    }
                }
                Action::CreatePod(p) => {
                    let mut pod = (**p).clone();
                    let name = pod.metadata.name.clone().expect("name");
                    if self
                        .pods
                        .iter()
                        .any(|x| x.metadata.name.as_deref() == Some(&name))
                    {
                        continue;
                    }
                    pod.metadata.uid = Some(format!("{name}-{}", self.status.attempt));
                    pod.metadata.creation_timestamp = Some(Time(
                        self.now
                            .saturating_add(self.api_clock_ahead)
                            .expect("in range"),
                    ));
                    if let Some(spec) = pod.spec.as_mut() {
                        spec.node_name = Some("n-1".into());
                    }
                    pod.status = serde_json::from_value(json!({"phase": "Pending"})).ok();
                    self.pods.push(Arc::new(pod));
                }
                Action::DeletePod { name, .. } => self.modify(name, |p| {
                    if p.metadata.deletion_timestamp.is_none() {
                        p.metadata.deletion_timestamp = Some(Time(ts(T0)));
                    }
                }),
                Action::ForceDeletePod { name, .. } => self
                    .pods
                    .retain(|p| p.metadata.name.as_deref() != Some(name)),
                Action::RelabelPod { name, attempt, .. } => self.modify(name, |p| {
                    p.metadata
                        .labels
                        .get_or_insert_with(Default::default)
                        .insert(LABEL_ATTEMPT.to_owned(), attempt.to_string());
                }),
            }
        }
        plan
    }

    fn modify(&mut self, name: &str, f: impl FnOnce(&mut Pod)) {
        if let Some(slot) = self
            .pods
            .iter_mut()
            .find(|p| p.metadata.name.as_deref() == Some(name))
        {
            let mut pod = (**slot).clone();
            f(&mut pod);
            *slot = Arc::new(pod);
        }
    }

    fn set_status(&mut self, name: &str, status: serde_json::Value) {
        self.modify(name, |p| p.status = serde_json::from_value(status).ok());
    }

    fn run_all(&mut self) {
        for p in self.pods.clone() {
            let name = p.metadata.name.clone().expect("name");
            self.set_status(
                &name,
                json!({"phase": "Running", "startTime": T0, "containerStatuses": [
                {"name": "trainer", "ready": true, "restartCount": 0, "image": "x", "imageID": "",
                 "state": {"running": {"startedAt": T0}}}]}),
            );
        }
    }

    fn exit(&mut self, name: &str, code: i32) {
        let phase = if code == 0 { "Succeeded" } else { "Failed" };
        self.set_status(
            name,
            json!({"phase": phase, "startTime": T0, "containerStatuses": [
            {"name": "trainer", "ready": false, "restartCount": 0, "image": "x", "imageID": "",
             "state": {"terminated": {"exitCode": code, "finishedAt": self.now.to_string(),
                                      "reason": if code == 0 { "Completed" } else { "Error" }}}}]}),
        );
    }

    /// A second node, `n-2`, with worker 1 moved onto it (a spot node in the stories below).
    fn with_worker_1_on_n2(mut self) -> Self {
        self.nodes
            .push(Arc::new(node("n-2").gpus(8).product("Tesla-T4").build()));
        self.modify("train-worker-1", |p| {
            p.spec.as_mut().expect("spec").node_name = Some("n-2".into());
        });
        self
    }

    fn replace_node(&mut self, built: Node) {
        let name = built.metadata.name.clone();
        self.nodes.retain(|n| n.metadata.name != name);
        self.nodes.push(Arc::new(built));
    }

    /// `node`'s kubelet renews its 40-s Lease now, and the operator sees it at once.
    fn heartbeat(&mut self, node: &str) {
        self.heartbeat_seen(node, self.now, self.now);
    }

    /// `node`'s kubelet renews its 40-s Lease, stamped `renewed` on its clock; the operator
    /// sees it at `seen`.
    fn heartbeat_seen(&mut self, node: &str, renewed: Timestamp, seen: Timestamp) {
        self.beats
            .renewal(node, renewed, SignedDuration::from_secs(40), seen);
    }

    /// The operator has watched `nodes` renew on time every 10 s for the minute before now, so
    /// the liveness margin is measured (a quiet cluster: the floor).
    fn watched_a_quiet_minute(&mut self, nodes: &[&str]) {
        for back in (1..=6).rev() {
            let t = self
                .now
                .checked_sub(SignedDuration::from_secs(10 * back))
                .expect("time");
            for n in nodes {
                self.heartbeat_seen(n, t, t);
            }
        }
    }

    /// The kubelet finishes every pending deletion.
    fn kubelet_removes_deleted(&mut self) {
        self.pods
            .retain(|p| p.metadata.deletion_timestamp.is_none());
    }

    fn creates(plan: &Plan) -> Vec<&Pod> {
        plan.actions
            .iter()
            .filter_map(|a| match a {
                Action::CreatePod(p) => Some(p.as_ref()),
                _ => None,
            })
            .collect()
    }

    /// The pods a plan deletes gracefully, or (`forced`) without a grace period.
    fn deleted(plan: &Plan, forced: bool) -> Vec<&str> {
        plan.actions
            .iter()
            .filter_map(|a| match a {
                Action::DeletePod { name, .. } if !forced => Some(name.as_str()),
                Action::ForceDeletePod { name, .. } if forced => Some(name.as_str()),
                _ => None,
            })
            .collect()
    }

    fn deletes(plan: &Plan) -> usize {
        plan.actions
            .iter()
            .filter(|a| matches!(a, Action::DeletePod { .. }))
            .count()
    }

    fn advance(&mut self, secs: i64) {
        self.now = self
            .now
            .saturating_add(SignedDuration::from_secs(secs))
            .expect("time");
    }

    fn running_world(yaml: &str) -> Self {
        let mut w = Self::new(yaml);
        w.step();
        w.run_all();
        w.step();
        assert_eq!(w.status.phase, Some(Phase::Running));
        w
    }

    fn preempt(&mut self, name: &str) {
        self.modify(name, |p| {
            let mut s = p.status.clone().unwrap_or_default();
            s.conditions = serde_json::from_value(json!([{"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet"}])).ok();
            p.status = Some(s);
        });
    }
}

fn env(pod: &Pod, key: &str) -> Option<String> {
    pod.spec.as_ref()?.containers[0]
        .env
        .as_ref()?
        .iter()
        .find(|e| e.name == key)?
        .value
        .clone()
}

/// What trainers of `attempt` report: each rank at `step`, advanced and reported at `at`.
fn reports(attempt: u32, ranks: &[(u32, u64)], at: Timestamp) -> ObservedProgress {
    ObservedProgress {
        attempt,
        ranks: ranks
            .iter()
            .map(|&(rank, step)| ObservedRank {
                rank,
                step,
                advanced_at: at,
                reported_at: at,
            })
            .collect(),
        ..ObservedProgress::default()
    }
}

/// Every rank that reported reports again now, at the step it was at.
fn still_reporting(w: &mut World) {
    let now = w.now;
    for r in w.progress.iter_mut().flat_map(|p| p.ranks.iter_mut()) {
        r.reported_at = now;
    }
}

fn condition_of<'s>(status: &'s TrainingJobStatus, type_: &str) -> Option<&'s JobCondition> {
    status.conditions.iter().find(|c| c.type_ == type_)
}

/// `n-2` with a termination notice (a Karpenter disruption), or without.
/// The first Event of `plan` with `reason`.
fn event<'a>(plan: &'a Plan, reason: &str) -> Option<&'a crate::model::events::JobEvent> {
    plan.events.iter().find(|e| e.reason == reason)
}

fn notice_on_n2(w: &mut World, noticed: bool) {
    let n2 = node("n-2").gpus(8).product("Tesla-T4");
    let n2 = match noticed {
        true => n2.taint(trainyard_api::spot::KARPENTER_DISRUPTED),
        false => n2,
    };
    w.replace_node(n2.build());
}

/// The progress store as the controller keeps it, fed by the World's trainers, and the
/// checkpoint requests of each plan carried out on it as the controller does.
struct Channel {
    store: crate::progress::store::ProgressStore,
}

impl Channel {
    fn new() -> Self {
        Self {
            store: crate::progress::store::ProgressStore::default(),
        }
    }

    /// Rank `rank` of the current attempt reports `step` (and a saved checkpoint).
    fn report(&self, w: &mut World, rank: u32, step: u64, checkpoint: Option<u64>) {
        let report = crate::progress::store::Report {
            rank,
            attempt: w.status.attempt,
            step,
            loss: None,
            checkpoint_step: checkpoint,
            checkpoint_file: None,
            resumed_from: None,
        };
        self.store.record("ml", "train", "uid-1", &report, w.now);
        w.progress = self.observed();
    }

    /// Decides a round and carries out its checkpoint request.
    fn step(&self, w: &mut World) -> Plan {
        let plan = w.step();
        if let Some(attempt) = plan.checkpoint_request {
            self.store.request_checkpoint("ml", "train", attempt);
        }
        if let Some(attempt) = plan.checkpoint_withdrawal {
            self.store
                .withdraw_checkpoint_request("ml", "train", attempt);
        }
        w.progress = self.observed();
        plan
    }

    /// What the controller hands the decision (`observe/recall.rs`).
    fn observed(&self) -> Option<ObservedProgress> {
        let p = self.store.snapshot("ml", "train")?;
        Some(crate::observe::recall::as_observed(p, None))
    }
}

/// Every trainer starts running now.
fn start_all_now(w: &mut World) {
    w.run_all();
    let now = w.now;
    for pod in w.pods.clone() {
        w.modify(pod.metadata.name.as_deref().expect("name"), |p| {
            let status = p.status.as_mut().expect("status");
            for c in status.container_statuses.iter_mut().flatten() {
                if let Some(running) = c.state.as_mut().and_then(|s| s.running.as_mut()) {
                    running.started_at = Some(Time(now));
                }
            }
        });
    }
}

/// Seconds after T0.
fn t(secs: i64) -> Timestamp {
    ts(T0)
        .saturating_add(SignedDuration::from_secs(secs))
        .expect("time")
}

/// The names of the pods a plan creates.
fn created_pods(plan: &Plan) -> Vec<Pod> {
    plan.actions
        .iter()
        .filter_map(|a| match a {
            Action::CreatePod(p) => Some((**p).clone()),
            _ => None,
        })
        .collect()
}

/// A running job with rank 1 on n-2, both ranks reporting, both kubelets renewing on time
/// for the last minute.
fn reporting_on_two_nodes(yaml: &str) -> (World, Channel) {
    let mut w = World::running_world(yaml).with_worker_1_on_n2();
    w.watched_a_quiet_minute(&["n-1", "n-2"]);
    let channel = Channel::new();
    w.heartbeat("n-1");
    w.heartbeat("n-2");
    channel.report(&mut w, 0, 40, None);
    channel.report(&mut w, 1, 40, None);
    channel.step(&mut w);
    (w, channel)
}

/// Rank 0's trainer exits 1 (its collective broke) `failed_at` seconds after n-2's kubelet last
/// renewed (at the start of [`reporting_on_two_nodes`]); n-1 renews at 10 s and at 14 s, when
/// n-2 is silent and the lost-peer rule decides: that round's plan.
fn rank_0_fails_as_n2_falls_silent(w: &mut World, channel: &Channel, failed_at: i64) -> Plan {
    w.exit("train-worker-0", 1);
    let plan = channel.step(w);
    assert_eq!(plan.restart, None, "held until n-2 is known lost");
    assert_eq!(
        plan.status.phase,
        Some(Phase::Running),
        "a held verdict decides nothing: the job still runs"
    );
    w.advance(10 - failed_at);
    w.heartbeat("n-1");
    assert_eq!(channel.step(w).restart, None, "n-2 is due now");
    w.advance(4);
    w.heartbeat("n-1");
    let plan = channel.step(w);
    assert_eq!(plan.restart, Some(RestartReason::Preemption));
    assert_eq!(plan.status.failures, 0);
    plan
}

/// GPU-milliseconds the plan's ledger counts as lost to detection.
fn detection(plan: &Plan) -> u64 {
    let ledger = plan.status.ledger.as_ref().expect("ledger");
    ledger.on_demand.lost_to_detection + ledger.spot.lost_to_detection
}

/// The round's `CreatingWorkers` Event, if it announces an attempt.
fn announcement(plan: &Plan) -> Option<&JobEvent> {
    plan.events.iter().find(|e| e.reason == "CreatingWorkers")
}
