//! Markdown for one operator benchmark run, and the targets checked against it.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::proxy::RequestCounts;
use crate::scenario::OperatorBenchReport;

/// operator / floor ratio target.
pub const RATIO_TARGET: f64 = 1.3;
/// Preemption → new pods p99 target, seconds, at this many simultaneous preemptions.
pub const RECOVERY_P99_TARGET: f64 = 2.0;
/// Simultaneous preemptions the recovery target is stated for.
pub const RECOVERY_AT: u32 = 100;
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
    /// Met, missed, or None when this run's size is not the one the target is for.
    pub met: Option<bool>,
}

/// The targets checked against a run.
pub fn targets(r: &OperatorBenchReport) -> Vec<TargetCheck> {
    let mut out = Vec::new();
    for (what, ratio) in [
        ("created", r.created_ratio()),
        ("scheduled", r.scheduled_ratio()),
    ] {
        out.push(TargetCheck {
            target: format!("operator / floor ≤ {RATIO_TARGET} (pods {what})"),
            measured: ratio
                .map(|x| format!("{x:.2}"))
                .unwrap_or_else(|| "not measured".to_owned()),
            met: ratio.map(|x| x <= RATIO_TARGET),
        });
    }
    let at_size = r.preempt >= RECOVERY_AT;
    out.push(TargetCheck {
        target: format!("preemption → new pods p99 ≤ {RECOVERY_P99_TARGET} s at {RECOVERY_AT} simultaneous preemptions"),
        measured: r
            .recovery
            .as_ref()
            .map(|x| format!("{:.2} s at {}", x.p99_seconds, x.preempted))
            .unwrap_or_else(|| "not measured".to_owned()),
        met: r.recovery.as_ref().filter(|_| at_size).map(|x| x.p99_seconds <= RECOVERY_P99_TARGET),
    });
    if let (Some(op), Some(floor)) = (&r.recovery, &r.floor_recovery) {
        out.push(TargetCheck {
            target:
                "preemption → new pods p99: operator / restart floor (context for the 2 s target)"
                    .to_owned(),
            measured: format!(
                "{:.2} s / {:.2} s = {:.2}",
                op.p99_seconds,
                floor.p99_seconds,
                op.p99_seconds / floor.p99_seconds.max(f64::EPSILON)
            ),
            met: None,
        });
    }
    let rss = r
        .usage
        .as_ref()
        .map(|u| u.last.peak_rss_mib.max(u.created.peak_rss_mib));
    out.push(TargetCheck {
        target: format!("operator RSS ≤ {RSS_TARGET_MIB} MiB at {RSS_AT_JOBS} jobs"),
        measured: rss
            .map(|x| format!("{x:.1} MiB at {} jobs", r.jobs))
            .unwrap_or_else(|| "not measured".to_owned()),
        met: rss
            .filter(|_| r.jobs >= RSS_AT_JOBS)
            .map(|x| x <= RSS_TARGET_MIB),
    });
    out
}

