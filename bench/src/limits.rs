//! The limits every operator run is judged against (the performance issue's "done when"), and
//! the figures of a run they judge: each a figure that must stay at or below its limit, so that
//! the worst of several runs is their largest.

use crate::report::{self, RATIO_TARGET, RECOVERY_FLOOR_FACTOR, RSS_AT_JOBS, RSS_TARGET_MIB};
use crate::scenario::OperatorBenchReport;

/// Reconciles per job from its TrainingJob applied to the job Running.
pub const RECONCILES_TO_RUNNING_TARGET: f64 = 2.0;
/// Reconciles per restart, from the preemption to the job Running again.
pub const RECONCILES_PER_RESTART_TARGET: f64 = 3.0;
/// The operator's API requests per job to Running against the fair floor's.
pub const REQUESTS_TO_RUNNING_RATIO_TARGET: f64 = 1.0;
/// The operator's API requests per restart above the graceful restart floor's: its Event.
pub const REQUESTS_PER_RESTART_ABOVE_FLOOR: f64 = 1.0;
/// The fewest jobs the request targets are judged at.
pub const REQUESTS_AT_JOBS: u32 = 1000;

/// The operator's time against a floor's in the same run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pair {
    /// The operator's seconds.
    pub operator: f64,
    /// The floor's seconds.
    pub floor: f64,
    /// Which floor.
    pub against: &'static str,
}

impl Pair {
    /// operator / floor.
    pub fn ratio(&self) -> f64 {
        self.operator / self.floor.max(f64::EPSILON)
    }

    /// "8.98 / 9.74 s = 0.92", and the floor when it is not the one the page's column names.
    pub fn show(&self) -> String {
        let floor = match self.against {
            FAIR_FLOOR | report::GRACEFUL_FLOOR => String::new(),
            other => format!(" ({other})"),
        };
        format!(
            "{:.2} / {:.2} s = {:.2}{floor}",
            self.operator,
            self.floor,
            self.ratio()
        )
    }
}

/// What the page's column compares the operator's creating with.
const FAIR_FLOOR: &str = "fair floor";

/// The operator's API requests against a floor's for the same work, per job or per restart.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Requests {
    /// The operator's.
    pub operator: f64,
    /// The floor's.
    pub floor: f64,
}

impl Requests {
    /// operator / floor.
    pub fn ratio(&self) -> f64 {
        self.operator / self.floor.max(f64::EPSILON)
    }

    /// operator − floor.
    pub fn above(&self) -> f64 {
        self.operator - self.floor
    }
}

/// "75.9 MiB".
pub fn mib(x: f64) -> String {
    format!("{x:.1} MiB")
}

/// What the limits judge in one run, and the operator's idle memory beside its peak.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Figures {
    /// First request → every pod created: the operator against the fair floor's median run.
    pub created: Option<Pair>,
    /// Preemption → every pod of the next attempt created, p99: the operator's median round
    /// against the judged restart floor's (the graceful one when it was measured).
    pub recovery: Option<Pair>,
    /// The operator's peak RSS (VmHWM) over the run, MiB.
    pub peak_rss_mib: Option<f64>,
    /// The operator's RSS once started with its caches filled, before any job, MiB.
    pub idle_rss_mib: Option<f64>,
    /// The operator's reconciles per job, from its TrainingJob applied to the job Running.
    pub reconciles_to_running: Option<f64>,
    /// The operator's reconciles per restart of the burst's first round, from the preemption
    /// to the job Running again.
    pub reconciles_per_restart: Option<f64>,
    /// API requests per job to Running: the operator's and the fair floor's.
    pub requests_to_running: Option<Requests>,
    /// API requests per restart: the operator's (the burst's first round) and the graceful
    /// restart floor's.
    pub requests_per_restart: Option<Requests>,
}

