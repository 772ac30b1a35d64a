//! The invariants a chaos run checks, as a pure checker fed with what the run's watches saw.
//!
//! Continuously (each pod list and each status the watches deliver):
//! - never two running pods of one rank, never running pods of two attempts at once (a pod
//!   kept for an in-place restart belongs to the attempt that kept it; a replacement created
//!   ahead of a termination notice, which runs nothing until started, to no attempt until the
//!   switch, and the pod it replaces to none from then until it is deleted);
//! - the counters (`attempt`, `preemptions`, `failures`, `hangs`, `requeues`) never decrease, and
//!   `attempt` is never below the restarts counted;
//! - the reported checkpoint step never goes backwards;
//! - `latest.pt`, read from the job's volume every second, is never torn, and the step stored
//!   in it never goes backwards (a rollback of the file itself);
//! - no process of an older attempt, found in `/proc` on either node, is alive after a newer
//!   attempt has trained a step; except on node 2 while it is cut off (partitioned, lost, or
//!   cut from the API server: nothing can kill its processes then, fencing guards the
//!   checkpoint) and for a grace period after, while its kubelet kills them.
//!
//! At the end: `attempt` = preemptions + failures + hangs + requeues + resumes, one restart Event per
//! restart, no failure the schedule did not cause and every genuine failure it caused away
//! from a gang restart counted as one failure, the job Succeeded with the digest of the
//! same job run without faults, nothing of the job left after its deletion, and
//! `latest.pt` and `/proc` both looked at.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::ops::Bound;
use std::time::Duration;

/// A pod of the job, as the API server shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodSeen {
    pub name: String,
    pub rank: u32,
    pub attempt: u32,
    /// Phase Running and not being deleted.
    pub running: bool,
    /// A replacement created ahead of a termination notice (label `trainyard.dev/standby`):
    /// labelled with the next attempt, it runs nothing until its supervisor starts it.
    pub standby: bool,
}

/// The job's status counters, as the API server shows them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobSeen {
    pub attempt: u32,
    pub preemptions: u32,
    pub failures: u32,
    pub hangs: u32,
    /// `status.requeues`: gang restarts for want of room, against no budget.
    pub requeues: u32,
    /// `status.progress.checkpointStep`.
    pub checkpoint_step: Option<u64>,
    /// `status.progress.stepsLost`, with the attempt it belongs to (`status.progress.attempt`).
    pub steps_lost: Option<(u32, u64)>,
    /// `status.progress`: how far its attempt has got.
    pub progress: Option<ProgressSeen>,
    /// `status.lastRestart.inPlaceRanks`: the ranks the restart that started `attempt` kept
    /// in their pods, to restart in place.
    pub kept: BTreeSet<u32>,
    /// `status.lastRestart.replacedAheadRanks`: the ranks whose pods of `attempt` are
    /// replacements created ahead of a termination notice (make before break).
    pub replaced_ahead: BTreeSet<u32>,
    /// `status.resumePoint.file`: the checkpoint the next attempt resumes from.
    pub resume_file: Option<String>,
}

/// `status.progress`'s attempt, `step` and `resumedFrom`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProgressSeen {
    pub attempt: u32,
    pub step: u64,
    pub resumed_from: Option<u64>,
}

impl ProgressSeen {
    /// Whether the attempt has trained a step: its step is past the one it resumed from (0 in
    /// a fresh start). Status shows it after the fact, so an older attempt's process alive
    /// after the status came was alive after the attempt's true first step.
    fn trained(&self) -> bool {
        self.step > self.resumed_from.unwrap_or(0)
    }
}

/// What of `job` only a forged worker's report could have set ([`crate::forged`]): its step,
/// its checkpoint step or its checkpoint file.
fn forged_in(job: &JobSeen) -> Option<String> {
    use crate::forged::{FORGED_FILE, FORGED_STEP};
    let step = job.progress.map(|p| p.step).filter(|s| *s >= FORGED_STEP);
    let saved = job.checkpoint_step.filter(|s| *s >= FORGED_STEP);
    let file = job
        .resume_file
        .as_deref()
        .filter(|f| f.contains(FORGED_FILE));
    match (step, saved, file) {
        (None, None, None) => None,
        _ => Some(format!(
            "progress.step {step:?}, checkpointStep {saved:?}, resumePoint.file {file:?}"
        )),
    }
}

/// A process of the job alive on this machine, found in `/proc` by its environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessSeen {
    pub pid: u32,
    /// `TRAINYARD_ATTEMPT`.
    pub attempt: u32,
    /// It runs on node 2 (in a pod below node 2's network namespace).
    pub on_node2: bool,
}

impl JobSeen {
    fn restarts(&self) -> u64 {
        u64::from(self.preemptions)
            + u64::from(self.failures)
            + u64::from(self.hangs)
            + u64::from(self.requeues)
    }
}

