//! Prometheus metrics and the HTTP endpoints `/metrics`, `/healthz` and `/readyz`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::error::Error;
use crate::model::crd::{GoodputLedger, GpuMillis};

/// How many entries each per-job map holds (`trainyard_operator_state_entries`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StateSizes {
    /// Statuses written that the cache may not show yet.
    pub written: usize,
    /// Worker detail waiting to be written.
    pub deferred: usize,
    /// Restarts decided whose next attempt is not created yet.
    pub detected: usize,
    /// Jobs whose last reconciles failed.
    pub error_counts: usize,
    /// Malformed objects reported.
    pub reported_malformed: usize,
    /// Jobs whose last valid object is remembered.
    pub last_valid: usize,
    /// Writes the caches do not show yet.
    pub expectations: usize,
}

impl StateSizes {
    /// Each map by its metric label.
    pub fn by_map(&self) -> [(&'static str, usize); 7] {
        [
            ("written", self.written),
            ("deferred", self.deferred),
            ("detected", self.detected),
            ("error_counts", self.error_counts),
            ("reported_malformed", self.reported_malformed),
            ("last_valid", self.last_valid),
            ("expectations", self.expectations),
        ]
    }
}

/// Label set of the error counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// [`Error::metric_label`].
    pub error: String,
}

/// Label set of the restart counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RestartLabels {
    /// Preemption, Failure or Resume.
    pub reason: String,
}

/// Label set of the progress report counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReportLabels {
    /// How the report was answered: `accepted`, `unauthenticated`, `forbidden`, `invalid`,
    /// `too_large`, `overloaded` or `unknown_job`.
    pub outcome: String,
}

/// Label set of a per-job gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobLabels {
    /// The job's namespace.
    pub namespace: String,
    /// The job's name.
    pub job: String,
}

/// Label set of the controller state gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    /// Which map ([`StateSizes::by_map`]).
    pub map: String,
}

/// Registers `metric` under `name` and gives it back: metrics are handles, the clone shares
/// the value the registry encodes.
fn registered<M>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M
where
    M: prometheus_client::registry::Metric + Clone,
{
    registry.register(name, help, metric.clone());
    metric
}

/// The ledger's uses of GPU time, as the `use` label spells them, in the order of
/// [`by_use`].
const LEDGER_USES: [&str; 8] = [
    "useful",
    "lost_to_recompute",
    "lost_to_detection",
    "lost_to_restart",
    "pending",
    "failed_attempts",
    "hangs",
    "recompute_unknown",
];

/// The GPU-milliseconds of each of [`LEDGER_USES`].
fn by_use(m: &GpuMillis) -> [u64; 8] {
    [
        m.useful,
        m.lost_to_recompute,
        m.lost_to_detection,
        m.lost_to_restart,
        m.pending,
        m.failed_attempts,
        m.hangs,
        m.recompute_unknown,
    ]
}

/// One job's ledger totals, as the latest status this replica read shows them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct LedgerTotals {
    /// The job object's uid: a job deleted and created again under its name starts over.
    uid: String,
    /// GPU-milliseconds on spot nodes, by [`LEDGER_USES`].
    spot: [u64; 8],
    /// GPU-milliseconds on on-demand nodes, by [`LEDGER_USES`].
    on_demand: [u64; 8],
    /// Micro-dollars spent.
    spent: u64,
    /// Micro-dollars the useful work would have cost on on-demand nodes.
    on_demand_equivalent: u64,
}

impl LedgerTotals {
    fn of(uid: &str, ledger: &GoodputLedger) -> Self {
        Self {
            uid: uid.to_owned(),
            spot: by_use(&ledger.spot),
            on_demand: by_use(&ledger.on_demand),
            spent: ledger.micro_dollars.spent,
            on_demand_equivalent: ledger.micro_dollars.on_demand_equivalent,
        }
    }

