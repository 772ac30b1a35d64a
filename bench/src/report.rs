//! Markdown for one operator benchmark run, and the issue's targets checked against it.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::limits::{COUNT_LIMITS, Figures, Verdict};
use crate::proxy::RequestCounts;
use crate::recovery_stages::{RecoveryStages, StageSeconds};
use crate::scenario::{OperatorBenchReport, Recovery, Throughput};

/// operator / floor ratio target.
pub const RATIO_TARGET: f64 = 1.3;
/// Preemption → new pods p99 target, seconds, at this many simultaneous preemptions.
pub const RECOVERY_P99_TARGET: f64 = 2.0;
/// Simultaneous preemptions the recovery target is stated for.
pub const RECOVERY_AT: u32 = 100;
/// Preemption → new pods p99 target, as a multiple of the restart floor's p99 in the same run.
pub const RECOVERY_FLOOR_FACTOR: f64 = 1.5;
/// Peak RSS target, MiB, at this many jobs.
pub const RSS_TARGET_MIB: f64 = 64.0;
/// Jobs the RSS target is stated for.
pub const RSS_AT_JOBS: u32 = 1000;

/// One target against one run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TargetCheck {
    /// The target as the issue states it.
    pub target: String,
    /// What was measured.
    pub measured: String,
    /// Met, missed, or None (see `unjudged` for why).
    pub met: Option<bool>,
    /// Why `met` is None.
    #[serde(default)]
    pub unjudged: Unjudged,
}

/// Why a row has no verdict.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Unjudged {
    /// This run's size is not the one the target is stated for.
    #[default]
    OtherSize,
    /// The run did not measure what the target needs (an older report, or a run that stopped
    /// early).
    NotMeasured,
    /// A figure shown next to the targets that is no target itself.
    Context,
}

impl TargetCheck {
    /// What the report's verdict column says.
    pub fn verdict(&self) -> &'static str {
        match (self.met, self.unjudged) {
            (Some(true), _) => "met",
            (Some(false), _) => "**missed**",
            (None, Unjudged::OtherSize) => "n/a at this size",
            (None, Unjudged::NotMeasured) => "not measured",
            (None, Unjudged::Context) => "context, no target",
        }
    }
}

const NOT_MEASURED: &str = "not measured";

/// An operator / floor ratio against [`RATIO_TARGET`]; a context row is not judged.
fn ratio_check(target: String, ratio: Option<f64>, context: bool) -> TargetCheck {
    TargetCheck {
        target,
        measured: ratio
            .map(|x| format!("{x:.2}"))
            .unwrap_or_else(|| NOT_MEASURED.to_owned()),
        met: ratio.filter(|_| !context).map(|x| x <= RATIO_TARGET),
        unjudged: if context {
            Unjudged::Context
        } else {
            Unjudged::NotMeasured
        },
    }
}

/// The performance issue's targets checked against a run, with context rows (met: None).
pub fn targets(r: &OperatorBenchReport) -> Vec<TargetCheck> {
    let mut out = vec![
        ratio_check(
            format!("operator / fair floor ≤ {RATIO_TARGET} (pods created)"),
            r.fair_created_ratio(),
            false,
        ),
        ratio_check(
            format!("operator / floor ≤ {RATIO_TARGET} (pods scheduled)"),
            r.scheduled_ratio(),
            false,
        ),
        ratio_check(
            "operator / pods-only floor, pods created (context for the fair floor's target)"
                .to_owned(),
            r.created_ratio(),
            true,
        ),
        recovery_against_floor(r),
    ];
    let at_size = r.preempt >= RECOVERY_AT;
    out.push(TargetCheck {
        target: format!("preemption → new pods p99 ≤ {RECOVERY_P99_TARGET} s at {RECOVERY_AT} simultaneous preemptions"),
        measured: r
            .recovery
            .as_ref()
            .map(|x| format!("{:.2} s at {}", x.p99_seconds, x.preempted))
            .unwrap_or_else(|| NOT_MEASURED.to_owned()),
        met: r.recovery.as_ref().filter(|_| at_size).map(|x| x.p99_seconds <= RECOVERY_P99_TARGET),
        unjudged: if at_size && r.recovery.is_none() {
            Unjudged::NotMeasured
        } else {
            Unjudged::OtherSize
        },
    });
    let rss = peak_rss_mib(r);
    out.push(TargetCheck {
        target: format!("operator RSS ≤ {RSS_TARGET_MIB} MiB at {RSS_AT_JOBS} jobs"),
        measured: rss
            .map(|x| format!("{x:.1} MiB at {} jobs", r.jobs))
            .unwrap_or_else(|| NOT_MEASURED.to_owned()),
        met: rss
            .filter(|_| r.jobs >= RSS_AT_JOBS)
            .map(|x| x <= RSS_TARGET_MIB),
        unjudged: if r.jobs >= RSS_AT_JOBS && rss.is_none() {
            Unjudged::NotMeasured
        } else {
            Unjudged::OtherSize
        },
    });
    // The counts' limits, as the page judges them.
    let figures = Figures::of(r);
    for limit in &COUNT_LIMITS {
        let verdict = limit.verdict(&figures, r.jobs);
        out.push(TargetCheck {
            target: limit.target(),
            measured: (limit.show)(&figures).unwrap_or_else(|| NOT_MEASURED.to_owned()),
            met: match verdict {
                Verdict::Met => Some(true),
                Verdict::Missed => Some(false),
                Verdict::OtherSize | Verdict::NotMeasured => None,
            },
            unjudged: if verdict == Verdict::OtherSize {
                Unjudged::OtherSize
            } else {
                Unjudged::NotMeasured
            },
        });
    }
    out
}

/// The operator's peak RSS (VmHWM) over the run, MiB.
pub fn peak_rss_mib(r: &OperatorBenchReport) -> Option<f64> {
    r.usage
        .as_ref()
        .map(|u| u.last.peak_rss_mib.max(u.created.peak_rss_mib))
}

/// The restart floors a run measured, the judged one first: the graceful restart floor when
/// it was measured, else the one among the jobs' Services, else the pods-only one; each with
/// its median round, its rounds and what it is.
fn restart_floors(r: &OperatorBenchReport) -> Vec<(&Recovery, &[Recovery], &'static str)> {
    [
        (
            &r.graceful_floor_recovery,
            &r.graceful_floor_recovery_rounds,
            GRACEFUL_FLOOR,
        ),
        (
            &r.fair_floor_recovery,
            &r.fair_floor_recovery_rounds,
            SERVICES_FLOOR,
        ),
        (&r.floor_recovery, &r.floor_recovery_rounds, PODS_ONLY_FLOOR),
    ]
    .into_iter()
    .filter_map(|(median, rounds, which)| Some((median.as_ref()?, rounds.as_slice(), which)))
    .collect()
}

/// What the report calls each restart floor.
pub(crate) const GRACEFUL_FLOOR: &str = "graceful restart floor";
const SERVICES_FLOOR: &str = "restart floor among the jobs' Services";
const PODS_ONLY_FLOOR: &str = "pods-only restart floor";