/// What the run knows once the job has ended and been deleted.
#[derive(Clone, Debug, Default)]
pub struct Ending {
    /// The last status.
    pub job: JobSeen,
    /// Whether the job reached Succeeded.
    pub succeeded: bool,
    /// Suspends followed by a resume while the job's workers existed.
    pub resumes: u32,
    /// Events the operator recorded for gang restarts and resumes.
    pub restart_events: u32,
    /// Failures the schedule caused on purpose (`TrainerFailure` injected).
    pub failures_caused: u32,
    /// Those of them with no fault that restarts the gang close by (from 60 s before to 20 s
    /// after): each must be counted as a failure, never taken for a preemption.
    pub failures_alone: u32,
    /// `ForceDeleted` Events on node 1, whose kubelet is never lost (only restarted).
    pub forced_on_live_node: Vec<String>,
    /// The final weights' digest, and that of the same job run without faults.
    pub digest: Option<String>,
    pub expected_digest: String,
    /// Pods, Services, Endpoints of the job still there after its deletion, and a claim
    /// that is there (or gone) against `retainOnDelete`.
    pub leftovers: Vec<String>,
}

/// An invariant that did not hold, and when (from the start of the run).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub at: Duration,
    pub what: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t+{:.1}s: {}", self.at.as_secs_f64(), self.what)
    }
}

/// Checks the invariants over everything the run saw.
#[derive(Debug, Default)]
pub struct Checker {
    last: Option<JobSeen>,
    violations: Vec<Violation>,
    /// The steps each restart lost, by the attempt after it.
    steps_lost: std::collections::BTreeMap<u32, u64>,
    /// How often `latest.pt` was read (a run that never read it checked nothing).
    checkpoints_read: u32,
    /// The highest step read from `latest.pt` itself.
    file_step: Option<u64>,
    /// How often a step was read from `latest.pt`.
    steps_read: u32,
    /// Why a whole `latest.pt` had no step to read, each reason reported once.
    unreadable: BTreeSet<String>,
    /// When each attempt was first seen to have trained a step (`status.progress`).
    trained: BTreeMap<u32, Duration>,
    /// When node 2 was cut off (a fault held on it), each with when it was back.
    node2_cut: Vec<(Duration, Option<Duration>)>,
    /// How long node 2's kubelet may take, once the node is back, to kill the processes of
    /// pods deleted meanwhile.
    kill_grace: Duration,
    /// The older attempts' processes already reported (pid, attempt): one that lingers is
    /// named once, not at every scan.
    lingering: BTreeSet<(u32, u32)>,
    /// How often `/proc` was scanned for the job's processes.
    proc_scans: u32,
    /// A pod list that shows an attempt the job's status has not shown yet, with when it was
    /// seen: judged once the status catches up ([`Self::pods`]).
    held: Option<(Duration, Vec<PodSeen>)>,
}

impl Checker {
    pub fn new() -> Self {
        Self::default()
    }

    /// How long node 2's kubelet may take, once the node is back, to kill an older attempt's
    /// processes (none by default).
    pub fn with_kill_grace(mut self, grace: Duration) -> Self {
        self.kill_grace = grace;
        self
    }

    /// The steps lost over every restart seen, each counted once.
    pub fn steps_lost(&self) -> u64 {
        self.steps_lost.values().sum()
    }

    /// The violations found so far.
    pub fn violations(&self) -> &[Violation] {
        &self.violations
    }

    /// One list of the job's pods. A pod of an older attempt whose rank the current attempt
    /// keeps in place belongs to neither attempt until it is relabelled: the restart's status
    /// names it kept before the old attempt's other pods are deleted, its supervisor stops the
    /// old attempt's processes (the `/proc` scan checks them), and the operator moves the
    /// pods' labels one write each. Every other pod counts with its label.
    ///
    /// The pods and the status come by two watches, and either may lag: a pod of an attempt
    /// newer than the last status seen means the status watch lags (the operator writes a
    /// restart's status before it relabels or creates a pod of the new attempt), so the list
    /// is held and judged once the status shows that attempt (a later list replaces it).
    ///
    /// Make before break: a standby of an attempt newer than the status runs nothing (its
    /// supervisor waits for the start order), so it counts with neither attempt; once the
    /// status shows its attempt, the pod it replaces belongs to neither until it is deleted,
    /// as a kept pod until it is relabelled. The `/proc` scan checks what actually runs.
    pub fn pods(&mut self, at: Duration, pods: &[PodSeen]) {
        let status_attempt = self.last.as_ref().map_or(0, |j| j.attempt);
        let mut by_rank: BTreeMap<u32, Vec<&str>> = BTreeMap::new();
        for pod in pods
            .iter()
            .filter(|p| p.running && !self.waiting(p) && (self.kept(p) || !self.replaced_ahead(p)))
        {
            by_rank.entry(pod.rank).or_default().push(&pod.name);
        }
        for (rank, names) in by_rank.iter().filter(|(_, n)| n.len() > 1) {
            self.violate(at, format!("two running pods of rank {rank}: {names:?}"));
        }
        if pods
            .iter()
            .any(|p| p.running && !self.waiting(p) && p.attempt > status_attempt)
        {
            self.held = Some((at, pods.to_vec()));
            return;
        }
        self.held = None;
        self.one_attempt(at, pods);
    }