impl Figures {
    /// The figures of one run; those it did not measure are None.
    pub fn of(r: &OperatorBenchReport) -> Self {
        let created = match (&r.operator, &r.fair_floor) {
            (Some(o), Some(f)) if f.created_seconds > 0.0 => Some(Pair {
                operator: o.created_seconds,
                floor: f.created_seconds,
                against: FAIR_FLOOR,
            }),
            _ => None,
        };
        let recovery = match (&r.recovery, report::judged_restart_floor(r)) {
            (Some(op), Some((floor, _, against))) => Some(Pair {
                operator: op.p99_seconds,
                floor: floor.p99_seconds,
                against,
            }),
            _ => None,
        };
        let requests = |(operator, floor)| Requests { operator, floor };
        Figures {
            created,
            recovery,
            peak_rss_mib: report::peak_rss_mib(r),
            idle_rss_mib: r.usage.as_ref().map(|u| u.idle.rss_mib),
            reconciles_to_running: r.reconciles_to_running_per_job(),
            reconciles_per_restart: r.reconciles_per_restart(),
            requests_to_running: r.requests_to_running_per_job().map(requests),
            requests_per_restart: r.requests_per_restart().map(requests),
        }
    }

    /// Each figure the median of the runs' (of an even number the larger of the two middle
    /// ones; a ratio by its ratio): what a target judged on the median run compares.
    pub fn median<'a>(runs: impl IntoIterator<Item = &'a Figures>) -> Figures {
        fn median_of<T: Copy>(values: Vec<Option<T>>, key: fn(&T) -> f64) -> Option<T> {
            let measured: Vec<T> = values.into_iter().flatten().collect();
            crate::stats::median_by(&measured, key).copied()
        }
        let runs: Vec<&Figures> = runs.into_iter().collect();
        let all = |f: fn(&Figures) -> Option<Pair>| runs.iter().map(|r| f(r)).collect();
        let each = |f: fn(&Figures) -> Option<f64>| runs.iter().map(|r| f(r)).collect();
        let counts = |f: fn(&Figures) -> Option<Requests>| runs.iter().map(|r| f(r)).collect();
        Figures {
            created: median_of(all(|f| f.created), Pair::ratio),
            recovery: median_of(all(|f| f.recovery), Pair::ratio),
            peak_rss_mib: median_of(each(|f| f.peak_rss_mib), |x| *x),
            idle_rss_mib: median_of(each(|f| f.idle_rss_mib), |x| *x),
            reconciles_to_running: median_of(each(|f| f.reconciles_to_running), |x| *x),
            reconciles_per_restart: median_of(each(|f| f.reconciles_per_restart), |x| *x),
            requests_to_running: median_of(counts(|f| f.requests_to_running), Requests::ratio),
            requests_per_restart: median_of(counts(|f| f.requests_per_restart), Requests::above),
        }
    }

    /// Each figure the largest of the runs' (a ratio by its ratio, with its two times): the
    /// worst the runs measured, figure by figure.
    pub fn worst<'a>(runs: impl IntoIterator<Item = &'a Figures>) -> Figures {
        fn max_by<T: Copy>(a: Option<T>, b: Option<T>, key: fn(&T) -> f64) -> Option<T> {
            match (a, b) {
                (Some(x), Some(y)) => Some(if key(&y) > key(&x) { y } else { x }),
                (x, y) => x.or(y),
            }
        }
        runs.into_iter().fold(Figures::default(), |w, f| Figures {
            created: max_by(w.created, f.created, Pair::ratio),
            recovery: max_by(w.recovery, f.recovery, Pair::ratio),
            peak_rss_mib: max_by(w.peak_rss_mib, f.peak_rss_mib, |x| *x),
            idle_rss_mib: max_by(w.idle_rss_mib, f.idle_rss_mib, |x| *x),
            reconciles_to_running: max_by(w.reconciles_to_running, f.reconciles_to_running, |x| *x),
            reconciles_per_restart: max_by(
                w.reconciles_per_restart,
                f.reconciles_per_restart,
                |x| *x,
            ),
            requests_to_running: max_by(
                w.requests_to_running,
                f.requests_to_running,
                Requests::ratio,
            ),
            requests_per_restart: max_by(
                w.requests_per_restart,
                f.requests_per_restart,
                Requests::above,
            ),
        })
    }
}

