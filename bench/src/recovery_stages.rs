//! Where the seconds of a preemption recovery go. Per job, four instants on the benchmark's
//! monotonic clock: the preemption, the operator's restart decision (its `gang restart` log
//! line), the last pod of the old attempt seen deleted and every pod of the next attempt seen
//! created; then p50 and p99 of each stage over the jobs it could be measured for.
//!
//! The stages are signed: a stage the watch saw end before it began (clock jitter between the
//! operator's wall clock and ours) shows as negative rather than as zero, so that a job's
//! stages still add up to its whole recovery.

use std::borrow::Cow;
use std::collections::HashMap;
use std::iter::Peekable;
use std::str::Chars;
use std::time::Instant;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::pod_tracker::PodRecord;
use crate::stats::percentile;

/// The message of the operator's log line for each gang restart it decides.
const GANG_RESTART: &str = "gang restart";
/// The attempt a job's first restart creates (each round of the burst restarts the same jobs
/// once more: round `r`, counted from 0, creates attempt `r + 1`).
pub const FIRST_RESTART: u32 = 1;

/// One `gang restart` line of the operator's log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestartLine {
    /// The line's timestamp (the operator's wall clock).
    pub at: Timestamp,
    /// `namespace/name` of the TrainingJob.
    pub job: String,
    /// The attempt the restart starts.
    pub attempt: u32,
}

/// Parses one line of the operator's log, text (with or without colour) or JSON; None for
/// every line that is not a complete `gang restart` line.
pub fn parse_restart_line(line: &str) -> Option<RestartLine> {
    let line = strip_ansi(line);
    let line = line.trim();
    if line.starts_with('{') {
        parse_json_line(line)
    } else {
        parse_text_line(line)
    }
}

/// `2026-11-23T16:20:37.064395Z  INFO spans: target: gang restart job=ns/name attempt=1 ...`
fn parse_text_line(line: &str) -> Option<RestartLine> {
    let (timestamp, rest) = line.split_once(char::is_whitespace)?;
    let at: Timestamp = timestamp.parse().ok()?;
    // The message follows the target (or the spans) and ": "; the fields follow the message.
    // Anchoring on it keeps a span field named `job` from being read.
    let marker = format!(": {GANG_RESTART}");
    let fields = &rest[rest.find(&marker)? + marker.len()..];
    if fields.chars().next().is_some_and(|c| !c.is_whitespace()) {
        return None;
    }
    let mut job = None;
    let mut attempt = None;
    for token in fields.split_whitespace() {
        if let Some(v) = token.strip_prefix("job=") {
            job = job.or(Some(v.trim_matches('"')));
        } else if let Some(v) = token.strip_prefix("attempt=") {
            attempt = attempt.or(v.trim_matches('"').parse().ok());
        }
    }
    Some(RestartLine {
        at,
        job: job.filter(|j| is_namespaced_name(j))?.to_owned(),
        attempt: attempt?,
    })
}

/// tracing-subscriber's JSON format: `{"timestamp":..,"fields":{"message":..,"job":..,..}}`.
fn parse_json_line(line: &str) -> Option<RestartLine> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    let fields = v.get("fields")?;
    if fields.get("message")?.as_str()? != GANG_RESTART {
        return None;
    }
    let attempt = match fields.get("attempt")? {
        serde_json::Value::Number(n) => u32::try_from(n.as_u64()?).ok()?,
        serde_json::Value::String(s) => s.parse().ok()?,
        _ => return None,
    };
    let job = fields.get("job")?.as_str()?;
    Some(RestartLine {
        at: v.get("timestamp")?.as_str()?.parse().ok()?,
        job: is_namespaced_name(job).then(|| job.to_owned())?,
        attempt,
    })
}

fn is_namespaced_name(job: &str) -> bool {
    job.split_once('/')
        .is_some_and(|(ns, name)| !ns.is_empty() && !name.is_empty())
}

/// The line without ANSI escape sequences (CSI sequences whole; any other escape loses only
/// its ESC).
fn strip_ansi(line: &str) -> Cow<'_, str> {
    if !line.contains('\x1b') {
        return Cow::Borrowed(line);
    }
    let mut out = String::with_capacity(line.len());
    let mut chars: Peekable<Chars<'_>> = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\x1b' {
            out.push(c);
            continue;
        }
        if chars.next_if_eq(&'[').is_some() {
            // Parameters and intermediates, up to a final byte in '@'..='~'.
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) {
                    break;
                }
            }
        }
    }
    Cow::Owned(out)
}

/// The first `gang restart` line of each (`namespace/name`, attempt) in a log; every other
/// line is skipped.
pub fn first_restarts(log: &str) -> HashMap<(String, u32), Timestamp> {
    let mut first = HashMap::new();
    for line in log.lines().filter_map(parse_restart_line) {
        first.entry((line.job, line.attempt)).or_insert(line.at);
    }
    first
}