    /// A standby of an attempt newer than the status's: it runs nothing until started.
    fn waiting(&self, pod: &PodSeen) -> bool {
        pod.standby && pod.attempt > self.last.as_ref().map_or(0, |j| j.attempt)
    }

    /// A pod of an older attempt whose rank the status's attempt keeps in place (until it is
    /// relabelled).
    fn kept(&self, pod: &PodSeen) -> bool {
        self.last
            .as_ref()
            .is_some_and(|j| pod.attempt < j.attempt && j.kept.contains(&pod.rank))
    }

    /// A pod of an older attempt whose rank the status's attempt runs in a replacement created
    /// ahead of a termination notice (until it is deleted).
    fn replaced_ahead(&self, pod: &PodSeen) -> bool {
        self.last
            .as_ref()
            .is_some_and(|j| pod.attempt < j.attempt && j.replaced_ahead.contains(&pod.rank))
    }

    /// Never running pods of two attempts at once (kept pods aside, see [`Self::pods`]).
    fn one_attempt(&mut self, at: Duration, pods: &[PodSeen]) {
        let mut by_attempt: BTreeMap<u32, Vec<&str>> = BTreeMap::new();
        for pod in pods.iter().filter(|p| p.running) {
            let in_between = self.last.is_some()
                && (self.kept(pod) || self.replaced_ahead(pod) || self.waiting(pod));
            if !in_between {
                by_attempt.entry(pod.attempt).or_default().push(&pod.name);
            }
        }
        if by_attempt.len() > 1 {
            self.violate(
                at,
                format!("running pods of several attempts: {by_attempt:?}"),
            );
        }
    }

    /// One read of `latest.pt`: why it is torn, if it is ([`super::checkpoint::torn`]).
    pub fn checkpoint(&mut self, at: Duration, torn: Option<String>) {
        self.checkpoints_read = self.checkpoints_read.saturating_add(1);
        if let Some(why) = torn {
            self.violate(at, format!("latest.pt is torn: {why}"));
        }
    }

    /// How often `latest.pt` was read.
    pub fn checkpoints_read(&self) -> u32 {
        self.checkpoints_read
    }

    /// The step stored in a whole `latest.pt` ([`super::checkpoint::step`]), or why it could
    /// not be read: a file whose step cannot be read is not a checkpoint a trainer can resume
    /// from, or the run cannot check it; either way it is named (once per reason).
    pub fn checkpoint_step(&mut self, at: Duration, step: Result<u64, String>) {
        let step = match step {
            Ok(step) => step,
            Err(why) => {
                if self.unreadable.insert(why.clone()) {
                    self.violate(
                        at,
                        format!("the step in latest.pt could not be read: {why}"),
                    );
                }
                return;
            }
        };
        self.steps_read = self.steps_read.saturating_add(1);
        if let Some(high) = self.file_step
            && step < high
        {
            self.violate(
                at,
                format!("latest.pt went back from step {high} to step {step}"),
            );
        }
        self.file_step = self.file_step.max(Some(step));
    }

    /// How often a step was read from `latest.pt`.
    pub fn steps_read(&self) -> u32 {
        self.steps_read
    }

    /// Node 2 is cut off from here on: partitioned, lost, or cut from the API server.
    pub fn node2_cut_off(&mut self, at: Duration) {
        self.node2_cut.push((at, None));
    }

    /// Node 2 is back (the fault that cut it off the longest ago is undone; windows that
    /// overlap cover the same span whichever is closed first).
    pub fn node2_back(&mut self, at: Duration) {
        if let Some((_, back)) = self.node2_cut.iter_mut().find(|(_, back)| back.is_none()) {
            *back = Some(at);
        }
    }

    /// Whether an older attempt's process on node 2 may still be alive at `at`: the node is
    /// cut off, or was back less than the kill grace ago.
    fn node2_excused(&self, at: Duration) -> bool {
        self.node2_cut
            .iter()
            .any(|&(cut, back)| cut <= at && back.is_none_or(|back| at <= back + self.kill_grace))
    }

