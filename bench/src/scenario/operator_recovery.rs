//! The operator's preemption burst: K workers preempted at once, repeated in rounds on the same
//! jobs, each job's recovery timed and split into stages.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, ListParams};

use super::kubelet::preempt;
use super::kubelet::report_running;
use super::numbered;
use super::params::OperatorBenchParams;
use super::results::OperatorBenchReport;
use super::results::OperatorRequests;
use super::results::OperatorUsage;
use super::results::Recovery;
use super::timing::jobs_running;
use super::timing::wait_recovered;
use crate::cpu_profile::{CpuProfile, CpuSampler};
use crate::error::{Error, Result};
use crate::operator_process::{OperatorProcess, metric_value};
use crate::pod_tracker::{PodRecord, PodTracker};
use crate::proxy::CountingProxy;
use crate::recovery_stages::{self, ClockPair, FIRST_RESTART, RecoveryStages};
use crate::stats::median_by;

/// How long a round waits for the Events that start its jobs' next attempts once their pods
/// are all created (the operator publishes its Events apart from its reconciles).
const EVENT_WAIT: Duration = Duration::from_secs(10);

/// The operator's preemption burst, repeated in rounds on the same jobs.
pub(super) struct Burst<'a> {
    pub(super) client: &'a Client,
    pub(super) ns: &'a str,
    pub(super) params: &'a OperatorBenchParams,
    pub(super) tracker: &'a PodTracker,
    pub(super) operator: &'a mut OperatorProcess,
    pub(super) sampler: &'a CpuSampler,
}

