//! The create floors: the pods-only floor (the operator's pods created directly) and the fair
//! floor (per job its TrainingJob, Service, pods and one status write, made directly), each
//! timed to every pod created and scheduled; the restart floors run among their pods.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::future;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource, ResourceExt};
use trainyard_operator::surface::TrainingJob;

use super::RunContext;
use super::numbered;
use super::objects::FAIR_FIELD_MANAGER;
use super::objects::FairJob;
use super::objects::fair_floor_jobs;
use super::objects::fair_status_patch;
use super::objects::floor_pods;
use super::objects::set_owner;
use super::params::OperatorBenchParams;
use super::restart_floors::ControllerMeans;
use super::restart_floors::DrainedWatch;
use super::restart_floors::RestartFloor;
use super::results::OperatorBenchReport;
use super::results::Throughput;
use super::timing::timed_writes;
use crate::cpu_profile::{CpuProfile, CpuSampler};
use crate::error::{Error, Result};
use crate::pod_tracker::PodTracker;
use crate::proxy::CountingProxy;
use crate::recovery_stages::FIRST_RESTART;
use crate::stats::median_by;

/// The pods-only floor: the operator's own pods, built by its pure builders, created directly;
/// then the restart floor among them. Its pods are deleted at the end.
pub(super) async fn pods_only_floor(
    ctx: &RunContext<'_>,
    ns: &str,
    jobs: &[TrainingJob],
    report: &mut OperatorBenchReport,
) -> Result<()> {
    let (client, params, sampler) = (ctx.client, ctx.params, ctx.sampler);
    let floor_pods = floor_pods(jobs, ns, ctx.nodes, params, 0)?;
    let expected = floor_pods.iter().map(Vec::len).sum::<usize>() as u64;
    let proxy = CountingProxy::start(ctx.upstream.clone()).await?;
    let tracker = PodTracker::start(client, ns, true).await?;
    tracing::info!(pods = expected, "floor: creating the pods directly");
    let api: Api<Pod> = Api::namespaced(proxy.client(ns)?, ns);
    let cpu0 = sampler.sample();
    let creates = floor_pods.into_iter().map(|job_pods| {
        let api = api.clone();
        async move { create_pods(&api, &job_pods).await }
    });
    let mut floor = timed_writes(&tracker, creates, expected, "floor", params, |_| true).await?;
    report.cpu.insert(
        "floor".to_owned(),
        sampler.between(&cpu0, &sampler.sample()),
    );
    floor.requests = proxy.counts();
    floor.peak_in_flight = proxy.take_peak_in_flight();
    tracing::info!(
        created = floor.created_seconds,
        scheduled = floor.scheduled_seconds,
        "floor done"
    );
    report.floor = Some(floor);

    // The restart floor: the same K restarts made directly, no controller in the loop.
    if params.preempt > 0 {
        let cpu = (ctx.sampler, "restart floor", &mut report.cpu);
        let floor = RestartFloor {
            pods: &api,
            ns,
            tracker: &tracker,
            first: FIRST_RESTART,
            controller: None,
        };
        let rounds = floor.rounds(jobs, ctx.nodes, params, cpu).await?;
        report.floor_recovery = median_by(&rounds, |r| r.p99_seconds).cloned();
        report.floor_recovery_rounds = rounds;
    }
    // Free the GPUs for the fair floor's pods.
    delete_pods(client, &tracker, ns, "floor", params.phase_timeout).await
}