    /// One scan of `/proc` that started at `at`: the job's processes alive then (each was alive
    /// at some moment of the scan, so no sooner than `at`).
    pub fn processes(&mut self, at: Duration, alive: &[ProcessSeen]) {
        self.proc_scans = self.proc_scans.saturating_add(1);
        for p in alive {
            let newer = self
                .trained
                .range((Bound::Excluded(p.attempt), Bound::Unbounded))
                .filter(|&(_, &trained)| trained < at)
                .min_by_key(|&(_, &trained)| trained);
            let Some((&newer, &trained)) = newer else {
                continue;
            };
            if p.on_node2 && self.node2_excused(at) {
                continue;
            }
            if self.lingering.insert((p.pid, p.attempt)) {
                let node = if p.on_node2 { 2 } else { 1 };
                self.violate(
                    at,
                    format!(
                        "process {} of attempt {} alive on node {node} after attempt {newer} trained a step (status at t+{:.1}s)",
                        p.pid,
                        p.attempt,
                        trained.as_secs_f64()
                    ),
                );
            }
        }
    }

    /// How often `/proc` was scanned.
    pub fn proc_scans(&self) -> u32 {
        self.proc_scans
    }

    /// One status of the job.
    pub fn job(&mut self, at: Duration, job: &JobSeen) {
        if let Some((attempt, lost)) = job.steps_lost {
            self.steps_lost.insert(attempt, lost);
        }
        if let Some(p) = job.progress.filter(ProgressSeen::trained) {
            self.trained.entry(p.attempt).or_insert(at);
        }
        if let Some(forged) = forged_in(job) {
            self.violate(
                at,
                format!("a forged worker's report moved status: {forged}"),
            );
        }
        if u64::from(job.attempt) < job.restarts() {
            self.violate(
                at,
                format!(
                    "attempt {} is below the restarts counted ({} preemptions + {} failures + {} \
                     hangs + {} requeues)",
                    job.attempt, job.preemptions, job.failures, job.hangs, job.requeues
                ),
            );
        }
        if let Some(last) = self.last.take() {
            let counters = [
                ("attempt", last.attempt, job.attempt),
                ("preemptions", last.preemptions, job.preemptions),
                ("failures", last.failures, job.failures),
                ("hangs", last.hangs, job.hangs),
                ("requeues", last.requeues, job.requeues),
            ];
            for (name, before, now) in counters {
                if now < before {
                    self.violate(at, format!("{name} went down from {before} to {now}"));
                }
            }
            if let (Some(before), Some(now)) = (last.checkpoint_step, job.checkpoint_step)
                && now < before
            {
                self.violate(
                    at,
                    format!("checkpointStep went back from {before} to {now}"),
                );
            }
            // A status without a checkpoint step keeps the last one known.
            let mut kept = job.clone();
            kept.checkpoint_step = job.checkpoint_step.or(last.checkpoint_step);
            self.last = Some(kept);
        } else {
            self.last = Some(job.clone());
        }
        if let Some((seen_at, pods)) = self.held.take() {
            if pods.iter().any(|p| p.running && p.attempt > job.attempt) {
                self.held = Some((seen_at, pods));
            } else {
                self.one_attempt(seen_at, &pods);
            }
        }
    }

    /// The end of the run.
    pub fn finish(&mut self, at: Duration, end: &Ending) {
        self.job(at, &end.job);
        let job = &end.job;
        let counted = job.restarts() + u64::from(end.resumes);
        if u64::from(job.attempt) != counted {
            self.violate(
                at,
                format!(
                    "attempt {} != {} preemptions + {} failures + {} hangs + {} requeues + {} \
                     resumes",
                    job.attempt,
                    job.preemptions,
                    job.failures,
                    job.hangs,
                    job.requeues,
                    end.resumes
                ),
            );
        }
        if end.restart_events != job.attempt {
            self.violate(
                at,
                format!(
                    "{} restart Events for attempt {}",
                    end.restart_events, job.attempt
                ),
            );
        }
        if job.failures > end.failures_caused {
            self.violate(
                at,
                format!(
                    "{} failures counted, {} caused by the schedule",
                    job.failures, end.failures_caused
                ),
            );
        }
        if job.failures < end.failures_alone {
            self.violate(
                at,
                format!(
                    "{} failures counted, {} genuine failures injected away from any restart",
                    job.failures, end.failures_alone
                ),
            );
        }
        for forced in &end.forced_on_live_node {
            self.violate(
                at,
                format!("a pod force-deleted on a node whose kubelet renewed: {forced}"),
            );
        }
        if !end.succeeded {
            self.violate(at, "the job did not succeed".to_owned());
        }
        match &end.digest {
            Some(d) if *d == end.expected_digest => {}
            Some(d) => self.violate(
                at,
                format!(
                    "final weights {d} differ from the run without faults {}",
                    end.expected_digest
                ),
            ),
            None => self.violate(at, "no final weights digest".to_owned()),
        }
        for left in &end.leftovers {
            self.violate(at, format!("left after the job's deletion: {left}"));
        }
        if self.checkpoints_read == 0 {
            self.violate(at, "latest.pt was never read".to_owned());
        }
        if self.proc_scans == 0 {
            self.violate(
                at,
                "/proc was never scanned for the job's processes".to_owned(),
            );
        }
    }

