//! The progress channel under load: N ranks reporting to the operator's real endpoint, and a
//! flood of requests it must refuse, with the operator-side cost measured in-process.
//!
//! The operator's own router ([`progress::serve`]) runs on loopback with
//! the real [`ProgressStore`] and [`Metrics`]. Two things are faked, both without network:
//! the token reviewer (a token `tok:<pod>` is that pod's; the real reviewer caches accepted
//! tokens by their SHA-256 for five minutes, so in the steady state it makes no TokenReview
//! calls: what it would review is the number of distinct tokens, which is counted) and the pod
//! cache (the jobs' worker pods, `ranks / jobs` each).
//!
//! The clients are raw keep-alive HTTP/1.1 connections in the same process, one per rank, so
//! the process's CPU time includes them. To take them out, the identical client run is
//! repeated against a trivial handler that answers every request `200` (the floor); the
//! difference is what the endpoint itself costs.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use trainyard_operator::surface::Metrics;
use trainyard_operator::surface::progress::{
    self, AuthError, Identity, MAX_BODY_BYTES, PATH, PodLookup, ProgressServer, ProgressStore,
    TokenReviewer, WorkerIdentity,
};

use crate::error::{Error, Result};
use crate::operator_process::{clock_ticks, parse_stat_cpu_ticks};
use crate::stats::percentile;

/// The namespace of the simulated worker pods.
const NAMESPACE: &str = "bench";
/// The attempt every simulated worker runs.
const ATTEMPT: u32 = 1;
/// How a valid token starts; what follows is the pod's name.
const TOKEN_PREFIX: &str = "tok:";
/// The body size of the flood's oversized requests: twice the endpoint's limit.
const OVERSIZED_BYTES: usize = 2 * MAX_BODY_BYTES;

/// What to run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProgressLoadParams {
    /// Reporting ranks in all.
    pub ranks: u32,
    /// Jobs they belong to; `ranks` must be a multiple.
    pub jobs: u32,
    /// How long the ranks report.
    pub seconds: f64,
    /// How often each rank reports, milliseconds.
    pub interval_ms: u64,
    /// Requests of the flood phase.
    pub flood_requests: u32,
    /// Connections the flood sends over at once.
    pub flood_connections: u32,
}

impl ProgressLoadParams {
    fn ranks_per_job(&self) -> Result<u32> {
        let param = |name, message: &str| Error::Param {
            name,
            message: message.to_owned(),
        };
        if self.jobs == 0 || self.ranks == 0 {
            return Err(param("ranks", "ranks and jobs must be positive"));
        }
        if !self.ranks.is_multiple_of(self.jobs) {
            return Err(param("ranks", "must be a multiple of --jobs"));
        }
        if self.interval_ms == 0 || self.seconds.is_nan() || self.seconds <= 0.0 {
            return Err(param(
                "seconds",
                "the interval and the run must be positive",
            ));
        }
        if self.flood_connections == 0 {
            return Err(param("flood-connections", "must be positive"));
        }
        Ok(self.ranks / self.jobs)
    }
}

/// What the ranks' steady reporting measured, against one server.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SteadyPhase {
    /// Reports sent.
    pub sent: u64,
    /// Reports answered 200.
    pub accepted: u64,
    /// Reports answered otherwise, by status.
    pub refused: BTreeMap<u16, u64>,
    /// Reports that got no answer (connection error).
    pub unanswered: u64,
    /// From the first rank's start to the last answer, seconds.
    pub wall_seconds: f64,
    /// Median time from writing a report to its whole answer, ms.
    pub latency_p50_ms: f64,
    /// 99th percentile of the same, ms.
    pub latency_p99_ms: f64,
    /// The slowest, ms.
    pub latency_max_ms: f64,
    /// The process's CPU (user + system) over the phase, seconds.
    pub cpu_seconds: f64,
}

impl SteadyPhase {
    /// Accepted reports per second of the phase.
    pub fn accepted_per_second(&self) -> f64 {
        self.accepted as f64 / self.wall_seconds.max(f64::EPSILON)
    }

    /// CPU seconds per 1,000 reports sent.
    pub fn cpu_per_1000(&self) -> f64 {
        self.cpu_seconds * 1000.0 / (self.sent.max(1) as f64)
    }
}