/// The fair floor, once per namespace in `nss`: what a correct controller must write at
/// least, written directly. Repeated: it is the reference of a target, and one run of it moved
/// by ±30% (52-97 s at 1,000 jobs) while the operator's own time did not. After the last run,
/// among its jobs' Services, the restart floor the operator is judged against (its pods built
/// from `jobs` in that namespace).
pub(super) async fn fair_floors(
    ctx: &RunContext<'_>,
    nss: &[String],
    jobs: &[TrainingJob],
    report: &mut OperatorBenchReport,
) -> Result<()> {
    let params = ctx.params;
    for (index, ns) in (0..).zip(nss) {
        let fair_jobs = fair_floor_jobs(ns, ctx.run, ctx.nodes, params)?;
        let fair = fair_floor(
            ctx.client,
            ctx.upstream.clone(),
            ns,
            fair_jobs,
            params,
            ctx.sampler,
            (index, &mut report.cpu),
        )
        .await?;
        // In the same surroundings as the operator's restarts: first as cheaply as the API
        // server allows, then as a correct controller must.
        if index + 1 == params.rounds && params.preempt > 0 {
            let mut floor = RestartFloor {
                pods: &fair.pods,
                ns,
                tracker: &fair.tracker,
                first: FIRST_RESTART,
                controller: None,
            };
            let cpu = (ctx.sampler, "restart floor among Services", &mut report.cpu);
            let rounds = floor.rounds(jobs, ctx.nodes, params, cpu).await?;
            report.fair_floor_recovery = median_by(&rounds, |r| r.p99_seconds).cloned();
            report.fair_floor_recovery_rounds = rounds;
            // A controller watches what it controls through its own client, as the operator
            // does: the pods (apart from the benchmark's watch, which times and plays the
            // kubelet) and the TrainingJobs.
            let own_pods = PodTracker::start(&fair.pods.clone().into_client(), ns, false).await?;
            let _own_jobs = DrainedWatch::start(fair.jobs.clone());
            floor.first += params.rounds;
            floor.controller = Some(ControllerMeans {
                jobs: &fair.jobs,
                pods: &own_pods,
            });
            let cpu = (ctx.sampler, "graceful restart floor", &mut report.cpu);
            let before = fair.proxy.counts();
            let rounds = floor.rounds(jobs, ctx.nodes, params, cpu).await?;
            report.graceful_floor_requests = Some(fair.proxy.counts().since(&before));
            report.graceful_floor_recovery = median_by(&rounds, |r| r.p99_seconds).cloned();
            report.graceful_floor_recovery_rounds = rounds;
        }
        // Free the GPUs for the next run's or the operator's pods.
        delete_pods(
            ctx.client,
            &fair.tracker,
            ns,
            "fair floor",
            params.phase_timeout,
        )
        .await?;
        report.fair_floor_runs.push(fair.throughput);
    }
    report.fair_floor = median_by(&report.fair_floor_runs, |f| f.created_seconds).cloned();
    Ok(())
}

/// The fair floor's client, through its counting proxy.
#[derive(Clone)]
struct FairApis {
    jobs: Api<TrainingJob>,
    services: Api<Service>,
    pods: Api<Pod>,
}

/// One job of the fair floor: the TrainingJob created, then at once its Service, its pods
/// and its status write.
async fn write_fair_job(apis: FairApis, ns: &str, fair: FairJob) -> Result<()> {
    let FairJob {
        job,
        mut service,
        mut pods,
    } = fair;
    let name = job.name_any();
    let created = apis
        .jobs
        .create(&PostParams::default(), &job)
        .await
        .map_err(Error::kube(format!(
            "fair floor: creating TrainingJob {ns}/{name}"
        )))?;
    let owner = created
        .controller_owner_ref(&())
        .ok_or_else(|| Error::Build {
            what: format!("an owner reference to TrainingJob {ns}/{name}"),
            message: "the created job has no name or uid".to_owned(),
        })?;
    set_owner(&mut service, &mut pods, &owner);
    let status = fair_status_patch(&created)?;
    let create_service = async {
        apis.services
            .create(&PostParams::default(), &service)
            .await
            .map(|_| ())
            .map_err(Error::kube(format!(
                "fair floor: creating Service {ns}/{name}"
            )))
    };
    let write_status = async {
        apis.jobs
            .patch_status(
                &name,
                &PatchParams::apply(FAIR_FIELD_MANAGER).force(),
                &Patch::Apply(&status),
            )
            .await
            .map(|_| ())
            .map_err(Error::kube(format!(
                "fair floor: writing the status of TrainingJob {ns}/{name}"
            )))
    };
    let (service, pods, status) =
        future::join3(create_service, create_pods(&apis.pods, &pods), write_status).await;
    service.and(pods).and(status)
}

