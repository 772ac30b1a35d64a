//! Where the seconds of a preemption recovery go. Per job, four instants on the benchmark's
//! monotonic clock: the preemption, the operator's restart decision (the `eventTime` of the
//! events.k8s.io/v1 Event that starts the next attempt, read from the API), the last pod of the
//! old attempt seen deleted and every pod of the next attempt seen created; then p50 and p99 of
//! each stage over the jobs it could be measured for.
//!
//! The stages are signed: a stage the watch saw end before it began (clock jitter between the
//! operator's wall clock and ours) shows as negative rather than as zero, so that a job's
//! stages still add up to its whole recovery.

use std::collections::HashMap;
use std::time::Instant;

use jiff::Timestamp;
use k8s_openapi::api::events::v1::Event;
use kube::Resource as _;
use serde::{Deserialize, Serialize};
use trainyard_operator::surface::{TrainingJob, attempt_event_name};

use crate::pod_tracker::PodRecord;
use crate::stats::percentile;

/// The attempt a job's first restart creates (each round of the burst restarts the same jobs
/// once more: round `r`, counted from 0, creates attempt `r + 1`).
pub const FIRST_RESTART: u32 = 1;

/// The TrainingJob whose `attempt` the Event starts; None for every other Event.
///
/// The operator publishes one Event per attempt it starts (a gang restart or a resume), named
/// by [`attempt_event_name`] after the job and its uid, `regarding` the TrainingJob. The name
/// is checked against `regarding`, so that an Event that merely looks like one is not taken
/// for it.
fn started_attempt(event: &Event, attempt: u32) -> Option<&str> {
    let regarding = event.regarding.as_ref()?;
    if regarding.kind.as_deref() != Some(TrainingJob::kind(&()).as_ref()) {
        return None;
    }
    let job = regarding.name.as_deref().filter(|n| !n.is_empty())?;
    let uid = regarding.uid.as_deref().filter(|u| !u.is_empty())?;
    let name = event.metadata.name.as_deref()?;
    (name == attempt_event_name(job, uid, attempt)).then_some(job)
}

/// When the operator decided to start `attempt` of each job: the `eventTime` of the Event
/// that starts it (the operator's wall clock), by job name. Events of other attempts and
/// every other Event are skipped, and so is an Event without an `eventTime`. Where one job has
/// several (it was deleted and applied again under its name, a new uid, while the API server
/// kept its predecessor's Events), the latest counts: the job there is now decided last.
pub fn decided_at(events: &[Event], attempt: u32) -> HashMap<String, Timestamp> {
    let mut decided: HashMap<String, Timestamp> = HashMap::new();
    for event in events {
        let Some(job) = started_attempt(event, attempt) else {
            continue;
        };
        let Some(at) = event.event_time.as_ref().map(|t| t.0) else {
            continue;
        };
        decided
            .entry(job.to_owned())
            .and_modify(|latest| *latest = (*latest).max(at))
            .or_insert(at);
    }
    decided
}

/// When the operator decided to restart each preempted job as `attempt`, by job name, on the
/// benchmark's monotonic clock, from the namespace's Events ([`decided_at`]). A job without
/// its Event is left out, and so are the jobs that were not preempted.
pub fn decisions(
    events: &[Event],
    preempted: &HashMap<String, Instant>,
    attempt: u32,
    clock: ClockPair,
) -> HashMap<String, Instant> {
    decided_at(events, attempt)
        .into_iter()
        .filter(|(job, _)| preempted.contains_key(job))
        .filter_map(|(job, at)| Some((job, clock.instant_of(at)?)))
        .collect()
}

/// The monotonic clock and the wall clock read at one moment: converts the times the operator
/// writes (its Events' `eventTime`) to the instants the benchmark measures with.
#[derive(Clone, Copy, Debug)]
pub struct ClockPair {
    instant: Instant,
    wall: Timestamp,
}

impl ClockPair {
    /// Both clocks now.
    pub fn now() -> Self {
        Self::new(Instant::now(), Timestamp::now())
    }

    /// A pair read at the same moment.
    pub fn new(instant: Instant, wall: Timestamp) -> Self {
        Self { instant, wall }
    }

    /// The instant of a wall-clock time; None where the monotonic clock cannot express it.
    pub fn instant_of(&self, at: Timestamp) -> Option<Instant> {
        let d = at.duration_since(self.wall);
        if d.is_negative() {
            self.instant.checked_sub(d.unsigned_abs())
        } else {
            self.instant.checked_add(d.unsigned_abs())
        }
    }
}