/// The restart floor the operator's burst is judged against ([`restart_floors`]' first).
pub(crate) fn judged_restart_floor(
    r: &OperatorBenchReport,
) -> Option<(&Recovery, &[Recovery], &'static str)> {
    restart_floors(r).into_iter().next()
}

/// Preemption → new pods p99 against the restart floor's p99 of the same run, at every size.
fn recovery_against_floor(r: &OperatorBenchReport) -> TargetCheck {
    let target = format!("preemption → new pods p99 ≤ {RECOVERY_FLOOR_FACTOR} × restart floor");
    let (measured, met) = match (&r.recovery, judged_restart_floor(r)) {
        (Some(op), Some((floor, _, which))) => (
            format!(
                "{:.2} s / {:.2} s = {:.2} ({which})",
                op.p99_seconds,
                floor.p99_seconds,
                op.p99_seconds / floor.p99_seconds.max(f64::EPSILON)
            ),
            Some(op.p99_seconds <= RECOVERY_FLOOR_FACTOR * floor.p99_seconds),
        ),
        (Some(op), None) => (
            format!("{:.2} s; restart floor {NOT_MEASURED}", op.p99_seconds),
            None,
        ),
        (None, _) => (NOT_MEASURED.to_owned(), None),
    };
    TargetCheck {
        target,
        measured,
        met,
        unjudged: Unjudged::NotMeasured,
    }
}

fn s(x: f64) -> String {
    format!("{x:.2} s")
}

/// The run's title, e.g. "100 jobs × 4 workers on 50 nodes".
pub fn title(r: &OperatorBenchReport) -> String {
    format!(
        "{} jobs × {} workers on {} nodes",
        r.jobs, r.workers, r.nodes
    )
}

fn counts_table(out: &mut String, label: &str, counts: &RequestCounts, per: f64, per_what: &str) {
    let _ = writeln!(
        out,
        "| {label} | requests | per {per_what} |\n|---|---:|---:|"
    );
    let mut rows: Vec<(&String, &u64)> = counts.0.iter().collect();
    rows.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    for (k, v) in rows {
        let _ = writeln!(out, "| {k} | {v} | {:.2} |", *v as f64 / per);
    }
    let _ = writeln!(
        out,
        "| **total** | **{}** | **{:.2}** |\n",
        counts.total(),
        counts.total() as f64 / per
    );
}

/// CPUs available to this process (the machine the report is rendered on).
fn machine_cpus() -> usize {
    std::thread::available_parallelism()
        .map(usize::from)
        .unwrap_or(0)
}

/// CPU seconds by process while each phase's clock ran: the profile of where the machine's
/// time went.
fn cpu_table(out: &mut String, r: &OperatorBenchReport) {
    const COLUMNS: [(&str, &str); 6] = [
        ("kube-apiserver", "API server"),
        ("etcd", "etcd"),
        ("kube-scheduler", "scheduler"),
        ("kube-controller-manager", "controller-manager"),
        ("trainyard-operator", "operator"),
        ("trainyard-bench", "benchmark + proxy"),
    ];
    let _ = write!(
        out,
        "CPU seconds by process while the clock ran (from /proc; the machine has {} CPUs):\n\n| phase | wall |",
        machine_cpus()
    );
    for (_, label) in COLUMNS {
        let _ = write!(out, " {label} |");
    }
    let _ = writeln!(
        out,
        " all (CPUs busy) |\n|---|---:|{}---:|",
        "---:|".repeat(COLUMNS.len())
    );
    for (phase, p) in &r.cpu {
        let _ = write!(out, "| {phase} | {} |", s(p.wall_seconds));
        for (key, _) in COLUMNS {
            match p.cpu_seconds.get(key) {
                Some(c) => {
                    let _ = write!(out, " {c:.2} |");
                }
                None => out.push_str(" — |"),
            }
        }
        let busy = if p.wall_seconds > 0.0 {
            p.total() / p.wall_seconds
        } else {
            0.0
        };
        let _ = writeln!(out, " {:.2} ({busy:.2}) |", p.total());
    }
    out.push('\n');
}

/// One figure of a create phase.
type Measure = fn(&Throughput) -> f64;

/// One run of the create phase, as a column of the throughput table.
struct Column<'a> {
    run: Option<&'a Throughput>,
    /// What an empty cell says.
    missing: &'static str,
}

impl Column<'_> {
    fn get(&self, measure: Measure) -> Option<f64> {
        self.run.map(measure)
    }

    fn cell(&self, value: Option<f64>, show: impl Fn(f64) -> String) -> String {
        value.map(show).unwrap_or_else(|| self.missing.to_owned())
    }
}

/// operator / floor, or "—".
fn ratio_cell(floor: Option<f64>, operator: Option<f64>) -> String {
    match (floor, operator) {
        (Some(f), Some(o)) if f > 0.0 => format!("{:.2}", o / f),
        _ => "—".to_owned(),
    }
}

/// Both floors and the operator, measure by measure, with the operator's ratio to each floor;
/// on the page without the diagnostic rows (when the benchmark's own requests were answered,
/// the most requests waiting).
fn throughput_table(out: &mut String, r: &OperatorBenchReport, telling: Telling) {
    let diagnostic = telling != Telling::Page;
    let floor = Column {
        run: r.floor.as_ref(),
        missing: "—",
    };
    let fair = Column {
        run: r.fair_floor.as_ref(),
        // Reports from before the fair floor existed.
        missing: NOT_MEASURED,
    };
    let operator = Column {
        run: r.operator.as_ref(),
        missing: "—",
    };
    let _ = writeln!(
        out,
        "| measure | pods-only floor (direct pod creates) | fair floor (TrainingJob, Service, pods, status write) | operator (TrainingJobs) | operator / pods-only floor | operator / fair floor |\n|---|---:|---:|---:|---:|---:|"
    );
    let row = |out: &mut String, label: &str, measure: Measure, show: fn(f64) -> String| {
        let (f, ff, o) = (floor.get(measure), fair.get(measure), operator.get(measure));
        let _ = writeln!(
            out,
            "| {label} | {} | {} | {} | {} | {} |",
            floor.cell(f, show),
            fair.cell(ff, show),
            operator.cell(o, show),
            ratio_cell(f, o),
            ratio_cell(ff, o),
        );
    };
    let times: [(&str, Measure); 4] = [
        (
            "first request → the benchmark's own requests answered (pods-only floor: pods; fair floor: every write; operator: TrainingJobs)",
            |t| t.inputs_done_seconds,
        ),
        ("first request → half the pods created", |t| {
            t.half_created_seconds
        }),
        ("first request → every pod created", |t| t.created_seconds),
        ("first request → every pod scheduled", |t| {
            t.scheduled_seconds
        }),
    ];
    for (k, (label, measure)) in times.into_iter().enumerate() {
        let recorded = [&floor, &fair, &operator]
            .iter()
            .any(|c| c.get(measure).unwrap_or_default() != 0.0);
        // A report from before the measure existed; the first row is diagnostic.
        if recorded && (k > 0 || diagnostic) {
            row(out, label, measure, s);
        }
    }
    if diagnostic {
        row(
            out,
            "most requests waiting for the API server at once",
            |t| t.peak_in_flight as f64,
            |n| format!("{n:.0}"),
        );
    }
    let jobs = f64::from(r.jobs.max(1));
    let per_job = |n: f64| format!("{n:.0} ({:.2})", n / jobs);
    let f = floor.get(|t| t.requests.total() as f64);
    let ff = fair.get(|t| t.requests.total() as f64);
    let o = operator.get(|t| t.requests.total() as f64);
    let _ = writeln!(
        out,
        "| API requests of the client (per job) | {} | {} | {} | {} | {} |\n",
        floor.cell(f, per_job),
        fair.cell(ff, per_job),
        operator.cell(o, per_job),
        ratio_cell(f, o),
        ratio_cell(ff, o),
    );
}

