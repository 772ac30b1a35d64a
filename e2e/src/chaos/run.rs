//! One chaos run: a real PyTorch DDP job (the example trainer under torchrun, three workers
//! across both nodes, progress reports on, `progressTimeoutSeconds` set) trains while a
//! seeded [`Schedule`] of faults runs against the local cluster, and the [`Checker`] is fed
//! from watches of the job's pods and status throughout, then with how the job ended.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Endpoints, PersistentVolumeClaim, Pod, Service};
use kube::api::{Api, ListParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, reflector, watcher::Config};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use trainyard_api::crd::{LABEL_ATTEMPT, LABEL_JOB, LABEL_RANK, LABEL_STANDBY, TrainingJobSpec};
use trainyard_api::ranks::RankSet;
use trainyard_operator::surface::reason;

use super::checkpoint;
use super::faults::{self, Effect, Injected, Line, Target};
use super::invariants::{Checker, Ending, JobSeen, PodSeen, ProgressSeen, Violation};
use super::schedule::{FaultKind, Schedule, near_a_restart};
use crate::jobs::{
    JOBS_NS, RELEASE_NS, create_job, final_digest, job_pods, job_status, running_pods, tj_api,
    torch_job, wait_phase,
};
use crate::wait_for;

/// How a run's termination notices went with make before break ([`RunReport::standbys`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Standbys {
    pub ready: u32,
    pub given_up: u32,
    pub withdrawn: u32,
}

/// What one run did and found.
#[derive(Debug)]
pub struct RunReport {
    pub seed: u64,
    /// Each fault that came due while the job ran, from the start of the schedule, with what
    /// it came to and did (or why it found nothing to act on).
    pub injected: Vec<Line>,
    /// Faults not injected because the job had ended first.
    pub not_injected: usize,
    pub attempt: u32,
    pub preemptions: u32,
    pub failures: u32,
    pub hangs: u32,
    /// `status.progress.stepsLost` of every restart the run saw, summed.
    pub steps_lost: u64,
    /// How often `latest.pt` was read from the job's volume and checked.
    pub checkpoints_read: u32,
    /// How often the step stored in `latest.pt` was read (from the whole ones).
    pub steps_read: u32,
    /// How often `/proc` was scanned for the job's processes on both nodes.
    pub proc_scans: u32,
    /// Gang restarts that kept pods and restarted their workers in place
    /// (`RestartingInPlace` Events).
    pub in_place: u32,
    /// Termination notices met with make before break: replacements created ahead that
    /// waited for the switch (`StandbyReady` Events), that were given up, with no room for
    /// them in time (`StandbyGivenUp`), and that were deleted as their notice was withdrawn
    /// first (`StandbyWithdrawn`).
    pub standbys: Standbys,
    pub wall: Duration,
    pub violations: Vec<Violation>,
}

impl RunReport {
    /// The kinds of the faults that went in, in order; those that found nothing to act on
    /// ([`Effect::Skipped`]) are left out.
    pub fn kinds_injected(&self) -> Vec<String> {
        self.injected
            .iter()
            .filter(|line| line.effect != Effect::Skipped)
            .map(|line| line.kind.to_string())
            .collect()
    }

    /// How many faults came due but found nothing to act on (no running worker, say).
    pub fn skipped(&self) -> usize {
        self.injected
            .iter()
            .filter(|line| line.effect == Effect::Skipped)
            .count()
    }
}

/// How long one training step of the chaos job takes (`STEP_SECONDS`).
const STEP: Duration = Duration::from_millis(300);
/// The fewest steps of the chaos job.
const MIN_STEPS: u32 = 400;
/// How far one API server restart may hold the rest of the schedule back: told to stop, the
/// API server serves the connections it has (the watches) for up to 60 s before it exits, and
/// the next control-plane fault waits until the new one is ready (about 64 s on the local cluster).
const API_SERVER_RESTART: Duration = Duration::from_secs(75);
/// Training still to do once the last fault of the schedule is undone: the job recovers from it.
const AFTER_THE_LAST_FAULT: Duration = Duration::from_secs(30);

/// Steps for the chaos job to train through its whole schedule, also when injections go in
/// late: a fault is injected only into a job that still runs. Restarts make a job longer, but a
/// seed may have none, and such a seed's job would end before its last faults (the finding of
/// seeds 9 and 11 in docs/reliability.md).
pub fn steps_to_outlast(schedule: &Schedule) -> u32 {
    let api_restarts = schedule
        .faults
        .iter()
        .filter(|f| f.kind == FaultKind::RestartApiServer)
        .count();
    let held = API_SERVER_RESTART * u32::try_from(api_restarts).unwrap_or(u32::MAX);
    let training = schedule.ends() + held + AFTER_THE_LAST_FAULT;
    let steps = training.as_millis().div_ceil(STEP.as_millis());
    u32::try_from(steps).unwrap_or(u32::MAX).max(MIN_STEPS)
}