/// The fair floor: per job, the benchmark's TrainingJob create and what a correct controller
/// must write at least for it (Service, pods, one status write), all made directly by a
/// minimal client through a counting proxy with `concurrency` jobs in flight. Timed by a pod
/// watch from the first request, like the other runs; its pods are then deleted, so that the
/// operator finds the fake nodes' GPUs free.
async fn fair_floor(
    client: &Client,
    upstream: Client,
    ns: &str,
    jobs: Vec<FairJob>,
    params: &OperatorBenchParams,
    sampler: &CpuSampler,
    (index, cpu): (u32, &mut BTreeMap<String, CpuProfile>),
) -> Result<FairRun> {
    let expected = jobs.iter().map(|j| j.pods.len()).sum::<usize>() as u64;
    let proxy = CountingProxy::start(upstream).await?;
    let fair_client = proxy.client(ns)?;
    let apis = FairApis {
        jobs: Api::namespaced(fair_client.clone(), ns),
        services: Api::namespaced(fair_client.clone(), ns),
        pods: Api::namespaced(fair_client, ns),
    };
    let tracker = PodTracker::start(client, ns, true).await?;
    tracing::info!(
        pods = expected,
        run = index + 1,
        "fair floor: creating TrainingJobs, Services, pods and status directly"
    );
    let cpu0 = sampler.sample();
    let writes = jobs
        .into_iter()
        .map(|job| write_fair_job(apis.clone(), ns, job));
    let mut fair = timed_writes(&tracker, writes, expected, "fair floor", params, |_| true).await?;
    cpu.insert(
        numbered("fair floor", "run", index, params.rounds),
        sampler.between(&cpu0, &sampler.sample()),
    );
    fair.requests = proxy.counts();
    fair.peak_in_flight = proxy.take_peak_in_flight();
    tracing::info!(
        run = index + 1,
        created = fair.created_seconds,
        scheduled = fair.scheduled_seconds,
        "fair floor done"
    );
    Ok(FairRun {
        throughput: fair,
        jobs: apis.jobs,
        pods: apis.pods,
        tracker,
        proxy,
    })
}

/// A timed run of the fair floor, its pods still there.
struct FairRun {
    throughput: Throughput,
    /// Its TrainingJobs, through its counting proxy.
    jobs: Api<TrainingJob>,
    /// Its pods, through its counting proxy.
    pods: Api<Pod>,
    /// The watch of its namespace's pods.
    tracker: PodTracker,
    /// Serves `jobs` and `pods`, and counts their requests.
    proxy: CountingProxy,
}

/// Force-deletes every pod of a floor's namespace and waits until the watch saw them gone.
/// One DeleteCollection of thousands of pods can outlast the API server's etcd deadline on a
/// busy machine: it is repeated until it goes through (what it deleted before failing stays
/// deleted).
async fn delete_pods(
    client: &Client,
    tracker: &PodTracker,
    ns: &str,
    who: &str,
    timeout: Duration,
) -> Result<()> {
    let api = Api::<Pod>::namespaced(client.clone(), ns);
    let force = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    let mut tries = 0;
    while let Err(e) = api.delete_collection(&force, &ListParams::default()).await {
        tries += 1;
        if tries >= 5 {
            return Err(Error::kube(format!(
                "deleting the {who}'s pods in {ns} ({tries} tries)"
            ))(e));
        }
        tracing::warn!(error = %e, who, "deleting a floor's pods; trying again");
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    tracker
        .wait_until(
            &format!("the {who}'s pods to be deleted"),
            timeout,
            |pods| {
                let left = pods.filter(|p| p.deleted.is_none()).count();
                if left == 0 {
                    Ok(())
                } else {
                    Err(format!("{left} left"))
                }
            },
        )
        .await
}

/// Creates one job's pods at once, as the floor's minimal client.
pub(super) async fn create_pods(api: &Api<Pod>, pods: &[Pod]) -> Result<()> {
    let creates = pods.iter().map(|p| async move {
        api.create(&PostParams::default(), p)
            .await
            .map(|_| ())
            .map_err(Error::kube(format!("floor: creating pod {}", p.name_any())))
    });
    future::join_all(creates).await.into_iter().collect()
}