    fn violate(&mut self, at: Duration, what: String) {
        self.violations.push(Violation { at, what });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, rank: u32, attempt: u32, running: bool) -> PodSeen {
        PodSeen {
            name: name.to_owned(),
            rank,
            attempt,
            running,
            standby: false,
        }
    }

    fn seen(attempt: u32, preemptions: u32, step: Option<u64>) -> JobSeen {
        JobSeen {
            attempt,
            preemptions,
            checkpoint_step: step,
            ..JobSeen::default()
        }
    }

    fn t(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn what_only_a_forged_report_could_set_in_status_is_a_violation() {
        let progress = |step| ProgressSeen {
            attempt: 1,
            step,
            resumed_from: None,
        };
        let mut c = Checker::new();
        c.job(
            t(1),
            &JobSeen {
                progress: Some(progress(120)),
                resume_file: Some("latest.pt".to_owned()),
                ..seen(1, 1, Some(115))
            },
        );
        assert!(c.violations().is_empty(), "{:?}", c.violations());
        let forged = [
            JobSeen {
                progress: Some(progress(999_999)),
                ..seen(1, 1, Some(115))
            },
            seen(1, 1, Some(999_999)),
            JobSeen {
                resume_file: Some("forged-nonexistent.pt".to_owned()),
                ..seen(1, 1, Some(115))
            },
        ];
        for (i, job) in forged.iter().enumerate() {
            let mut c = Checker::new();
            c.job(t(2), job);
            assert_eq!(c.violations().len(), 1, "case {i}: {:?}", c.violations());
            assert!(
                c.violations()[0]
                    .what
                    .contains("a forged worker's report moved status")
            );
        }
    }

    #[test]
    fn steps_lost_count_each_restart_once_however_often_its_status_is_seen() {
        let mut c = Checker::new();
        let lost = |attempt, steps| JobSeen {
            steps_lost: Some((attempt, steps)),
            ..seen(attempt, attempt, None)
        };
        for job in [lost(1, 3), lost(1, 3), lost(2, 0), lost(3, 4), lost(3, 4)] {
            c.job(t(1), &job);
        }
        assert_eq!(c.steps_lost(), 7);
    }

    #[test]
    fn two_running_pods_of_a_rank_or_of_two_attempts_are_violations() {
        let mut c = Checker::new();
        let at_3 = JobSeen {
            attempt: 3,
            preemptions: 3,
            ..JobSeen::default()
        };
        c.job(t(0), &at_3);
        c.pods(t(1), &[pod("w-0", 0, 1, true), pod("w-1", 1, 1, true)]);
        assert!(c.violations().is_empty());
        // A terminating pod of the old attempt beside the new one is not running.
        c.pods(t(2), &[pod("w-0", 0, 1, false), pod("w-0b", 0, 2, true)]);
        assert!(c.violations().is_empty());
        c.pods(t(3), &[pod("w-0", 0, 2, true), pod("w-0x", 0, 2, true)]);
        assert_eq!(c.violations().len(), 1);
        assert!(
            c.violations()[0].what.contains("rank 0"),
            "{:?}",
            c.violations()
        );
        c.pods(t(4), &[pod("w-0", 0, 2, true), pod("w-1", 1, 3, true)]);
        assert_eq!(c.violations().len(), 2);
        assert!(c.violations()[1].what.contains("several attempts"));
    }

    #[test]
    fn a_pod_kept_in_place_may_carry_the_old_attempt_until_it_is_relabelled() {
        let mut c = Checker::new();
        let restarted = JobSeen {
            attempt: 1,
            failures: 1,
            kept: BTreeSet::from([0, 1]),
            ..JobSeen::default()
        };
        c.job(t(1), &restarted);
        // Rank 0 relabelled first, rank 1 not yet: both kept.
        c.pods(t(2), &[pod("w-0", 0, 1, true), pod("w-1", 1, 0, true)]);
        assert!(c.violations().is_empty(), "{:?}", c.violations());
        // Rank 2 was not kept: its old pod running beside the new attempt is a violation.
        c.pods(t(3), &[pod("w-0", 0, 1, true), pod("w-2", 2, 0, true)]);
        assert_eq!(c.violations().len(), 1);
        assert!(c.violations()[0].what.contains("several attempts"));
    }

    #[test]
    fn a_standby_counts_with_no_attempt_until_the_switch_and_its_noticed_pod_until_deleted() {
        let mut c = Checker::new();
        c.job(t(0), &seen(0, 0, None));
        let standby = PodSeen {
            standby: true,
            ..pod("w-1-b", 1, 1, true)
        };
        // Waiting beside worker 1, labelled attempt 1 while the status shows 0.
        let waiting = [
            pod("w-0", 0, 0, true),
            pod("w-1", 1, 0, true),
            standby.clone(),
        ];
        c.pods(t(1), &waiting);
        assert!(c.violations().is_empty(), "{:?}", c.violations());
        // The switch: rank 0 kept, rank 1 replaced ahead; worker 1 not deleted yet.
        let switched = JobSeen {
            kept: BTreeSet::from([0]),
            replaced_ahead: BTreeSet::from([1]),
            ..seen(1, 1, None)
        };
        c.job(t(2), &switched);
        c.pods(t(3), &waiting);
        assert!(c.violations().is_empty(), "{:?}", c.violations());
        // A pod that is no standby labelled with a newer attempt is judged as before, and so
        // is a rank that was neither kept nor replaced ahead.
        c.pods(
            t(4),
            &[
                pod("w-1", 1, 1, true),
                pod("w-1x", 1, 1, true),
                standby.clone(),
            ],
        );
        assert_eq!(c.violations().len(), 1, "{:?}", c.violations());
        assert!(
            c.violations()[0]
                .what
                .contains("two running pods of rank 1")
        );
        c.pods(t(5), &[pod("w-2", 2, 0, true), standby]);
        assert_eq!(c.violations().len(), 2, "{:?}", c.violations());
        assert!(c.violations()[1].what.contains("several attempts"));
    }

    /// Seed 1: the status watch, back from an etcd restart, showed the restart (attempt 1,
    /// ranks 0 and 1 kept) after the pod watch showed rank 1 relabelled and rank 0 not yet.
    #[test]
    fn pods_ahead_of_the_status_are_judged_once_the_status_catches_up() {
        let mut c = Checker::new();
        c.job(t(1), &JobSeen::default());
        c.pods(t(2), &[pod("w-0", 0, 0, true), pod("w-1", 1, 1, true)]);
        assert!(c.violations().is_empty(), "{:?}", c.violations());
        let restarted = JobSeen {
            attempt: 1,
            preemptions: 1,
            kept: BTreeSet::from([0, 1]),
            ..JobSeen::default()
        };
        c.job(t(3), &restarted);
        assert!(c.violations().is_empty(), "{:?}", c.violations());
        // Had rank 0 not been kept, the held list would have been one.
        let mut c = Checker::new();
        c.job(t(1), &JobSeen::default());
        c.pods(t(2), &[pod("w-0", 0, 0, true), pod("w-1", 1, 1, true)]);
        let kept_1 = JobSeen {
            kept: BTreeSet::from([1]),
            ..restarted
        };
        c.job(t(3), &kept_1);
        assert_eq!(c.violations().len(), 1);
        assert_eq!(c.violations()[0].at, t(2), "judged as seen, when seen");
    }

    /// Seed 20294459: the restart's status (attempt 1, rank 0 kept) is written before the
    /// old attempt's other pods are deleted; meanwhile they run beside the kept pod, all of
    /// attempt 0's label, and nothing of attempt 1 runs anywhere.
    #[test]
    fn the_old_pods_of_a_restart_that_keeps_a_rank_may_run_until_they_are_deleted() {
        let mut c = Checker::new();
        let restarted = JobSeen {
            attempt: 1,
            preemptions: 1,
            kept: BTreeSet::from([0]),
            ..JobSeen::default()
        };
        c.job(t(1), &restarted);
        let old = [
            pod("w-0", 0, 0, true),
            pod("w-1", 1, 0, true),
            pod("w-2", 2, 0, true),
        ];
        c.pods(t(2), &old);
        assert!(c.violations().is_empty(), "{:?}", c.violations());
        // A pod of the new attempt beside them is one.
        c.pods(
            t(3),
            &[
                pod("w-0", 0, 0, true),
                pod("w-1", 1, 0, true),
                pod("w-2", 2, 1, true),
            ],
        );
        assert_eq!(c.violations().len(), 1);
    }

    #[test]
    fn counters_and_the_checkpoint_step_never_go_back() {
        let mut c = Checker::new();
        c.job(t(1), &seen(1, 1, Some(100)));
        c.job(t(2), &seen(1, 1, None)); // unknown keeps the last step
        c.job(t(3), &seen(2, 2, Some(150)));
        assert!(c.violations().is_empty(), "{:?}", c.violations());
        c.job(t(4), &seen(2, 2, Some(120)));
        c.job(t(5), &seen(1, 1, Some(150)));
        let what: Vec<_> = c.violations().iter().map(|v| v.what.as_str()).collect();
        assert_eq!(
            what,
            [
                "checkpointStep went back from 150 to 120",
                "attempt went down from 2 to 1",
                "preemptions went down from 2 to 1",
            ]
        );
    }

    #[test]
    fn an_attempt_below_its_restarts_is_a_violation() {
        let mut c = Checker::new();
        c.job(t(1), &seen(1, 2, None));
        assert_eq!(c.violations().len(), 1);
        assert!(
            c.violations()[0]
                .to_string()
                .starts_with("t+1.0s: attempt 1 is below")
        );
    }

    fn ending() -> Ending {
        Ending {
            job: JobSeen {
                attempt: 3,
                preemptions: 2,
                ..JobSeen::default()
            },
            succeeded: true,
            resumes: 1,
            restart_events: 3,
            failures_caused: 0,
            failures_alone: 0,
            forced_on_live_node: Vec::new(),
            digest: Some("abc".to_owned()),
            expected_digest: "abc".to_owned(),
            leftovers: Vec::new(),
        }
    }

    #[test]
    fn a_clean_ending_passes_and_each_broken_promise_is_named() {
        let mut c = Checker::new();
        c.checkpoint(t(5), None);
        c.processes(t(5), &[]);
        c.finish(t(9), &ending());
        assert!(c.violations().is_empty(), "{:?}", c.violations());

        let mut bad = ending();
        bad.job.failures = 1;
        bad.restart_events = 5;
        bad.succeeded = false;
        bad.digest = Some("def".to_owned());
        bad.leftovers = vec!["Service demo".to_owned()];
        bad.forced_on_live_node =
            vec!["pod demo-worker-0 was stuck terminating on lost node node-1".to_owned()];
        let mut c = Checker::new();
        c.finish(t(9), &bad);
        let what: Vec<_> = c.violations().iter().map(|v| v.what.clone()).collect();
        assert_eq!(what.len(), 9, "{what:?}");
        assert!(
            what[0].contains("attempt 3 != 2 preemptions + 1 failures"),
            "{what:?}"
        );
        assert!(
            what[1].contains("5 restart Events for attempt 3"),
            "{what:?}"
        );
        assert!(what[2].contains("1 failures counted, 0 caused"), "{what:?}");
        assert!(what[3].starts_with("a pod force-deleted on a node whose kubelet renewed"));
        assert_eq!(what[4], "the job did not succeed");
        assert!(what[5].contains("final weights def differ"), "{what:?}");
        assert_eq!(what[6], "left after the job's deletion: Service demo");
        assert_eq!(what[7], "latest.pt was never read");
        assert_eq!(what[8], "/proc was never scanned for the job's processes");
    }

    /// A genuine failure injected away from any restart that the operator took for a
    /// preemption (the review's repro: a late Lease beside it) is a violation.
    #[test]
    fn a_genuine_failure_not_counted_as_one_is_named() {
        let mut end = ending();
        end.job = JobSeen {
            attempt: 3,
            preemptions: 3,
            ..JobSeen::default()
        };
        end.resumes = 0;
        end.failures_caused = 1;
        end.failures_alone = 1;
        let mut c = Checker::new();
        c.checkpoint(t(5), None);
        c.processes(t(5), &[]);
        c.finish(t(9), &end);
        let what: Vec<_> = c.violations().iter().map(|v| v.what.clone()).collect();
        assert_eq!(
            what,
            ["0 failures counted, 1 genuine failures injected away from any restart"]
        );
        end.job.preemptions = 2;
        end.job.failures = 1;
        let mut c = Checker::new();
        c.checkpoint(t(5), None);
        c.processes(t(5), &[]);
        c.finish(t(9), &end);
        assert!(c.violations().is_empty(), "{:?}", c.violations());
    }

    #[test]
    fn a_torn_checkpoint_is_a_violation_at_the_time_it_was_read() {
        let mut c = Checker::new();
        c.checkpoint(t(1), None);
        c.checkpoint(t(2), Some("not a whole zip archive (10 bytes)".to_owned()));
        assert_eq!(c.checkpoints_read(), 2);
        assert_eq!(
            c.violations()
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            ["t+2.0s: latest.pt is torn: not a whole zip archive (10 bytes)"]
        );
    }

    fn what(c: &Checker) -> Vec<String> {
        c.violations().iter().map(ToString::to_string).collect()
    }

    #[test]
    fn the_step_in_latest_pt_going_back_is_a_violation_the_same_or_higher_is_not() {
        let mut c = Checker::new();
        for (at, step) in [(1, 5), (2, 5), (3, 10), (4, 10), (5, 15)] {
            c.checkpoint_step(t(at), Ok(step));
        }
        assert!(c.violations().is_empty(), "{:?}", c.violations());
        c.checkpoint_step(t(6), Ok(10));
        // Back from the highest step ever read, not only from the last one.
        c.checkpoint_step(t(7), Ok(12));
        c.checkpoint_step(t(8), Ok(20));
        assert_eq!(c.steps_read(), 8);
        assert_eq!(
            what(&c),
            [
                "t+6.0s: latest.pt went back from step 15 to step 10",
                "t+7.0s: latest.pt went back from step 15 to step 12",
            ]
        );
    }

    #[test]
    fn a_step_that_cannot_be_read_is_named_once_per_reason() {
        let mut c = Checker::new();
        let no_step =
            || Err(r#"archive/data.pkl has no non-negative integer "step": None"#.to_owned());
        c.checkpoint_step(t(1), no_step());
        c.checkpoint_step(t(2), no_step());
        c.checkpoint_step(t(3), Err("python3: not found".to_owned()));
        assert_eq!(c.steps_read(), 0);
        assert_eq!(
            what(&c),
            [
                r#"t+1.0s: the step in latest.pt could not be read: archive/data.pkl has no non-negative integer "step": None"#,
                "t+3.0s: the step in latest.pt could not be read: python3: not found",
            ]
        );
    }

    fn process(pid: u32, attempt: u32, on_node2: bool) -> ProcessSeen {
        ProcessSeen {
            pid,
            attempt,
            on_node2,
        }
    }

    /// Attempt `attempt`'s status, `step` steps done after resuming from step 100.
    fn progress(attempt: u32, step: u64) -> JobSeen {
        JobSeen {
            progress: Some(ProgressSeen {
                attempt,
                step,
                resumed_from: Some(100),
            }),
            ..seen(attempt, attempt, Some(100))
        }
    }

    #[test]
    fn an_older_attempts_process_alive_after_the_newer_one_trained_is_a_violation() {
        let mut c = Checker::new();
        c.job(t(10), &progress(1, 100)); // attempt 1 resumed, no step trained yet
        c.processes(t(11), &[process(40, 0, false), process(50, 1, false)]);
        assert!(c.violations().is_empty(), "{:?}", c.violations());
        c.job(t(12), &progress(1, 101));
        c.processes(t(12), &[process(40, 0, false)]); // the scan began as the status came
        assert!(c.violations().is_empty(), "{:?}", c.violations());
        c.processes(t(13), &[process(40, 0, false), process(50, 1, false)]);
        // Still there at the next scan: named once.
        c.processes(t(14), &[process(40, 0, false)]);
        assert_eq!(c.proc_scans(), 4);
        assert_eq!(
            what(&c),
            [
                "t+13.0s: process 40 of attempt 0 alive on node 1 after attempt 1 trained a step (status at t+12.0s)"
            ]
        );
    }

    #[test]
    fn a_fresh_start_has_trained_once_its_step_is_past_zero() {
        let fresh = |step| JobSeen {
            progress: Some(ProgressSeen {
                attempt: 2,
                step,
                resumed_from: None,
            }),
            ..seen(2, 2, None)
        };
        let mut c = Checker::new();
        c.job(t(1), &fresh(0));
        c.processes(t(2), &[process(7, 1, false)]);
        assert!(c.violations().is_empty(), "{:?}", c.violations());
        c.job(t(3), &fresh(1));
        c.processes(t(4), &[process(7, 1, false)]);
        assert_eq!(c.violations().len(), 1, "{:?}", c.violations());
    }

    #[test]
    fn old_processes_on_node_2_are_excused_while_it_is_cut_off_and_for_the_kill_grace_after() {
        let mut c = Checker::new().with_kill_grace(t(50));
        c.job(t(10), &progress(1, 101));
        c.node2_cut_off(t(20));
        c.processes(t(30), &[process(60, 0, true)]);
        c.node2_back(t(40));
        c.processes(t(90), &[process(60, 0, true)]);
        assert!(c.violations().is_empty(), "{:?}", c.violations());
        // Node 1 is never excused, not even while node 2 is cut off.
        c.processes(t(35), &[process(70, 0, false)]);
        // Past the grace, and before the cut.
        c.processes(t(91), &[process(60, 0, true)]);
        let mut before = Checker::new().with_kill_grace(t(50));
        before.job(t(10), &progress(1, 101));
        before.processes(t(15), &[process(61, 0, true)]);
        before.node2_cut_off(t(20));
        assert_eq!(
            what(&c),
            [
                "t+35.0s: process 70 of attempt 0 alive on node 1 after attempt 1 trained a step (status at t+10.0s)",
                "t+91.0s: process 60 of attempt 0 alive on node 2 after attempt 1 trained a step (status at t+10.0s)",
            ]
        );
        assert_eq!(before.violations().len(), 1, "{:?}", before.violations());
    }

    #[test]
    fn a_node_2_cut_still_held_excuses_after_another_one_is_undone() {
        let mut c = Checker::new().with_kill_grace(t(5));
        c.job(t(1), &progress(1, 101));
        c.node2_cut_off(t(10));
        c.node2_cut_off(t(20));
        c.node2_back(t(30));
        c.processes(t(60), &[process(8, 0, true)]);
        assert!(c.violations().is_empty(), "{:?}", c.violations());
        c.node2_back(t(70));
        c.processes(t(75), &[process(8, 0, true)]);
        assert!(c.violations().is_empty(), "{:?}", c.violations());
        c.processes(t(76), &[process(8, 0, true)]);
        assert_eq!(c.violations().len(), 1, "{:?}", c.violations());
    }
}