/// Runs `schedule` against a fresh job; the chart must be installed and node 2 schedulable.
pub async fn run(client: &Client, schedule: &Schedule) -> Result<RunReport> {
    let started = Instant::now();
    let name = format!("chaos-{}", schedule.seed);
    let baseline = format!("{name}-baseline");
    let ns = JOBS_NS;
    let steps = steps_to_outlast(schedule);
    let job = in_new_sessions(chaos_job(&name, steps, json!({"policy": "Prefer"})));
    let kill_grace = node2_kill_grace(&job)?;
    create_job(client, ns, job).await?;
    create_job(
        client,
        ns,
        chaos_job(&baseline, steps, json!({"policy": "Never"})),
    )
    .await?;
    let checker = Arc::new(Mutex::new(Checker::new().with_kill_grace(kill_grace)));
    let feed = Feed {
        checker: checker.clone(),
        started,
    };
    let watches = watch(client, ns, &name, feed.clone());
    let reads = read_checkpoints(client, ns, &name, feed.clone());
    let scans = super::procs::scan_processes(&name, feed.clone());
    let played = play_and_end(client, schedule, &name, &baseline, &feed).await;
    watches.abort();
    reads.abort();
    scans.abort();
    let Played {
        injected,
        not_injected,
        ending,
        in_place,
        standbys,
    } = match played {
        Ok(played) => played,
        Err(e) => {
            // The run could not go on: leave no job of it behind for the next test.
            if let Err(cleanup) = delete_and_find_leftovers(client, ns, &[&name, &baseline]).await {
                println!("chaos: deleting the run's jobs failed: {cleanup:#}");
            }
            return Err(e);
        }
    };
    let (violations, steps_lost, checkpoints_read, steps_read, proc_scans) = {
        let mut checker = checker
            .lock()
            .map_err(|_| anyhow::anyhow!("checker poisoned"))?;
        checker.job(started.elapsed(), &ending.job);
        checker.finish(started.elapsed(), &ending);
        (
            checker.violations().to_vec(),
            checker.steps_lost(),
            checker.checkpoints_read(),
            checker.steps_read(),
            checker.proc_scans(),
        )
    };
    Ok(RunReport {
        seed: schedule.seed,
        injected,
        not_injected,
        attempt: ending.job.attempt,
        preemptions: ending.job.preemptions,
        failures: ending.job.failures,
        hangs: ending.job.hangs,
        steps_lost,
        checkpoints_read,
        steps_read,
        proc_scans,
        in_place,
        standbys,
        wall: started.elapsed(),
        violations,
    })
}

/// The checker, shared by the run's watches, its reads of `latest.pt` and `/proc`, and its
/// play of the schedule, with the start of the run that their times count from.
#[derive(Clone)]
pub(super) struct Feed {
    checker: Arc<Mutex<Checker>>,
    pub(super) started: Instant,
}

impl Feed {
    /// Hands the checker to `f` with the time from the start of the run.
    pub(super) fn tell(&self, f: impl FnOnce(&mut Checker, Duration)) {
        let at = self.started.elapsed();
        if let Ok(mut checker) = self.checker.lock() {
            f(&mut checker, at);
        }
    }
}

/// What [`play_and_end`] saw: the faults as injected and how the job ended.
struct Played {
    injected: Vec<Line>,
    not_injected: usize,
    ending: Ending,
    in_place: u32,
    standbys: Standbys,
}

/// Plays the schedule once the job runs, waits for both jobs to end, then deletes them and
/// gathers what the end-of-run invariants need.
async fn play_and_end(
    client: &Client,
    schedule: &Schedule,
    name: &str,
    baseline: &str,
    feed: &Feed,
) -> Result<Played> {
    let ns = JOBS_NS;
    let (restarts_before, _) = component_restarts(client).await?;
    running_pods(client, ns, name, 0, 3).await?;

    let target = Target {
        client: client.clone(),
        namespace: ns.to_owned(),
        job: name.to_owned(),
    };
    let mut pick = fastrand::Rng::with_seed(schedule.seed ^ 0x5eed);
    let (injected, not_injected) = play(&target, schedule, &mut pick, feed).await?;

    let end = wait_phase(client, ns, name, "Succeeded", Duration::from_secs(900)).await;
    if let Err(e) = &end {
        println!("chaos: {e:#}\n{}", diagnosis(client, ns, name).await);
    }
    let base = wait_phase(client, ns, baseline, "Succeeded", Duration::from_secs(900)).await?;
    let st = job_status(client, ns, name).await?;
    let job = seen(&st);
    let expected_digest = final_digest(client, ns, baseline, counter(&base, "attempt")).await?;
    let digest = final_digest(client, ns, name, job.attempt).await.ok();
    let events = job_event_counts(client, ns, name).await?;
    let count = |reasons: &[&str]| reasons.iter().filter_map(|r| events.get(*r)).sum::<u32>();
    let (restart_events, in_place) = (count(RESTARTS), count(&[reason::RESTARTING_IN_PLACE]));
    let standbys = Standbys {
        ready: count(&[reason::STANDBY_READY]),
        given_up: count(&[reason::STANDBY_GIVEN_UP]),
        withdrawn: count(&[reason::STANDBY_WITHDRAWN]),
    };
    // Read before the job is deleted: its Events are found by its uid.
    let forced_on_live_node = force_deletes_on(client, ns, name, &crate::node_name()).await?;
    let leftovers = delete_and_find_leftovers(client, ns, &[name, baseline]).await?;
    let mut ending = Ending {
        job: job.clone(),
        succeeded: end.is_ok(),
        resumes: resumes(&injected),
        restart_events,
        failures_caused: failures_caused(&injected),
        failures_alone: failures_alone(&injected),
        forced_on_live_node,
        digest,
        expected_digest,
        leftovers,
    };
    ending
        .leftovers
        .extend(component_trouble(client, &injected, restarts_before).await?);
    Ok(Played {
        injected,
        not_injected,
        ending,
        in_place,
        standbys,
    })
}

