//! The restart floors: the operator's preemption burst made directly, round by round, either
//! as cheaply as the API server allows or as a correct controller must, timed like the
//! operator's so that both can be compared.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use futures::{StreamExt, future};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use trainyard_operator::surface::{TrainingJob, pod_name};

use super::create_floors::create_pods;
use super::kubelet::delete_pod;
use super::kubelet::preempt_pod;
use super::kubelet::preempted_rank;
use super::numbered;
use super::objects::FAIR_FIELD_MANAGER;
use super::objects::floor_pods;
use super::objects::restart_status_patch;
use super::params::OperatorBenchParams;
use super::results::Recovery;
use super::timing::wait_all_scheduled;
use super::timing::wait_recovered;
use crate::cpu_profile::{CpuProfile, CpuSampler};
use crate::error::{Error, Result};
use crate::pod_tracker::PodTracker;
use crate::recovery_stages::{self, RecoveryStages};

/// Where a restart floor's rounds record the CPU they cost: the sampler, the phase's name, the
/// report's table.
type CpuRecord<'a> = (
    &'a CpuSampler,
    &'a str,
    &'a mut BTreeMap<String, CpuProfile>,
);

/// Where and how a restart floor restarts the jobs.
pub(super) struct RestartFloor<'a> {
    /// The pods' API (through a counting proxy).
    pub(super) pods: &'a Api<Pod>,
    pub(super) ns: &'a str,
    /// The watch of `ns`'s pods, which finishes graceful deletions as a kubelet would.
    pub(super) tracker: &'a PodTracker,
    /// The attempt its first round creates (each round creates the next one).
    pub(super) first: u32,
    /// With a controller's means: restart as a correct controller must
    /// ([`restart_as_controller`]); without: as cheaply as the API server allows
    /// ([`restart_directly`]).
    pub(super) controller: Option<ControllerMeans<'a>>,
}

/// What a correct controller restarts the jobs with: the TrainingJobs' API and its own pod
/// watch (the TrainingJob watch it also keeps is a [`DrainedWatch`]).
#[derive(Clone, Copy)]
pub(super) struct ControllerMeans<'a> {
    pub(super) jobs: &'a Api<TrainingJob>,
    pub(super) pods: &'a PodTracker,
}

/// A watch whose events are read and dropped: what a controller's watch of its objects costs
/// the API server and the client. Stops when dropped.
pub(super) struct DrainedWatch(tokio::task::JoinHandle<()>);

impl DrainedWatch {
    pub(super) fn start(api: Api<TrainingJob>) -> Self {
        Self(tokio::spawn(async move {
            let mut events = watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            while events.next().await.is_some() {}
        }))
    }
}

impl Drop for DrainedWatch {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl RestartFloor<'_> {
    /// The floor, once per round: the same K restarts made directly, no controller in the
    /// loop. Round `r` (from 0) restarts the jobs' attempt `first + r - 1` as `first + r`,
    /// preempting the rank the operator's round `r` preempts. Each round's CPU goes into
    /// `cpu`, as the operator's rounds' does, so that their costs can be compared.
    pub(super) async fn rounds(
        &self,
        jobs: &[TrainingJob],
        nodes: &[Node],
        params: &OperatorBenchParams,
        (sampler, phase, cpu): CpuRecord<'_>,
    ) -> Result<Vec<Recovery>> {
        let (ns, tracker) = (self.ns, self.tracker);
        let mut rounds = Vec::new();
        for round in 0..params.rounds {
            let next = self.first + round;
            let pods = floor_pods(&jobs[..params.preempt as usize], ns, nodes, params, next)?;
            tracing::info!(
                restarts = params.preempt,
                round = round + 1,
                ns,
                phase,
                "floor: restarting jobs directly"
            );
            let cpu0 = sampler.sample();
            let restarted = match self.controller {
                None => restart_directly(self.pods, ns, pods, params, round).await?,
                Some(means) => {
                    let old = live_pods(means.pods, next - 1);
                    let apis = (means.jobs, self.pods, means.pods);
                    let attempts = (next, round);
                    restart_as_controller(apis, ns, pods, old, params, attempts).await?
                }
            };
            let recovered = wait_recovered(
                tracker,
                &restarted,
                params.workers,
                next,
                params.phase_timeout,
            )
            .await?;
            cpu.insert(
                numbered(phase, "round", round, params.rounds),
                sampler.between(&cpu0, &sampler.sample()),
            );
            // Let the scheduler bind them before they are deleted: binding pods that are gone
            // would still occupy it when the operator's pods arrive (seen: a scheduled ratio
            // of 1.74 instead of about 1.0 at 100 jobs).
            wait_all_scheduled(tracker, "the restart floor's pods", params.phase_timeout).await?;
            let mut recovery =
                Recovery::from_seconds(params.preempt, recovered.into_values().collect(), None);
            // The floor decides nothing: no decision instants, no log.
            recovery.stages = Some(RecoveryStages::from_timelines(&recovery_stages::timelines(
                &tracker.records(),
                &restarted,
                &HashMap::new(),
                params.workers,
                next,
            )));
            tracing::info!(
                round = round + 1,
                ns,
                phase,
                p50 = recovery.p50_seconds,
                p99 = recovery.p99_seconds,
                "restart floor done"
            );
            rounds.push(recovery);
        }
        Ok(rounds)
    }
}