/// One job's recovery on the benchmark's monotonic clock; what was not observed is None.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobTimeline {
    /// The preemption began (the benchmark's first request).
    pub preempted: Instant,
    /// The operator decided the restart: its Event's `eventTime` (none for the restart floor).
    pub decided: Option<Instant>,
    /// The watch saw the last pod of the old attempt deleted.
    pub old_gone: Option<Instant>,
    /// The watch saw the last pod of the next attempt created.
    pub created: Option<Instant>,
}

/// Each preempted job's timeline from the pod watch's records (`next - 1` the old attempt,
/// `next` the one its restart creates) and the decisions read from the operator's Events
/// ([`decisions`]). A job's old attempt counts as gone only when at least `workers` of its
/// pods were seen and every one of them was seen deleted; its next attempt as created once
/// `workers` of its pods were seen.
pub fn timelines(
    records: &[PodRecord],
    preempted: &HashMap<String, Instant>,
    decided: &HashMap<String, Instant>,
    workers: u32,
    next: u32,
) -> Vec<JobTimeline> {
    let old_attempt = next.saturating_sub(1);
    #[derive(Default)]
    struct Attempts {
        old: u32,
        old_left: bool,
        old_gone: Option<Instant>,
        new: u32,
        created: Option<Instant>,
    }
    let mut by_job: HashMap<&str, Attempts> = HashMap::new();
    for r in records {
        let Some(job) = r.job.as_deref().filter(|j| preempted.contains_key(*j)) else {
            continue;
        };
        let a = by_job.entry(job).or_default();
        match r.attempt {
            Some(n) if n == old_attempt => {
                a.old += 1;
                match r.deleted {
                    Some(at) => a.old_gone = a.old_gone.max(Some(at)),
                    None => a.old_left = true,
                }
            }
            Some(n) if n == next => {
                a.new += 1;
                a.created = a.created.max(Some(r.seen));
            }
            _ => {}
        }
    }
    preempted
        .iter()
        .map(|(job, &at)| {
            let a = by_job.get(job.as_str());
            JobTimeline {
                preempted: at,
                decided: decided.get(job).copied(),
                old_gone: a
                    .filter(|a| a.old >= workers && !a.old_left)
                    .and_then(|a| a.old_gone),
                created: a.filter(|a| a.new >= workers).and_then(|a| a.created),
            }
        })
        .collect()
}

/// Seconds from `from` to `to`, negative when `to` came first.
fn seconds(from: Instant, to: Instant) -> f64 {
    match to.checked_duration_since(from) {
        Some(d) => d.as_secs_f64(),
        None => -from.duration_since(to).as_secs_f64(),
    }
}

/// One stage over the jobs it was measured for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StageSeconds {
    /// Jobs the percentiles cover (of the preempted ones).
    pub jobs: u32,
    /// Median seconds.
    pub p50_seconds: f64,
    /// 99th percentile seconds.
    pub p99_seconds: f64,
}

impl StageSeconds {
    /// Percentiles of per-job seconds; None for no job.
    pub fn from_samples(mut seconds: Vec<f64>) -> Option<Self> {
        if seconds.is_empty() {
            return None;
        }
        seconds.sort_by(f64::total_cmp);
        Some(Self {
            jobs: u32::try_from(seconds.len()).unwrap_or(u32::MAX),
            p50_seconds: percentile(&seconds, 50.0),
            p99_seconds: percentile(&seconds, 99.0),
        })
    }
}

/// The recovery split into stages, each None when no job could be measured for it. The
/// operator fills every stage; the restart floor, which decides nothing, only the two that do
/// not involve a decision.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RecoveryStages {
    /// Preemption → the restart decided (the `eventTime` of the Event that starts the next
    /// attempt): watch lag, queueing, the decision.
    #[serde(default)]
    pub preempted_to_decided: Option<StageSeconds>,
    /// Restart decided → last pod of the old attempt seen deleted: the status write, the
    /// delete requests, the grace period the benchmark finishes at once, watch lag.
    #[serde(default)]
    pub decided_to_old_gone: Option<StageSeconds>,
    /// Preemption → last pod of the old attempt seen deleted (the two above together; the
    /// restart floor's comparable figure).
    #[serde(default)]
    pub preempted_to_old_gone: Option<StageSeconds>,
    /// Last pod of the old attempt seen deleted → every pod of the next attempt seen created:
    /// queueing at the operator, the create requests, watch lag.
    #[serde(default)]
    pub old_gone_to_created: Option<StageSeconds>,
}

