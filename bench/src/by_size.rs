//! Runs grouped by size: the worst figures of a size's runs, which the page judges, the run
//! that missed the most, and the operator's memory over sizes with a straight line fitted to it.

use crate::limits::{Figures, LIMITS, Verdict};
use crate::report;
use crate::scenario::OperatorBenchReport;

/// The runs of one size (jobs, workers, nodes, GPUs per worker), in the order given.
#[derive(Clone, Debug)]
pub struct Size<'a> {
    /// At least one.
    pub runs: Vec<&'a OperatorBenchReport>,
}

/// The runs grouped by size, the sizes in the order of their first run.
pub fn group(runs: &[OperatorBenchReport]) -> Vec<Size<'_>> {
    let key = |r: &OperatorBenchReport| (r.jobs, r.workers, r.nodes, r.gpus_per_worker);
    let mut sizes: Vec<Size<'_>> = Vec::new();
    for r in runs {
        match sizes.iter_mut().find(|s| key(s.runs[0]) == key(r)) {
            Some(size) => size.runs.push(r),
            None => sizes.push(Size { runs: vec![r] }),
        }
    }
    sizes
}

impl Size<'_> {
    /// "100 jobs × 4 workers on 50 nodes".
    pub fn title(&self) -> String {
        report::title(self.runs[0])
    }

    /// Jobs of every run.
    pub fn jobs(&self) -> u32 {
        self.runs[0].jobs
    }

    /// Each run's figures, in the runs' order.
    pub fn figures(&self) -> Vec<Figures> {
        self.runs.iter().map(|r| Figures::of(r)).collect()
    }

    /// The worst of the runs, figure by figure: what the page judges memory and counts on.
    pub fn worst(&self) -> Figures {
        Figures::worst(&self.figures())
    }

    /// The median of the runs, figure by figure: what the page judges the time ratios on.
    pub fn median(&self) -> Figures {
        Figures::median(&self.figures())
    }

    /// The run that missed the most (a run that stopped early missed running to completion);
    /// among those the one farthest over (or nearest) its limits: its figures as fractions of
    /// their limits, largest first, compared in turn. The first of equals; its index and the run.
    pub fn worst_run(&self) -> (usize, &OperatorBenchReport) {
        let badness = |r: &OperatorBenchReport| {
            let f = Figures::of(r);
            let missed = LIMITS
                .iter()
                .filter(|l| l.verdict(&f, r.jobs) == Verdict::Missed)
                .count()
                + usize::from(r.error.is_some());
            let mut over: Vec<f64> = LIMITS.iter().filter_map(|l| l.over(&f, r.jobs)).collect();
            over.sort_by(|a, b| b.total_cmp(a));
            (missed, over)
        };
        let mut worst = (0, self.runs[0], badness(self.runs[0]));
        for (i, r) in self.runs.iter().enumerate().skip(1) {
            let b = badness(r);
            let worse = b.0.cmp(&worst.2.0).then_with(|| {
                b.1.iter()
                    .zip(&worst.2.1)
                    .map(|(x, y)| x.total_cmp(y))
                    .find(|o| o.is_ne())
                    .unwrap_or(std::cmp::Ordering::Equal)
            });
            if worse.is_gt() {
                worst = (i, r, b);
            }
        }
        (worst.0, worst.1)
    }
}

/// The operator's memory at one size: the largest of its runs'.
#[derive(Clone, Debug, PartialEq)]
pub struct Memory {
    /// Jobs.
    pub jobs: u32,
    /// Pods (jobs × workers).
    pub pods: u64,
    /// Fake nodes (each in the operator's node cache).
    pub nodes: u32,
    /// Runs that measured it.
    pub runs: usize,
    /// RSS once started with its caches filled, before any job, MiB.
    pub idle_mib: f64,
    /// Peak RSS (VmHWM) over the run, MiB.
    pub peak_mib: f64,
}

impl Memory {
    /// (peak − idle) / jobs, KiB: what each job costs at this size.
    pub fn kib_per_job(&self) -> f64 {
        (self.peak_mib - self.idle_mib) * 1024.0 / f64::from(self.jobs.max(1))
    }
}

/// The memory at each size whose runs measured it, by jobs.
pub fn memory(sizes: &[Size<'_>]) -> Vec<Memory> {
    let mut rows: Vec<Memory> = sizes
        .iter()
        .filter_map(|size| {
            let worst = size.worst();
            let r = size.runs[0];
            Some(Memory {
                jobs: r.jobs,
                pods: u64::from(r.jobs) * u64::from(r.workers),
                nodes: r.nodes,
                runs: size.runs.iter().filter(|r| r.usage.is_some()).count(),
                idle_mib: worst.idle_rss_mib?,
                peak_mib: worst.peak_rss_mib?,
            })
        })
        .collect();
    rows.sort_by_key(|m| (m.jobs, m.pods));
    rows
}

/// y = intercept + slope × x.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Line {
    /// y at x = 0.
    pub intercept: f64,
    /// dy / dx.
    pub slope: f64,
}