/// The resumes the faults caused: a `SuspendResume` counts when it went in and the job was
/// `Suspended` when it was resumed (one that reached the job as it finished caused none:
/// [`Effect::NoResume`]).
fn resumes(injected: &[Line]) -> u32 {
    went_in(injected, |line| line.kind.counts_a_resume())
}

/// The genuine failures the faults caused: each `TrainerFailure` that went in.
fn failures_caused(injected: &[Line]) -> u32 {
    went_in(injected, |line| line.kind.counts_a_failure())
}

/// The genuine failures with no fault that restarts the gang near them
/// ([`near_a_restart`]): each must be counted as exactly one failure.
fn failures_alone(injected: &[Line]) -> u32 {
    let restarts: Vec<Duration> = injected
        .iter()
        .filter(|l| l.kind.restarts_the_gang() && l.effect != Effect::Skipped)
        .map(|l| l.at)
        .collect();
    went_in(injected, |l| {
        l.kind.counts_a_failure() && !restarts.iter().any(|&r| near_a_restart(l.at, r))
    })
}

/// How many of the faults that `counts` went in ([`Effect::Injected`]).
fn went_in(injected: &[Line], counts: impl Fn(&Line) -> bool) -> u32 {
    let n = injected
        .iter()
        .filter(|line| line.effect == Effect::Injected && counts(line))
        .count();
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The chaos job: three workers of one GPU (two fit on the spot node), the example trainer
/// training `steps` steps and reporting every second, checkpoints every 5 steps, hangs judged
/// after 60 s, restarting in place where it can (`restartPolicy.inPlace`).
fn chaos_job(name: &str, steps: u32, spot: Value) -> Value {
    let step_seconds = STEP.as_secs_f64().to_string();
    let mut job = torch_job(name, 1, steps, &step_seconds, spot);
    let spec = &mut job["spec"];
    spec["workers"] = json!(3);
    spec["restartPolicy"] = json!({
        "maxFailures": 3, "maxPreemptions": 100, "backoffSeconds": 1,
        "progressTimeoutSeconds": 60, "inPlace": true,
    });
    if let Some(env) = spec["template"]["spec"]["containers"][0]["env"].as_array_mut() {
        env.push(json!({"name": "PROGRESS_EVERY_SECONDS", "value": "1"}));
        env.push(json!({"name": "COLLECTIVE_TIMEOUT_SECONDS", "value": "30"}));
    }
    job
}

/// `job` with its workers started as torch >= 2.1's torchrun starts them, each in a session of
/// its own (`e2e/torchrun_new_sessions.py` in the trainer image): its launcher must stop
/// processes outside the agent's session. The baseline keeps torch 1.13's torchrun.
fn in_new_sessions(mut job: Value) -> Value {
    job["spec"]["template"]["spec"]["containers"][0]["command"] = json!([
        "python3",
        "/app/trainyard_launch.py",
        "python3",
        "/app/torchrun_new_sessions.py",
        "/app/train.py"
    ]);
    job
}

/// The faults' lines, and how many faults the end of the job left out.
type Injections = (Vec<Line>, usize);

/// Injects and undoes the schedule's faults at their times; stops injecting once the job has
/// ended, but always undoes what it injected. Tells the checker while node 2 is cut off.
async fn play(
    target: &Target,
    schedule: &Schedule,
    pick: &mut fastrand::Rng,
    feed: &Feed,
) -> Result<Injections> {
    let start = Instant::now();
    // Injections at their scheduled times; each undo is queued when its fault goes in, a
    // hold after it: a fault injected late (the one before it took long, as an API server
    // restart can) is still held as long as the schedule says.
    let mut timeline = Timeline::new(schedule.faults.iter().map(|f| f.at));
    let mut active: Vec<Option<Injected>> = schedule.faults.iter().map(|_| None).collect();
    // Where each fault stands in `injected`, to add what undoing it found.
    let mut position: Vec<Option<usize>> = vec![None; schedule.faults.len()];
    let (mut injected, mut not_injected) = (Vec::new(), 0);
    while let Some((at, i, inject)) = timeline.next() {
        tokio::time::sleep(at.saturating_sub(start.elapsed())).await;
        if inject {
            if job_ended(target).await {
                not_injected += 1;
                continue;
            }
            let planned = &schedule.faults[i];
            let kind = planned.kind;
            // The schedule keeps two faults on one resource apart, but a fault injected late
            // (behind a long API server restart) is held late too: wait for its undo; a fault
            // aimed at a worker also waits for a suspended job's resume.
            let holds = |j: usize| kind.waits_for(schedule.faults[j].kind);
            if let Some(undone_at) = timeline.undo_of(holds) {
                timeline.postpone(i, undone_at);
                continue;
            }
            // From before it acts: the node's processes may be out of reach from then on.
            if cuts_off_node2(kind) {
                feed.tell(|c, at| c.node2_cut_off(at));
            }
            let fault = match faults::inject(target, kind, pick).await {
                Ok(fault) => fault,
                Err(e) => {
                    undo_all(target, &mut active).await;
                    return Err(e.context(format!("injecting {kind} at t+{}s", at.as_secs())));
                }
            };
            println!(
                "chaos t+{:>4}s {kind}: {}",
                start.elapsed().as_secs(),
                fault.what
            );
            position[i] = Some(injected.len());
            injected.push(Line {
                at: start.elapsed(),
                kind,
                effect: fault.effect,
                what: fault.what.clone(),
            });
            active[i] = Some(fault);
            if kind.is_undone() {
                timeline.injected(i, start.elapsed(), planned.hold);
            }
        } else if let Some(fault) = active[i].take() {
            let line = position[i].and_then(|p| injected.get_mut(p));
            undo_one(target, &fault, line, start, feed).await?;
        }
    }
    Ok((injected, not_injected))
}

/// Undoes `fault` of the schedule played since `start`, adds what undoing it found to its
/// `line`, and tells the checker when node 2 is back.
async fn undo_one(
    target: &Target,
    fault: &Injected,
    line: Option<&mut Line>,
    start: Instant,
    feed: &Feed,
) -> Result<()> {
    let found = faults::undo(target, fault)
        .await
        .with_context(|| format!("undoing {}", fault.kind))?;
    if cuts_off_node2(fault.kind) {
        feed.tell(|c, at| c.node2_back(at));
    }
    let note = found
        .as_ref()
        .map(|(_, f)| format!(": {f}"))
        .unwrap_or_default();
    println!(
        "chaos t+{:>4}s {} undone{note}",
        start.elapsed().as_secs(),
        fault.kind
    );
    if let Some(line) = line {
        line.what.push_str(&note);
        if let Some((effect, _)) = found {
            line.effect = effect;
        }
    }
    Ok(())
}

/// The faults that cut node 2 off while they are held (partitioned, lost, or cut from the API
/// server): nobody can kill its processes until it is back, and then its kubelet does.
fn cuts_off_node2(kind: FaultKind) -> bool {
    matches!(
        kind,
        FaultKind::PartitionNode2 | FaultKind::LoseNode2 | FaultKind::Node2CutFromApi
    )
}

/// How long after node 2 is back its kubelet may take to kill the processes of an older
/// attempt's pods (deleted while it was cut off): the job's termination grace period, and
/// [`KUBELET_CATCH_UP`].
fn node2_kill_grace(job: &Value) -> Result<Duration> {
    let spec: TrainingJobSpec =
        serde_json::from_value(job["spec"].clone()).context("reading the chaos job's spec")?;
    let grace = u64::try_from(spec.termination_grace_period_seconds).unwrap_or(0);
    Ok(Duration::from_secs(grace) + KUBELET_CATCH_UP)
}

/// How long a kubelet back in touch with the API server may take to learn that its pods were
/// deleted and start killing them.
const KUBELET_CATCH_UP: Duration = Duration::from_secs(30);

/// The run's actions still to come, from the start of the schedule: each fault's injection
/// at its scheduled time, and each undo a hold after its fault actually went in.
struct Timeline {
    /// (when, fault, inject rather than undo).
    queue: Vec<(Duration, usize, bool)>,
}

impl Timeline {
    /// The injections of faults scheduled at these times, in order.
    fn new(at: impl Iterator<Item = Duration>) -> Self {
        Self {
            queue: at.enumerate().map(|(i, at)| (at, i, true)).collect(),
        }
    }

    /// Fault `i` went in at `at`: it is undone `hold` later.
    fn injected(&mut self, i: usize, at: Duration, hold: Duration) {
        self.queue.push((at + hold, i, false));
    }

    /// When the last undo still to come of the faults `holds` picks is due, if any.
    fn undo_of(&self, holds: impl Fn(usize) -> bool) -> Option<Duration> {
        self.queue
            .iter()
            .filter(|(_, j, inject)| !inject && holds(*j))
            .map(|(at, ..)| *at)
            .max()
    }

    /// Fault `i` is injected at `at` instead (after an undo due then: see [`Self::next`]).
    fn postpone(&mut self, i: usize, at: Duration) {
        self.queue.push((at, i, true));
    }

    /// Takes the earliest action: by time, an undo before an injection at the same time,
    /// then in schedule order.
    fn next(&mut self) -> Option<(Duration, usize, bool)> {
        let first = self
            .queue
            .iter()
            .enumerate()
            .min_by_key(|(_, (at, i, inject))| (*at, *inject, *i))
            .map(|(pos, _)| pos)?;
        Some(self.queue.swap_remove(first))
    }
}

/// Undoes every fault still active, after the run failed to inject one: the cluster is left
/// as the run found it. What cannot be undone is printed; the run fails anyway.
async fn undo_all(target: &Target, active: &mut [Option<Injected>]) {
    for fault in active.iter_mut().filter_map(Option::take) {
        if let Err(e) = faults::undo(target, &fault).await {
            println!("chaos: undoing {} failed: {e:#}", fault.kind);
        }
    }
}

async fn job_ended(target: &Target) -> bool {
    matches!(
        target.phase().await.as_deref(),
        Some("Succeeded" | "Failed")
    )
}

/// Watches the job's pods and its status, feeding every change to the checker.
fn watch(client: &Client, ns: &str, job: &str, feed: Feed) -> tokio::task::JoinHandle<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod_config = Config::default().labels(&format!("{LABEL_JOB}={job}"));
    let jobs = tj_api(client, ns);
    let job_config = Config::default().fields(&format!("metadata.name={job}"));
    tokio::spawn(async move {
        // The pods as the watch shows them, in kube's reflector store: a relist (after an
        // error, such as an etcd or API server restart) replaces them whole at its end, so a
        // pod deleted meanwhile leaves.
        let (known, mut writer) = reflector::store::<Pod>();
        let mut pod_events = watcher::watcher(pods, pod_config).default_backoff().boxed();
        let mut job_events = watcher::watcher(jobs, job_config)
            .default_backoff()
            .applied_objects()
            .boxed();
        loop {
            tokio::select! {
                Some(event) = pod_events.next() => {
                    let Ok(event) = event else { continue };
                    writer.apply_watcher_event(&event);
                    // A relist shows its pods once it is whole.
                    if matches!(event, Event::Init | Event::InitApply(_)) {
                        continue;
                    }
                    // The pods the harness forged itself are no pods of the job's.
                    let list: Vec<PodSeen> = known
                        .state()
                        .iter()
                        .filter(|p| !p.labels().contains_key(crate::forged::FORGED_LABEL))
                        .map(|p| pod_seen(p))
                        .collect();
                    feed.tell(|c, at| c.pods(at, &list));
                }
                Some(Ok(obj)) = job_events.next() => {
                    let st = obj.data.get("status").cloned().unwrap_or(Value::Null);
                    feed.tell(|c, at| c.job(at, &seen(&st)));
                }
                else => break,
            }
        }
    })
}