impl RecoveryStages {
    /// Percentiles of each stage over the jobs whose timeline has both of its ends.
    pub fn from_timelines(jobs: &[JobTimeline]) -> Self {
        let stage = |between: fn(&JobTimeline) -> Option<(Instant, Instant)>| {
            StageSeconds::from_samples(
                jobs.iter()
                    .filter_map(between)
                    .map(|(from, to)| seconds(from, to))
                    .collect(),
            )
        };
        Self {
            preempted_to_decided: stage(|j| Some((j.preempted, j.decided?))),
            decided_to_old_gone: stage(|j| Some((j.decided?, j.old_gone?))),
            preempted_to_old_gone: stage(|j| Some((j.preempted, j.old_gone?))),
            old_gone_to_created: stage(|j| Some((j.old_gone?, j.created?))),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    use k8s_openapi::api::core::v1::ObjectReference;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};

    fn ts(s: &str) -> Timestamp {
        s.parse().expect("a valid timestamp")
    }

    /// An Event named `name` in namespace `ns`, regarding the `kind` named `job` with `uid`,
    /// dated `at`.
    fn event(name: &str, kind: &str, job: &str, uid: &str, at: Option<&str>) -> Event {
        Event {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some("ns".to_owned()),
                ..ObjectMeta::default()
            },
            action: Some("Reconcile".to_owned()),
            reason: Some("Preempted".to_owned()),
            type_: Some("Normal".to_owned()),
            event_time: at.map(|t| MicroTime(ts(t))),
            regarding: Some(ObjectReference {
                api_version: Some("trainyard.dev/v1alpha1".to_owned()),
                kind: Some(kind.to_owned()),
                name: Some(job.to_owned()),
                namespace: Some("ns".to_owned()),
                uid: Some(uid.to_owned()),
                ..ObjectReference::default()
            }),
            reporting_controller: Some("trainyard-operator".to_owned()),
            ..Event::default()
        }
    }

    /// The Event that starts `attempt` of `job`, dated `at`.
    fn restart_event(job: &str, attempt: u32, at: &str) -> Event {
        let uid = format!("uid-{job:.8}");
        event(
            &attempt_event_name(job, &uid, attempt),
            "TrainingJob",
            job,
            &uid,
            Some(at),
        )
    }

    #[test]
    fn the_event_that_starts_the_attempt_gives_the_decision_time() {
        let events = [restart_event("job-00099", 1, "2026-11-23T16:20:37.064395Z")];
        assert_eq!(
            decided_at(&events, 1),
            [("job-00099".to_owned(), ts("2026-11-23T16:20:37.064395Z"))].into()
        );
    }

    #[test]
    fn decisions_are_the_preempted_jobs_attempt_on_the_monotonic_clock() {
        let events = [
            restart_event("a", 1, "2026-11-23T16:20:37.250000Z"),
            restart_event("b", 1, "2026-11-23T16:20:36.500000Z"),
            // The attempt before and the one after: other rounds' restarts.
            restart_event("a", 0, "2026-11-23T16:20:30Z"),
            restart_event("a", 2, "2026-11-23T16:20:50Z"),
            // Not preempted in this round.
            restart_event("d", 1, "2026-11-23T16:20:37Z"),
            // c: preempted, its Event of attempt 2 only.
            restart_event("c", 2, "2026-11-23T16:20:38Z"),
        ];
        let base = Instant::now() + Duration::from_secs(10);
        let clock = ClockPair::new(base, ts("2026-11-23T16:20:37Z"));
        let preempted: HashMap<String, Instant> =
            ["a", "b", "c"].map(|j| (j.to_owned(), base)).into();
        let d = decisions(&events, &preempted, 1, clock);
        assert_eq!(d.len(), 2, "{d:?}");
        assert_eq!(d["a"], base + Duration::from_millis(250));
        assert_eq!(d["b"], base - Duration::from_millis(500));
        assert!(!d.contains_key("c"), "a missing Event leaves the job out");
        let later = decisions(&events, &preempted, 2, clock);
        assert_eq!(later.len(), 2, "{later:?}");
        assert_eq!(later["a"], base + Duration::from_secs(13));
        assert_eq!(later["c"], base + Duration::from_secs(1));
    }

