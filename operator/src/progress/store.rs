//! What the trainers reported, per job: pure, no I/O.
//!
//! The server records a report only after it has checked the token and the pod, so an entry
//! exists only for a job with a worker pod that reported, and its ranks are that job's ranks.
//! The controller forgets a job when the job is deleted ([`ProgressStore::forget`],
//! [`ProgressStore::retain`]).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};

use jiff::{SignedDuration, Timestamp};

use crate::state::job_memory::{JobKey, LiveJobs, PerJob};

/// One rank's report, as the server checked it.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// The worker's rank.
    pub rank: u32,
    /// The attempt it runs in.
    pub attempt: u32,
    /// The step it is at.
    pub step: u64,
    /// Its latest loss, finite.
    pub loss: Option<f64>,
    /// The step of the latest checkpoint it knows is saved.
    pub checkpoint_step: Option<u64>,
    /// The file (in the checkpoint directory) holding that checkpoint, if it named one.
    pub checkpoint_file: Option<String>,
    /// The step this attempt resumed from.
    pub resumed_from: Option<u64>,
}

/// One rank's progress in the current attempt.
#[derive(Clone, Debug, PartialEq)]
pub struct RankProgress {
    /// The step it reported last.
    pub step: u64,
    /// The loss it reported last, if it ever did in this attempt.
    pub loss: Option<f64>,
    /// When it reported last.
    pub reported_at: Timestamp,
    /// When its step last increased (or its first report).
    pub advanced_at: Timestamp,
    /// The longest gap between two of its reports in this attempt (zero after one report):
    /// how long it may go quiet ([`crate::model::liveness::quiet_after`]).
    pub longest_gap: SignedDuration,
}

/// A job's progress in its latest reporting attempt.
#[derive(Clone, Debug, PartialEq)]
pub struct JobProgress {
    /// The uid of the job whose workers reported: a job deleted and applied again under the
    /// same name is another job, and never reads its namesake's reports.
    pub job_uid: String,
    /// The attempt the figures belong to: the highest one that reported.
    pub attempt: u32,
    /// Each rank that reported in this attempt.
    pub ranks: BTreeMap<u32, RankProgress>,
    /// The highest `checkpointStep` reported in this attempt, each at or below the step of
    /// the report that carried it.
    pub checkpoint_step: Option<u64>,
    /// The file holding that checkpoint, when its report named one.
    pub checkpoint_file: Option<String>,
    /// When that checkpoint step was first reported.
    pub checkpoint_at: Option<Timestamp>,
    /// The highest `resumedFrom` reported in this attempt.
    pub resumed_from: Option<u64>,
    /// The highest step reported in the attempt that reported before this one.
    pub previous_attempt_step: Option<u64>,
    /// The highest step known when a checkpoint was requested in this attempt, while no
    /// checkpoint at or past it has been reported. Once one is, this is `None` again and
    /// `checkpoint_step` is at least that step; a request is made once, until it is withdrawn
    /// ([`ProgressStore::withdraw_checkpoint_request`]).
    pub checkpoint_requested: Option<u64>,
    /// The checkpoint step that answered this attempt's checkpoint request, once one did
    /// (at or past the step the request was made at; possibly a checkpoint saved just before).
    pub checkpoint_saved_on_request: Option<u64>,
    /// Steps per second of the job's highest step over its recent reports (about the last
    /// 16 seconds or more); `None` until two reports some time apart.
    pub steps_per_second: Option<f64>,
}

impl JobProgress {
    fn new(job_uid: &str, attempt: u32) -> Self {
        Self {
            job_uid: job_uid.to_owned(),
            attempt,
            ranks: BTreeMap::new(),
            checkpoint_step: None,
            checkpoint_file: None,
            checkpoint_at: None,
            resumed_from: None,
            previous_attempt_step: None,
            checkpoint_requested: None,
            checkpoint_saved_on_request: None,
            steps_per_second: None,
        }
    }

    /// The highest step any rank reported in this attempt.
    pub fn step(&self) -> Option<u64> {
        self.ranks.values().map(|r| r.step).max()
    }

    /// The longest gap between two reports of one rank in this attempt, once a rank reported
    /// twice.
    pub fn report_cadence(&self) -> Option<SignedDuration> {
        self.ranks
            .values()
            .map(|r| r.longest_gap)
            .max()
            .filter(|g| g.is_positive())
    }