/// How often the job's `latest.pt` is read while the run lasts.
const CHECKPOINT_READS: Duration = Duration::from_secs(1);

/// Reads the job's `latest.pt` from its volume every second and feeds the checker whether it
/// is whole and, when it is, the step stored in it. The local cluster's claims are hostPath
/// volumes that both nodes share with this machine, so the file is read where the trainers
/// write it; a rank 0 that renames a finished file over it (as `examples/train.py` does)
/// never shows a torn one. The job is created once per run, so its steps are one sequence.
fn read_checkpoints(
    client: &Client,
    ns: &str,
    job: &str,
    feed: Feed,
) -> tokio::task::JoinHandle<()> {
    let (client, ns, claim) = (client.clone(), ns.to_owned(), format!("{job}-checkpoints"));
    tokio::spawn(async move {
        let mut dir: Option<std::path::PathBuf> = None;
        let mut tick = tokio::time::interval(CHECKPOINT_READS);
        loop {
            tick.tick().await;
            if dir.is_none() {
                dir = crate::jobs::volume_dir(&client, &ns, &claim).await;
            }
            let Some(file) = dir.as_ref().map(|d| d.join("latest.pt")) else {
                continue;
            };
            let bytes = match tokio::fs::read(&file).await {
                Ok(bytes) => bytes,
                // Not saved yet.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => {
                    println!("chaos: reading {}: {e}", file.display());
                    continue;
                }
            };
            let torn = checkpoint::torn(&bytes);
            let whole = torn.is_none();
            feed.tell(|c, at| c.checkpoint(at, torn));
            // A torn file is a violation already; the step of a whole one must not go back.
            if whole {
                let step = checkpoint::step(&bytes).await.map_err(|e| format!("{e:#}"));
                feed.tell(|c, at| c.checkpoint_step(at, step));
            }
        }
    })
}