    #[test]
    fn events_that_do_not_start_the_jobs_attempt_are_skipped() {
        let at = Some("2026-11-23T16:20:37Z");
        let events = [
            // Another Event on the job, named as the API server's recorder names them.
            event("a.17abc0123456789f", "TrainingJob", "a", "uid-a", at),
            // Named for the attempt, but regarding a pod, or another job, or another uid.
            event("a.uid-a.attempt-1", "Pod", "a", "uid-a", at),
            event("a.uid-a.attempt-1", "TrainingJob", "b", "uid-a", at),
            event("a.uid-a.attempt-1", "TrainingJob", "a", "uid-other", at),
            // The job's name and uid in the name, but no attempt number, or a malformed one.
            event("a.uid-a.attempt-", "TrainingJob", "a", "uid-a", at),
            event("a.uid-a.attempt-+1", "TrainingJob", "a", "uid-a", at),
            event("a.uid-a.attempt-1x", "TrainingJob", "a", "uid-a", at),
            event(
                "a.uid-a.attempt-99999999999",
                "TrainingJob",
                "a",
                "uid-a",
                at,
            ),
            event("a.uid-a", "TrainingJob", "a", "uid-a", at),
            // The right name without a time.
            event("a.uid-a.attempt-1", "TrainingJob", "a", "uid-a", None),
            // No name, no reference.
            Event::default(),
            Event {
                regarding: None,
                ..event("a.uid-a.attempt-1", "TrainingJob", "a", "uid-a", at)
            },
        ];
        assert_eq!(decided_at(&events, 1), HashMap::new());
    }

    #[test]
    fn a_long_job_name_cut_short_in_the_event_name_still_matches() {
        // Cut at the '-', which goes too.
        let job = format!("{}-{}", "x".repeat(229), "y".repeat(21));
        let e = restart_event(&job, 3, "2026-11-23T16:20:37Z");
        let name = e.metadata.name.clone().unwrap_or_default();
        assert_eq!(name, format!("{}.uid-xxxxxxxx.attempt-3", "x".repeat(229)));
        assert_eq!(
            decided_at(&[e], 3),
            [(job, ts("2026-11-23T16:20:37Z"))].into()
        );
    }

    #[test]
    fn of_several_events_for_one_jobs_attempt_the_latest_counts() {
        // The job deleted and applied again under the same name (a new uid) within the hour the
        // API server keeps Events: its predecessor's Event came first.
        let mut again = restart_event("a", 1, "2026-11-23T16:20:39Z");
        if let Some(r) = again.regarding.as_mut() {
            r.uid = Some("uid-a2".to_owned());
        }
        again.metadata.name = Some(attempt_event_name("a", "uid-a2", 1));
        let events = [again, restart_event("a", 1, "2026-11-23T16:20:38Z")];
        assert_eq!(
            decided_at(&events, 1),
            [("a".to_owned(), ts("2026-11-23T16:20:39Z"))].into()
        );
    }

    fn record(job: &str, attempt: u32, seen: Instant, deleted: Option<Instant>) -> PodRecord {
        PodRecord {
            name: format!("{job}-worker"),
            uid: format!("{job}-{attempt}"),
            job: Some(job.to_owned()),
            attempt: Some(attempt),
            seen,
            scheduled: None,
            deleted,
        }
    }