/// What the flood measured, against one server.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FloodPhase {
    /// Requests sent.
    pub sent: u64,
    /// Answers by status.
    pub statuses: BTreeMap<u16, u64>,
    /// Requests that got no answer (connection error).
    pub unanswered: u64,
    /// Seconds the flood took.
    pub wall_seconds: f64,
    /// The process's CPU over the flood, seconds.
    pub cpu_seconds: f64,
}

impl FloodPhase {
    /// Requests answered 4xx or 503.
    pub fn refused(&self) -> u64 {
        self.statuses
            .iter()
            .filter(|(s, _)| (400..500).contains(*s) || **s == 503)
            .map(|(_, n)| n)
            .sum()
    }
}

/// Everything one run measured.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProgressLoadReport {
    /// What ran.
    pub params: ProgressLoadParams,
    /// The ranks against the operator's endpoint.
    pub operator: SteadyPhase,
    /// The identical ranks against a trivial 200 handler.
    pub floor: SteadyPhase,
    /// The flood against the operator's endpoint.
    pub flood: FloodPhase,
    /// The identical flood against the trivial handler (CPU only; it answers 200).
    pub flood_floor: FloodPhase,
    /// `trainyard_operator_progress_reports_total` by outcome after the operator's phases.
    pub server_outcomes: BTreeMap<String, u64>,
    /// Entries in the progress store after the steady phase (must equal the jobs).
    pub store_entries: usize,
    /// Distinct valid tokens reviewed: what the real (caching) reviewer would send as
    /// TokenReviews in five minutes.
    pub distinct_tokens_reviewed: usize,
    /// Calls of the (fake) reviewer in all, rejected tokens included.
    pub review_calls: u64,
    /// Reconciles the endpoint asked for (the wake channel).
    pub wakes: u64,
    /// Resident set before the ranks start, MiB.
    pub rss_idle_mib: f64,
    /// Resident set just before the flood, MiB.
    pub rss_before_flood_mib: f64,
    /// Resident set just after the flood, MiB.
    pub rss_after_flood_mib: f64,
    /// Peak resident set (VmHWM) after the operator's phases, MiB.
    pub peak_rss_mib: f64,
}

impl ProgressLoadReport {
    /// What went wrong, if anything: a valid report not accepted, a flood request not
    /// refused, a store entry count other than the jobs.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let op = &self.operator;
        if op.sent == 0 || op.accepted != op.sent {
            problems.push(format!(
                "{} of {} valid reports accepted (refused {:?}, unanswered {})",
                op.accepted, op.sent, op.refused, op.unanswered
            ));
        }
        if self.server_outcomes.get("accepted").copied().unwrap_or(0) != op.accepted {
            problems.push(format!(
                "the server counted {:?}, the ranks {} accepted",
                self.server_outcomes, op.accepted
            ));
        }
        let flood = &self.flood;
        if flood.refused() != flood.sent || flood.unanswered != 0 {
            problems.push(format!(
                "{} of {} flood requests refused with 4xx/503 (answers {:?}, unanswered {})",
                flood.refused(),
                flood.sent,
                flood.statuses,
                flood.unanswered
            ));
        }
        if self.store_entries != self.params.jobs as usize {
            problems.push(format!(
                "the store holds {} entries for {} jobs",
                self.store_entries, self.params.jobs
            ));
        }
        problems
    }
}