fn pod_seen(p: &Pod) -> PodSeen {
    let label = |k: &str| p.labels().get(k).and_then(|v| v.parse().ok()).unwrap_or(0);
    // The name, with the start of the uid: pod names repeat from attempt to attempt.
    let uid = p.uid().unwrap_or_default();
    PodSeen {
        name: format!("{}@{}", p.name_any(), uid.get(..8).unwrap_or(&uid)),
        rank: label(LABEL_RANK),
        attempt: label(LABEL_ATTEMPT),
        running: p.metadata.deletion_timestamp.is_none()
            && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"),
        standby: p.labels().get(LABEL_STANDBY).map(String::as_str) == Some("true"),
    }
}

fn counter(st: &Value, key: &str) -> u32 {
    st[key]
        .as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or(0)
}

fn seen(st: &Value) -> JobSeen {
    let progress = &st["progress"];
    JobSeen {
        attempt: counter(st, "attempt"),
        preemptions: counter(st, "preemptions"),
        failures: counter(st, "failures"),
        hangs: counter(st, "hangs"),
        requeues: counter(st, "requeues"),
        checkpoint_step: progress["checkpointStep"].as_u64(),
        steps_lost: progress["stepsLost"].as_u64().map(|lost| {
            let attempt = progress["attempt"].as_u64().unwrap_or(0);
            (u32::try_from(attempt).unwrap_or(u32::MAX), lost)
        }),
        progress: progress["attempt"]
            .as_u64()
            .zip(progress["step"].as_u64())
            .map(|(attempt, step)| ProgressSeen {
                attempt: u32::try_from(attempt).unwrap_or(u32::MAX),
                step,
                resumed_from: progress["resumedFrom"].as_u64(),
            }),
        kept: st["lastRestart"]["inPlaceRanks"]
            .as_str()
            .map(|ranks| RankSet::parse(ranks).iter().collect())
            .unwrap_or_default(),
        replaced_ahead: st["lastRestart"]["replacedAheadRanks"]
            .as_str()
            .map(|ranks| RankSet::parse(ranks).iter().collect())
            .unwrap_or_default(),
        resume_file: st["resumePoint"]["file"].as_str().map(str::to_owned),
    }
}

