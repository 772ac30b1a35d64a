//! The clocks of the timed phases, read from the pod watch: the writes sent with `concurrency`
//! in flight, then the pods seen created, scheduled, or recreated as a job's next attempt.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use kube::api::{Api, ListParams};
use trainyard_operator::surface::{Phase, TrainingJob};

use super::params::OperatorBenchParams;
use super::results::Throughput;
use crate::error::{Error, Result};
use crate::pod_tracker::{PodRecord, PodTracker};
use crate::proxy::RequestCounts;

/// One timed create phase, the same for both floors and the operator: `writes` sent with
/// `concurrency` in flight from the clock's start, then `expected` pods (those `counts`
/// takes) seen created and scheduled. `inputs_done_seconds` is when the writes were answered.
pub(super) async fn timed_writes(
    tracker: &PodTracker,
    writes: impl Iterator<Item = impl Future<Output = Result<()>>>,
    expected: u64,
    who: &str,
    params: &OperatorBenchParams,
    counts: impl Fn(&PodRecord) -> bool,
) -> Result<Throughput> {
    let t0 = Instant::now();
    let results: Vec<Result<()>> = stream::iter(writes)
        .buffer_unordered(params.concurrency)
        .collect()
        .await;
    let inputs_done = t0.elapsed().as_secs_f64();
    results.into_iter().collect::<Result<()>>()?;
    let mut timed =
        wait_created_scheduled(tracker, t0, expected, who, params.phase_timeout, counts).await?;
    timed.inputs_done_seconds = inputs_done;
    Ok(timed)
}

async fn wait_created_scheduled(
    tracker: &PodTracker,
    t0: Instant,
    expected: u64,
    who: &str,
    timeout: Duration,
    counts: impl Fn(&PodRecord) -> bool,
) -> Result<Throughput> {
    let times = |pods: &mut dyn Iterator<Item = &PodRecord>| -> (Vec<Instant>, Vec<Instant>) {
        let mut seen = Vec::new();
        let mut scheduled = Vec::new();
        for p in pods.filter(|p| counts(p)) {
            seen.push(p.seen);
            scheduled.extend(p.scheduled);
        }
        (seen, scheduled)
    };
    let (mut seen, scheduled) = tracker
        .wait_until(
            &format!("{who}: {expected} pods created and scheduled"),
            timeout,
            |pods| {
                let (seen, scheduled) = times(pods);
                if scheduled.len() as u64 >= expected {
                    Ok((seen, scheduled))
                } else {
                    Err(format!(
                        "{} created, {} scheduled",
                        seen.len(),
                        scheduled.len()
                    ))
                }
            },
        )
        .await?;
    seen.sort();
    let secs = |t: Option<&Instant>| {
        t.map(|t| t.saturating_duration_since(t0).as_secs_f64())
            .unwrap_or_default()
    };
    Ok(Throughput {
        pods: expected,
        created_seconds: secs(seen.last()),
        half_created_seconds: secs(seen.get(seen.len() / 2)),
        scheduled_seconds: secs(scheduled.iter().max()),
        requests: RequestCounts::default(),
        peak_in_flight: 0,
        inputs_done_seconds: 0.0,
    })
}

/// How many TrainingJobs are Running now (one list).
pub(super) async fn jobs_running(api: &Api<TrainingJob>) -> Result<u64> {
    let list = api
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("listing the TrainingJobs"))?;
    let running = list
        .items
        .iter()
        .filter(|j| j.status.as_ref().and_then(|s| s.phase) == Some(Phase::Running))
        .count();
    Ok(running as u64)
}

/// Waits until the watch saw every pod that is not deleted scheduled.
pub(super) async fn wait_all_scheduled(
    tracker: &PodTracker,
    what: &str,
    timeout: Duration,
) -> Result<()> {
    tracker
        .wait_until(&format!("{what} to be scheduled"), timeout, |pods| {
            let left = pods
                .filter(|p| p.deleted.is_none() && p.scheduled.is_none())
                .count();
            if left == 0 {
                Ok(())
            } else {
                Err(format!("{left} not scheduled"))
            }
        })
        .await
}

/// Seconds from each job's preemption to every pod of its attempt `next` seen created.
pub(super) async fn wait_recovered(
    tracker: &PodTracker,
    preempted: &HashMap<String, Instant>,
    workers: u32,
    next: u32,
    timeout: Duration,
) -> Result<HashMap<String, f64>> {
    let jobs: HashSet<&String> = preempted.keys().collect();
    tracker
        .wait_until(
            &format!("{} preempted jobs' next attempts", jobs.len()),
            timeout,
            |pods| {
                let mut latest: HashMap<&str, (u32, Instant)> = HashMap::new();
                for p in pods {
                    let Some(job) = p.job.as_ref().filter(|j| jobs.contains(j)) else {
                        continue;
                    };
                    if p.attempt != Some(next) {
                        continue;
                    }
                    let e = latest.entry(job.as_str()).or_insert((0, p.seen));
                    e.0 += 1;
                    e.1 = e.1.max(p.seen);
                }
                let done = latest.values().filter(|(n, _)| *n >= workers).count();
                if done < jobs.len() {
                    return Err(format!("{done} of {} recovered", jobs.len()));
                }
                Ok(latest
                    .into_iter()
                    .filter_map(|(job, (_, at))| {
                        let start = preempted.get(job)?;
                        Some((
                            job.to_owned(),
                            at.saturating_duration_since(*start).as_secs_f64(),
                        ))
                    })
                    .collect())
            },
        )
        .await
}
