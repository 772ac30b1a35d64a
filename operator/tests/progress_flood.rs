//! The progress endpoint under a connection flood, on a real TCP listener and without a
//! cluster: slow and oversized request heads, heads whose bodies never come, and more
//! connections than the listener's cap, while the ranks of a job keep reporting over the
//! connections they keep alive (as a trainer's HTTP session does). The operator must keep
//! answering the ranks 200, close the connections beyond its cap at once, and what the flood
//! costs it in memory must stay bounded.
//!
//! Its own test binary: the resident set it measures is this process's, and no other test runs
//! in it. Everything (server, flood, ranks) runs on one thread, as the operator does. No
//! assertion is on a duration: the listener's timeouts are set far beyond the test's run.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::mpsc;
use trainyard_operator::HttpLimits;
use trainyard_operator::surface::Metrics;
use trainyard_operator::surface::progress::PATH;
use trainyard_operator::surface::progress::{
    AuthError, Identity, PodLookup, ProgressServer, ProgressStore, TokenReviewer, WorkerIdentity,
};

/// Connections that send a request head one byte at a time and never finish it.
const DRIPPING: usize = 100;
/// Connections that send a large part of a request head at once and never finish it.
const OVERSIZED: usize = 200;
/// How much of a head each of those sends: under hyper's default buffer limit (~400 KiB).
const OVERSIZED_BYTES: usize = 256 * 1024;
/// Complete heads with a forged bearer token, whose bodies never come.
const FORGED_SLOW_BODIES: usize = 64;
/// Complete heads without a token, whose bodies never come.
const TOKENLESS_SLOW_BODIES: usize = 32;
/// The job's ranks, and the rounds each reports during the flood.
const RANKS: u32 = 8;
const ROUNDS: u64 = 3;
/// The listener's connection cap: above what the flood holds open before the silent
/// connections come.
const MAX_CONNECTIONS: usize = 256;
/// Connections that send nothing, opened once the rest of the flood is in: enough to fill the
/// cap however many of the other flood connections the server has closed by then.
const SILENT: usize = MAX_CONNECTIONS;
/// How many silent connections at least are closed at accept: those beyond what the ranks and
/// the dripping heads leave of the cap (the other flood connections may hold more).
const REFUSED_AT_LEAST: usize = SILENT - (MAX_CONNECTIONS - RANKS as usize - DRIPPING);
/// How much the flood may grow the resident set: a few hundred connections at a few KiB each.
const MAX_RSS_GROWTH_MIB: f64 = 24.0;
/// How many times the test looks for the silent connections to be closed before it gives up
/// (a guard against a server that never closes them, not a measure).
const LOOKS: usize = 1000;

/// Tokens `tok-<pod>` are that pod's in `ml`; any other is refused.
struct Reviewer;

impl TokenReviewer for Reviewer {
    fn review(&self, token: String) -> BoxFuture<'static, Result<Identity, AuthError>> {
        let answer = match token.strip_prefix("tok-") {
            Some(pod) => Ok(Identity {
                namespace: "ml".to_owned(),
                pod_name: pod.to_owned(),
                pod_uid: format!("uid-{pod}"),
            }),
            None => Err(AuthError::Unauthenticated("invalid token".to_owned())),
        };
        futures::future::ready(answer).boxed()
    }
}

/// The workers `train-worker-<rank>` of attempt 1 in `ml`.
struct Pods(HashMap<String, WorkerIdentity>);

impl Pods {
    fn of_train() -> Self {
        let pods = (0..RANKS)
            .map(|rank| {
                let name = format!("train-worker-{rank}");
                let worker = WorkerIdentity {
                    uid: format!("uid-{name}"),
                    job: "train".to_owned(),
                    job_uid: "uid-job-train".to_owned(),
                    rank,
                    attempt: 1,
                };
                (name, worker)
            })
            .collect();
        Self(pods)
    }
}

impl PodLookup for Pods {
    fn worker(&self, namespace: &str, pod: &str) -> Option<WorkerIdentity> {
        (namespace == "ml").then(|| self.0.get(pod).cloned())?
    }
}

fn rss_mib() -> f64 {
    let stats = memory_stats::memory_stats().expect("the resident set is readable");
    stats.physical_mem as f64 / (1024.0 * 1024.0)
}

/// A rank's kept-alive connection to the endpoint.
struct Rank {
    rank: u32,
    stream: TcpStream,
}

impl Rank {
    async fn connect(addr: SocketAddr, rank: u32) -> Self {
        let stream = TcpStream::connect(addr).await.expect("a rank connects");
        Self { rank, stream }
    }