/// A figure that must stay at or below a limit, from some number of jobs on.
#[derive(Clone, Copy, Debug)]
pub struct Limit {
    /// The figure, as the page's tables name it.
    pub figure: &'static str,
    /// Its limit.
    pub limit: f64,
    /// The limit's unit and the size it is stated for, after the limit.
    pub suffix: &'static str,
    /// The fewest jobs it is judged at (0: every size).
    pub from_jobs: u32,
    /// Whether a size is judged on its median run (a time ratio, which the machine's noise
    /// moves from run to run) or on every run (a count or memory, which it does not).
    pub judged: Judged,
    /// The figure's value in a run.
    pub value: fn(&Figures) -> Option<f64>,
    /// The figure as the page shows it (a ratio with its two times).
    pub show: fn(&Figures) -> Option<String>,
    /// A value of [`Limit::value`] as the page shows it alone.
    pub brief: fn(f64) -> String,
}

/// Which of a size's runs a limit judges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Judged {
    /// The median run, figure by figure ([`Figures::median`]); the worst is shown beside it.
    Median,
    /// Every run: the worst ([`Figures::worst`]) must meet it.
    EveryRun,
}

fn two_places(x: f64) -> String {
    format!("{x:.2}")
}

fn one_place(x: f64) -> String {
    format!("{x:.1}")
}

/// "9.1 / 7.0 = 1.30".
fn requests_ratio(r: Requests) -> String {
    format!("{:.1} / {:.1} = {:.2}", r.operator, r.floor, r.ratio())
}

/// "12.0 − 11.0 = 1.0".
fn requests_above(r: Requests) -> String {
    format!("{:.1} − {:.1} = {:.1}", r.operator, r.floor, r.above())
}

/// The limits on counts (reconciles and API requests, per job or per restart), which the
/// machine's noise does not move: also checked run by run in the details file
/// ([`crate::report::targets`]).
pub const COUNT_LIMITS: [Limit; 4] = [
    Limit {
        figure: "reconciles per job to Running",
        limit: RECONCILES_TO_RUNNING_TARGET,
        suffix: "",
        from_jobs: 0,
        judged: Judged::EveryRun,
        value: |f| f.reconciles_to_running,
        show: |f| f.reconciles_to_running.map(two_places),
        brief: two_places,
    },
    Limit {
        figure: "reconciles per restart",
        limit: RECONCILES_PER_RESTART_TARGET,
        suffix: "",
        from_jobs: 0,
        judged: Judged::EveryRun,
        value: |f| f.reconciles_per_restart,
        show: |f| f.reconciles_per_restart.map(two_places),
        brief: two_places,
    },
    Limit {
        figure: "API requests per job to Running: operator / fair floor",
        limit: REQUESTS_TO_RUNNING_RATIO_TARGET,
        suffix: " at 1000 jobs",
        from_jobs: REQUESTS_AT_JOBS,
        judged: Judged::EveryRun,
        value: |f| f.requests_to_running.map(|r| r.ratio()),
        show: |f| f.requests_to_running.map(requests_ratio),
        brief: two_places,
    },
    Limit {
        figure: "API requests per restart: operator − graceful restart floor",
        limit: REQUESTS_PER_RESTART_ABOVE_FLOOR,
        suffix: " at 1000 jobs",
        from_jobs: REQUESTS_AT_JOBS,
        judged: Judged::EveryRun,
        value: |f| f.requests_per_restart.map(|r| r.above()),
        show: |f| f.requests_per_restart.map(requests_above),
        brief: one_place,
    },
];