impl Burst<'_> {
    /// Every job Running (as kubelets would report), then every round of the burst; the
    /// operator's memory and requests at each step.
    pub(super) async fn all_rounds(
        &mut self,
        proxy: &CountingProxy,
        report: &mut OperatorBenchReport,
        usage: &mut OperatorUsage,
        requests: &mut OperatorRequests,
    ) -> Result<()> {
        let params = self.params;
        let before = proxy.counts();
        self.running_again(|_| true).await?;
        usage.running = Some(self.operator.usage()?);
        let after_running = proxy.counts();
        requests.running = Some(after_running.since(&before));
        let reconciles_running = super::operator::reconciles_total(self.operator).await;
        if let Some(r) = report.reconciles.as_mut() {
            r.running = reconciles_running;
        }

        for round in 0..params.rounds {
            let recovery = self
                .round(round, &mut report.cpu, &mut report.warnings)
                .await?;
            if round == 0 {
                requests.preemption = Some(proxy.counts().since(&after_running));
            }
            report.recovery_rounds.push(recovery);
            // This round's new pods Running, and every job Running again.
            let restarted = FIRST_RESTART + round;
            self.running_again(|p| p.attempt == Some(restarted)).await?;
            if round == 0 {
                let first = super::operator::reconciles_total(self.operator).await;
                if let Some(r) = report.reconciles.as_mut() {
                    r.first_restart = first;
                }
            }
        }
        report.recovery = median_by(&report.recovery_rounds, |r| r.p99_seconds).cloned();
        usage.recovered = Some(self.operator.usage()?);
        Ok(())
    }

    /// One round: K workers of the first K jobs preempted at once, timed until each job's next
    /// attempt is created, with its stages and the CPU it cost.
    async fn round(
        &mut self,
        round: u32,
        cpu: &mut BTreeMap<String, CpuProfile>,
        warnings: &mut Vec<String>,
    ) -> Result<Recovery> {
        let params = self.params;
        let next = FIRST_RESTART + round;
        let histogram = |m: &str| {
            (
                metric_value(m, "trainyard_operator_preemption_recovery_seconds_sum"),
                metric_value(m, "trainyard_operator_preemption_recovery_seconds_count"),
            )
        };
        let before = histogram(&self.operator.metrics().await.unwrap_or_default());
        tracing::info!(
            preempt = params.preempt,
            round = round + 1,
            "preempting workers"
        );
        let cpu0 = self.sampler.sample();
        // The operator's Events carry wall-clock times; this pair converts them.
        let clock = ClockPair::now();
        let preempted = preempt(self.client, self.ns, params, round).await?;
        let recovered = wait_recovered(
            self.tracker,
            &preempted,
            params.workers,
            next,
            params.phase_timeout,
        )
        .await?;
        cpu.insert(
            numbered("preemption", "round", round, params.rounds),
            self.sampler.between(&cpu0, &self.sampler.sample()),
        );
        self.operator.check_alive()?;
        // The operator's own view of this round: the histogram's growth over it.
        let hist_mean = match (
            before,
            histogram(&self.operator.metrics().await.unwrap_or_default()),
        ) {
            ((sum0, count0), (Some(sum), Some(count))) => {
                let (sum, count) = (sum - sum0.unwrap_or(0.0), count - count0.unwrap_or(0.0));
                (count > 0.0).then(|| sum / count)
            }
            _ => None,
        };
        let mut recovery =
            Recovery::from_seconds(params.preempt, recovered.into_values().collect(), hist_mean);
        recovery.stages = Some(self.stages(&preempted, clock, next, warnings).await);
        tracing::info!(
            round = round + 1,
            p50 = recovery.p50_seconds,
            p99 = recovery.p99_seconds,
            "recovery done"
        );
        Ok(recovery)
    }

    /// The round's stages: the pod watch's records and the restart decisions, read from the
    /// Events that start each job's next attempt.
    async fn stages(
        &self,
        preempted: &HashMap<String, Instant>,
        clock: ClockPair,
        next: u32,
        warnings: &mut Vec<String>,
    ) -> RecoveryStages {
        let decided = self.decisions(preempted, clock, next, warnings).await;
        RecoveryStages::from_timelines(&recovery_stages::timelines(
            &self.tracker.records(),
            preempted,
            &decided,
            self.params.workers,
            next,
        ))
    }

    /// When the operator decided each preempted job's restart as `next`: the `eventTime` of the
    /// events.k8s.io/v1 Event that starts that attempt, listed from the namespace. The operator
    /// publishes its Events apart from its reconciles, so one may show up after the pods: the
    /// list is read again until every preempted job has its Event or [`EVENT_WAIT`] passes; a
    /// job still without one is left out of the stages that need it (the report's "jobs"
    /// column shows how many). Events that cannot be listed leave every decision out (with a
    /// warning), never the run.
    async fn decisions(
        &self,
        preempted: &HashMap<String, Instant>,
        clock: ClockPair,
        next: u32,
        warnings: &mut Vec<String>,
    ) -> HashMap<String, Instant> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), self.ns);
        let deadline = Instant::now() + EVENT_WAIT;
        loop {
            let listed = match events.list(&ListParams::default()).await {
                Ok(list) => list.items,
                Err(e) => {
                    warnings.push(format!(
                        "listing the Events in {} for the restart decisions: {e}; the recovery breakdown leaves out the stages that need them",
                        self.ns
                    ));
                    return HashMap::new();
                }
            };
            let decided = recovery_stages::decisions(&listed, preempted, next, clock);
            if decided.len() >= preempted.len() || Instant::now() >= deadline {
                if decided.len() < preempted.len() {
                    tracing::warn!(
                        found = decided.len(),
                        preempted = preempted.len(),
                        attempt = next,
                        "not every restarted job has the Event that starts its attempt"
                    );
                }
                return decided;
            }
            // A list of every Event is not free at 1,000 jobs; this wait is not timed.
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// The pods that are not deleted and that `which` takes reported Running, as kubelets
    /// would, then every job Running; then a second for the status writes to settle. A pod
    /// the operator replaces meanwhile (a fake node taken for lost under load) is skipped and
    /// its replacement reported Running in turn, as its node's kubelet would.
    async fn running_again(&self, which: impl Fn(&PodRecord) -> bool) -> Result<()> {
        let start = Instant::now();
        let deadline = start + self.params.phase_timeout;
        let jobs = Api::namespaced(self.client.clone(), self.ns);
        let mut reported = HashSet::new();
        let mut replaced = 0;
        loop {
            let (uids, pods): (Vec<String>, Vec<String>) = self
                .tracker
                .records()
                .into_iter()
                .filter(|p| p.deleted.is_none())
                .filter(|p| which(p) || (p.seen > start && p.scheduled.is_some()))
                .filter(|p| !reported.contains(&p.uid))
                .map(|p| (p.uid, p.name))
                .unzip();
            replaced += report_running(self.client, self.ns, pods, self.params.concurrency).await?;
            reported.extend(uids);
            let running = jobs_running(&jobs).await?;
            if running >= u64::from(self.params.jobs) {
                break;
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    what: "every TrainingJob Running".to_owned(),
                    after: self.params.phase_timeout,
                    progress: format!("{running} of {} Running", self.params.jobs),
                });
            }
            // Listing every job is not free at 1,000 jobs; this phase is not timed.
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        if replaced > 0 {
            tracing::warn!(
                replaced,
                "pods replaced by the operator before they were reported Running"
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        Ok(())
    }
}