    /// The larger of each total: every total of a job's ledger only grows, so a status read
    /// that is older than one read before (a cache behind the operator's own write) never
    /// moves a counter back.
    fn max(&self, other: &Self) -> Self {
        let each = |a: [u64; 8], b: [u64; 8]| std::array::from_fn(|i| a[i].max(b[i]));
        Self {
            uid: self.uid.clone(),
            spot: each(self.spot, other.spot),
            on_demand: each(self.on_demand, other.on_demand),
            spent: self.spent.max(other.spent),
            on_demand_equivalent: self.on_demand_equivalent.max(other.on_demand_equivalent),
        }
    }
}

/// One job's series: its ledger totals and its step rate.
#[derive(Clone, Debug, Default)]
struct JobValues {
    ledger: Option<LedgerTotals>,
    steps_per_second: Option<f64>,
}

/// The per-job series of the jobs this replica reconciles, by namespace and name, encoded at
/// scrape time: their ledgers as counters and their step rates as gauges.
///
/// A job's status is the durable record of its ledger (`status.ledger`): the totals only grow
/// while the job lives, and a new leader reads them back from status. prometheus_client's
/// `Counter` only counts up from zero in this process, so after a leader change it would
/// start over and disagree with the status. The idiomatic way to expose a counter whose value
/// lives elsewhere is a [`Collector`] that encodes [`ConstCounter`]s at each scrape: the
/// series are counters (`# TYPE ... counter`, `_total`), their value is the status's, and a
/// job's series disappear as soon as its entry is removed. (A `Gauge` set from the status
/// would carry the value too, but a gauge named `*_total` breaks the Prometheus convention
/// that `rate` and `increase` rely on.) The label sets are bounded: per job 2 capacity types
/// × 8 uses of GPU time, and one series in each of the two money families (dollars carry no
/// capacity: the ledger keeps money spent as one sum).
#[derive(Clone, Debug, Default)]
pub struct JobSeries {
    jobs: Arc<Mutex<BTreeMap<(String, String), JobValues>>>,
}

/// The ledgers to encode, by namespace and name.
type Ledgers<'a> = [(&'a (String, String), &'a LedgerTotals)];