    /// When any rank's step last advanced: the hang check compares it with now.
    pub fn advanced_at(&self) -> Option<Timestamp> {
        self.ranks.values().map(|r| r.advanced_at).max()
    }
}

/// What recording a report decided.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Recorded {
    /// Answer `{"checkpoint": true}`: a requested checkpoint is not saved yet.
    pub checkpoint: bool,
    /// Reconcile the job now: the report changed something the plan decides on (a new attempt,
    /// a rank's first report, a newer checkpoint, the step resumed from). A plain step
    /// advance does not, so reports do not cost a reconcile each.
    pub wake: bool,
}

/// Samples of a job's highest step at least this far apart feed `steps_per_second`.
const SAMPLE_SPACING: SignedDuration = SignedDuration::from_secs(1);
/// How many samples the rate spans.
const MAX_SAMPLES: usize = 16;

/// The recent history of a job's highest step.
#[derive(Debug, Default)]
struct Rate {
    /// `(when, highest step)`, oldest first, at least [`SAMPLE_SPACING`] apart.
    samples: VecDeque<(Timestamp, u64)>,
}

impl Rate {
    /// Adds the highest step at `now` and returns the rate from the oldest sample to it.
    fn observe(&mut self, now: Timestamp, step: u64) -> Option<f64> {
        if self.samples.back().is_some_and(|&(_, last)| step < last) {
            // The highest step went back (a rank restarted from a checkpoint): start over.
            self.samples.clear();
        }
        let (first_at, first_step) = *self.samples.front().unwrap_or(&(now, step));
        match self.samples.back() {
            Some(&(last_at, _)) if now.duration_since(last_at) < SAMPLE_SPACING => {}
            _ => {
                if self.samples.len() == MAX_SAMPLES {
                    self.samples.pop_front();
                }
                self.samples.push_back((now, step));
            }
        }
        let seconds = now.duration_since(first_at).as_secs_f64();
        (seconds > 0.0).then(|| (step - first_step) as f64 / seconds)
    }
}

/// A job's entry.
#[derive(Debug)]
struct Entry {
    progress: JobProgress,
    /// The step a checkpoint was requested at in this attempt, outstanding or satisfied.
    requested_at: Option<u64>,
    rate: Rate,
}

impl Entry {
    fn new(job_uid: &str, attempt: u32) -> Self {
        Self {
            progress: JobProgress::new(job_uid, attempt),
            requested_at: None,
            rate: Rate::default(),
        }
    }

    /// Applies a report of this entry's attempt; true when the plan should look now.
    fn apply(&mut self, report: &Report, now: Timestamp) -> bool {
        let p = &mut self.progress;
        let mut wake = false;
        match p.ranks.get_mut(&report.rank) {
            None => {
                p.ranks.insert(
                    report.rank,
                    RankProgress {
                        step: report.step,
                        loss: report.loss,
                        reported_at: now,
                        advanced_at: now,
                        longest_gap: SignedDuration::ZERO,
                    },
                );
                wake = true;
            }
            Some(rank) => {
                if report.step > rank.step {
                    rank.advanced_at = now;
                }
                rank.step = report.step;
                rank.loss = report.loss.or(rank.loss);
                rank.longest_gap = rank.longest_gap.max(now.duration_since(rank.reported_at));
                rank.reported_at = now;
            }
        }
        // A checkpoint past the steps its own report says are done is not one: it neither
        // counts nor answers a request.
        if let Some(step) = report.checkpoint_step.filter(|&c| c <= report.step) {
            if p.checkpoint_step.is_none_or(|known| step > known) {
                p.checkpoint_step = Some(step);
                p.checkpoint_file.clone_from(&report.checkpoint_file);
                p.checkpoint_at = Some(now);
                wake = true;
            } else if p.checkpoint_step == Some(step)
                && p.checkpoint_file.is_none()
                && report.checkpoint_file.is_some()
            {
                // The rank that saved it names the file; another may have reported the step
                // it resumed from first.
                p.checkpoint_file.clone_from(&report.checkpoint_file);
                wake = true;
            }
        }
        if let Some(step) = report.resumed_from
            && p.resumed_from.is_none_or(|known| step > known)
        {
            p.resumed_from = Some(step);
            wake = true;
        }
        if let Some(requested) = p.checkpoint_requested
            && let Some(saved) = p.checkpoint_step.filter(|&saved| saved >= requested)
        {
            p.checkpoint_requested = None;
            p.checkpoint_saved_on_request = Some(saved);
        }
        if let Some(step) = p.step() {
            p.steps_per_second = self.rate.observe(now, step);
        }
        wake
    }
}