/// One stage of the recovery, as a row of the stages table.
struct StageRow {
    label: &'static str,
    holds: &'static str,
    get: fn(&RecoveryStages) -> Option<StageSeconds>,
    /// Whether the restart floor has the stage (it decides nothing).
    in_floor: bool,
}

const STAGE_ROWS: [StageRow; 4] = [
    StageRow {
        label: "1. preemption → restart decided (the `eventTime` of the Event that starts the next attempt)",
        holds: "watch lag + queueing + decision",
        get: |s| s.preempted_to_decided,
        in_floor: false,
    },
    StageRow {
        label: "2. restart decided → last pod of the old attempt gone",
        holds: "the status write + the delete requests + the grace period the bench finishes at once + watch lag",
        get: |s| s.decided_to_old_gone,
        in_floor: false,
    },
    StageRow {
        label: "1 + 2. preemption → last pod of the old attempt gone",
        holds: "both of the above (the restart floor: the preemption and delete requests + watch lag)",
        get: |s| s.preempted_to_old_gone,
        in_floor: true,
    },
    StageRow {
        label: "3. old attempt gone → every pod of the next attempt created",
        holds: "queueing at the operator + the create requests + watch lag (the restart floor: the create requests + watch lag)",
        get: |s| s.old_gone_to_created,
        in_floor: true,
    },
];

/// p50, p99 and "jobs of preempted" of one stage of one side, or why they are missing.
fn stage_cells(side: Option<&Recovery>, row: &StageRow, applies: bool) -> [String; 3] {
    let dash = || ["—".to_owned(), "—".to_owned(), "—".to_owned()];
    if !applies {
        return dash();
    }
    let Some(rec) = side else {
        return dash();
    };
    let Some(stages) = &rec.stages else {
        // A report from before the stages were measured.
        return [
            NOT_MEASURED.to_owned(),
            NOT_MEASURED.to_owned(),
            "—".to_owned(),
        ];
    };
    match (row.get)(stages) {
        Some(st) => [
            s(st.p50_seconds),
            s(st.p99_seconds),
            format!("{} of {}", st.jobs, rec.preempted),
        ],
        None => [
            "—".to_owned(),
            "—".to_owned(),
            format!("0 of {}", rec.preempted),
        ],
    }
}

/// What the stages table shows and where each stage ends.
pub const STAGES_EXPLAINED: &str = "Where each job's recovery goes, stage by stage: p50 and p99 over the jobs each stage could be measured for (\"jobs\"). Stage 1 ends at the `eventTime` of the events.k8s.io/v1 Event that starts the job's next attempt (`<job>.<uid>.attempt-<n>`), read from the API (a job whose Event is not found is left out of stages 1 and 2); the pod watch ends stages 2 and 3. The restart floor decides nothing: it has stages 1 + 2 only together.";

/// Where each job's recovery goes, stage by stage, the operator beside the restart floor,
/// after [`STAGES_EXPLAINED`] where `explain` (the page says it once, in its method).
/// Nothing for reports from before the stages were measured.
fn stages_table(out: &mut String, op: &Recovery, floor: Option<&Recovery>, explain: bool) {
    if op.stages.is_none() && floor.and_then(|f| f.stages.as_ref()).is_none() {
        return;
    }
    if explain {
        let _ = writeln!(out, "{STAGES_EXPLAINED}\n");
    }
    let _ = writeln!(
        out,
        "| stage | what it holds | operator p50 | operator p99 | jobs | restart floor p50 | restart floor p99 | jobs |\n|---|---|---:|---:|---:|---:|---:|---:|"
    );
    for row in &STAGE_ROWS {
        let [op50, op99, opn] = stage_cells(Some(op), row, true);
        let [f50, f99, fnn] = stage_cells(floor, row, row.in_floor);
        let _ = writeln!(
            out,
            "| {} | {} | {op50} | {op99} | {opn} | {f50} | {f99} | {fnn} |",
            row.label, row.holds
        );
    }
    out.push('\n');
}

/// A restart floor's figures and the operator's p99 against it.
fn against_floor(op: &Recovery, floor: &Recovery) -> String {
    format!(
        "p50 **{}**, p99 **{}**, max {}. Operator / floor at p99: **{:.2}**.",
        s(floor.p50_seconds),
        s(floor.p99_seconds),
        s(floor.max_seconds),
        op.p99_seconds / floor.p99_seconds.max(f64::EPSILON),
    )
}

/// How much of a run is told, and how.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Telling {
    /// Everything: each restart floor in a paragraph of its own that says how it was made,
    /// the stages table after what it shows (the run's own report).
    Full,
    /// Every figure, told briefly: the restart floors in figures beside the operator's
    /// recovery, the stages table alone, the CPUs' load with the operator's cost; the page's
    /// method says how each floor was made and what the stages are (the companion file).
    Figures,
    /// As [`Telling::Figures`], less the create phase's diagnostic rows (the page, whose
    /// companion file has them).
    Page,
}

/// " (the target's reference)" for the restart floor the target is judged against.
fn reference(r: &OperatorBenchReport, which: &str) -> &'static str {
    if judged_restart_floor(r).map(|(_, _, w)| w) == Some(which) {
        " (the target's reference)"
    } else {
        ""
    }
}

/// What each restart floor of the run did, and the operator's p99 against it; the judged one
/// is marked as the target's reference.
fn restart_floor_paragraphs(out: &mut String, r: &OperatorBenchReport, rec: &Recovery) {
    if let Some(floor) = &r.floor_recovery {
        let _ = writeln!(
            out,
            "**Restart floor, pods only**{}: the same {} restarts made directly by a minimal client, all at once (the preemption as above, the other workers deleted with grace period 0, the next attempt's pods created; no controller in the loop): {}\n",
            reference(r, PODS_ONLY_FLOOR),
            floor.preempted,
            against_floor(rec, floor),
        );
    }
    if let Some(floor) = &r.fair_floor_recovery {
        let _ = writeln!(
            out,
            "**Restart floor among the jobs' Services**{}: the same restarts made the same way, in the last fair floor run's namespace, where every job has its TrainingJob and headless Service as the operator's jobs do (the controller-manager keeps each Service's endpoints, which costs the control plane CPU on every pod change; the pods-only floor has no Service): {}\n",
            reference(r, SERVICES_FLOOR),
            against_floor(rec, floor),
        );
    }
    if let Some(floor) = &r.graceful_floor_recovery {
        let _ = writeln!(
            out,
            "**Graceful restart floor**{}: the same restarts among the same Services, made as any correct controller must make them and nothing more: the preemption; one status write (Restarting, the next attempt), before anything is stopped; the other workers deleted gracefully with their uid preconditions, so that their trainers can checkpoint (the benchmark finishes each deletion as a kubelet does once the containers stopped); the next attempt's pods, owned by the job, created once its own pod watch shows the old ones gone, whose names they reuse; it keeps a pod watch and a TrainingJob watch of its own, as the operator does. No Event, no decision: {}\n",
            reference(r, GRACEFUL_FLOOR),
            against_floor(rec, floor),
        );
    }
}