    #[test]
    fn stages_split_each_jobs_recovery_at_the_decision_and_the_old_attempt_gone() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // Two workers per job. a: decided at 100 ms, old gone at 400, new created at 700.
        // b: decided at 300, old gone at 1000, new created at 1200. c: no Event.
        let records = [
            record("a", 0, at(0), Some(at(50))),
            record("a", 0, at(0), Some(at(400))),
            record("a", 1, at(600), None),
            record("a", 1, at(700), None),
            record("b", 0, at(0), Some(at(1000))),
            record("b", 0, at(0), Some(at(900))),
            record("b", 1, at(1100), None),
            record("b", 1, at(1200), None),
            record("c", 0, at(0), Some(at(500))),
            record("c", 0, at(0), Some(at(500))),
            record("c", 1, at(800), None),
            record("c", 1, at(800), None),
            // Not preempted: ignored.
            record("d", 0, at(0), Some(at(9000))),
        ];
        let preempted: HashMap<String, Instant> = [("a", at(10)), ("b", at(20)), ("c", at(30))]
            .map(|(j, t)| (j.to_owned(), t))
            .into();
        let decided: HashMap<String, Instant> = [("a", at(100)), ("b", at(300))]
            .map(|(j, t)| (j.to_owned(), t))
            .into();
        let lines = timelines(&records, &preempted, &decided, 2, FIRST_RESTART);
        assert_eq!(lines.len(), 3);
        let stages = RecoveryStages::from_timelines(&lines);
        let close = |s: Option<StageSeconds>, jobs: u32, p50: f64, p99: f64| {
            let s = s.expect("measured");
            assert_eq!(s.jobs, jobs);
            assert!((s.p50_seconds - p50).abs() < 1e-9, "{s:?}");
            assert!((s.p99_seconds - p99).abs() < 1e-9, "{s:?}");
        };
        // a: 0.09, b: 0.28.
        close(stages.preempted_to_decided, 2, 0.09, 0.28);
        // a: 0.3, b: 0.7.
        close(stages.decided_to_old_gone, 2, 0.3, 0.7);
        // a: 0.39, b: 0.98, c: 0.47.
        close(stages.preempted_to_old_gone, 3, 0.47, 0.98);
        // a: 0.3, b: 0.2, c: 0.3.
        close(stages.old_gone_to_created, 3, 0.3, 0.3);
    }

    #[test]
    fn a_job_whose_old_pods_are_not_all_seen_deleted_or_new_pods_not_all_seen_is_left_out() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let records = [
            // a: one old pod never seen deleted.
            record("a", 0, at(0), Some(at(50))),
            record("a", 0, at(0), None),
            record("a", 1, at(600), None),
            record("a", 1, at(700), None),
            // b: one new pod of two.
            record("b", 0, at(0), Some(at(50))),
            record("b", 0, at(0), Some(at(60))),
            record("b", 1, at(600), None),
        ];
        let preempted: HashMap<String, Instant> =
            [("a", at(0)), ("b", at(0)), ("never-seen", at(0))]
                .map(|(j, t)| (j.to_owned(), t))
                .into();
        let stages = RecoveryStages::from_timelines(&timelines(
            &records,
            &preempted,
            &HashMap::new(),
            2,
            FIRST_RESTART,
        ));
        assert_eq!(stages.preempted_to_decided, None);
        assert_eq!(stages.decided_to_old_gone, None);
        let gone = stages.preempted_to_old_gone.expect("b measured");
        assert_eq!(gone.jobs, 1);
        assert!((gone.p50_seconds - 0.06).abs() < 1e-9);
        assert_eq!(stages.old_gone_to_created, None);
    }

    #[test]
    fn a_later_round_times_its_own_attempts_and_ignores_the_earlier_ones() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // Round 1 of job a: attempt 0 went long ago, attempt 1 is the old one, 2 the next.
        let records = [
            record("a", 0, at(0), Some(at(9000))),
            record("a", 0, at(0), Some(at(9000))),
            record("a", 1, at(100), Some(at(10_300))),
            record("a", 1, at(100), Some(at(10_400))),
            record("a", 2, at(10_600), None),
            record("a", 2, at(10_700), None),
        ];
        let preempted: HashMap<String, Instant> = [("a".to_owned(), at(10_000))].into();
        let lines = timelines(&records, &preempted, &HashMap::new(), 2, FIRST_RESTART + 1);
        assert_eq!(
            lines,
            vec![JobTimeline {
                preempted: at(10_000),
                decided: None,
                old_gone: Some(at(10_400)),
                created: Some(at(10_700)),
            }]
        );
    }

    #[test]
    fn a_stage_that_ends_before_it_begins_is_negative_and_the_stages_still_add_up() {
        let t0 = Instant::now();
        let line = JobTimeline {
            preempted: t0 + Duration::from_millis(100),
            // The operator's clock a little behind ours.
            decided: Some(t0 + Duration::from_millis(95)),
            old_gone: Some(t0 + Duration::from_millis(300)),
            created: Some(t0 + Duration::from_millis(500)),
        };
        let s = RecoveryStages::from_timelines(&[line]);
        let p50 = |s: Option<StageSeconds>| s.expect("measured").p50_seconds;
        assert!((p50(s.preempted_to_decided) + 0.005).abs() < 1e-9);
        let sum =
            p50(s.preempted_to_decided) + p50(s.decided_to_old_gone) + p50(s.old_gone_to_created);
        assert!((sum - 0.4).abs() < 1e-9, "{sum}");
    }

    #[test]
    fn no_samples_make_no_stage() {
        assert_eq!(StageSeconds::from_samples(Vec::new()), None);
        assert_eq!(
            RecoveryStages::from_timelines(&[]),
            RecoveryStages::default()
        );
    }
}