/// The restart floor: for each job at once, what a restart minimally costs the API server with
/// no controller in the loop: the preemption itself (DisruptionTarget, then delete, as in
/// [`preempt`](super::kubelet::preempt)), the other workers deleted with grace period 0 and the next attempt's pods
/// created. Returns when each job's restart began.
async fn restart_directly(
    api: &Api<Pod>,
    ns: &str,
    next: Vec<Vec<Pod>>,
    params: &OperatorBenchParams,
    round: u32,
) -> Result<HashMap<String, Instant>> {
    let burst = next.into_iter().enumerate().map(|(i, pods)| {
        let api = api.clone();
        async move {
            let job = format!("job-{i:05}");
            let rank = preempted_rank(i as u32, round, params.workers);
            let preempted = pod_name(&job, rank);
            let at = Instant::now();
            preempt_pod(&api, ns, &preempted).await?;
            let dp = DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            };
            let deletes = pods.iter().map(|p| {
                let (api, dp, name) = (api.clone(), dp.clone(), p.name_any());
                async move { delete_pod(&api, ns, &name, &dp).await }
            });
            future::join_all(deletes)
                .await
                .into_iter()
                .collect::<Result<()>>()?;
            create_pods(&api, &pods).await?;
            Ok((job, at))
        }
    });
    future::join_all(burst).await.into_iter().collect()
}

/// The pods of `attempt` that the watch shows not deleted, by job: (name, uid).
fn live_pods(tracker: &PodTracker, attempt: u32) -> HashMap<String, Vec<(String, String)>> {
    let mut by_job: HashMap<String, Vec<(String, String)>> = HashMap::new();
    for p in tracker.records() {
        if let Some(job) = p
            .job
            .filter(|_| p.attempt == Some(attempt) && p.deleted.is_none())
        {
            by_job.entry(job).or_default().push((p.name, p.uid));
        }
    }
    by_job
}

/// The restart floor as a correct controller restarts, for each job at once: the preemption
/// (as in [`preempt`](super::kubelet::preempt)); one status write (server-side apply: Restarting, the next attempt),
/// which a controller must make before it stops anything, so that a controller that dies
/// mid-restart neither loses nor double-counts it; the other workers deleted gracefully with
/// their uid preconditions, so that their trainers can save a checkpoint (here the pod
/// watch finishes each deletion at once, as a kubelet does once the containers stopped);
/// and, once the watch shows every old pod gone (the next attempt reuses their names), the
/// next attempt's pods created, owned by the job. No Event, no decision: what any correct
/// controller must ask of the API server, and nothing more. Returns when each job's restart
/// began.
async fn restart_as_controller(
    (jobs, api, tracker): (&Api<TrainingJob>, &Api<Pod>, &PodTracker),
    ns: &str,
    next: Vec<Vec<Pod>>,
    mut old: HashMap<String, Vec<(String, String)>>,
    params: &OperatorBenchParams,
    (attempt, round): (u32, u32),
) -> Result<HashMap<String, Instant>> {
    let burst = next.into_iter().enumerate().map(|(i, mut pods)| {
        let job = format!("job-{i:05}");
        let old = old.remove(&job).unwrap_or_default();
        async move {
            let rank = preempted_rank(i as u32, round, params.workers);
            let preempted = pod_name(&job, rank);
            let at = Instant::now();
            preempt_pod(api, ns, &preempted).await?;
            let status = restart_status_patch(&job, attempt)?;
            let written = jobs
                .patch_status(
                    &job,
                    &PatchParams::apply(FAIR_FIELD_MANAGER).force(),
                    &Patch::Apply(&status),
                )
                .await
                .map_err(Error::kube(format!(
                    "floor: writing the restart status of TrainingJob {ns}/{job}"
                )))?;
            let deletes = old
                .iter()
                .filter(|(name, _)| *name != preempted)
                .map(|(name, uid)| {
                    let dp = DeleteParams {
                        preconditions: Some(Preconditions {
                            uid: Some(uid.clone()),
                            resource_version: None,
                        }),
                        ..DeleteParams::default()
                    };
                    async move { delete_pod(api, ns, name, &dp).await }
                });
            future::join_all(deletes)
                .await
                .into_iter()
                .collect::<Result<()>>()?;
            let uids: Vec<String> = old.into_iter().map(|(_, uid)| uid).collect();
            let what = format!("the old pods of {ns}/{job} to be gone");
            tracker.gone(&what, &uids, params.phase_timeout).await?;
            if let Some(owner) = written.controller_owner_ref(&()) {
                for pod in &mut pods {
                    pod.metadata.owner_references = Some(vec![owner.clone()]);
                }
            }
            create_pods(api, &pods).await?;
            Ok((job, at))
        }
    });
    future::join_all(burst).await.into_iter().collect()
}
