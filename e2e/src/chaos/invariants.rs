//! The invariants a chaos run checks, as a pure checker fed with what the run's watches saw.
//!
//! Continuously (each pod list and each status the watches deliver):
//! - never two running pods of one rank, never running pods of two attempts at once;
//! - the counters (`attempt`, `preemptions`, `failures`, `hangs`) never decrease, and
//!   `attempt` is never below the restarts counted;
//! - the reported checkpoint step never goes backwards;
//! - `latest.pt`, read from the job's volume every second, is never torn.
//!
//! At the end: `attempt` = preemptions + failures + hangs + resumes, one restart Event per
//! restart, no failure the schedule did not cause and every genuine failure it caused away
//! from a gang restart counted as one failure, the job Succeeded with the digest of the
//! same job run without faults, and nothing of the job left after its deletion.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// A pod of the job, as the API server shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodSeen {
    pub name: String,
    pub rank: u32,
    pub attempt: u32,
    /// Phase Running and not being deleted.
    pub running: bool,
}

/// The job's status counters, as the API server shows them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobSeen {
    pub attempt: u32,
    pub preemptions: u32,
    pub failures: u32,
    pub hangs: u32,
    /// `status.progress.checkpointStep`.
    pub checkpoint_step: Option<u64>,
    /// `status.progress.stepsLost`, with the attempt it belongs to (`status.progress.attempt`).
    pub steps_lost: Option<(u32, u64)>,
}

impl JobSeen {
    fn restarts(&self) -> u64 {
        u64::from(self.preemptions) + u64::from(self.failures) + u64::from(self.hangs)
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
}

impl Checker {
    pub fn new() -> Self {
        Self::default()
    }

    /// The steps lost over every restart seen, each counted once.
    pub fn steps_lost(&self) -> u64 {
        self.steps_lost.values().sum()
    }

    /// The violations found so far.
    pub fn violations(&self) -> &[Violation] {
        &self.violations
    }

    /// One list of the job's pods.
    pub fn pods(&mut self, at: Duration, pods: &[PodSeen]) {
        let mut by_rank: BTreeMap<u32, Vec<&str>> = BTreeMap::new();
        let mut by_attempt: BTreeMap<u32, Vec<&str>> = BTreeMap::new();
        for pod in pods.iter().filter(|p| p.running) {
            by_rank.entry(pod.rank).or_default().push(&pod.name);
            by_attempt.entry(pod.attempt).or_default().push(&pod.name);
        }
        for (rank, names) in by_rank.iter().filter(|(_, n)| n.len() > 1) {
            self.violate(at, format!("two running pods of rank {rank}: {names:?}"));
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

    /// One status of the job.
    pub fn job(&mut self, at: Duration, job: &JobSeen) {
        if let Some((attempt, lost)) = job.steps_lost {
            self.steps_lost.insert(attempt, lost);
        }
        if u64::from(job.attempt) < job.restarts() {
            self.violate(
                at,
                format!(
                    "attempt {} is below the restarts counted ({} preemptions + {} failures + {} hangs)",
                    job.attempt, job.preemptions, job.failures, job.hangs
                ),
            );
        }
        if let Some(last) = self.last.take() {
            let counters = [
                ("attempt", last.attempt, job.attempt),
                ("preemptions", last.preemptions, job.preemptions),
                ("failures", last.failures, job.failures),
                ("hangs", last.hangs, job.hangs),
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
                    "attempt {} != {} preemptions + {} failures + {} hangs + {} resumes",
                    job.attempt, job.preemptions, job.failures, job.hangs, end.resumes
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
        assert_eq!(what.len(), 8, "{what:?}");
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
}