impl JobSeries {
    fn with_jobs<T>(&self, f: impl FnOnce(&mut BTreeMap<(String, String), JobValues>) -> T) -> T {
        // A panic while holding the lock leaves whole entries behind: the map stays usable.
        f(&mut self.jobs.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Takes the ledger of `namespace/job` (object `uid`) from the status just read.
    fn record(&self, namespace: &str, job: &str, uid: &str, ledger: &GoodputLedger) {
        let read = LedgerTotals::of(uid, ledger);
        self.with_jobs(|jobs| {
            let values = jobs
                .entry((namespace.to_owned(), job.to_owned()))
                .or_default();
            values.ledger = Some(match &values.ledger {
                Some(known) if known.uid == uid => known.max(&read),
                _ => read,
            });
        });
    }

    fn encode_gpu_seconds(
        jobs: &Ledgers<'_>,
        encoder: &mut DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        let mut family = encoder.encode_descriptor(
            "trainyard_operator_gpu_seconds",
            "GPU-seconds of each job from its status.ledger, by capacity type (spot, on_demand) and use (useful or what lost them)",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for ((namespace, job), totals) in jobs {
            for (capacity, millis) in [("spot", &totals.spot), ("on_demand", &totals.on_demand)] {
                for (use_, ms) in LEDGER_USES.iter().zip(millis) {
                    let labels = [
                        ("namespace", namespace.as_str()),
                        ("job", job.as_str()),
                        ("capacity", capacity),
                        ("use", use_),
                    ];
                    // GPU-milliseconds are far below 2^53: exact as f64.
                    ConstCounter::new(*ms as f64 / 1000.0)
                        .encode(family.encode_family(&labels)?)?;
                }
            }
        }
        Ok(())
    }

    fn encode_dollars(
        jobs: &Ledgers<'_>,
        encoder: &mut DescriptorEncoder,
        name: &str,
        help: &str,
        micro: fn(&LedgerTotals) -> u64,
    ) -> Result<(), std::fmt::Error> {
        let mut family = encoder.encode_descriptor(
            name,
            help,
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for ((namespace, job), totals) in jobs {
            let labels = JobLabels {
                namespace: namespace.clone(),
                job: job.clone(),
            };
            let dollars = micro(totals) as f64 / 1_000_000.0;
            ConstCounter::new(dollars).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }

    fn encode_steps_per_second(
        jobs: &BTreeMap<(String, String), JobValues>,
        encoder: &mut DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        let mut family = encoder.encode_descriptor(
            "trainyard_operator_job_steps_per_second",
            "Training steps per second of each job that reports progress",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for ((namespace, job), values) in jobs {
            if let Some(rate) = values.steps_per_second {
                let labels = [("namespace", namespace.as_str()), ("job", job.as_str())];
                ConstGauge::new(rate).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

impl Collector for JobSeries {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let jobs = self.with_jobs(|jobs| jobs.clone());
        Self::encode_steps_per_second(&jobs, &mut encoder)?;
        let ledgers: Vec<_> = jobs
            .iter()
            .filter_map(|(key, values)| Some((key, values.ledger.as_ref()?)))
            .collect();
        let jobs = ledgers.as_slice();
        Self::encode_gpu_seconds(jobs, &mut encoder)?;
        Self::encode_dollars(
            jobs,
            &mut encoder,
            "trainyard_operator_cost_dollars",
            "Dollars each job has spent, from its status.ledger (microDollars.spent) and the operator's price table",
            |t| t.spent,
        )?;
        Self::encode_dollars(
            jobs,
            &mut encoder,
            "trainyard_operator_on_demand_equivalent_dollars",
            "Dollars each job's useful GPU time would have cost on on-demand nodes (status.ledger microDollars.onDemandEquivalent); minus cost_dollars, what spot saved",
            |t| t.on_demand_equivalent,
        )
    }
}

/// The operator's metrics.
pub struct Metrics {
    registry: Registry,
    /// Reconciles started.
    pub reconciles: Counter,
    /// Reconcile errors by kind.
    pub reconcile_errors: Family<ErrorLabels, Counter>,
    /// Reconcile duration.
    pub reconcile_duration: Histogram,
    /// Gang restarts by reason.
    pub restarts: Family<RestartLabels, Counter>,
    /// Seconds from a preemption being detected to the next attempt's pods being created.
    pub preemption_recovery: Histogram,
    /// 1 while this replica holds the leader Lease (or runs without leader election).
    pub leader: Gauge,
    /// Entries of the controller's per-job maps; they return to 0 once the jobs are deleted.
    pub state_entries: Family<StateLabels, Gauge>,
    /// Progress reports from trainers, by how they were answered.
    pub progress_reports: Family<ReportLabels, Counter>,
    /// Polls of in-place restart supervisors, by how they were answered.
    pub supervisor_polls: Family<ReportLabels, Counter>,
    /// Steps lost per gang restart after a preemption: the step the trainers had reported
    /// before it, minus the step the next attempt resumed from.
    pub steps_lost: Histogram,
    /// Status-only rounds that found every routine slot taken and parked their job.
    pub status_rounds_parked: Counter,
    /// Each job's goodput ledger, from its status (`trainyard_operator_gpu_seconds_total`,
    /// `trainyard_operator_cost_dollars_total`,
    /// `trainyard_operator_on_demand_equivalent_dollars_total`), and its step rate
    /// (`trainyard_operator_job_steps_per_second`).
    jobs: JobSeries,
    ready: AtomicBool,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Registers the reconcile counter, error counter and duration histogram.
fn register_reconcile_metrics(
    r: &mut Registry,
) -> (Counter, Family<ErrorLabels, Counter>, Histogram) {
    let reconciles = registered(
        r,
        "trainyard_operator_reconciles",
        "Reconciles started",
        Counter::default(),
    );
    let reconcile_errors = registered(
        r,
        "trainyard_operator_reconcile_errors",
        "Reconcile errors by kind",
        Family::<ErrorLabels, Counter>::default(),
    );
    let reconcile_duration = registered(
        r,
        "trainyard_operator_reconcile_duration_seconds",
        "Time spent in one reconcile",
        Histogram::new([0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0]),
    );
    (reconciles, reconcile_errors, reconcile_duration)
}

/// Registers the restart counter and the preemption recovery histogram.
fn register_restart_metrics(r: &mut Registry) -> (Family<RestartLabels, Counter>, Histogram) {
    let restarts = registered(
        r,
        "trainyard_operator_restarts",
        "Gang restarts by reason (Preemption, Failure)",
        Family::<RestartLabels, Counter>::default(),
    );
    let preemption_recovery = registered(
        r,
        "trainyard_operator_preemption_recovery_seconds",
        "Seconds from a preemption being detected to the next attempt's pods being created",
        Histogram::new([
            0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
        ]),
    );
    (restarts, preemption_recovery)
}

/// Registers the leader gauge and the per-map state gauges.
fn register_controller_metrics(r: &mut Registry) -> (Gauge, Family<StateLabels, Gauge>) {
    let leader = registered(
        r,
        "trainyard_operator_leader",
        "1 while this replica reconciles (holds the leader Lease)",
        Gauge::default(),
    );
    let state_entries = registered(
        r,
        "trainyard_operator_state_entries",
        "Entries the controller keeps per job, by map; back to 0 once the jobs are deleted",
        Family::<StateLabels, Gauge>::default(),
    );
    (leader, state_entries)
}

/// The progress channel's metrics.
struct ProgressMetrics {
    reports: Family<ReportLabels, Counter>,
    polls: Family<ReportLabels, Counter>,
    steps_lost: Histogram,
}

/// Registers the progress report and supervisor poll counters and the steps-lost histogram.
fn register_progress_metrics(r: &mut Registry) -> ProgressMetrics {
    let reports = registered(
        r,
        "trainyard_operator_progress_reports",
        "Progress reports from trainers, by outcome",
        Family::<ReportLabels, Counter>::default(),
    );
    let polls = registered(
        r,
        "trainyard_operator_supervisor_polls",
        "Polls of in-place restart supervisors, by outcome",
        Family::<ReportLabels, Counter>::default(),
    );
    let steps_lost = registered(
        r,
        "trainyard_operator_steps_lost_per_preemption",
        "Training steps lost per preemption: the step reported before it minus the step resumed from",
        Histogram::new([
            0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 5000.0,
        ]),
    );
    ProgressMetrics {
        reports,
        polls,
        steps_lost,
    }
}

/// Registers the count of status-only rounds that parked their job (`crate::writes`).
fn register_parked_metric(r: &mut Registry) -> Counter {
    registered(
        r,
        "trainyard_operator_status_rounds_parked",
        "Status-only rounds that found every routine slot taken and parked their job until one was free",
        Counter::default(),
    )
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Self {
        let mut r = Registry::default();
        let (reconciles, reconcile_errors, reconcile_duration) = register_reconcile_metrics(&mut r);
        let (restarts, preemption_recovery) = register_restart_metrics(&mut r);
        let (leader, state_entries) = register_controller_metrics(&mut r);
        let progress = register_progress_metrics(&mut r);
        let status_rounds_parked = register_parked_metric(&mut r);
        let jobs = JobSeries::default();
        r.register_collector(Box::new(jobs.clone()));
        Self {
            registry: r,
            reconciles,
            reconcile_errors,
            reconcile_duration,
            restarts,
            preemption_recovery,
            leader,
            state_entries,
            progress_reports: progress.reports,
            supervisor_polls: progress.polls,
            steps_lost: progress.steps_lost,
            status_rounds_parked,
            jobs,
            ready: AtomicBool::new(false),
        }
    }

    /// Counts an error by kind.
    pub fn count_error(&self, error: &Error) {
        self.reconcile_errors
            .get_or_create(&ErrorLabels {
                error: error.metric_label().to_owned(),
            })
            .inc();
    }

    /// Sets the state gauges.
    pub fn set_state_sizes(&self, sizes: &StateSizes) {
        for (map, n) in sizes.by_map() {
            self.state_entries
                .get_or_create(&StateLabels {
                    map: map.to_owned(),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// Counts a progress report by how it was answered.
    pub fn count_report(&self, outcome: &str) {
        self.progress_reports
            .get_or_create(&ReportLabels {
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    /// Counts a supervisor's poll by how it was answered.
    pub fn count_supervisor_poll(&self, outcome: &str) {
        self.supervisor_polls
            .get_or_create(&ReportLabels {
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    /// Exposes the ledger of `namespace/job` (object `uid`) as its status shows it; a job
    /// whose status has no ledger (it requests no GPUs) has no series.
    pub fn record_ledger(
        &self,
        namespace: &str,
        job: &str,
        uid: &str,
        ledger: Option<&GoodputLedger>,
    ) {
        if let Some(ledger) = ledger {
            self.jobs.record(namespace, job, uid, ledger);
        }
    }

    /// Sets the step rate of `namespace/job`.
    pub fn set_steps_per_second(&self, namespace: &str, job: &str, rate: f64) {
        self.jobs.with_jobs(|jobs| {
            let key = (namespace.to_owned(), job.to_owned());
            jobs.entry(key).or_default().steps_per_second = Some(rate);
        });
    }

    /// Removes every series of a deleted job.
    pub fn forget_job(&self, namespace: &str, job: &str) {
        self.jobs.with_jobs(|jobs| {
            jobs.remove(&(namespace.to_owned(), job.to_owned()));
        });
    }

    /// Keeps the series only of the jobs `exists` says still exist.
    pub fn retain_jobs(&self, exists: impl Fn(&str, &str) -> bool) {
        self.jobs
            .with_jobs(|jobs| jobs.retain(|(namespace, job), _| exists(namespace, job)));
    }

    /// How many jobs have a series.
    pub fn jobs_with_series(&self) -> usize {
        self.jobs.with_jobs(|jobs| jobs.len())
    }

    /// Removes every ledger series: a replica that no longer leads exposes none, so that the
    /// leader's are the only ones.
    pub fn forget_ledgers(&self) {
        self.jobs.with_jobs(|jobs| {
            jobs.retain(|_, values| {
                values.ledger = None;
                values.steps_per_second.is_some()
            });
        });
    }

    /// Marks the process ready (`/readyz` answers 200).
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

async fn metrics(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        m.render(),
    )
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(m): State<Arc<Metrics>>) -> (StatusCode, &'static str) {
    if m.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting")
    }
}

/// Binds the HTTP server; the returned future serves within `limits` until `shutdown`
/// completes.
pub async fn serve(
    addr: SocketAddr,
    metrics_: Arc<Metrics>,
    limits: trainyard_listen::HttpLimits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<
    (
        SocketAddr,
        impl std::future::Future<Output = std::io::Result<()>>,
    ),
    Error,
> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(metrics_);
    Ok(trainyard_listen::serve("metrics", addr, app, limits, shutdown).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_names_the_metrics_the_dashboard_uses() {
        let m = Metrics::new();
        m.restarts
            .get_or_create(&RestartLabels {
                reason: "Preemption".into(),
            })
            .inc();
        m.count_error(&Error::CacheGone("pods"));
        m.preemption_recovery.observe(0.4);
        let text = m.render();
        assert!(
            text.contains("trainyard_operator_restarts_total{reason=\"Preemption\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("trainyard_operator_reconcile_errors_total{error=\"cache_gone\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("trainyard_operator_preemption_recovery_seconds_bucket"),
            "{text}"
        );
        assert!(
            text.contains("trainyard_operator_reconciles_total"),
            "{text}"
        );
    }

    #[test]
    fn state_entries_are_one_gauge_per_map() {
        let m = Metrics::new();
        m.set_state_sizes(&StateSizes {
            detected: 3,
            ..StateSizes::default()
        });
        let text = m.render();
        assert!(
            text.contains("trainyard_operator_state_entries{map=\"detected\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("trainyard_operator_state_entries{map=\"written\"} 0"),
            "{text}"
        );
    }

    fn ledger(useful_ms: u64, detection_ms: u64, spent: u64) -> GoodputLedger {
        let mut l = GoodputLedger::default();
        l.spot.useful = useful_ms;
        l.spot.lost_to_detection = detection_ms;
        l.on_demand.pending = 500;
        l.micro_dollars.spent = spent;
        l.micro_dollars.on_demand_equivalent = 3 * spent;
        l
    }

    /// The lines of `text` that name `job`.
    fn series_of(text: &str, job: &str) -> Vec<String> {
        let label = format!("job=\"{job}\"");
        text.lines()
            .filter(|l| l.contains(&label))
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn ledger_totals_are_counters_of_the_status_values() {
        let m = Metrics::new();
        m.record_ledger("ml", "a", "u1", Some(&ledger(90_000, 1_500, 2_500_000)));
        let text = m.render();
        for line in [
            "# TYPE trainyard_operator_gpu_seconds counter",
            "trainyard_operator_gpu_seconds_total{namespace=\"ml\",job=\"a\",capacity=\"spot\",use=\"useful\"} 90.0",
            "trainyard_operator_gpu_seconds_total{namespace=\"ml\",job=\"a\",capacity=\"spot\",use=\"lost_to_detection\"} 1.5",
            "trainyard_operator_gpu_seconds_total{namespace=\"ml\",job=\"a\",capacity=\"on_demand\",use=\"pending\"} 0.5",
            "trainyard_operator_gpu_seconds_total{namespace=\"ml\",job=\"a\",capacity=\"on_demand\",use=\"useful\"} 0.0",
            "# TYPE trainyard_operator_cost_dollars counter",
            "trainyard_operator_cost_dollars_total{namespace=\"ml\",job=\"a\"} 2.5",
            "trainyard_operator_on_demand_equivalent_dollars_total{namespace=\"ml\",job=\"a\"} 7.5",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing from\n{text}"
            );
        }
        // 2 capacity types × 8 uses, and one series of each money family: bounded per job.
        assert_eq!(
            series_of(&text, "a").len(),
            2 * LEDGER_USES.len() + 2,
            "{text}"
        );
    }

    #[test]
    fn a_status_read_older_than_the_last_never_moves_a_counter_back() {
        let m = Metrics::new();
        m.record_ledger("ml", "a", "u1", Some(&ledger(90_000, 1_500, 2_500_000)));
        m.record_ledger("ml", "a", "u1", Some(&ledger(60_000, 2_000, 1_000_000)));
        let text = m.render();
        assert!(
            text.contains("capacity=\"spot\",use=\"useful\"} 90.0"),
            "{text}"
        );
        assert!(
            text.contains("capacity=\"spot\",use=\"lost_to_detection\"} 2.0"),
            "{text}"
        );
        assert!(
            text.contains("cost_dollars_total{namespace=\"ml\",job=\"a\"} 2.5"),
            "{text}"
        );
        // A job created again under the same name starts over.
        m.record_ledger("ml", "a", "u2", Some(&ledger(1_000, 0, 10)));
        let text = m.render();
        assert!(
            text.contains("capacity=\"spot\",use=\"useful\"} 1.0"),
            "{text}"
        );
    }

    #[test]
    fn step_rates_are_gauges_that_outlive_the_ledgers_but_not_their_job() {
        let m = Metrics::new();
        m.set_steps_per_second("ml", "a", 1.5);
        m.record_ledger("ml", "a", "u1", Some(&ledger(1_000, 0, 10)));
        let text = m.render();
        for line in [
            "# TYPE trainyard_operator_job_steps_per_second gauge",
            "trainyard_operator_job_steps_per_second{namespace=\"ml\",job=\"a\"} 1.5",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing from\n{text}"
            );
        }
        // A replica that stops leading drops the ledgers; the step rate stays as it was.
        m.forget_ledgers();
        assert_eq!(series_of(&m.render(), "a").len(), 1);
        m.forget_job("ml", "a");
        assert!(series_of(&m.render(), "a").is_empty());
        assert_eq!(m.jobs_with_series(), 0);
    }

    #[test]
    fn ledger_series_vanish_with_their_job() {
        let m = Metrics::new();
        m.record_ledger("ml", "a", "u1", Some(&ledger(1_000, 0, 10)));
        m.record_ledger("ml", "b", "u2", Some(&ledger(2_000, 0, 20)));
        m.record_ledger("ml", "c", "u3", Some(&ledger(3_000, 0, 30)));
        m.record_ledger("ml", "no-gpus", "u4", None);
        m.forget_job("ml", "a");
        let text = m.render();
        assert!(series_of(&text, "a").is_empty(), "{text}");
        assert!(series_of(&text, "no-gpus").is_empty(), "{text}");
        assert_eq!(series_of(&text, "b").len(), 18, "{text}");
        m.retain_jobs(|_, job| job == "c");
        let text = m.render();
        assert!(series_of(&text, "b").is_empty(), "{text}");
        assert_eq!(series_of(&text, "c").len(), 18, "{text}");
        m.forget_ledgers();
        assert!(series_of(&m.render(), "c").is_empty());
    }
}

#[cfg(test)]
mod http_tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .expect("write");
        let mut out = String::new();
        s.read_to_string(&mut out).await.expect("read");
        out
    }

    #[tokio::test]
    async fn endpoints_serve_health_readiness_and_metrics() {
        let m = Arc::new(Metrics::new());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (addr, server) = serve(
            "127.0.0.1:0".parse().expect("addr"),
            m.clone(),
            trainyard_listen::HttpLimits::METRICS,
            async {
                let _ = rx.await;
            },
        )
        .await
        .expect("bind");
        let server = tokio::spawn(server);

        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(
            get(addr, "/readyz").await.starts_with("HTTP/1.1 503"),
            "not ready before start-up"
        );
        m.set_ready(true);
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
        m.restarts
            .get_or_create(&RestartLabels {
                reason: "Failure".into(),
            })
            .inc();
        let metrics = get(addr, "/metrics").await;
        assert!(
            metrics.contains("trainyard_operator_restarts_total{reason=\"Failure\"} 1"),
            "{metrics}"
        );

        let _ = tx.send(());
        server.await.expect("join").expect("server stops cleanly");
    }

    /// The metrics port serves within the limits it is given; each bound itself is tested in
    /// trainyard-listen.
    #[tokio::test]
    async fn the_metrics_port_closes_a_connection_beyond_its_cap_at_accept() {
        let limits = trainyard_listen::HttpLimits {
            max_connections: 1,
            ..trainyard_listen::HttpLimits::METRICS
        };
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let addr = "127.0.0.1:0".parse().expect("addr");
        let (addr, server) = serve(addr, Arc::new(Metrics::new()), limits, async {
            let _ = rx.await;
        })
        .await
        .expect("bind");
        tokio::spawn(server);

        let _held = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let mut beyond = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let mut out = Vec::new();
        let _ = beyond.read_to_end(&mut out).await;
        assert!(out.is_empty(), "closed unanswered: {out:?}");
        drop(tx);
    }
}