/// Runs the load test: the ranks and the flood against the operator's endpoint, then the same
/// client work against the floor.
pub async fn run(params: &ProgressLoadParams) -> Result<ProgressLoadReport> {
    let ranks_per_job = params.ranks_per_job()?;
    let ranks: Vec<Rank> = (0..params.ranks)
        .map(|i| Rank::new(i / ranks_per_job, i % ranks_per_job))
        .collect();
    let reviewer = Arc::new(FakeReviewer::default());
    let (wake, mut woken) = mpsc::channel(1024);
    let wakes = Arc::new(AtomicU64::new(0));
    let draining = {
        let wakes = wakes.clone();
        tokio::spawn(async move {
            while woken.recv().await.is_some() {
                wakes.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let server = Arc::new(ProgressServer {
        store: Arc::new(ProgressStore::default()),
        reviewer: reviewer.clone(),
        pods: Arc::new(FakePods::of(&ranks)),
        metrics: Arc::new(Metrics::new()),
        wake,
    });
    let (stop, stopped) = oneshot::channel::<()>();
    let (addr, serving) = progress::serve(
        "127.0.0.1:0".parse().expect("a literal address"),
        server.clone(),
        async {
            let _ = stopped.await;
        },
    )
    .await
    .map_err(|e| Error::Operator(format!("starting the progress endpoint: {e}")))?;
    let serving = tokio::spawn(serving);

    let rss_idle_mib = status_mib("VmRSS");
    let operator = run_steady(addr, &ranks, params).await;
    let store_entries = server.store.len();
    let rss_before_flood_mib = status_mib("VmRSS");
    let flood = run_flood(addr, &ranks, params).await;
    let rss_after_flood_mib = status_mib("VmRSS");
    let peak_rss_mib = status_mib("VmHWM");
    let server_outcomes = outcomes(&server.metrics.render());
    let _ = stop.send(());
    let _ = serving.await;
    drop(server);
    let _ = draining.await;

    let (floor_addr, stop_floor, floor_serving) = serve_floor().await?;
    let floor = run_steady(floor_addr, &ranks, params).await;
    let flood_floor = run_flood(floor_addr, &ranks, params).await;
    let _ = stop_floor.send(());
    let _ = floor_serving.await;

    Ok(ProgressLoadReport {
        params: params.clone(),
        operator,
        floor,
        flood,
        flood_floor,
        server_outcomes,
        store_entries,
        distinct_tokens_reviewed: reviewer.distinct(),
        review_calls: reviewer.calls.load(Ordering::Relaxed),
        wakes: wakes.load(Ordering::Relaxed),
        rss_idle_mib,
        rss_before_flood_mib,
        rss_after_flood_mib,
        peak_rss_mib,
    })
}

/// One simulated worker.
#[derive(Clone, Debug)]
struct Rank {
    job: String,
    rank: u32,
    pod: String,
}

impl Rank {
    fn new(job: u32, rank: u32) -> Self {
        let job = format!("job-{job:04}");
        let pod = format!("{job}-worker-{rank}");
        Self { job, rank, pod }
    }

    fn token(&self) -> String {
        format!("{TOKEN_PREFIX}{}", self.pod)
    }
}

/// Reviews `tok:<pod>` as that pod's token, anything else as invalid, and remembers which
/// valid tokens it saw.
#[derive(Default)]
struct FakeReviewer {
    seen: Mutex<HashSet<String>>,
    calls: AtomicU64,
}

impl FakeReviewer {
    fn distinct(&self) -> usize {
        self.seen.lock().map(|s| s.len()).unwrap_or(0)
    }
}

impl TokenReviewer for FakeReviewer {
    fn review(&self, token: String) -> BoxFuture<'static, Result<Identity, AuthError>> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let answer = match token.strip_prefix(TOKEN_PREFIX) {
            Some(pod) => {
                if let Ok(mut seen) = self.seen.lock() {
                    seen.insert(token.clone());
                }
                Ok(Identity {
                    namespace: NAMESPACE.to_owned(),
                    pod_name: pod.to_owned(),
                    pod_uid: format!("uid-{pod}"),
                })
            }
            None => Err(AuthError::Unauthenticated("invalid token".to_owned())),
        };
        futures::future::ready(answer).boxed()
    }
}

/// The worker pods of the simulated ranks.
struct FakePods(HashMap<String, WorkerIdentity>);

impl FakePods {
    fn of(ranks: &[Rank]) -> Self {
        let pods = ranks
            .iter()
            .map(|r| {
                let worker = WorkerIdentity {
                    uid: format!("uid-{}", r.pod),
                    job: r.job.clone(),
                    job_uid: format!("uid-job-{}", r.job),
                    rank: r.rank,
                    attempt: ATTEMPT,
                };
                (r.pod.clone(), worker)
            })
            .collect();
        Self(pods)
    }
}

impl PodLookup for FakePods {
    fn worker(&self, namespace: &str, pod: &str) -> Option<WorkerIdentity> {
        (namespace == NAMESPACE).then(|| self.0.get(pod).cloned())?
    }
}

/// A trivial endpoint that answers every request `200 {"checkpoint":false}`.
async fn serve_floor() -> Result<(
    SocketAddr,
    oneshot::Sender<()>,
    tokio::task::JoinHandle<std::io::Result<()>>,
)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(Error::io("binding the floor endpoint"))?;
    let addr = listener
        .local_addr()
        .map_err(Error::io("reading the floor endpoint's address"))?;
    let router = axum::Router::new().route(
        PATH,
        axum::routing::post(|| async {
            (
                [(axum::http::header::CONTENT_TYPE, "application/json")],
                r#"{"checkpoint":false}"#,
            )
        }),
    );
    let (stop, stopped) = oneshot::channel::<()>();
    let serving = tokio::spawn(
        axum::serve(listener, router)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .into_future(),
    );
    Ok((addr, stop, serving))
}

/// splitmix64: deterministic jitter without a dependency, the same in the floor's run.
struct Jitter(u64);

impl Jitter {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A keep-alive HTTP/1.1 connection that reconnects after the server closed it, from a
/// loopback address of its own: each rank is a pod with an address of its own, and the
/// endpoint admits at most 64 connections per source address.
struct Connection {
    addr: SocketAddr,
    source: std::net::IpAddr,
    stream: Option<BufReader<TcpStream>>,
    line: String,
    body: Vec<u8>,
}

impl Connection {
    /// The `n`-th client's connection to `addr`, from 127.1.x.y (all of 127/8 is loopback).
    fn new(addr: SocketAddr, n: usize) -> Self {
        let n = u32::try_from(n % (250 * 250)).unwrap_or(0);
        let [x, y] = [n / 250, n % 250 + 1].map(|v| u8::try_from(v).unwrap_or(1));
        Self {
            addr,
            source: std::net::Ipv4Addr::new(127, 1, x, y).into(),
            stream: None,
            line: String::new(),
            body: Vec::new(),
        }
    }

    /// Posts `body` with `token` and returns the answer's status.
    async fn post(&mut self, token: &str, body: &str) -> std::io::Result<u16> {
        let request = format!(
            "POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let answer = self.exchange(request.as_bytes()).await;
        if answer.is_err() {
            self.stream = None;
        }
        answer
    }

    async fn exchange(&mut self, request: &[u8]) -> std::io::Result<u16> {
        let stream = match &mut self.stream {
            Some(stream) => stream,
            None => {
                let socket = tokio::net::TcpSocket::new_v4()?;
                socket.bind(SocketAddr::new(self.source, 0))?;
                let stream = socket.connect(self.addr).await?;
                stream.set_nodelay(true)?;
                self.stream.insert(BufReader::new(stream))
            }
        };
        stream.get_mut().write_all(request).await?;
        let eof = || std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "closed");
        self.line.clear();
        if stream.read_line(&mut self.line).await? == 0 {
            return Err(eof());
        }
        let status: u16 = self
            .line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("bad status line {:?}", self.line)))?;
        let mut length = 0usize;
        let mut close = false;
        loop {
            self.line.clear();
            if stream.read_line(&mut self.line).await? == 0 {
                return Err(eof());
            }
            let line = self.line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                let value = value.trim();
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.parse().map_err(std::io::Error::other)?;
                } else if name.eq_ignore_ascii_case("connection") {
                    close = value.eq_ignore_ascii_case("close");
                }
            }
        }
        self.body.resize(length, 0);
        stream.read_exact(&mut self.body).await?;
        if close {
            self.stream = None;
        }
        Ok(status)
    }
}