/// What a job that did not succeed was doing, for the run's output: its status, its pods
/// (phase, node, waiting or scheduling reason) and its newest Events.
async fn diagnosis(client: &Client, ns: &str, job: &str) -> String {
    let mut out = Vec::new();
    match job_status(client, ns, job).await {
        Ok(st) => out.push(format!(
            "status: {}",
            serde_json::to_string_pretty(&st).unwrap_or_default()
        )),
        Err(e) => out.push(format!("status: {e:#}")),
    }
    for pod in job_pods(client, ns, job).await.unwrap_or_default() {
        let status = pod.status.as_ref();
        let why = status
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .filter(|c| c.status == "False")
            .filter_map(|c| c.message.clone())
            .chain(
                status
                    .and_then(|s| s.container_statuses.as_ref())
                    .into_iter()
                    .flatten()
                    .filter_map(|c| c.state.as_ref()?.waiting.as_ref()?.reason.clone()),
            )
            .collect::<Vec<_>>()
            .join("; ");
        out.push(format!(
            "pod {}: {} on {} deleting={} {why}",
            pod.name_any(),
            status.and_then(|s| s.phase.as_deref()).unwrap_or("?"),
            pod.spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .unwrap_or("(none)"),
            pod.metadata.deletion_timestamp.is_some(),
        ));
    }
    let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    let mut events: Vec<_> = events
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(job))
        .collect();
    events.sort_by_key(|e| e.last_timestamp.clone().map(|t| t.0));
    for e in events.iter().rev().take(20).rev() {
        out.push(format!(
            "event {} x{}: {}",
            e.reason.as_deref().unwrap_or("?"),
            e.count.unwrap_or(1),
            e.message.as_deref().unwrap_or("")
        ));
    }
    out.join("\n")
}

/// The reasons of the Events that announce a gang restart or a resume.
const RESTARTS: &[&str] = &[
    reason::PREEMPTED,
    reason::WORKER_FAILED,
    reason::HANG,
    reason::REQUEUED,
    reason::RESUMED,
];

/// How many Events of this job (its uid) each reason has, counted with their repetitions.
async fn job_event_counts(
    client: &Client,
    ns: &str,
    job: &str,
) -> Result<std::collections::BTreeMap<String, u32>> {
    let uid = tj_api(client, ns).get(job).await?.uid().context("no uid")?;
    let list = Api::<k8s_openapi::api::core::v1::Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await?;
    let mut counts = std::collections::BTreeMap::new();
    for e in list
        .items
        .iter()
        .filter(|e| e.involved_object.uid.as_deref() == Some(uid.as_str()))
    {
        let n = u32::try_from(e.count.unwrap_or(1).max(1)).unwrap_or(1);
        *counts
            .entry(e.reason.clone().unwrap_or_default())
            .or_default() += n;
    }
    Ok(counts)
}

/// The operator's `ForceDeleted` Events of the job that name `node`: node 1 is never lost in
/// the chaos run (its kubelet is only restarted), so a pod removed there without its kubelet
/// had its SIGTERM save taken from it.
async fn force_deletes_on(client: &Client, ns: &str, job: &str, node: &str) -> Result<Vec<String>> {
    let uid = tj_api(client, ns).get(job).await?.uid().context("no uid")?;
    let list = Api::<k8s_openapi::api::core::v1::Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await?;
    let on = format!("node {node}");
    Ok(list
        .items
        .into_iter()
        .filter(|e| e.involved_object.uid.as_deref() == Some(uid.as_str()))
        .filter(|e| e.reason.as_deref() == Some(reason::FORCE_DELETED))
        .filter_map(|e| e.message)
        .filter(|m| m.ends_with(&on))
        .collect())
}

/// Deletes the jobs and names what of them is left: pods, Services, Endpoints, and a claim
/// that `retainOnDelete` (true here) should have kept. The kept claims are deleted after.
async fn delete_and_find_leftovers(
    client: &Client,
    ns: &str,
    jobs: &[&str],
) -> Result<Vec<String>> {
    for job in jobs {
        tj_api(client, ns).delete(job, &Default::default()).await?;
    }
    let mut left = Vec::new();
    for job in jobs {
        let gone = wait_for(
            &format!("the pods of {job} to go"),
            Duration::from_secs(180),
            || async move { Ok(job_pods(client, ns, job).await?.is_empty().then_some(())) },
        )
        .await;
        if gone.is_err() {
            left.push(format!("pods of {job}"));
        }
        // The garbage collector deletes the Service, and the endpoints controller then its
        // Endpoints, each when it gets to it (later after a control-plane restart).
        let services = Api::<Service>::namespaced(client.clone(), ns);
        let endpoints = Api::<Endpoints>::namespaced(client.clone(), ns);
        let gone = wait_for(
            &format!("the Service and Endpoints of {job} to go"),
            Duration::from_secs(120),
            || {
                let (services, endpoints) = (services.clone(), endpoints.clone());
                async move {
                    let service = services.get_opt(job).await?.is_some();
                    let endpoints = endpoints.get_opt(job).await?.is_some();
                    Ok((!service && !endpoints).then_some(()))
                }
            },
        )
        .await;
        if gone.is_err() {
            if services.get_opt(job).await?.is_some() {
                left.push(format!("Service {job}"));
            }
            if endpoints.get_opt(job).await?.is_some() {
                left.push(format!("Endpoints {job}"));
            }
        }
        let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns);
        let claim = format!("{job}-checkpoints");
        if claims.get_opt(&claim).await?.is_none() {
            left.push(format!("no claim {claim}, though retainOnDelete is true"));
        } else {
            claims.delete(&claim, &Default::default()).await?;
        }
    }
    Ok(left)
}