/// Every restart floor's figures and the operator's p99 against each, in one sentence, the
/// judged one first and marked as the target's reference.
fn restart_floor_figures(r: &OperatorBenchReport, rec: &Recovery) -> Option<String> {
    let floors: Vec<String> = restart_floors(r)
        .into_iter()
        .map(|(floor, _, which)| {
            format!(
                "the {which}{}: p50 **{}**, p99 **{}**, max {}, operator / floor at p99 **{:.2}**",
                reference(r, which),
                s(floor.p50_seconds),
                s(floor.p99_seconds),
                s(floor.max_seconds),
                rec.p99_seconds / floor.p99_seconds.max(f64::EPSILON),
            )
        })
        .collect();
    (!floors.is_empty()).then(|| {
        format!(
            "**Restart floors** (the same {} restarts made without the operator, as the method above says): {}.",
            rec.preempted,
            floors.join("; ")
        )
    })
}

/// Every run of the repeated phases, and which one the targets are judged on (the median).
fn repeated(r: &OperatorBenchReport) -> Vec<String> {
    let list = |xs: Vec<f64>| xs.iter().map(|x| s(*x)).collect::<Vec<_>>().join(", ");
    let mut sentences = Vec::new();
    if r.fair_floor_runs.len() > 1
        && let Some(median) = &r.fair_floor
    {
        sentences.push(format!(
            "**Fair floor, {} runs in this run**, every pod created after {}: judged on the median run, {}.",
            r.fair_floor_runs.len(),
            list(
                r.fair_floor_runs
                    .iter()
                    .map(|f| f.created_seconds)
                    .collect()
            ),
            s(median.created_seconds),
        ));
    }
    let floor = judged_restart_floor(r);
    let floor_rounds = floor.map(|(_, rounds, _)| rounds).unwrap_or_default();
    if r.recovery_rounds.len() > 1 || floor_rounds.len() > 1 {
        let p99s = |rounds: &[Recovery]| list(rounds.iter().map(|x| x.p99_seconds).collect());
        let others: Vec<String> = restart_floors(r)
            .into_iter()
            .skip(1)
            .filter(|(_, rounds, _)| !rounds.is_empty())
            .map(|(_, rounds, which)| format!("the {which}: {}", p99s(rounds)))
            .collect();
        let others = if others.is_empty() {
            String::new()
        } else {
            format!(" ({})", others.join("; "))
        };
        sentences.push(format!(
            "**Preemption burst, {} rounds in this run** (each restarts the same jobs once more, a different rank preempted each round; the restart floors likewise): p99 per round, operator {}; {} {}{others}. Judged on the median round of each: {} / {}.",
            r.recovery_rounds.len().max(floor_rounds.len()),
            p99s(&r.recovery_rounds),
            floor.map(|(_, _, which)| which).unwrap_or("restart floor"),
            p99s(floor_rounds),
            r.recovery
                .as_ref()
                .map(|x| s(x.p99_seconds))
                .unwrap_or_else(|| NOT_MEASURED.to_owned()),
            floor
                .map(|(x, _, _)| s(x.p99_seconds))
                .unwrap_or_else(|| NOT_MEASURED.to_owned()),
        ));
    }
    sentences
}

/// The run as a markdown section, all of it (what `trainyard-bench operator` prints): what ran
/// and what may have distorted it, the create phase, the preemption recovery, the operator's
/// cost and metrics, the CPU and API requests, and the targets' verdicts.
pub fn markdown(r: &OperatorBenchReport) -> String {
    let mut out = format!("### {}\n\n", title(r));
    headline(&mut out, r, Telling::Full);
    if !r.cpu.is_empty() {
        cpu_table(&mut out, r);
    }
    let _ = writeln!(
        out,
        "<details><summary>API requests by verb and resource (counting proxy)</summary>\n"
    );
    requests_tables(&mut out, r);
    let _ = writeln!(out, "</details>\n");
    targets_table(&mut out, r);
    out
}

/// The run as docs/benchmarks.md tells it, under a heading of the page's: the headline figures
/// of [`markdown`] less the create phase's diagnostic rows, each restart floor in figures only,
/// the stages table without [`STAGES_EXPLAINED`] (the page's method says it), and how busy the
/// CPUs were; the rest is in [`details`].
pub fn summary(r: &OperatorBenchReport) -> String {
    let mut out = String::new();
    headline(&mut out, r, Telling::Page);
    out
}

/// The run in full for the page's companion file, under `heading`: its figures as [`summary`]
/// tells them (the create phase's diagnostic rows included), then its detail tables: CPU
/// seconds by process and phase, API requests by verb and resource of each client and phase,
/// and every target row (context rows and the targets stated for another size included).
pub fn details(r: &OperatorBenchReport, heading: &str) -> String {
    let mut out = format!("## {heading}\n\n");
    headline(&mut out, r, Telling::Figures);
    if r.cpu.is_empty() {
        let _ = writeln!(out, "No CPU profile was recorded.\n");
    } else {
        cpu_table(&mut out, r);
    }
    let _ = writeln!(out, "API requests by verb and resource (counting proxy):\n");
    requests_tables(&mut out, r);
    let _ = writeln!(
        out,
        "Every target row, context rows and the targets stated for another size included:\n"
    );
    targets_table(&mut out, r);
    out
}

/// What [`markdown`], [`summary`] and [`details`] share, told as `telling` says: the run's
/// header, the create phase, the preemption recovery against its restart floors, the repeated
/// phases and the operator's cost and metrics (briefly: in one paragraph, with how busy the
/// CPUs were, which the full report's CPU table shows).
fn headline(out: &mut String, r: &OperatorBenchReport, telling: Telling) {
    run_header(out, r);
    throughput_table(out, r, telling);
    recovery_paragraphs(out, r, telling);
    let paragraphs = if telling == Telling::Full {
        vec![repeated(r), cost_sentences(r)]
    } else {
        let mut all = repeated(r);
        all.extend(cost_sentences(r));
        all.extend(cpu_busy(r));
        vec![all]
    };
    for sentences in paragraphs.iter().filter(|p| !p.is_empty()) {
        let _ = writeln!(out, "{}\n", sentences.join(" "));
    }
}