/// What one rank saw.
#[derive(Default)]
struct RankOutcome {
    sent: u64,
    accepted: u64,
    refused: BTreeMap<u16, u64>,
    unanswered: u64,
    latencies_ms: Vec<f64>,
}

/// Every rank reports every interval (the first at a jittered offset) until the phase ends.
async fn run_steady(addr: SocketAddr, ranks: &[Rank], params: &ProgressLoadParams) -> SteadyPhase {
    let interval = Duration::from_millis(params.interval_ms);
    let cpu_before = cpu_seconds();
    let start = tokio::time::Instant::now();
    let deadline = start + Duration::from_secs_f64(params.seconds);
    let tasks: Vec<_> = ranks
        .iter()
        .enumerate()
        .map(|(i, rank)| {
            let rank = rank.clone();
            let mut jitter = Jitter(i as u64);
            let offset = Duration::from_millis(jitter.below(params.interval_ms));
            tokio::spawn(async move {
                let mut connection = Connection::new(addr, i);
                let token = rank.token();
                let mut outcome = RankOutcome::default();
                let mut step = 0u64;
                let mut checkpoint = None;
                let mut next = start + offset;
                while next < deadline {
                    tokio::time::sleep_until(next).await;
                    next += interval;
                    step += 1 + jitter.below(20);
                    // About one report in five names a newer checkpoint.
                    if jitter.below(5) == 0 {
                        checkpoint = Some(step);
                    }
                    let loss = 4.0 / (1.0 + step as f64 / 1000.0);
                    let body = match checkpoint {
                        Some(c) => format!(
                            r#"{{"job":"{}","rank":{},"attempt":{ATTEMPT},"step":{step},"loss":{loss:.4},"checkpointStep":{c}}}"#,
                            rank.job, rank.rank
                        ),
                        None => format!(
                            r#"{{"job":"{}","rank":{},"attempt":{ATTEMPT},"step":{step},"loss":{loss:.4}}}"#,
                            rank.job, rank.rank
                        ),
                    };
                    let sent_at = Instant::now();
                    outcome.sent += 1;
                    match connection.post(&token, &body).await {
                        Ok(200) => {
                            outcome.accepted += 1;
                            outcome
                                .latencies_ms
                                .push(sent_at.elapsed().as_secs_f64() * 1e3);
                        }
                        Ok(status) => *outcome.refused.entry(status).or_default() += 1,
                        Err(_) => outcome.unanswered += 1,
                    }
                }
                outcome
            })
        })
        .collect();
    let mut phase = SteadyPhase::default();
    let mut latencies = Vec::new();
    for task in tasks {
        let Ok(outcome) = task.await else {
            phase.unanswered += 1;
            continue;
        };
        phase.sent += outcome.sent;
        phase.accepted += outcome.accepted;
        phase.unanswered += outcome.unanswered;
        for (status, n) in outcome.refused {
            *phase.refused.entry(status).or_default() += n;
        }
        latencies.extend(outcome.latencies_ms);
    }
    phase.wall_seconds = start.elapsed().as_secs_f64();
    phase.cpu_seconds = cpu_seconds() - cpu_before;
    latencies.sort_by(f64::total_cmp);
    phase.latency_p50_ms = percentile(&latencies, 50.0);
    phase.latency_p99_ms = percentile(&latencies, 99.0);
    phase.latency_max_ms = latencies.last().copied().unwrap_or(0.0);
    phase
}