fn verdict(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "met",
        Some(false) => "**missed**",
        None => "n/a at this size",
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
        std::thread::available_parallelism()
            .map(usize::from)
            .unwrap_or(0)
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

/// The run as a markdown section.
pub fn markdown(r: &OperatorBenchReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "### {}\n\n{} GPU per worker, {} pods; {} workers of {} jobs preempted at once; {} jobs in flight while applying (floor: the same). Run `{}`.\n",
        title(r),
        r.gpus_per_worker,
        u64::from(r.jobs) * u64::from(r.workers),
        r.preempt,
        r.preempt,
        r.concurrency,
        r.run_id
    );
    if let Some(load) = r.load_before {
        let _ = writeln!(
            out,
            "Load average before the run: {load:.2} (other work on the machine shares its CPUs).\n"
        );
    }
    if let Some(e) = &r.error {
        let _ = writeln!(out, "**The run did not finish:** {e}\n");
    }
    for w in &r.warnings {
        let _ = writeln!(out, "> warning: {w}\n");
    }

    let _ = writeln!(
        out,
        "| measure | floor (direct pod creates) | operator (TrainingJobs) | operator / floor |\n|---|---:|---:|---:|"
    );
    let cell = |t: Option<f64>| t.map(s).unwrap_or_else(|| "—".to_owned());
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(f), Some(o)) if f > 0.0 => format!("{:.2}", o / f),
        _ => "—".to_owned(),
    };
    let f = r.floor.as_ref();
    let o = r.operator.as_ref();
    for (label, get) in [
        (
            "first request → the benchmark's own creates answered (floor: pods; operator: TrainingJobs)",
            (|t: &crate::scenario::Throughput| t.inputs_done_seconds)
                as fn(&crate::scenario::Throughput) -> f64,
        ),
        ("first request → half the pods created", |t| {
            t.half_created_seconds
        }),
        ("first request → every pod created", |t| t.created_seconds),
        ("first request → every pod scheduled", |t| {
            t.scheduled_seconds
        }),
    ] {
        let (a, b) = (f.map(get), o.map(get));
        if a.unwrap_or_default() == 0.0 && b.unwrap_or_default() == 0.0 {
            // Not recorded (a report from before the measure existed).
            continue;
        }
        let _ = writeln!(
            out,
            "| {label} | {} | {} | {} |",
            cell(a),
            cell(b),
            ratio(a, b)
        );
    }
    let req = |t: Option<&crate::scenario::Throughput>| t.map(|t| t.requests.total() as f64);
    let peak = |t: Option<&crate::scenario::Throughput>| t.map(|t| t.peak_in_flight as f64);
    let _ = writeln!(
        out,
        "| most requests waiting for the API server at once | {} | {} | {} |",
        peak(f)
            .map(|n| format!("{n:.0}"))
            .unwrap_or_else(|| "—".to_owned()),
        peak(o)
            .map(|n| format!("{n:.0}"))
            .unwrap_or_else(|| "—".to_owned()),
        ratio(peak(f), peak(o)),
    );
    let _ = writeln!(
        out,
        "| API requests of the client (per job) | {} | {} | {} |\n",
        req(f)
            .map(|n| format!("{n:.0} ({:.2})", n / f64::from(r.jobs)))
            .unwrap_or_else(|| "—".to_owned()),
        req(o)
            .map(|n| format!("{n:.0} ({:.2})", n / f64::from(r.jobs)))
            .unwrap_or_else(|| "—".to_owned()),
        ratio(req(f), req(o)),
    );

    if let Some(rec) = &r.recovery {
        let _ = writeln!(
            out,
            "**Preemption recovery** ({} workers of {} jobs: DisruptionTarget, then deleted), per job from the preemption to every pod of the next attempt created: p50 **{}**, p99 **{}**, max {}{}.\n",
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
        if let Some(floor) = &r.floor_recovery {
            let _ = writeln!(
                out,
                "**Restart floor**: the same {} restarts made directly by a minimal client, all at once (the preemption as above, the other workers deleted with grace period 0, the next attempt's pods created; no controller in the loop): p50 **{}**, p99 **{}**, max {}. Operator / floor at p99: **{:.2}**.\n",
                floor.preempted,
                s(floor.p50_seconds),
                s(floor.p99_seconds),
                s(floor.max_seconds),
                rec.p99_seconds / floor.p99_seconds.max(f64::EPSILON),
            );
        }
    }

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
        let _ = writeln!(
            out,
            "**Operator cost:** peak RSS **{peak:.1} MiB** (VmHWM; {:.1} MiB idle with the caches filled, {:.1} MiB after creating); CPU **{:.2} s** in all ({cpu}).\n",
            u.idle.rss_mib,
            u.created.rss_mib,
            u.last.cpu_seconds.max(u.created.cpu_seconds)
        );
    }
    if !r.operator_metrics.is_empty() {
        let m = |k: &str| r.operator_metrics.get(k).copied().unwrap_or_default();
        let n = m("trainyard_operator_reconcile_duration_seconds_count");
        let _ = writeln!(
            out,
            "Operator metrics: {:.0} reconciles ({:.2} per job), {:.0} reconcile errors, mean reconcile {:.1} ms.\n",
            m("trainyard_operator_reconciles_total"),
            m("trainyard_operator_reconciles_total") / f64::from(r.jobs),
            m("trainyard_operator_reconcile_errors_total"),
            if n > 0.0 {
                1000.0 * m("trainyard_operator_reconcile_duration_seconds_sum") / n
            } else {
                0.0
            },
        );
    }

    if !r.cpu.is_empty() {
        cpu_table(&mut out, r);
    }
    let _ = writeln!(
        out,
        "<details><summary>API requests by verb and resource (counting proxy)</summary>\n"
    );
    if let Some(f) = f {
        counts_table(
            &mut out,
            "floor, creating",
            &f.requests,
            f64::from(r.jobs),
            "job",
        );
    }
    if let Some(o) = o {
        counts_table(
            &mut out,
            "operator, creating",
            &o.requests,
            f64::from(r.jobs),
            "job",
        );
    }
    if let Some(q) = &r.requests {
        counts_table(&mut out, "operator, start-up", &q.startup, 1.0, "run");
        if let Some(run) = &q.running {
            counts_table(
                &mut out,
                "operator, jobs going Running",
                run,
                f64::from(r.jobs),
                "job",
            );
        }
        if let Some(p) = &q.preemption {
            counts_table(
                &mut out,
                "operator, preemption burst",
                p,
                f64::from(r.preempt.max(1)),
                "preempted job",
            );
        }
    }
    let _ = writeln!(out, "</details>\n");

    let _ = writeln!(out, "| target | measured | verdict |\n|---|---|---|");
    for t in targets(r) {
        let _ = writeln!(
            out,
            "| {} | {} | {} |",
            t.target,
            t.measured,
            verdict(t.met)
        );
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Throughput;

    fn report(floor: f64, operator: f64, jobs: u32) -> OperatorBenchReport {
        OperatorBenchReport {
            jobs,
            workers: 4,
            nodes: jobs / 2,
            floor: Some(Throughput {
                created_seconds: floor,
                scheduled_seconds: floor,
                ..Throughput::default()
            }),
            operator: Some(Throughput {
                created_seconds: operator,
                scheduled_seconds: operator,
                ..Throughput::default()
            }),
            ..OperatorBenchReport::default()
        }
    }

    #[test]
    fn ratio_target_is_met_at_or_below_1_3_and_missed_above() {
        assert_eq!(targets(&report(10.0, 13.0, 100))[0].met, Some(true));
        assert_eq!(targets(&report(10.0, 13.5, 100))[0].met, Some(false));
    }

    #[test]
    fn size_bound_targets_are_not_judged_at_other_sizes() {
        let t = targets(&report(1.0, 1.0, 100));
        assert_eq!(t[2].met, None, "no preemption phase");
        assert_eq!(t[3].met, None, "no usage measured");
    }

    #[test]
    fn markdown_names_the_size_and_the_ratio() {
        let md = markdown(&report(2.0, 3.0, 100));
        assert!(md.contains("### 100 jobs × 4 workers on 50 nodes"));
        assert!(md.contains("| 1.50 |"));
        assert!(md.contains("**missed**"));
    }
}