/// The limits, in the order of the page's columns: the time ratios, memory, the counts.
pub const LIMITS: [Limit; 7] = [
    Limit {
        figure: "every pod created: operator / fair floor",
        limit: RATIO_TARGET,
        suffix: "",
        from_jobs: 0,
        judged: Judged::Median,
        value: |f| f.created.map(|p| p.ratio()),
        show: |f| f.created.map(|p| p.show()),
        brief: two_places,
    },
    Limit {
        figure: "preemption → new pods p99: operator / graceful restart floor",
        limit: RECOVERY_FLOOR_FACTOR,
        suffix: "",
        from_jobs: 0,
        judged: Judged::Median,
        value: |f| f.recovery.map(|p| p.ratio()),
        show: |f| f.recovery.map(|p| p.show()),
        brief: two_places,
    },
    Limit {
        figure: "peak RSS",
        limit: RSS_TARGET_MIB,
        suffix: " MiB at 1000 jobs",
        from_jobs: RSS_AT_JOBS,
        judged: Judged::EveryRun,
        value: |f| f.peak_rss_mib,
        show: |f| f.peak_rss_mib.map(mib),
        brief: mib,
    },
    COUNT_LIMITS[0],
    COUNT_LIMITS[1],
    COUNT_LIMITS[2],
    COUNT_LIMITS[3],
];

/// What a verdict cell says: met, missed, not judged at this size or not measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// At or below the limit.
    Met,
    /// Above it.
    Missed,
    /// The run has fewer jobs than the limit is stated for.
    OtherSize,
    /// The run did not measure the figure.
    NotMeasured,
}

impl Verdict {
    /// As the page writes it.
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Met => "met",
            Verdict::Missed => "**missed**",
            Verdict::OtherSize => "n/a at this size",
            Verdict::NotMeasured => "not measured",
        }
    }
}

impl Limit {
    /// The target as the page states it, e.g. "peak RSS ≤ 64 MiB at 1000 jobs".
    pub fn target(&self) -> String {
        format!("{} ≤ {}{}", self.figure, self.limit, self.suffix)
    }

    /// Whether a run of `jobs` jobs with these figures met the limit.
    pub fn verdict(&self, figures: &Figures, jobs: u32) -> Verdict {
        if jobs < self.from_jobs {
            return Verdict::OtherSize;
        }
        match (self.value)(figures) {
            Some(x) if x <= self.limit => Verdict::Met,
            Some(_) => Verdict::Missed,
            None => Verdict::NotMeasured,
        }
    }