/// The least-squares line through the points; None for fewer than two distinct x.
pub fn least_squares(points: &[(f64, f64)]) -> Option<Line> {
    let n = points.len() as f64;
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    (points.len() >= 2 && sxx > 0.0).then(|| {
        let slope = sxy / sxx;
        Line {
            intercept: mean_y - slope * mean_x,
            slope,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator_process::ProcessUsage;
    use crate::scenario::{OperatorUsage, ReconcileCounts, Throughput};

    /// A run whose operator took `ratio` × the fair floor, peaked at `peak` MiB and reconciled
    /// `reconciles` times per job to Running.
    fn run(jobs: u32, ratio: f64, peak: f64, reconciles: f64) -> OperatorBenchReport {
        let timed = |created_seconds| Throughput {
            created_seconds,
            ..Throughput::default()
        };
        let usage = |mib| ProcessUsage {
            peak_rss_mib: mib,
            rss_mib: mib,
            cpu_seconds: 0.0,
        };
        OperatorBenchReport {
            jobs,
            workers: 4,
            nodes: jobs / 2,
            fair_floor: Some(timed(10.0)),
            operator: Some(timed(10.0 * ratio)),
            usage: Some(OperatorUsage {
                idle: usage(peak / 4.0),
                created: usage(peak),
                last: usage(peak),
                ..OperatorUsage::default()
            }),
            reconciles: Some(ReconcileCounts {
                before_create: 0.0,
                running: Some(reconciles * f64::from(jobs)),
                first_restart: None,
            }),
            ..OperatorBenchReport::default()
        }
    }

    #[test]
    fn runs_are_grouped_by_size_in_the_order_of_their_first_run() {
        let runs = [
            run(100, 1.0, 30.0, 1.5),
            run(1000, 1.0, 60.0, 1.5),
            run(100, 1.1, 31.0, 1.5),
        ];
        let sizes = group(&runs);
        assert_eq!(sizes.len(), 2);
        assert_eq!(sizes[0].title(), "100 jobs × 4 workers on 50 nodes");
        assert_eq!(sizes[0].runs.len(), 2);
        assert_eq!(sizes[1].jobs(), 1000);
    }

    #[test]
    fn the_worst_run_is_the_one_that_missed_the_most_then_the_one_farthest_over() {
        let runs = [
            // Over on the ratio only, by far.
            run(1000, 2.0, 60.0, 1.5),
            // Over on RSS and reconciles, each by a little.
            run(1000, 1.0, 65.0, 2.1),
            run(1000, 1.2, 62.0, 1.8),
        ];
        let sizes = group(&runs);
        assert_eq!(sizes[0].worst_run().0, 1);
        let met_all = [run(100, 1.1, 30.0, 1.5), run(100, 1.25, 30.0, 1.5)];
        assert_eq!(
            group(&met_all)[0].worst_run().0,
            1,
            "the one nearer a limit"
        );
        // Each misses reconciles by as much; the second is nearer its other limits.
        let tied = [
            run(100, 1.0, 30.0, 3.0),
            run(100, 1.2, 30.0, 3.0),
            run(100, 1.1, 30.0, 3.0),
        ];
        assert_eq!(
            group(&tied)[0].worst_run().0,
            1,
            "equal misses: the next figure decides"
        );
        let mut stopped = run(100, 1.0, 30.0, 1.5);
        stopped.error = Some("interrupted".to_owned());
        let runs = [run(100, 1.25, 30.0, 1.5), stopped];
        assert_eq!(group(&runs)[0].worst_run().0, 1, "stopping early is a miss");
    }

    #[test]
    fn the_memory_of_a_size_is_its_largest_and_sizes_are_sorted_by_jobs() {
        let runs = [
            run(1000, 1.0, 60.0, 1.5),
            run(250, 1.0, 40.0, 1.5),
            run(1000, 1.0, 66.0, 1.5),
            OperatorBenchReport {
                usage: None,
                ..run(1000, 1.0, 0.0, 1.5)
            },
        ];
        let memory = memory(&group(&runs));
        assert_eq!(memory.len(), 2);
        assert_eq!((memory[0].jobs, memory[0].peak_mib), (250, 40.0));
        let large = &memory[1];
        assert_eq!(
            (large.jobs, large.pods, large.nodes, large.runs),
            (1000, 4000, 500, 2)
        );
        assert_eq!((large.idle_mib, large.peak_mib), (16.5, 66.0));
        assert!((large.kib_per_job() - 49.5 * 1024.0 / 1000.0).abs() < 1e-9);
    }

    #[test]
    fn least_squares_fits_the_line_through_the_points() {
        let exact =
            least_squares(&[(250.0, 30.0), (500.0, 40.0), (2000.0, 100.0)]).expect("three sizes");
        assert!((exact.slope - 0.04).abs() < 1e-12, "{exact:?}");
        assert!((exact.intercept - 20.0).abs() < 1e-9, "{exact:?}");
        // Off the line: the slope that minimises the squared error, Sxy / Sxx = 2 / 2.
        let noisy = least_squares(&[(0.0, 1.0), (1.0, 1.0), (2.0, 3.0)]).expect("fits");
        assert!((noisy.slope - 1.0).abs() < 1e-12, "{noisy:?}");
        assert!((noisy.intercept - 2.0 / 3.0).abs() < 1e-12, "{noisy:?}");
        assert_eq!(least_squares(&[(1000.0, 60.0)]), None);
        assert_eq!(least_squares(&[(1000.0, 60.0), (1000.0, 66.0)]), None);
        assert_eq!(least_squares(&[]), None);
    }
}