/// A component in a crash loop, or an operator restarted more often than the schedule
/// killed it (`before`: the operator's container restarts when the run began).
async fn component_trouble(
    client: &Client,
    injected: &[Line],
    before: usize,
) -> Result<Vec<String>> {
    let kills = injected
        .iter()
        .filter(|line| line.kind == FaultKind::KillOperatorLeader)
        .count();
    let (restarts, mut trouble) = component_restarts(client).await?;
    if restarts.saturating_sub(before) > kills {
        trouble.push(format!(
            "the operator restarted {} times, killed {kills}",
            restarts.saturating_sub(before)
        ));
    }
    Ok(trouble)
}

/// The operator's container restarts, and every component container in CrashLoopBackOff.
async fn component_restarts(client: &Client) -> Result<(usize, Vec<String>)> {
    let mut trouble = Vec::new();
    let mut operator_restarts = 0;
    for pod in Api::<Pod>::namespaced(client.clone(), RELEASE_NS)
        .list(&ListParams::default())
        .await?
    {
        for c in pod
            .status
            .iter()
            .flat_map(|s| s.container_statuses.iter().flatten())
        {
            let waiting = c.state.as_ref().and_then(|s| s.waiting.as_ref());
            if waiting.and_then(|w| w.reason.as_deref()) == Some("CrashLoopBackOff") {
                trouble.push(format!("{} in CrashLoopBackOff", pod.name_any()));
            }
            if pod.name_any().contains("operator") {
                operator_restarts += usize::try_from(c.restart_count).unwrap_or(0);
            }
        }
    }
    Ok((operator_restarts, trouble))
}

#[cfg(test)]
mod tests {
    use super::super::schedule::Fault;
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn line(at: Duration, kind: FaultKind, effect: Effect, what: &str) -> Line {
        Line {
            at,
            kind,
            effect,
            what: what.to_owned(),
        }
    }

    /// Seed 1: the API server restart before it took 80 s, and the suspend that followed was
    /// undone at the instant it went in (its undo had been timed from the schedule).
    #[test]
    fn a_fault_injected_late_is_still_held_for_its_whole_hold() {
        let mut t = Timeline::new([secs(134), secs(156)].into_iter());
        assert_eq!(t.next(), Some((secs(134), 0, true)));
        // The restart finishes at t+196; the suspend goes in then.
        assert_eq!(t.next(), Some((secs(156), 1, true)));
        t.injected(1, secs(196), secs(29));
        assert_eq!(t.next(), Some((secs(225), 1, false)));
        assert_eq!(t.next(), None);
    }

    /// A fault that found nothing to act on is told apart from those that went in, so that
    /// the results table never counts it as injected.
    #[test]
    fn a_skipped_fault_is_not_counted_as_injected() {
        let report = RunReport {
            seed: 11,
            injected: vec![
                line(
                    secs(20),
                    FaultKind::RestartEtcd,
                    Effect::Injected,
                    "etcd restarted",
                ),
                line(
                    secs(262),
                    FaultKind::DeleteWorkerPod,
                    Effect::Skipped,
                    "skipped: no running worker to delete",
                ),
            ],
            not_injected: 0,
            attempt: 1,
            preemptions: 0,
            failures: 0,
            hangs: 0,
            steps_lost: 0,
            checkpoints_read: 0,
            steps_read: 0,
            proc_scans: 0,
            in_place: 0,
            standbys: Standbys::default(),
            wall: secs(270),
            violations: Vec::new(),
        };
        assert_eq!(report.kinds_injected(), vec!["RestartEtcd".to_owned()]);
        assert_eq!(report.skipped(), 1);
    }

    /// Found by seed 9 at 75e90c6: a suspend that reached the job as it finished was counted
    /// as a resume, so the run expected one attempt more than the job made.
    #[test]
    fn a_suspend_undone_after_the_job_ended_caused_no_resume() {
        let suspend = |effect| line(secs(90), FaultKind::SuspendResume, effect, "job suspended");
        let resumed = suspend(Effect::Injected);
        let ended = suspend(Effect::NoResume);
        let skipped = suspend(Effect::Skipped);
        let other = line(
            secs(10),
            FaultKind::DeleteWorkerPod,
            Effect::Injected,
            "worker deleted",
        );
        assert_eq!(resumes(&[resumed.clone(), other]), 1);
        assert_eq!(resumes(&[ended, skipped]), 0);
        assert_eq!(resumes(&[resumed.clone(), resumed]), 2);
    }