/// How many deleted jobs' uids the store remembers, to drop the reports their terminating
/// workers still send.
const RETIRED_UIDS: usize = 1024;

/// The progress of every job that reported, keyed by namespace and name; an entry belongs to
/// one job uid.
#[derive(Debug, Default)]
pub struct ProgressStore {
    jobs: Mutex<HashMap<(String, String), Entry>>,
    /// Uids of deleted jobs, newest last: their workers' late reports are dropped.
    retired: Mutex<VecDeque<String>>,
    /// When the endpoint last refused a report for a reason of its own ([`Self::refused`]).
    refused_at: Mutex<Option<Timestamp>>,
    /// The supervisors of in-place restarts, forgotten with their jobs.
    pub supervisors: super::supervisors::SupervisorBoard,
}

/// Every update leaves the data whole, so a panic elsewhere cannot leave it torn.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl ProgressStore {
    fn jobs(&self) -> MutexGuard<'_, HashMap<(String, String), Entry>> {
        lock(&self.jobs)
    }

    /// Records a checked report of `namespace/job` received at `now`.
    ///
    /// A report of a later attempt than the entry's starts the entry over for that attempt,
    /// keeping the old attempt's highest step as `previous_attempt_step`; a report of an
    /// earlier attempt is ignored.
    ///
    /// `job_uid` is the uid of the job that controls the reporting pod. A report of a deleted
    /// job ([`Self::forget`]) is dropped; one of another job of the same name starts the entry
    /// over for that job.
    pub fn record(
        &self,
        namespace: &str,
        job: &str,
        job_uid: &str,
        report: &Report,
        now: Timestamp,
    ) -> Recorded {
        if lock(&self.retired).iter().any(|u| u == job_uid) {
            return Recorded::default();
        }
        let mut jobs = self.jobs();
        let key = (namespace.to_owned(), job.to_owned());
        if jobs
            .get(&key)
            .is_some_and(|e| e.progress.job_uid != job_uid)
        {
            jobs.remove(&key);
        }
        let (entry, new_attempt) = match jobs.get_mut(&key) {
            Some(entry) if report.attempt < entry.progress.attempt => {
                return Recorded::default();
            }
            Some(entry) if report.attempt > entry.progress.attempt => {
                let previous = entry.progress.step();
                *entry = Entry::new(job_uid, report.attempt);
                entry.progress.previous_attempt_step = previous;
                (entry, true)
            }
            Some(entry) => (entry, false),
            None => (
                jobs.entry(key)
                    .or_insert_with(|| Entry::new(job_uid, report.attempt)),
                true,
            ),
        };
        let changed = entry.apply(report, now);
        Recorded {
            checkpoint: entry.progress.checkpoint_requested.is_some(),
            wake: new_attempt || changed,
        }
    }

    /// The progress of `namespace/job`, if it reported.
    pub fn snapshot(&self, namespace: &str, job: &str) -> Option<JobProgress> {
        self.jobs()
            .get(&(namespace.to_owned(), job.to_owned()))
            .map(|e| e.progress.clone())
    }

    /// Asks the trainers of `attempt` for a checkpoint at or past the highest step known now;
    /// their next reports are answered `{"checkpoint": true}` until one reports it saved.
    ///
    /// Once per request: calling it again (every reconcile while a termination notice stands)
    /// changes nothing, also after the checkpoint was saved, until the request is withdrawn.
    /// It does nothing for an attempt that has not reported yet (its first report wakes the
    /// reconcile, which asks again) or that a later attempt replaced.
    pub fn request_checkpoint(&self, namespace: &str, job: &str, attempt: u32) {
        let mut jobs = self.jobs();
        let Some(entry) = jobs.get_mut(&(namespace.to_owned(), job.to_owned())) else {
            return;
        };
        if entry.progress.attempt != attempt || entry.requested_at.is_some() {
            return;
        }
        let step = entry.progress.step().unwrap_or(0);
        entry.requested_at = Some(step);
        match entry
            .progress
            .checkpoint_step
            .filter(|&saved| saved >= step)
        {
            Some(saved) => entry.progress.checkpoint_saved_on_request = Some(saved),
            None => entry.progress.checkpoint_requested = Some(step),
        }
    }

    /// Forgets the checkpoint request of `attempt`, answered or not: the notice it was made
    /// for is gone, and the next request (a later notice) asks for a checkpoint at or past the
    /// highest step known then, not for the one saved for this one.
    pub fn withdraw_checkpoint_request(&self, namespace: &str, job: &str, attempt: u32) {
        let mut jobs = self.jobs();
        let Some(entry) = jobs.get_mut(&(namespace.to_owned(), job.to_owned())) else {
            return;
        };
        if entry.progress.attempt != attempt {
            return;
        }
        entry.requested_at = None;
        entry.progress.checkpoint_requested = None;
        entry.progress.checkpoint_saved_on_request = None;
    }

    /// The endpoint could not take a report at `now` for a reason of its own: the API server
    /// could not review its token, or too many reports came at once. Until then, a rank whose
    /// reports stopped may have sent them all along (a node is lost only from ranks quiet
    /// while the channel took reports: `crate::model::liveness::lost_nodes`).
    pub fn refused(&self, now: Timestamp) {
        let mut at = lock(&self.refused_at);
        *at = Some(at.map_or(now, |t| t.max(now)));
    }

    /// When the endpoint last refused a report for a reason of its own.
    pub fn last_refusal(&self) -> Option<Timestamp> {
        *lock(&self.refused_at)
    }

    /// How many jobs have an entry.
    pub fn len(&self) -> usize {
        self.jobs().len()
    }

    /// Whether no job has an entry.
    pub fn is_empty(&self) -> bool {
        self.jobs().is_empty()
    }
}