    /// How far over the limit the figure is (1.0 at the limit), where it is judged.
    pub fn over(&self, figures: &Figures, jobs: u32) -> Option<f64> {
        (jobs >= self.from_jobs)
            .then(|| (self.value)(figures))
            .flatten()
            .map(|x| x / self.limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(operator: f64, floor: f64) -> Option<Pair> {
        Some(Pair {
            operator,
            floor,
            against: "fair floor",
        })
    }

    fn requests(operator: f64, floor: f64) -> Option<Requests> {
        Some(Requests { operator, floor })
    }

    /// A run's figures; its counts per restart and its requests follow `reconciles` (per job
    /// to Running): one more reconcile per restart, and as many requests above the floors.
    fn figures(created: f64, recovery: f64, peak: f64, reconciles: f64) -> Figures {
        Figures {
            created: pair(created, 1.0),
            recovery: pair(recovery, 1.0),
            peak_rss_mib: Some(peak),
            idle_rss_mib: Some(peak / 3.0),
            reconciles_to_running: Some(reconciles),
            reconciles_per_restart: Some(reconciles + 1.0),
            requests_to_running: requests(reconciles * 5.0, 10.0),
            requests_per_restart: requests(8.0 + reconciles / 2.0, 8.0),
        }
    }

    /// Three runs whose largest and middle figures each come from different runs.
    fn three_runs() -> [Figures; 3] {
        [
            figures(1.1, 1.6, 60.0, 7.0),
            figures(1.4, 1.2, 66.0, 6.0),
            figures(1.2, 1.3, 62.0, 9.0),
        ]
    }

    #[test]
    fn the_worst_of_runs_is_each_figures_largest_whichever_run_it_came_from() {
        let runs = three_runs();
        let worst = Figures::worst(&runs);
        assert_eq!(worst.created, pair(1.4, 1.0));
        assert_eq!(worst.recovery, pair(1.6, 1.0));
        assert_eq!(worst.peak_rss_mib, Some(66.0));
        assert_eq!(worst.idle_rss_mib, Some(22.0));
        assert_eq!(worst.reconciles_to_running, Some(9.0));
        assert_eq!(worst.reconciles_per_restart, Some(10.0));
        assert_eq!(worst.requests_to_running, requests(45.0, 10.0));
        assert_eq!(worst.requests_per_restart, requests(12.5, 8.0));
    }

    #[test]
    fn the_median_of_runs_is_each_figures_middle_whichever_run_it_came_from() {
        let runs = three_runs();
        let median = Figures::median(&runs);
        assert_eq!(median.created, pair(1.2, 1.0));
        assert_eq!(median.recovery, pair(1.3, 1.0));
        assert_eq!(median.peak_rss_mib, Some(62.0));
        assert_eq!(median.reconciles_to_running, Some(7.0));
        // Of two, the larger; a run that did not measure a figure is left out.
        let two = [runs[0], runs[1]];
        assert_eq!(Figures::median(&two).created, pair(1.4, 1.0));
        let with_unmeasured = [Figures::default(), runs[0], runs[1], runs[2]];
        assert_eq!(Figures::median(&with_unmeasured).recovery, pair(1.3, 1.0));
        assert_eq!(Figures::median(&[Figures::default()]), Figures::default());
    }

    #[test]
    fn a_ratio_is_compared_by_ratio_not_by_its_times() {
        let slow_but_fair = Figures {
            created: pair(40.0, 38.0),
            ..Figures::default()
        };
        let fast_but_slower_than_its_floor = Figures {
            created: pair(4.0, 2.0),
            ..Figures::default()
        };
        let worst = Figures::worst(&[slow_but_fair, fast_but_slower_than_its_floor]);
        assert_eq!(worst.created, pair(4.0, 2.0));
    }

    #[test]
    fn a_pair_shows_both_times_and_names_a_floor_other_than_the_columns() {
        let graceful = Pair {
            operator: 8.98,
            floor: 9.74,
            against: "graceful restart floor",
        };
        assert_eq!(graceful.show(), "8.98 / 9.74 s = 0.92");
        let pods_only = Pair {
            against: "pods-only restart floor",
            ..graceful
        };
        assert_eq!(
            pods_only.show(),
            "8.98 / 9.74 s = 0.92 (pods-only restart floor)"
        );
    }

    #[test]
    fn a_figure_one_run_did_not_measure_is_the_others_worst() {
        let unmeasured = Figures::default();
        let worst = Figures::worst(&[unmeasured, figures(1.0, 1.0, 50.0, 5.0), unmeasured]);
        assert_eq!(worst.peak_rss_mib, Some(50.0));
        assert_eq!(Figures::worst(&[unmeasured]), Figures::default());
    }

    #[test]
    fn a_limit_is_met_at_its_value_missed_above_and_judged_only_from_its_size() {
        let [
            created,
            recovery,
            rss,
            to_running,
            per_restart,
            req_running,
            req_restart,
        ] = LIMITS;
        assert_eq!(
            created.target(),
            "every pod created: operator / fair floor ≤ 1.3"
        );
        assert_eq!(rss.target(), "peak RSS ≤ 64 MiB at 1000 jobs");
        assert_eq!(to_running.target(), "reconciles per job to Running ≤ 2");
        assert_eq!(per_restart.target(), "reconciles per restart ≤ 3");
        assert_eq!(
            req_running.target(),
            "API requests per job to Running: operator / fair floor ≤ 1 at 1000 jobs"
        );
        assert_eq!(
            req_restart.target(),
            "API requests per restart: operator − graceful restart floor ≤ 1 at 1000 jobs"
        );
        // The time ratios are judged on the median run, the rest on every run.
        for limit in LIMITS {
            let median = [created.figure, recovery.figure].contains(&limit.figure);
            let judged = if median {
                Judged::Median
            } else {
                Judged::EveryRun
            };
            assert_eq!(limit.judged, judged, "{limit:?}");
        }
        let at_limits = Figures {
            requests_to_running: requests(10.0, 10.0),
            requests_per_restart: requests(9.0, 8.0),
            reconciles_per_restart: Some(3.0),
            ..figures(1.3, 1.5, 64.0, 2.0)
        };
        for limit in LIMITS {
            assert_eq!(limit.verdict(&at_limits, 1000), Verdict::Met, "{limit:?}");
        }
        let over = Figures {
            requests_to_running: requests(10.1, 10.0),
            requests_per_restart: requests(9.1, 8.0),
            reconciles_per_restart: Some(3.1),
            ..figures(1.31, 1.51, 64.1, 2.1)
        };
        for limit in LIMITS {
            assert_eq!(limit.verdict(&over, 1000), Verdict::Missed, "{limit:?}");
        }
        for limit in [rss, req_running, req_restart] {
            assert_eq!(limit.verdict(&over, 999), Verdict::OtherSize, "{limit:?}");
            assert_eq!(limit.over(&over, 999), None);
        }
        assert_eq!(to_running.verdict(&over, 100), Verdict::Missed);
        assert_eq!(per_restart.verdict(&over, 100), Verdict::Missed);
        assert_eq!(
            created.verdict(&Figures::default(), 100),
            Verdict::NotMeasured
        );
        assert_eq!(
            (req_running.show)(&over).as_deref(),
            Some("10.1 / 10.0 = 1.01")
        );
        assert_eq!(
            (req_restart.show)(&over).as_deref(),
            Some("9.1 − 8.0 = 1.1")
        );
    }

    #[test]
    fn the_figures_of_a_report_come_from_its_judged_phases() {
        use crate::scenario::{OperatorUsage, Recovery, Throughput};
        let timed = |created_seconds| Throughput {
            created_seconds,
            ..Throughput::default()
        };
        let p99 = |p99_seconds| Recovery {
            p99_seconds,
            ..Recovery::default()
        };
        let mut r = OperatorBenchReport {
            jobs: 100,
            fair_floor: Some(timed(4.0)),
            operator: Some(timed(5.0)),
            recovery: Some(p99(6.0)),
            floor_recovery: Some(p99(2.0)),
            graceful_floor_recovery: Some(p99(4.0)),
            usage: Some(OperatorUsage::default()),
            ..OperatorBenchReport::default()
        };
        r.reconciles = Some(crate::scenario::ReconcileCounts {
            before_create: 10.0,
            running: Some(160.0),
            first_restart: Some(185.0),
        });
        r.preempt = 10;
        let f = Figures::of(&r);
        assert_eq!(f.created.map(|p| p.ratio()), Some(1.25));
        assert_eq!(
            f.recovery,
            Some(Pair {
                operator: 6.0,
                floor: 4.0,
                against: "graceful restart floor"
            })
        );
        assert_eq!(f.reconciles_to_running, Some(1.5));
        assert_eq!(f.reconciles_per_restart, Some(2.5));
        // No request counts in this report: nothing to compare.
        assert_eq!(
            (f.requests_to_running, f.requests_per_restart),
            (None, None)
        );
        assert_eq!(f.peak_rss_mib, Some(0.0));
        assert_eq!(
            Figures::of(&OperatorBenchReport::default()),
            Figures::default()
        );
    }
}