    /// A genuine failure counts on its own only away from the faults that restart the gang:
    /// close to a node loss it may be taken into that preemption.
    #[test]
    fn genuine_failures_count_alone_only_away_from_gang_restarts() {
        let failure = |at| {
            line(
                secs(at),
                FaultKind::TrainerFailure,
                Effect::Injected,
                "killed",
            )
        };
        let lost = line(
            secs(100),
            FaultKind::LoseNode2,
            Effect::Injected,
            "node 2 lost",
        );
        let kubelet = line(
            secs(100),
            FaultKind::RestartKubelet,
            Effect::Injected,
            "restarted",
        );
        let skipped = line(
            secs(10),
            FaultKind::TrainerFailure,
            Effect::Skipped,
            "skipped",
        );
        let all = [
            failure(30),
            failure(120),
            failure(170),
            lost,
            kubelet,
            skipped,
        ];
        assert_eq!(failures_caused(&all), 3);
        // 30 s: 70 s before the loss (alone); 120 s: 20 s after it; 170 s: 70 s after it.
        assert_eq!(
            failures_alone(&[
                failure(80),
                line(secs(100), FaultKind::LoseNode2, Effect::Injected, "")
            ]),
            0
        );
        assert_eq!(failures_alone(&all), 2);
    }

    #[test]
    fn an_undo_comes_before_an_injection_at_the_same_time() {
        let mut t = Timeline::new([secs(0), secs(10)].into_iter());
        assert_eq!(t.next(), Some((secs(0), 0, true)));
        t.injected(0, secs(0), secs(10));
        assert_eq!(t.next(), Some((secs(10), 0, false)));
        assert_eq!(t.next(), Some((secs(10), 1, true)));
    }

    /// Found by `make chaos` at 91fe937, seed 18: `LoseNode2` (scheduled at t+60 s for 19 s)
    /// went in at t+87 s behind a 64 s API server restart, and `PartitionNode2`, scheduled at
    /// t+103 s, went in while node 2 was still lost; its undo then could not bring node 2 back
    /// (the partition cut it off) and the run stopped.
    #[test]
    fn an_injection_on_a_resource_still_held_waits_for_its_undo() {
        let mut t = Timeline::new([secs(60), secs(103)].into_iter());
        assert_eq!(t.next(), Some((secs(60), 0, true)));
        // Injected late: held until t+106.
        t.injected(0, secs(87), secs(19));
        assert_eq!(t.next(), Some((secs(103), 1, true)));
        let same_resource = |j: usize| j == 0;
        assert_eq!(t.undo_of(same_resource), Some(secs(106)));
        assert_eq!(t.undo_of(|_| false), None);
        t.postpone(1, secs(106));
        assert_eq!(t.next(), Some((secs(106), 0, false)));
        assert_eq!(t.undo_of(same_resource), None);
        assert_eq!(t.next(), Some((secs(106), 1, true)));
        assert_eq!(t.next(), None);
    }

    fn fault(at: u64, kind: FaultKind, hold: u64) -> Fault {
        Fault {
            at: secs(at),
            kind,
            hold: secs(hold),
        }
    }

    #[test]
    fn the_job_trains_past_the_last_undo_also_behind_an_api_server_restart() {
        // Seed 11 at 8a7f71c: its last fault undone at t+238 s, one API server restart.
        let schedule = Schedule {
            seed: 11,
            faults: vec![
                fault(108, FaultKind::RestartApiServer, 0),
                fault(219, FaultKind::GpuUnhealthy, 19),
            ],
        };
        // 238 s + 75 s held + 30 s after = 343 s of training at 0.3 s a step.
        assert_eq!(steps_to_outlast(&schedule), 1144);
        let quiet = Schedule {
            seed: 11,
            faults: vec![fault(219, FaultKind::GpuUnhealthy, 19)],
        };
        assert_eq!(steps_to_outlast(&quiet), 894, "no restart to wait for");
        // A short schedule (make test's fixed seed ends at t+80 s) keeps the fewest steps.
        let short = Schedule {
            seed: 20261125,
            faults: vec![fault(70, FaultKind::GpuUnhealthy, 10)],
        };
        assert_eq!(steps_to_outlast(&short), MIN_STEPS);
    }

    #[test]
    fn the_attempts_progress_is_read_from_the_status() {
        let st = json!({"attempt": 2, "progress": {
            "attempt": 2, "step": 130, "resumedFrom": 125, "checkpointStep": 125, "stepsLost": 3,
        }});
        let job = seen(&st);
        assert_eq!(
            job.progress,
            Some(ProgressSeen {
                attempt: 2,
                step: 130,
                resumed_from: Some(125),
            })
        );
        assert_eq!(job.steps_lost, Some((2, 3)));
        assert_eq!(seen(&json!({"attempt": 0})).progress, None);
    }

    #[test]
    fn node_2_is_given_the_jobs_grace_period_and_the_kubelets_catch_up_to_kill() {
        let job = chaos_job("chaos-1", MIN_STEPS, json!({"policy": "Prefer"}));
        assert_eq!(node2_kill_grace(&job).expect("grace"), secs(20 + 30));
        let mut unset = job;
        if let Some(spec) = unset["spec"].as_object_mut() {
            spec.remove("terminationGracePeriodSeconds");
        }
        // The CRD's default.
        assert_eq!(node2_kill_grace(&unset).expect("grace"), secs(60 + 30));
    }
}