/// What ran, the load before it, and why it stopped or may be distorted.
fn run_header(out: &mut String, r: &OperatorBenchReport) {
    let load = r
        .load_before
        .map(|load| {
            format!(" Load average before the run: {load:.2} (other work on the machine shares its CPUs).")
        })
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "{} GPU per worker, {} pods; {} workers of {} jobs preempted at once; {} jobs in flight while applying (both floors: the same). Run `{}`.{load}\n",
        r.gpus_per_worker,
        u64::from(r.jobs) * u64::from(r.workers),
        r.preempt,
        r.preempt,
        r.concurrency,
        r.run_id
    );
    if let Some(e) = &r.error {
        let _ = writeln!(out, "**The run did not finish:** {e}\n");
    }
    for w in &r.warnings {
        let _ = writeln!(out, "> warning: {w}\n");
    }
}

/// The preemption recovery against the restart floors (in one paragraph when told briefly),
/// and its stages.
fn recovery_paragraphs(out: &mut String, r: &OperatorBenchReport, telling: Telling) {
    if let Some(rec) = &r.recovery {
        let _ = write!(
            out,
            "**Preemption recovery** ({} workers of {} jobs: DisruptionTarget, then deleted), per job from the preemption to every pod of the next attempt created: p50 **{}**, p99 **{}**, max {}{}.",
            rec.preempted,
            rec.preempted,
            s(rec.p50_seconds),
            s(rec.p99_seconds),
            s(rec.max_seconds),
            rec.operator_histogram_mean_seconds
                .map(|m| format!(
                    "; the operator's own histogram (from its detection) averages {}",
                    s(m)
                ))
                .unwrap_or_default()
        );
        if telling == Telling::Full {
            out.push_str("\n\n");
            restart_floor_paragraphs(out, r, rec);
        } else {
            match restart_floor_figures(r, rec) {
                Some(floors) => {
                    let _ = writeln!(out, " {floors}\n");
                }
                None => out.push_str("\n\n"),
            }
        }
        let floor = judged_restart_floor(r).map(|(f, _, _)| f);
        stages_table(out, rec, floor, telling == Telling::Full);
    }
}

/// The operator's peak memory and its CPU, phase by phase, and its reconciles from its own
/// metrics.
fn cost_sentences(r: &OperatorBenchReport) -> Vec<String> {
    let mut sentences = Vec::new();
    if let Some(u) = &r.usage {
        let peak = u.last.peak_rss_mib.max(u.created.peak_rss_mib);
        let mut cpu = format!(
            "start-up {:.2} s, create {:.2} s",
            u.idle.cpu_seconds,
            u.created.cpu_seconds - u.idle.cpu_seconds
        );
        let mut prev = u.created.cpu_seconds;
        if let Some(run) = &u.running {
            let _ = write!(cpu, ", jobs going Running {:.2} s", run.cpu_seconds - prev);
            prev = run.cpu_seconds;
        }
        if let Some(rec) = &u.recovered {
            let _ = write!(cpu, ", preemption burst {:.2} s", rec.cpu_seconds - prev);
        }
        sentences.push(format!(
            "**Operator cost:** peak RSS **{peak:.1} MiB** (VmHWM; {:.1} MiB idle with the caches filled, {:.1} MiB after creating); CPU **{:.2} s** in all ({cpu}).",
            u.idle.rss_mib,
            u.created.rss_mib,
            u.last.cpu_seconds.max(u.created.cpu_seconds)
        ));
    }
    if !r.operator_metrics.is_empty() {
        let m = |k: &str| r.operator_metrics.get(k).copied().unwrap_or_default();
        let n = m("trainyard_operator_reconcile_duration_seconds_count");
        sentences.push(format!(
            "Operator metrics: {:.0} reconciles ({:.2} per job), {:.0} reconcile errors, mean reconcile {:.1} ms.",
            m("trainyard_operator_reconciles_total"),
            m("trainyard_operator_reconciles_total") / f64::from(r.jobs),
            m("trainyard_operator_reconcile_errors_total"),
            if n > 0.0 {
                1000.0 * m("trainyard_operator_reconcile_duration_seconds_sum") / n
            } else {
                0.0
            },
        ));
    }
    sentences
}

/// How busy the machine's CPUs were while the clocks ran, over every timed phase, and the
/// operator's share: the sentence that stands for [`cpu_table`] on the page.
fn cpu_busy(r: &OperatorBenchReport) -> Option<String> {
    let timed: Vec<_> = r.cpu.values().filter(|p| p.wall_seconds > 0.0).collect();
    let range = |xs: Vec<f64>| {
        let lo = format!("{:.2}", xs.iter().copied().fold(f64::INFINITY, f64::min));
        let hi = format!(
            "{:.2}",
            xs.iter().copied().fold(f64::NEG_INFINITY, f64::max)
        );
        (!xs.is_empty()).then(|| if lo == hi { lo } else { format!("{lo}–{hi}") })
    };
    let all = range(timed.iter().map(|p| p.total() / p.wall_seconds).collect())?;
    let operator = range(
        timed
            .iter()
            .filter_map(|p| Some(p.cpu_seconds.get("trainyard-operator")? / p.wall_seconds))
            .collect(),
    )
    .map(|x| format!(", the operator {x} of them in the phases it ran"))
    .unwrap_or_default();
    Some(format!(
        "**CPUs busy** while the clocks ran: {all} of the machine's {} in the {} timed phases (every measured process{operator}).",
        machine_cpus(),
        timed.len(),
    ))
}

/// The API requests of each client and phase, by verb and resource.
fn requests_tables(out: &mut String, r: &OperatorBenchReport) {
    for (label, run) in [
        ("pods-only floor, creating", &r.floor),
        ("fair floor, creating", &r.fair_floor),
        ("operator, creating", &r.operator),
    ] {
        let Some(run) = run else { continue };
        counts_table(out, label, &run.requests, f64::from(r.jobs), "job");
    }
    if let Some(q) = &r.requests {
        counts_table(out, "operator, start-up", &q.startup, 1.0, "run");
        if let Some(run) = &q.running {
            counts_table(
                out,
                "operator, jobs going Running",
                run,
                f64::from(r.jobs),
                "job",
            );
        }
        if let Some(p) = &q.preemption {
            counts_table(
                out,
                "operator, preemption burst",
                p,
                f64::from(r.preempt.max(1)),
                "preempted job",
            );
        }
    }
}