/// `flood_requests` requests as fast as `flood_connections` connections can send them, in
/// three kinds by turn: an oversized body with a valid token, a valid body with a bad token,
/// and an oversized body with a bad token.
async fn run_flood(addr: SocketAddr, ranks: &[Rank], params: &ProgressLoadParams) -> FloodPhase {
    let cpu_before = cpu_seconds();
    let start = Instant::now();
    let next = Arc::new(AtomicU32::new(0));
    let ranks: Arc<[Rank]> = ranks.into();
    let padding: Arc<str> = "x".repeat(OVERSIZED_BYTES).into();
    let tasks: Vec<_> = (0..params.flood_connections)
        .map(|c| {
            let (next, ranks, padding) = (next.clone(), ranks.clone(), padding.clone());
            let total = params.flood_requests;
            tokio::spawn(async move {
                let mut connection = Connection::new(addr, c as usize);
                let mut phase = FloodPhase::default();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total {
                        break phase;
                    }
                    let rank = &ranks[i as usize % ranks.len()];
                    let valid = format!(
                        r#"{{"job":"{}","rank":{},"attempt":{ATTEMPT},"step":1"#,
                        rank.job, rank.rank
                    );
                    let (token, body) = match i % 3 {
                        0 => (rank.token(), format!(r#"{valid},"padding":"{padding}"}}"#)),
                        1 => (format!("forged-{i}"), format!("{valid}}}")),
                        _ => (
                            format!("forged-{i}"),
                            format!(r#"{valid},"padding":"{padding}"}}"#),
                        ),
                    };
                    phase.sent += 1;
                    match connection.post(&token, &body).await {
                        Ok(status) => *phase.statuses.entry(status).or_default() += 1,
                        Err(_) => phase.unanswered += 1,
                    }
                }
            })
        })
        .collect();
    let mut phase = FloodPhase::default();
    for task in tasks {
        let Ok(part) = task.await else {
            phase.unanswered += 1;
            continue;
        };
        phase.sent += part.sent;
        phase.unanswered += part.unanswered;
        for (status, n) in part.statuses {
            *phase.statuses.entry(status).or_default() += n;
        }
    }
    phase.wall_seconds = start.elapsed().as_secs_f64();
    phase.cpu_seconds = cpu_seconds() - cpu_before;
    phase
}

/// This process's CPU time (user + system, all threads), seconds, from /proc/self/stat.
fn cpu_seconds() -> f64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| parse_stat_cpu_ticks(&s))
        .map_or(0.0, |ticks| ticks as f64 / clock_ticks())
}