/// The reports and the supervisors of each job, by namespace and name.
impl PerJob for ProgressStore {
    /// Also drops every later report of the job's uid: its workers may report while they
    /// terminate.
    fn forget(&self, job: &JobKey<'_>) {
        self.jobs()
            .remove(&(job.namespace.to_owned(), job.name.to_owned()));
        self.supervisors.forget(job);
        let mut retired = lock(&self.retired);
        if !retired.iter().any(|u| u == job.uid) {
            if retired.len() == RETIRED_UIDS {
                retired.pop_front();
            }
            retired.push_back(job.uid.to_owned());
        }
    }

    fn retain(&self, live: &LiveJobs) {
        self.jobs().retain(|(ns, job), _| live.has(ns, job));
        self.supervisors.retain(live);
    }

    fn largest(&self) -> usize {
        self.len().max(self.supervisors.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key<'a>(namespace: &'a str, name: &'a str, uid: &'a str) -> JobKey<'a> {
        JobKey {
            uid,
            namespace,
            name,
        }
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + seconds).expect("timestamp")
    }

    fn report(rank: u32, attempt: u32, step: u64) -> Report {
        Report {
            rank,
            attempt,
            step,
            loss: None,
            checkpoint_step: None,
            checkpoint_file: None,
            resumed_from: None,
        }
    }

    const WAKE: Recorded = Recorded {
        checkpoint: false,
        wake: true,
    };
    const QUIET: Recorded = Recorded {
        checkpoint: false,
        wake: false,
    };

    #[test]
    fn a_report_is_kept_per_rank_and_a_step_advance_does_not_wake() {
        let store = ProgressStore::default();
        assert_eq!(store.record("ns", "j", "u", &report(0, 0, 10), at(0)), WAKE);
        assert_eq!(
            store.record("ns", "j", "u", &report(1, 0, 9), at(1)),
            WAKE,
            "a rank's first report wakes"
        );
        let advance = Report {
            loss: Some(1.5),
            ..report(0, 0, 11)
        };
        assert_eq!(store.record("ns", "j", "u", &advance, at(5)), QUIET);
        assert_eq!(store.record("ns", "j", "u", &report(1, 0, 9), at(6)), QUIET);

        let p = store.snapshot("ns", "j").expect("reported");
        assert_eq!(p.attempt, 0);
        assert_eq!(p.step(), Some(11));
        assert_eq!(
            p.ranks[&0],
            RankProgress {
                step: 11,
                loss: Some(1.5),
                reported_at: at(5),
                advanced_at: at(5),
                longest_gap: SignedDuration::from_secs(5),
            }
        );
        assert_eq!(
            p.report_cadence(),
            Some(SignedDuration::from_secs(5)),
            "the longest gap of any rank: rank 0's, 0 to 5"
        );
        assert_eq!(
            (p.ranks[&1].reported_at, p.ranks[&1].advanced_at),
            (at(6), at(1)),
            "a step that did not increase is not an advance"
        );
        assert_eq!(p.advanced_at(), Some(at(5)));
        assert_eq!(store.snapshot("ns", "other"), None);
        assert_eq!(store.snapshot("other", "j"), None);
    }

    #[test]
    fn a_newer_checkpoint_and_the_first_resumed_from_wake_the_same_ones_do_not() {
        let store = ProgressStore::default();
        let resumed = Report {
            resumed_from: Some(100),
            ..report(0, 1, 100)
        };
        assert_eq!(store.record("ns", "j", "u", &resumed, at(0)), WAKE);
        assert_eq!(store.record("ns", "j", "u", &resumed, at(1)), QUIET);
        let saved = Report {
            checkpoint_step: Some(150),
            ..report(0, 1, 160)
        };
        assert_eq!(store.record("ns", "j", "u", &saved, at(2)), WAKE);
        assert_eq!(store.record("ns", "j", "u", &saved, at(3)), QUIET);
        let older = Report {
            checkpoint_step: Some(120),
            ..report(1, 1, 160)
        };
        store.record("ns", "j", "u", &older, at(4));
        let p = store.snapshot("ns", "j").expect("reported");
        assert_eq!(
            (p.checkpoint_step, p.checkpoint_at, p.resumed_from),
            (Some(150), Some(at(2)), Some(100)),
            "the highest checkpoint and when it first appeared"
        );
    }

    #[test]
    fn a_later_attempt_starts_over_keeping_the_previous_attempts_step() {
        let store = ProgressStore::default();
        store.record("ns", "j", "u", &report(0, 0, 480), at(0));
        store.record("ns", "j", "u", &report(1, 0, 500), at(0));
        let saved = Report {
            checkpoint_step: Some(400),
            ..report(0, 0, 480)
        };
        store.record("ns", "j", "u", &saved, at(1));
        store.request_checkpoint("ns", "j", 0);

        let resumed = Report {
            resumed_from: Some(400),
            ..report(1, 1, 400)
        };
        assert_eq!(store.record("ns", "j", "u", &resumed, at(10)), WAKE);
        let p = store.snapshot("ns", "j").expect("reported");
        assert_eq!(p.attempt, 1);
        assert_eq!(p.previous_attempt_step, Some(500));
        assert_eq!(p.resumed_from, Some(400));
        assert_eq!(p.ranks.keys().copied().collect::<Vec<_>>(), vec![1]);
        assert_eq!(
            (p.checkpoint_step, p.checkpoint_at, p.checkpoint_requested),
            (None, None, None),
            "checkpoints and requests belong to their attempt"
        );
        assert_eq!(p.steps_per_second, None);

        assert_eq!(
            store.record("ns", "j", "u", &report(0, 0, 510), at(11)),
            QUIET,
            "a report of an earlier attempt is ignored"
        );
        assert_eq!(store.snapshot("ns", "j"), Some(p));
    }

    #[test]
    fn a_checkpoint_is_asked_for_until_one_at_or_past_the_request_step_is_reported() {
        let store = ProgressStore::default();
        let saved = Report {
            checkpoint_step: Some(100),
            ..report(0, 3, 180)
        };
        store.record("ns", "j", "u", &saved, at(0));
        store.record("ns", "j", "u", &report(1, 3, 200), at(0));
        store.request_checkpoint("ns", "j", 2);
        store.request_checkpoint("ns", "j", 4);
        assert_eq!(
            store
                .snapshot("ns", "j")
                .expect("reported")
                .checkpoint_requested,
            None,
            "a request for another attempt is not this attempt's"
        );

        store.request_checkpoint("ns", "j", 3);
        assert_eq!(
            store
                .snapshot("ns", "j")
                .expect("reported")
                .checkpoint_requested,
            Some(200),
            "the highest step known at the request"
        );
        let asked = Recorded {
            checkpoint: true,
            wake: false,
        };
        assert_eq!(store.record("ns", "j", "u", &saved, at(5)), asked);
        let short = Report {
            checkpoint_step: Some(150),
            ..report(1, 3, 205)
        };
        assert_eq!(
            store.record("ns", "j", "u", &short, at(6)),
            Recorded {
                checkpoint: true,
                wake: true
            },
            "a checkpoint before the request step does not satisfy it"
        );
        // Asked again while outstanding: nothing changes, the step stays.
        store.record("ns", "j", "u", &report(0, 3, 300), at(7));
        store.request_checkpoint("ns", "j", 3);
        assert_eq!(
            store
                .snapshot("ns", "j")
                .expect("reported")
                .checkpoint_requested,
            Some(200)
        );

        let done = Report {
            checkpoint_step: Some(206),
            ..report(0, 3, 300)
        };
        assert_eq!(store.record("ns", "j", "u", &done, at(8)), WAKE);
        assert_eq!(
            store.record("ns", "j", "u", &report(1, 3, 301), at(9)),
            QUIET
        );
        let p = store.snapshot("ns", "j").expect("reported");
        assert_eq!(
            (
                p.checkpoint_requested,
                p.checkpoint_step,
                p.checkpoint_saved_on_request
            ),
            (None, Some(206), Some(206))
        );

        store.request_checkpoint("ns", "j", 3);
        assert_eq!(
            store.record("ns", "j", "u", &report(1, 3, 302), at(10)),
            QUIET,
            "once per attempt: a satisfied request is not made again"
        );
    }

    #[test]
    fn a_checkpoint_already_at_the_highest_step_satisfies_a_request_at_once() {
        let store = ProgressStore::default();
        let saved = Report {
            checkpoint_step: Some(50),
            ..report(0, 0, 50)
        };
        store.record("ns", "j", "u", &saved, at(0));
        store.request_checkpoint("ns", "j", 0);
        let p = store.snapshot("ns", "j").expect("reported");
        assert_eq!(
            (p.checkpoint_requested, p.checkpoint_saved_on_request),
            (None, Some(50)),
            "answered by the checkpoint already saved"
        );
        assert_eq!(
            store.record("ns", "j", "u", &report(0, 0, 51), at(1)),
            QUIET
        );
    }

    #[test]
    fn a_request_before_any_report_makes_no_entry() {
        let store = ProgressStore::default();
        store.request_checkpoint("ns", "j", 0);
        assert!(store.is_empty());
    }

    #[test]
    fn steps_per_second_follow_the_highest_step_once_two_reports_are_apart() {
        let store = ProgressStore::default();
        store.record("ns", "j", "u", &report(0, 0, 100), at(0));
        store.record("ns", "j", "u", &report(1, 0, 90), at(0));
        assert_eq!(
            store
                .snapshot("ns", "j")
                .expect("reported")
                .steps_per_second,
            None
        );
        store.record("ns", "j", "u", &report(0, 0, 150), at(10));
        assert_eq!(
            store
                .snapshot("ns", "j")
                .expect("reported")
                .steps_per_second,
            Some(5.0)
        );
        // A slower rank does not pull the job's rate down.
        store.record("ns", "j", "u", &report(1, 0, 95), at(10));
        store.record("ns", "j", "u", &report(0, 0, 200), at(20));
        assert_eq!(
            store
                .snapshot("ns", "j")
                .expect("reported")
                .steps_per_second,
            Some(5.0)
        );
        // Over a long run the rate spans the recent samples only.
        for i in 3..40 {
            store.record(
                "ns",
                "j",
                "u",
                &report(0, 0, 200 + (i - 2) * 20),
                at(i as i64 * 10),
            );
        }
        assert_eq!(
            store
                .snapshot("ns", "j")
                .expect("reported")
                .steps_per_second,
            Some(2.0)
        );
    }

    #[test]
    fn forget_and_retain_drop_entries() {
        let store = ProgressStore::default();
        for job in ["a", "b", "c"] {
            store.record("ns", job, "u", &report(0, 0, 1), at(0));
        }
        store.record("other", "a", "u", &report(0, 0, 1), at(0));
        assert_eq!(store.len(), 4);
        store.forget(&key("ns", "a", "u"));
        assert_eq!(store.snapshot("ns", "a"), None);
        assert!(store.snapshot("other", "a").is_some());
        store.retain(&[key("ns", "b", "u")].into_iter().collect());
        assert_eq!(store.len(), 1);
        assert!(store.snapshot("ns", "b").is_some());
        store.retain(&LiveJobs::default());
        assert!(store.is_empty());
    }

    #[test]
    fn a_job_applied_again_under_the_same_name_never_reads_its_namesakes_reports() {
        let store = ProgressStore::default();
        store.record("ns", "j", "old", &report(0, 0, 50), at(0));
        // Applied again before the delete was seen: the new job's first report starts over.
        assert_eq!(
            store.record("ns", "j", "new", &report(0, 0, 0), at(1)),
            WAKE
        );
        let p = store.snapshot("ns", "j").expect("reported");
        assert_eq!((p.job_uid.as_str(), p.step()), ("new", Some(0)));
        // The delete of the old job seen: its terminating workers' reports are dropped.
        store.forget(&key("ns", "j", "old"));
        assert_eq!(
            store.record("ns", "j", "old", &report(0, 0, 51), at(2)),
            Recorded::default()
        );
        assert_eq!(
            store.snapshot("ns", "j"),
            None,
            "forget dropped the name's entry"
        );
        store.record("ns", "j", "new", &report(0, 0, 1), at(3));
        let p = store.snapshot("ns", "j").expect("reported");
        assert_eq!((p.job_uid.as_str(), p.step()), ("new", Some(1)));
    }

    #[test]
    fn only_a_checkpoint_at_or_below_the_step_of_its_own_report_answers_a_request() {
        let store = ProgressStore::default();
        store.record("ns", "j", "u", &report(0, 0, 180), at(0));
        store.record("ns", "j", "u", &report(1, 0, 200), at(0));
        store.request_checkpoint("ns", "j", 0);
        // Rank 0 is at step 180 and claims a checkpoint at 250: steps it has not done.
        let ahead = Report {
            checkpoint_step: Some(250),
            ..report(0, 0, 180)
        };
        let answer = store.record("ns", "j", "u", &ahead, at(1));
        assert!(answer.checkpoint, "still asked for");
        let p = store.snapshot("ns", "j").expect("reported");
        assert_eq!(
            (
                p.checkpoint_step,
                p.checkpoint_requested,
                p.checkpoint_saved_on_request
            ),
            (None, Some(200), None),
            "not recorded, not an answer"
        );
        // Saved at step 205 and reported at 205: the answer.
        let saved = Report {
            checkpoint_step: Some(205),
            ..report(0, 0, 205)
        };
        assert!(!store.record("ns", "j", "u", &saved, at(2)).checkpoint);
        let p = store.snapshot("ns", "j").expect("reported");
        assert_eq!(p.checkpoint_saved_on_request, Some(205));
    }

    #[test]
    fn a_withdrawn_request_is_made_anew_at_the_step_reached_since() {
        let store = ProgressStore::default();
        let saved = Report {
            checkpoint_step: Some(40),
            ..report(0, 0, 40)
        };
        store.record("ns", "j", "u", &saved, at(0));
        store.request_checkpoint("ns", "j", 0);
        assert_eq!(
            store
                .snapshot("ns", "j")
                .expect("reported")
                .checkpoint_saved_on_request,
            Some(40)
        );
        store.withdraw_checkpoint_request("ns", "j", 1);
        assert!(
            store
                .snapshot("ns", "j")
                .expect("reported")
                .checkpoint_saved_on_request
                .is_some(),
            "another attempt's withdrawal changes nothing"
        );
        store.withdraw_checkpoint_request("ns", "j", 0);
        store.record("ns", "j", "u", &report(0, 0, 90), at(5));
        store.request_checkpoint("ns", "j", 0);
        let p = store.snapshot("ns", "j").expect("reported");
        assert_eq!(
            (p.checkpoint_requested, p.checkpoint_saved_on_request),
            (Some(90), None)
        );
        assert!(
            store
                .record("ns", "j", "u", &report(0, 0, 91), at(6))
                .checkpoint
        );
    }
}