/// Each target with what was measured and its verdict.
fn targets_table(out: &mut String, r: &OperatorBenchReport) {
    let _ = writeln!(out, "| target | measured | verdict |\n|---|---|---|");
    for t in targets(r) {
        let _ = writeln!(out, "| {} | {} | {} |", t.target, t.measured, t.verdict());
    }
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu_profile::CpuProfile;
    use crate::recovery_stages::{RecoveryStages, StageSeconds};
    use crate::scenario::{OperatorRequests, OperatorUsage, Recovery};

    fn timed(seconds: f64) -> Throughput {
        Throughput {
            created_seconds: seconds,
            scheduled_seconds: seconds,
            ..Throughput::default()
        }
    }

    /// A run with the pods-only floor, the fair floor and the operator timed.
    fn report(floor: f64, fair: f64, operator: f64, jobs: u32) -> OperatorBenchReport {
        OperatorBenchReport {
            jobs,
            workers: 4,
            nodes: jobs / 2,
            floor: Some(timed(floor)),
            fair_floor: Some(timed(fair)),
            operator: Some(timed(operator)),
            ..OperatorBenchReport::default()
        }
    }

    fn recovery(preempted: u32, p99: f64) -> Recovery {
        Recovery {
            preempted,
            p99_seconds: p99,
            ..Recovery::default()
        }
    }

    fn check<'a>(checks: &'a [TargetCheck], starts: &str) -> &'a TargetCheck {
        checks
            .iter()
            .find(|t| t.target.starts_with(starts))
            .unwrap_or_else(|| panic!("a target row starting with {starts:?}"))
    }

    const FAIR: &str = "operator / fair floor ≤ 1.3 (pods created)";
    const SCHEDULED: &str = "operator / floor ≤ 1.3 (pods scheduled)";
    const PODS_ONLY: &str = "operator / pods-only floor, pods created";
    const VS_RESTART_FLOOR: &str = "preemption → new pods p99 ≤ 1.5 × restart floor";
    const RECOVERY_2S: &str = "preemption → new pods p99 ≤ 2 s at 100";
    const RSS: &str = "operator RSS ≤ 64 MiB at 1000 jobs";

    #[test]
    fn repeated_runs_are_all_listed_with_the_median_they_are_judged_on() {
        let mut r = report(5.0, 10.0, 13.0, 100);
        r.fair_floor_runs = vec![timed(12.0), timed(10.0), timed(30.0)];
        r.fair_floor = Some(timed(12.0));
        r.recovery_rounds = vec![recovery(100, 3.0), recovery(100, 2.5), recovery(100, 9.0)];
        r.floor_recovery_rounds = vec![recovery(100, 2.0), recovery(100, 2.2), recovery(100, 1.9)];
        r.recovery = Some(recovery(100, 3.0));
        r.floor_recovery = Some(recovery(100, 2.0));
        let md = markdown(&r);
        assert!(
            md.contains("**Fair floor, 3 runs in this run**, every pod created after 12.00 s, 10.00 s, 30.00 s: judged on the median run, 12.00 s."),
            "{md}"
        );
        assert!(
            md.contains("p99 per round, operator 3.00 s, 2.50 s, 9.00 s; pods-only restart floor 2.00 s, 2.20 s, 1.90 s. Judged on the median round of each: 3.00 s / 2.00 s."),
            "{md}"
        );
        // One run of each (reports from before the rounds): nothing about repetition.
        let once = markdown(&report(5.0, 10.0, 13.0, 100));
        assert!(!once.contains("runs in this run") && !once.contains("rounds in this run"));
    }

    #[test]
    fn the_fair_floor_target_is_met_at_or_below_1_3_and_missed_above() {
        let met = targets(&report(5.0, 10.0, 13.0, 100));
        assert_eq!(check(&met, FAIR).met, Some(true));
        assert_eq!(check(&met, FAIR).measured, "1.30");
        let missed = targets(&report(5.0, 10.0, 13.5, 100));
        assert_eq!(check(&missed, FAIR).met, Some(false));
        assert_eq!(check(&missed, FAIR).verdict(), "**missed**");
    }

    #[test]
    fn the_pods_only_created_ratio_is_context_and_never_judged() {
        let t = targets(&report(5.0, 10.0, 13.0, 100));
        let pods_only = check(&t, PODS_ONLY);
        assert_eq!(pods_only.measured, "2.60");
        assert_eq!(pods_only.met, None);
        assert_eq!(pods_only.verdict(), "context, no target");
    }

    #[test]
    fn the_scheduled_target_stays_against_the_pods_only_floor() {
        let mut r = report(10.0, 20.0, 13.0, 100);
        r.operator = Some(Throughput {
            scheduled_seconds: 12.0,
            ..timed(13.0)
        });
        assert_eq!(check(&targets(&r), SCHEDULED).measured, "1.20");
        assert_eq!(check(&targets(&r), SCHEDULED).met, Some(true));
    }

    #[test]
    fn recovery_is_judged_against_1_5_times_the_restart_floor_at_every_size() {
        let mut r = report(1.0, 1.0, 1.0, 10);
        r.preempt = 2;
        r.floor_recovery = Some(recovery(2, 2.0));
        r.recovery = Some(recovery(2, 3.0));
        let met = targets(&r);
        assert_eq!(
            check(&met, VS_RESTART_FLOOR).met,
            Some(true),
            "3.0 ≤ 1.5 × 2.0"
        );
        assert_eq!(
            check(&met, VS_RESTART_FLOOR).measured,
            "3.00 s / 2.00 s = 1.50 (pods-only restart floor)"
        );
        assert_eq!(check(&met, RECOVERY_2S).met, None, "2 preemptions, not 100");
        r.recovery = Some(recovery(2, 3.1));
        assert_eq!(
            check(&targets(&r), VS_RESTART_FLOOR).met,
            Some(false),
            "3.1 > 1.5 × 2.0"
        );
    }

    #[test]
    fn recovery_is_judged_against_the_restart_floor_among_services_when_it_was_measured() {
        let mut r = report(5.0, 10.0, 13.0, 100);
        r.recovery = Some(recovery(2, 3.0));
        r.floor_recovery = Some(recovery(2, 1.0));
        r.fair_floor_recovery = Some(recovery(2, 2.5));
        let checks = targets(&r);
        let row = check(&checks, VS_RESTART_FLOOR);
        assert_eq!(row.met, Some(true));
        assert_eq!(
            row.measured,
            "3.00 s / 2.50 s = 1.20 (restart floor among the jobs' Services)"
        );
        let md = markdown(&r);
        assert!(
            md.contains("**Restart floor, pods only**: the same 2 restarts"),
            "{md}"
        );
        assert!(md.contains("Operator / floor at p99: **3.00**"), "{md}");
        assert!(
            md.contains("**Restart floor among the jobs' Services** (the target's reference)"),
            "{md}"
        );
        assert!(md.contains("Operator / floor at p99: **1.20**"), "{md}");
    }

    #[test]
    fn recovery_is_judged_against_the_graceful_restart_floor_when_it_was_measured() {
        let mut r = report(5.0, 10.0, 13.0, 100);
        r.recovery = Some(recovery(2, 3.0));
        r.recovery_rounds = vec![recovery(2, 3.0), recovery(2, 3.3), recovery(2, 2.9)];
        r.floor_recovery = Some(recovery(2, 1.0));
        r.floor_recovery_rounds = vec![recovery(2, 1.0), recovery(2, 1.1), recovery(2, 0.9)];
        r.fair_floor_recovery = Some(recovery(2, 1.5));
        r.fair_floor_recovery_rounds = vec![recovery(2, 1.5), recovery(2, 1.6), recovery(2, 1.4)];
        r.graceful_floor_recovery = Some(recovery(2, 2.4));
        r.graceful_floor_recovery_rounds =
            vec![recovery(2, 2.4), recovery(2, 2.5), recovery(2, 2.2)];
        let checks = targets(&r);
        let row = check(&checks, VS_RESTART_FLOOR);
        assert_eq!(
            row.measured,
            "3.00 s / 2.40 s = 1.25 (graceful restart floor)"
        );
        assert_eq!(row.met, Some(true), "3.0 ≤ 1.5 × 2.4");
        r.graceful_floor_recovery = Some(recovery(2, 1.9));
        assert_eq!(
            check(&targets(&r), VS_RESTART_FLOOR).met,
            Some(false),
            "3.0 > 1.5 × 1.9, though 3.0 ≤ 1.5 × 2.4 of another floor would pass"
        );
        r.graceful_floor_recovery = Some(recovery(2, 2.4));
        let md = markdown(&r);
        // Every floor is reported; only the graceful one is the reference.
        assert!(
            md.contains("**Graceful restart floor** (the target's reference)"),
            "{md}"
        );
        assert!(md.contains("**Restart floor, pods only**: "), "{md}");
        assert!(
            md.contains("**Restart floor among the jobs' Services**: "),
            "{md}"
        );
        assert!(
            md.contains("graceful restart floor 2.40 s, 2.50 s, 2.20 s (the restart floor among the jobs' Services: 1.50 s, 1.60 s, 1.40 s; the pods-only restart floor: 1.00 s, 1.10 s, 0.90 s). Judged on the median round of each: 3.00 s / 2.40 s."),
            "{md}"
        );
    }

    #[test]
    fn recovery_without_a_restart_floor_is_not_judged() {
        let mut r = report(1.0, 1.0, 1.0, 10);
        r.recovery = Some(recovery(2, 3.0));
        let t = targets(&r);
        assert_eq!(check(&t, VS_RESTART_FLOOR).met, None);
        assert_eq!(check(&t, VS_RESTART_FLOOR).verdict(), "not measured");
    }

    #[test]
    fn size_bound_targets_are_not_judged_at_other_sizes() {
        let mut r = report(1.0, 1.0, 1.0, 100);
        r.usage = Some(OperatorUsage::default());
        r.preempt = 10;
        r.recovery = Some(recovery(10, 0.5));
        let t = targets(&r);
        assert_eq!(check(&t, RECOVERY_2S).met, None, "10 preemptions, not 100");
        assert_eq!(check(&t, RECOVERY_2S).verdict(), "n/a at this size");
        assert_eq!(check(&t, RSS).met, None, "100 jobs, not 1000");
        assert_eq!(check(&t, RSS).verdict(), "n/a at this size");
    }

    #[test]
    fn markdown_shows_both_floors_and_the_ratio_to_each() {
        let md = markdown(&report(2.0, 2.5, 3.0, 100));
        assert!(md.contains("### 100 jobs × 4 workers on 50 nodes"));
        assert!(
            md.contains(
                "| first request → every pod created | 2.00 s | 2.50 s | 3.00 s | 1.50 | 1.20 |"
            ),
            "{md}"
        );
        assert!(md.contains(&format!("| {FAIR} | 1.20 | met |")), "{md}");
        assert!(md.contains("| 1.50 | context, no target |"), "{md}");
    }

    #[test]
    fn the_fair_floor_requests_per_job_are_shown() {
        let mut r = report(2.0, 2.5, 3.0, 10);
        let mut fair = timed(2.5);
        fair.requests = RequestCounts(
            [
                ("create trainingjobs".to_owned(), 10),
                ("create services".to_owned(), 10),
                ("create pods".to_owned(), 40),
                ("apply trainingjobs/status".to_owned(), 10),
            ]
            .into(),
        );
        r.fair_floor = Some(fair);
        let md = markdown(&r);
        assert!(
            md.contains(
                "| API requests of the client (per job) | 0 (0.00) | 70 (7.00) | 0 (0.00) |"
            ),
            "{md}"
        );
        assert!(
            md.contains("| fair floor, creating | requests | per job |"),
            "{md}"
        );
    }

    fn stage(jobs: u32, p50: f64, p99: f64) -> Option<StageSeconds> {
        Some(StageSeconds {
            jobs,
            p50_seconds: p50,
            p99_seconds: p99,
        })
    }

    /// A run whose operator's restart Events were found for 9 of its 10 decisions, beside a
    /// restart floor.
    fn staged_report() -> OperatorBenchReport {
        let mut r = report(1.0, 1.0, 1.0, 10);
        r.preempt = 10;
        r.recovery = Some(Recovery {
            stages: Some(RecoveryStages {
                preempted_to_decided: stage(9, 0.1, 0.3),
                decided_to_old_gone: stage(9, 0.4, 0.6),
                preempted_to_old_gone: stage(10, 0.5, 0.9),
                old_gone_to_created: stage(10, 0.2, 0.25),
            }),
            ..recovery(10, 1.2)
        });
        r.floor_recovery = Some(Recovery {
            stages: Some(RecoveryStages {
                preempted_to_old_gone: stage(10, 0.05, 0.08),
                old_gone_to_created: stage(10, 0.03, 0.04),
                ..RecoveryStages::default()
            }),
            ..recovery(10, 0.2)
        });
        r
    }

    #[test]
    fn markdown_splits_the_recovery_into_stages_beside_the_restart_floor() {
        let md = markdown(&staged_report());
        assert!(
            md.contains("| 1. preemption → restart decided (the `eventTime` of the Event that starts the next attempt) | watch lag + queueing + decision | 0.10 s | 0.30 s | 9 of 10 | — | — | — |"),
            "{md}"
        );
        assert!(
            md.contains("| 2. restart decided → last pod of the old attempt gone | the status write + the delete requests + the grace period the bench finishes at once + watch lag | 0.40 s | 0.60 s | 9 of 10 | — | — | — |"),
            "{md}"
        );
        assert!(
            md.contains("| 0.50 s | 0.90 s | 10 of 10 | 0.05 s | 0.08 s | 10 of 10 |"),
            "{md}"
        );
        assert!(
            md.contains("| 3. old attempt gone → every pod of the next attempt created | queueing at the operator + the create requests + watch lag"),
            "{md}"
        );
        assert!(
            md.contains("| 0.20 s | 0.25 s | 10 of 10 | 0.03 s | 0.04 s | 10 of 10 |"),
            "{md}"
        );
        assert!(
            md.contains("Stage 1 ends at the `eventTime` of the events.k8s.io/v1 Event that starts the job's next attempt (`<job>.<uid>.attempt-<n>`), read from the API"),
            "{md}"
        );
        assert!(!md.contains("log line"), "{md}");
        // The table follows the recovery paragraphs.
        let para = md.find("**Preemption recovery**").expect("paragraph");
        let table = md.find("| stage | what it holds |").expect("table");
        assert!(para < table, "{md}");
    }

    /// The staged run with a graceful restart floor, the CPU of two phases, the operator's
    /// start-up requests, its cost and metrics, and the load before it.
    fn detailed_report() -> OperatorBenchReport {
        let mut r = staged_report();
        r.run_id = "abc123".to_owned();
        r.load_before = Some(1.07);
        r.graceful_floor_recovery = Some(Recovery {
            p50_seconds: 0.5,
            max_seconds: 0.9,
            ..recovery(10, 0.8)
        });
        let profile = |wall_seconds: f64, cpu: &[(&str, f64)]| CpuProfile {
            wall_seconds,
            cpu_seconds: cpu.iter().map(|(p, c)| ((*p).to_owned(), *c)).collect(),
        };
        r.cpu = [
            (
                "operator",
                profile(
                    10.0,
                    &[("kube-apiserver", 8.0), ("trainyard-operator", 1.5)],
                ),
            ),
            (
                "fair floor, run 1",
                profile(5.0, &[("kube-apiserver", 7.0)]),
            ),
        ]
        .map(|(k, v)| (k.to_owned(), v))
        .into();
        r.requests = Some(OperatorRequests {
            startup: RequestCounts([("list pods".to_owned(), 1)].into()),
            ..OperatorRequests::default()
        });
        r.usage = Some(OperatorUsage::default());
        r.operator_metrics = [("trainyard_operator_reconciles_total".to_owned(), 20.0)].into();
        r
    }

    #[test]
    fn the_summary_gives_the_restart_floors_in_figures_and_leaves_the_tables_to_the_details() {
        let r = detailed_report();
        let page = summary(&r);
        assert!(
            page.contains("**Restart floors** (the same 10 restarts made without the operator, as the method above says): the graceful restart floor (the target's reference): p50 **0.50 s**, p99 **0.80 s**, max 0.90 s, operator / floor at p99 **1.50**; the pods-only restart floor: p50 **0.00 s**, p99 **0.20 s**, max 0.00 s, operator / floor at p99 **6.00**.\n"),
            "{page}"
        );
        assert!(!page.contains("**Graceful restart floor**"), "{page}");
        // The page's method says what the stages are.
        assert!(!page.contains(STAGES_EXPLAINED), "{page}");
        assert!(
            page.contains("| 1 + 2. preemption → last pod of the old attempt gone |"),
            "{page}"
        );
        assert!(
            page.contains("Run `abc123`. Load average before the run: 1.07 (other work on the machine shares its CPUs).\n"),
            "{page}"
        );
        assert!(
            page.contains("CPU **0.00 s** in all (start-up 0.00 s, create 0.00 s). Operator metrics: 20 reconciles (2.00 per job)"),
            "{page}"
        );
        assert!(
            page.contains(&format!("**CPUs busy** while the clocks ran: 0.95–1.40 of the machine's {} in the 2 timed phases (every measured process, the operator 0.15 of them in the phases it ran).\n", machine_cpus())),
            "{page}"
        );
        for table in [
            "| phase | wall |",
            "| operator, start-up | requests | per run |",
            "<details>",
            "\n| target | measured | verdict |",
        ] {
            assert!(!page.contains(table), "{table}: {page}");
        }
        // The page leaves the heading to its own sections.
        assert!(!page.contains("### "), "{page}");
        assert!(!page.contains("| most requests waiting"), "{page}");
        let details = details(&r, "10 jobs × 4 workers on 5 nodes, run 2 of 3");
        assert!(
            details.starts_with(
                "## 10 jobs × 4 workers on 5 nodes, run 2 of 3\n\n0 GPU per worker, 40 pods;"
            ),
            "the run's figures first: {details}"
        );
        for part in [
            "| most requests waiting for the API server at once |",
            "**Restart floors** (the same 10 restarts",
            "| 1 + 2. preemption → last pod of the old attempt gone |",
            "Operator metrics: 20 reconciles (2.00 per job)",
        ] {
            assert!(details.contains(part), "{part}: {details}");
        }
        assert!(
            details.contains("| operator | 10.00 s | 8.00 | — | — | — | 1.50 | — | 9.50 (0.95) |"),
            "{details}"
        );
        assert!(
            details.contains("| operator, start-up | requests | per run |\n|---|---:|---:|\n| list pods | 1 | 1.00 |"),
            "{details}"
        );
        assert!(
            details.contains(&format!(
                "| {PODS_ONLY} (context for the fair floor's target) | 1.00 | context, no target |"
            )),
            "{details}"
        );
        // The run's own report (what `trainyard-bench operator` prints) keeps all of it.
        let full = markdown(&r);
        for part in [
            STAGES_EXPLAINED,
            "**Graceful restart floor** (the target's reference): the same restarts",
            "| phase | wall |",
            "<details><summary>API requests by verb and resource",
            "| list pods | 1 | 1.00 |",
            "| target | measured | verdict |",
        ] {
            assert!(full.contains(part), "{part}: {full}");
        }
    }

    #[test]
    fn a_stage_no_job_could_be_measured_for_says_so() {
        let mut r = staged_report();
        if let Some(s) = r.recovery.as_mut().and_then(|x| x.stages.as_mut()) {
            s.preempted_to_decided = None;
            s.decided_to_old_gone = None;
        }
        let md = markdown(&r);
        assert!(
            md.contains("watch lag + queueing + decision | — | — | 0 of 10 | — | — | — |"),
            "{md}"
        );
    }

    #[test]
    fn the_stages_survive_a_json_round_trip() {
        let r = staged_report();
        let json = serde_json::to_string(&r).expect("serialises");
        let back: OperatorBenchReport = serde_json::from_str(&json).expect("parses");
        assert_eq!(
            back.recovery.and_then(|x| x.stages),
            r.recovery.and_then(|x| x.stages)
        );
    }

    /// A report written before the fair floor existed (no `fair_floor` and none of the other
    /// later fields).
    const OLD_REPORT: &str = r#"{
        "jobs": 100, "workers": 4, "nodes": 50, "gpus_per_worker": 1, "preempt": 100,
        "concurrency": 16, "run_id": "abc123",
        "floor": {"pods": 400, "created_seconds": 2.0, "half_created_seconds": 1.0,
                  "scheduled_seconds": 3.0, "requests": {"create pods": 400}},
        "operator": {"pods": 400, "created_seconds": 4.0, "half_created_seconds": 2.0,
                     "scheduled_seconds": 3.6, "requests": {"create pods": 400}},
        "recovery": {"preempted": 100, "p50_seconds": 1.0, "p99_seconds": 1.8,
                     "max_seconds": 1.9, "operator_histogram_mean_seconds": null},
        "usage": null, "requests": null, "operator_metrics": {}, "warnings": [],
        "error": null
    }"#;

    #[test]
    fn an_old_report_without_the_fair_floor_renders_it_as_not_measured() {
        let r: OperatorBenchReport = serde_json::from_str(OLD_REPORT).expect("old JSON parses");
        assert!(r.fair_floor.is_none());
        assert!(r.recovery.as_ref().is_some_and(|x| x.stages.is_none()));
        let t = targets(&r);
        assert_eq!(check(&t, FAIR).measured, "not measured");
        assert_eq!(check(&t, FAIR).met, None);
        assert_eq!(check(&t, PODS_ONLY).measured, "2.00");
        assert_eq!(check(&t, RECOVERY_2S).met, Some(true));
        let md = markdown(&r);
        assert!(
            md.contains(&format!("| {FAIR} | not measured | not measured |")),
            "{md}"
        );
        assert!(
            md.contains(
                "| first request → every pod created | 2.00 s | not measured | 4.00 s | 2.00 | — |"
            ),
            "{md}"
        );
        assert!(!md.contains("| stage | what it holds |"), "{md}");
    }
}