/// A `kB` field of /proc/self/status (`VmRSS`, `VmHWM`) in MiB; 0 where it cannot be read.
fn status_mib(field: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status.lines().find_map(|line| {
                let value = line.strip_prefix(field)?.strip_prefix(':')?;
                value
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// `trainyard_operator_progress_reports_total` by outcome, from the metrics text.
fn outcomes(metrics: &str) -> BTreeMap<String, u64> {
    metrics
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("trainyard_operator_progress_reports_total{outcome=\"")?;
            let (outcome, rest) = rest.split_once("\"}")?;
            Some((outcome.to_owned(), rest.trim().parse().ok()?))
        })
        .collect()
}

/// The report as a markdown table: the steady reporting against the floor, what the endpoint
/// kept and asked for, the flood and memory, and the checks.
pub fn markdown(report: &ProgressLoadReport) -> String {
    let mut rows = steady_rows(report);
    rows.extend(cpu_rows(report));
    rows.extend(endpoint_rows(report));
    rows.extend(flood_rows(report));
    rows.push(checks_row(report));
    let mut out = String::from("| measure | value |\n|---|---|\n");
    for (measure, value) in rows {
        out.push_str(&format!("| {measure} | {value} |\n"));
    }
    out
}

/// Answers counted by HTTP status: "3× 413, 2× 503".
fn statuses(s: &BTreeMap<u16, u64>) -> String {
    s.iter()
        .map(|(status, n)| format!("{n}× {status}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The steady reporting: what ran, what was accepted, and how fast it was answered.
fn steady_rows(report: &ProgressLoadReport) -> Vec<(String, String)> {
    let p = &report.params;
    let (op, floor) = (&report.operator, &report.floor);
    vec![
        (
            "ranks × interval".into(),
            format!(
                "{} ranks ({} jobs × {}) every {} ms, jittered start, {:.0} s",
                p.ranks,
                p.jobs,
                p.ranks / p.jobs.max(1),
                p.interval_ms,
                p.seconds
            ),
        ),
        (
            "reports accepted / sent".into(),
            format!(
                "{} / {} (refused: {}; unanswered: {})",
                op.accepted,
                op.sent,
                if op.refused.is_empty() {
                    "none".to_owned()
                } else {
                    statuses(&op.refused)
                },
                op.unanswered
            ),
        ),
        (
            "reports accepted per second".into(),
            format!("{:.1}", op.accepted_per_second()),
        ),
        (
            "report latency p50 / p99 / max".into(),
            format!(
                "{:.2} / {:.2} / {:.2} ms (floor: {:.2} / {:.2} ms)",
                op.latency_p50_ms,
                op.latency_p99_ms,
                op.latency_max_ms,
                floor.latency_p50_ms,
                floor.latency_p99_ms
            ),
        ),
    ]
}

/// The process CPU of the steady reporting, against the floor's, and their difference: what
/// the endpoint itself costs.
fn cpu_rows(report: &ProgressLoadReport) -> Vec<(String, String)> {
    let (op, floor) = (&report.operator, &report.floor);
    vec![
        (
            "process CPU per 1,000 reports: endpoint + clients".into(),
            format!(
                "{:.3} s ({:.2} s in all)",
                op.cpu_per_1000(),
                op.cpu_seconds
            ),
        ),
        (
            "process CPU per 1,000 reports: clients vs. a trivial 200 handler (floor)".into(),
            format!(
                "{:.3} s ({:.2} s in all)",
                floor.cpu_per_1000(),
                floor.cpu_seconds
            ),
        ),
        (
            "**endpoint CPU per 1,000 reports (difference)**".into(),
            format!(
                "**{:.3} s** ({:.2}% of one core at this rate)",
                op.cpu_per_1000() - floor.cpu_per_1000(),
                100.0 * (op.cpu_seconds - floor.cpu_seconds) / op.wall_seconds.max(f64::EPSILON)
            ),
        ),
    ]
}

/// What the endpoint kept and asked for: store entries, token reviews, reconcile wakes.
fn endpoint_rows(report: &ProgressLoadReport) -> Vec<(String, String)> {
    vec![
        (
            "progress store entries".into(),
            format!("{} (jobs: {})", report.store_entries, report.params.jobs),
        ),
        (
            "distinct tokens reviewed (= TokenReviews of the caching reviewer)".into(),
            format!(
                "{} ({} reviewer calls, flood included)",
                report.distinct_tokens_reviewed, report.review_calls
            ),
        ),
        (
            "reconciles asked for (wakes)".into(),
            report.wakes.to_string(),
        ),
    ]
}

/// The flood's answers and CPU, and the process's memory around it.
fn flood_rows(report: &ProgressLoadReport) -> Vec<(String, String)> {
    let flood = &report.flood;
    vec![
        (
            "flood: answers".into(),
            format!(
                "{} requests over {} connections in {:.2} s: {}; unanswered {}",
                flood.sent,
                report.params.flood_connections,
                flood.wall_seconds,
                statuses(&flood.statuses),
                flood.unanswered
            ),
        ),
        (
            "flood: process CPU (floor)".into(),
            format!(
                "{:.2} s ({:.2} s)",
                flood.cpu_seconds, report.flood_floor.cpu_seconds
            ),
        ),
        (
            "RSS idle / before flood / after flood".into(),
            format!(
                "{:.1} / {:.1} / {:.1} MiB (the flood: {:+.1} MiB)",
                report.rss_idle_mib,
                report.rss_before_flood_mib,
                report.rss_after_flood_mib,
                report.rss_after_flood_mib - report.rss_before_flood_mib
            ),
        ),
        (
            "peak RSS (VmHWM), endpoint + clients".into(),
            format!("{:.1} MiB", report.peak_rss_mib),
        ),
    ]
}

/// The checks' verdict: what passed, or each problem.
fn checks_row(report: &ProgressLoadReport) -> (String, String) {
    let problems = report.problems();
    (
        "checks".into(),
        if problems.is_empty() {
            "every valid report accepted, every flood request refused (4xx/503), one store entry per job".to_owned()
        } else {
            format!("**failed**: {}", problems.join("; "))
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_are_read_from_the_metrics_text() {
        let text = "# TYPE x counter\n\
            trainyard_operator_progress_reports_total{outcome=\"accepted\"} 12\n\
            trainyard_operator_progress_reports_total{outcome=\"too_large\"} 3\n\
            trainyard_operator_other 5\n";
        let got = outcomes(text);
        assert_eq!(got.get("accepted"), Some(&12));
        assert_eq!(got.get("too_large"), Some(&3));
        assert_eq!(got.len(), 2);
    }

    #[test]
    fn ranks_must_divide_into_jobs() {
        let params = ProgressLoadParams {
            ranks: 10,
            jobs: 4,
            seconds: 1.0,
            interval_ms: 100,
            flood_requests: 0,
            flood_connections: 1,
        };
        assert!(params.ranks_per_job().is_err());
        assert_eq!(
            ProgressLoadParams { jobs: 5, ..params }
                .ranks_per_job()
                .expect("10 / 5"),
            2
        );
    }
}