    /// Reports `step`; the status code of the answer.
    async fn report(&mut self, step: u64) -> u16 {
        let rank = self.rank;
        let body = format!(r#"{{"job":"train","rank":{rank},"attempt":1,"step":{step}}}"#);
        let request = format!(
            "POST {PATH} HTTP/1.1\r\nHost: x\r\n\
             Authorization: Bearer tok-train-worker-{rank}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        self.stream
            .write_all(request.as_bytes())
            .await
            .expect("the rank's connection stays open");
        self.read_answer().await
    }

    /// Reads one answer (head and `Content-Length` body); its status code.
    async fn read_answer(&mut self) -> u16 {
        let mut answer = Vec::new();
        let head_end = loop {
            if let Some(end) = answer.windows(4).position(|w| w == b"\r\n\r\n") {
                break end + 4;
            }
            let mut chunk = [0u8; 1024];
            let n = self.stream.read(&mut chunk).await.expect("an answer");
            assert!(n > 0, "rank {}: closed without an answer", self.rank);
            answer.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&answer[..head_end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("a content length");
        while answer.len() < head_end + length {
            let mut chunk = [0u8; 1024];
            let n = self.stream.read(&mut chunk).await.expect("the body");
            assert!(n > 0, "rank {}: closed in the body", self.rank);
            answer.extend_from_slice(&chunk[..n]);
        }
        head.get(9..12)
            .and_then(|code| code.parse().ok())
            .expect("a status code")
    }
}

/// Opens a connection that sends a request head one byte at a time until `stop` or until the
/// server closes it.
async fn drip(addr: SocketAddr, stop: Arc<AtomicBool>) {
    let Ok(mut stream) = TcpStream::connect(addr).await else {
        return;
    };
    let head = format!("POST {PATH} HTTP/1.1\r\nHost: x\r\nX-Drip: ");
    if stream.write_all(head.as_bytes()).await.is_err() {
        return;
    }
    while !stop.load(Ordering::Relaxed) {
        if stream.write_all(b"a").await.is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Opens a connection and sends `OVERSIZED_BYTES` of a head that never ends; the connection,
/// for the caller to hold open.
async fn oversized(addr: SocketAddr, padding: Arc<Vec<u8>>) -> Option<TcpStream> {
    let mut stream = TcpStream::connect(addr).await.ok()?;
    let head = format!("POST {PATH} HTTP/1.1\r\nHost: x\r\nX-Pad: ");
    // The server may close it at any point (a header limit, a connection cap): ignored.
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(&padding).await;
    Some(stream)
}

/// Opens a connection and sends a complete head announcing a body that never comes.
async fn slow_body(addr: SocketAddr, token: Option<String>) -> Option<TcpStream> {
    let mut stream = TcpStream::connect(addr).await.ok()?;
    let authorization = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let head = format!(
        "POST {PATH} HTTP/1.1\r\nHost: x\r\n{authorization}Content-Type: application/json\r\n\
         Content-Length: 100\r\n\r\n"
    );
    let _ = stream.write_all(head.as_bytes()).await;
    Some(stream)
}

/// Opens a connection that sends nothing, and counts it in `closed` once the server closes it;
/// its writing half, for the caller to hold open.
async fn silent(addr: SocketAddr, closed: Arc<AtomicUsize>) -> Option<OwnedWriteHalf> {
    let stream = TcpStream::connect(addr).await.ok()?;
    let (mut reader, writer) = stream.into_split();
    tokio::spawn(async move {
        let mut byte = [0u8; 1];
        if matches!(reader.read(&mut byte).await, Ok(0) | Err(_)) {
            closed.fetch_add(1, Ordering::SeqCst);
        }
    });
    Some(writer)
}

/// The endpoint on a free loopback port, with the listener's timeouts beyond the test's run.
struct Endpoint {
    addr: SocketAddr,
    server: Arc<ProgressServer>,
    stop: tokio::sync::oneshot::Sender<()>,
    serving: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Endpoint {
    async fn start() -> Self {
        let (wake, mut woken) = mpsc::channel(1024);
        tokio::spawn(async move { while woken.recv().await.is_some() {} });
        let server = Arc::new(ProgressServer {
            store: Arc::new(ProgressStore::default()),
            reviewer: Arc::new(Reviewer),
            pods: Arc::new(Pods::of_train()),
            metrics: Arc::new(Metrics::new()),
            wake,
        });
        // Flood and ranks all come from 127.0.0.1 here, so the per-source share is the whole
        // cap: this is the total cap under a flood (one source's share is tested in
        // trainyard-listen).
        let limits = HttpLimits {
            header_timeout: Duration::from_secs(3600),
            idle_timeout: Duration::from_secs(3600),
            max_connections_per_source: MAX_CONNECTIONS,
            ..HttpLimits::with_max_connections(MAX_CONNECTIONS)
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (addr, serving) = trainyard_operator::surface::progress::serve_within(
            "127.0.0.1:0".parse().expect("addr"),
            server.clone(),
            limits,
            async {
                let _ = stopped.await;
            },
        )
        .await
        .expect("bind");
        let serving = tokio::spawn(serving);
        Self {
            addr,
            server,
            stop,
            serving,
        }
    }
}

/// The flood's connections, held open until [`Flood::end`].
struct Flood {
    stop_dripping: Arc<AtomicBool>,
    dripping: Vec<tokio::task::JoinHandle<()>>,
    held: Vec<Option<TcpStream>>,
    silent: Vec<Option<OwnedWriteHalf>>,
    /// How many silent connections the server closed.
    closed: Arc<AtomicUsize>,
}

impl Flood {
    /// Opens every kind of flood connection, the silent ones last.
    async fn start(addr: SocketAddr) -> Self {
        let stop_dripping = Arc::new(AtomicBool::new(false));
        let dripping = (0..DRIPPING)
            .map(|_| tokio::spawn(drip(addr, stop_dripping.clone())))
            .collect();
        let padding = Arc::new(vec![b'a'; OVERSIZED_BYTES]);
        let mut held =
            futures::future::join_all((0..OVERSIZED).map(|_| oversized(addr, padding.clone())))
                .await;
        for i in 0..FORGED_SLOW_BODIES {
            held.push(slow_body(addr, Some(format!("forged-{i}"))).await);
        }
        for _ in 0..TOKENLESS_SLOW_BODIES {
            held.push(slow_body(addr, None).await);
        }
        let closed = Arc::new(AtomicUsize::new(0));
        let mut silent_ones = Vec::new();
        for _ in 0..SILENT {
            silent_ones.push(silent(addr, closed.clone()).await);
        }
        Self {
            stop_dripping,
            dripping,
            held,
            silent: silent_ones,
            closed,
        }
    }

    /// How many silent connections were closed at once: waits until at least
    /// [`REFUSED_AT_LEAST`] are, or it has looked [`LOOKS`] times.
    async fn refused(&self) -> usize {
        for _ in 0..LOOKS {
            if self.closed.load(Ordering::SeqCst) >= REFUSED_AT_LEAST {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.closed.load(Ordering::SeqCst)
    }

    async fn end(self) {
        self.stop_dripping.store(true, Ordering::Relaxed);
        drop((self.held, self.silent));
        for task in self.dripping {
            let _ = task.await;
        }
    }
}

#[tokio::test]
async fn a_connection_flood_costs_bounded_memory_while_genuine_reports_are_accepted() {
    let endpoint = Endpoint::start().await;
    // Every rank connects and reports once before the flood, so that what a report allocates
    // is in the baseline.
    let mut ranks = Vec::new();
    for rank in 0..RANKS {
        let mut r = Rank::connect(endpoint.addr, rank).await;
        assert_eq!(r.report(0).await, 200);
        ranks.push(r);
    }
    let baseline = rss_mib();

    let flood = Flood::start(endpoint.addr).await;
    let refused = flood.refused().await;
    let mut statuses = Vec::new();
    for step in 1..=ROUNDS {
        for r in &mut ranks {
            statuses.push(r.report(step).await);
        }
    }
    let growth = rss_mib() - baseline;
    println!(
        "the flood grew the resident set by {growth:.1} MiB; {refused} of {SILENT} silent \
         connections were closed at once"
    );
    flood.end().await;
    drop(ranks);
    let _ = endpoint.stop.send(());
    let _ = endpoint.serving.await;

    assert_eq!(
        statuses,
        vec![200; (RANKS as u64 * ROUNDS) as usize],
        "every genuine report is accepted during the flood"
    );
    let progress = endpoint
        .server
        .store
        .snapshot("ml", "train")
        .expect("recorded");
    assert_eq!(progress.step(), Some(ROUNDS));
    assert!(
        refused >= REFUSED_AT_LEAST,
        "{refused} silent connections closed, at least {REFUSED_AT_LEAST} are beyond the cap"
    );
    assert!(
        growth < MAX_RSS_GROWTH_MIB,
        "the flood grew the resident set by {growth:.1} MiB (bound {MAX_RSS_GROWTH_MIB} MiB)"
    );
}