/// When the operator decided to restart each job of namespace `ns` as `attempt`, by job
/// name, on the benchmark's monotonic clock.
pub fn decisions(log: &str, ns: &str, attempt: u32, clock: ClockPair) -> HashMap<String, Instant> {
    first_restarts(log)
        .into_iter()
        .filter(|((_, a), _)| *a == attempt)
        .filter_map(|((job, _), at)| {
            let (job_ns, name) = job.split_once('/')?;
            (job_ns == ns).then_some(())?;
            Some((name.to_owned(), clock.instant_of(at)?))
        })
        .collect()
}

/// The monotonic clock and the wall clock read at one moment: converts the operator's log
/// timestamps to the instants the benchmark measures with.
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
    /// The operator logged its gang restart (none for the restart floor).
    pub decided: Option<Instant>,
    /// The watch saw the last pod of the old attempt deleted.
    pub old_gone: Option<Instant>,
    /// The watch saw the last pod of the next attempt created.
    pub created: Option<Instant>,
}

/// Each preempted job's timeline from the pod watch's records (`next - 1` the old attempt,
/// `next` the one its restart creates) and the decisions found in the operator's log. A job's old attempt
/// counts as gone only when at least `workers` of its pods were seen and every one of them was
/// seen deleted; its next attempt as created once `workers` of its pods were seen.
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
    /// Preemption → the operator's `gang restart` line: watch lag, queueing, the decision.
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

    const LINE: &str = "2026-11-23T16:20:37.064395Z  INFO reconciling object{object.ref=TrainingJob.v1alpha1.trainyard.dev/job-00099.tybench-8d4aee-operator object.reason=object updated}: trainyard_operator::writes::executor: gang restart job=tybench-8d4aee-operator/job-00099 attempt=1 reason=\"Preemption\"";

    /// The same line as tracing-subscriber writes it with colour on.
    const COLOURED: &str = "\x1b[2m2026-11-23T16:20:37.064395Z\x1b[0m \x1b[32m INFO\x1b[0m \x1b[1mreconciling object\x1b[0m\x1b[1m{\x1b[0m\x1b[3mobject.ref\x1b[0m\x1b[2m=\x1b[0mTrainingJob.v1alpha1.trainyard.dev/job-00099.tybench-8d4aee-operator\x1b[1m}\x1b[0m\x1b[2m:\x1b[0m \x1b[2mtrainyard_operator::writes::executor\x1b[0m\x1b[2m:\x1b[0m gang restart \x1b[3mjob\x1b[0m\x1b[2m=\x1b[0mtybench-8d4aee-operator/job-00099 \x1b[3mattempt\x1b[0m\x1b[2m=\x1b[0m1 \x1b[3mreason\x1b[0m\x1b[2m=\x1b[0m\"Preemption\"";

    fn ts(s: &str) -> Timestamp {
        s.parse().expect("a valid timestamp")
    }

    fn expected() -> RestartLine {
        RestartLine {
            at: ts("2026-11-23T16:20:37.064395Z"),
            job: "tybench-8d4aee-operator/job-00099".to_owned(),
            attempt: 1,
        }
    }

    #[test]
    fn a_gang_restart_line_gives_its_timestamp_job_and_attempt() {
        assert_eq!(parse_restart_line(LINE), Some(expected()));
    }

    #[test]
    fn a_coloured_gang_restart_line_parses_like_a_plain_one() {
        assert!(!strip_ansi(COLOURED).contains('\x1b'));
        assert_eq!(parse_restart_line(COLOURED), Some(expected()));
    }

    #[test]
    fn a_json_gang_restart_line_parses_too() {
        let line = r#"{"timestamp":"2026-11-23T16:20:37.064395Z","level":"INFO","fields":{"message":"gang restart","job":"tybench-8d4aee-operator/job-00099","attempt":1,"reason":"Preemption"},"target":"trainyard_operator::writes::executor"}"#;
        assert_eq!(parse_restart_line(line), Some(expected()));
    }

    /// Everything a subscriber writes, shared with the test.
    #[derive(Clone, Default)]
    struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The operator's gang restart event, inside a reconcile span, as a subscriber writes it.
    fn written_by(subscriber: impl tracing::Subscriber + Send + Sync) {
        tracing::subscriber::with_default(subscriber, || {
            let span =
                tracing::info_span!("reconciling object", object.ref = "TrainingJob/job-00099");
            let _entered = span.enter();
            tracing::info!(job = %"ns/job-00099", attempt = 1u32, reason = "Preemption", "gang restart");
        });
    }

    #[test]
    fn what_tracing_subscriber_writes_parses_plain_coloured_and_as_json() {
        for (ansi, json) in [(false, false), (true, false), (false, true)] {
            let out = Captured::default();
            let writer = out.clone();
            let builder = tracing_subscriber::fmt()
                .with_ansi(ansi)
                .with_writer(move || writer.clone());
            if json {
                written_by(builder.json().finish());
            } else {
                written_by(builder.finish());
            }
            let bytes = out.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let log = String::from_utf8_lossy(&bytes);
            assert_eq!(log.contains('\x1b'), ansi, "{log:?}");
            let first = first_restarts(&log);
            assert_eq!(first.len(), 1, "ansi {ansi}, json {json}: {log:?}");
            assert!(
                first.contains_key(&("ns/job-00099".to_owned(), 1)),
                "ansi {ansi}, json {json}: {log:?}"
            );
        }
    }

    #[test]
    fn garbage_and_other_lines_are_skipped_without_panicking() {
        let lines = [
            "",
            "   ",
            "gang restart job=ns/a attempt=1",
            "not-a-time  INFO x: gang restart job=ns/a attempt=1",
            "2026-11-23T16:20:37.064395Z  INFO x: gang restart job=ns/a",
            "2026-11-23T16:20:37.064395Z  INFO x: gang restart attempt=1",
            "2026-11-23T16:20:37.064395Z  INFO x: gang restart job=ns/a attempt=one",
            "2026-11-23T16:20:37.064395Z  INFO x: gang restart job=a attempt=1",
            "2026-11-23T16:20:37.064395Z  INFO x: gang restart job=/a attempt=1",
            "2026-11-23T16:20:37.064395Z  INFO x: gang restart job=ns/a attempt=-1",
            "2026-11-23T16:20:37.064395Z  INFO x: gang restarted job=ns/a attempt=1",
            "2026-11-23T16:20:37.064395Z  INFO x: created pods job=ns/a attempt=1",
            "2026-11-23T16:20:37.064395Z  WARN x: event failed message=\"preempted; gang restart as attempt 1\" job=ns/a attempt=1",
            "2026-11-23T16:20:37.064395Z  INFO x: gang restart job=ns/a attempt=99999999999",
            "2026-11-23T16:20:37.064395Z  INFO x: gang rest",
            "\x1b[",
            "\x1b[2m2026-11-23T16:20:37",
            "{",
            r#"{"timestamp":"2026-11-23T16:20:37Z","fields":{"message":"gang restart","job":"ns/a","attempt":true}}"#,
            r#"{"timestamp":"2026-11-23T16:20:37Z","fields":{"message":"reconciled","job":"ns/a","attempt":1}}"#,
            "ünïcödé ∞ 🚀: gang restart job=ns/a attempt=1",
        ];
        for line in lines {
            assert_eq!(parse_restart_line(line), None, "{line:?}");
        }
    }

    #[test]
    fn the_first_line_of_each_job_and_attempt_wins() {
        let log = [
            "2026-11-23T16:20:37.000001Z  INFO x: gang restart job=ns/a attempt=1 reason=\"Preemption\"",
            "garbage",
            "2026-11-23T16:20:38.000000Z  INFO x: gang restart job=ns/a attempt=1 reason=\"Preemption\"",
            "2026-11-23T16:20:39.000000Z  INFO x: gang restart job=ns/a attempt=2 reason=\"Failure\"",
            "2026-11-23T16:20:40.000000Z  INFO x: gang restart job=ns/b attempt=1 reason=\"Preemption\"",
        ]
        .join("\n");
        let first = first_restarts(&log);
        assert_eq!(first.len(), 3);
        assert_eq!(
            first[&("ns/a".to_owned(), 1)],
            ts("2026-11-23T16:20:37.000001Z")
        );
        assert_eq!(first[&("ns/a".to_owned(), 2)], ts("2026-11-23T16:20:39Z"));
    }

    #[test]
    fn decisions_are_the_namespaces_attempt_on_the_monotonic_clock() {
        let log = [
            "2026-11-23T16:20:37.250000Z  INFO x: gang restart job=ns/a attempt=1",
            "2026-11-23T16:20:36.500000Z  INFO x: gang restart job=ns/b attempt=1",
            "2026-11-23T16:20:37.000000Z  INFO x: gang restart job=other/c attempt=1",
            "2026-11-23T16:20:38.000000Z  INFO x: gang restart job=ns/c attempt=2",
        ]
        .join("\n");
        let base = Instant::now() + Duration::from_secs(10);
        let clock = ClockPair::new(base, ts("2026-11-23T16:20:37Z"));
        let d = decisions(&log, "ns", 1, clock);
        assert_eq!(d.len(), 2, "{d:?}");
        assert_eq!(d["a"], base + Duration::from_millis(250));
        assert_eq!(d["b"], base - Duration::from_millis(500));
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
        // b: decided at 300, old gone at 1000, new created at 1200. c: no log line.
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
