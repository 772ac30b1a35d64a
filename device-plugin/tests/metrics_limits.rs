//! The metrics and health port under a flood of slow request heads, on the server `run` starts
//! (`metrics::serve`, within `HttpLimits::METRICS`) and a real loopback listener. Pods the
//! plugin does not trust may reach the port, and the plugin lives within 128 Mi: connections
//! beyond the cap are closed at accept, a held one is closed at its header timeout however
//! slowly it keeps sending, a head is cut at the header limit, so what a flood costs stays
//! bounded, and `/healthz` (the kubelet's liveness probe) is answered once the flood is gone.
//!
//! Paused time: once the connections are open, the drips and the header timeout run on
//! tokio's virtual clock, so the durations asserted are that clock's, never the machine's
//! speed.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::status_kib;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use trainyard_device_plugin::metrics::{self, Metrics};
use trainyard_listen::HttpLimits;
use trainyard_listen::testing::connect_from;

/// What the port allows: the defaults `run` serves it with.
const LIMITS: HttpLimits = HttpLimits::METRICS;
/// Connections in a flood: four times the cap, all open at once.
const FLOOD: usize = 4 * LIMITS.max_connections;
/// The flood's source addresses (127.0.0.1 and up): as many as it takes for their shares to
/// fill the whole cap, so that the total cap is what the flood meets.
const SOURCES: usize = LIMITS.max_connections / LIMITS.max_connections_per_source;
/// The start of a request head that never ends: the rest is one header's value.
const HEAD: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: ";
const PAD: [u8; 4096] = [b'a'; 4096];
/// How long the connections may take to open, on the machine's clock: only a guard against a
/// hang.
const HANG_LIMIT: Duration = Duration::from_secs(30);

/// A head sent slowly: `pieces` more pieces of `piece` bytes of its header value, one every
/// `every`, after [`HEAD`].
#[derive(Clone, Copy)]
struct Drip {
    piece: usize,
    pieces: usize,
    every: Duration,
}

/// What became of one connection of a flood.
#[derive(Debug)]
struct Fate {
    /// From connecting until the server closed it.
    closed_after: Duration,
    /// What the server sent before closing it.
    answer: String,
}

/// The metrics server as `run` starts it, on a free loopback port.
async fn start() -> (SocketAddr, CancellationToken) {
    let stop = CancellationToken::new();
    let addr = "127.0.0.1:0".parse().expect("addr");
    let (addr, _serving) = metrics::serve(addr, Arc::new(Metrics::new("n")), stop.clone())
        .await
        .expect("bind");
    (addr, stop)
}

/// Sends [`HEAD`] on `stream`, opened at `opened`; once `go`, sends `drip`, and never ends the
/// head. Tells `closed` what became of the connection once the server closed it.
async fn drip_head(
    (stream, opened): (TcpStream, Instant),
    drip: Drip,
    mut go: watch::Receiver<bool>,
    closed: mpsc::UnboundedSender<Fate>,
) {
    let (mut reader, mut writer) = stream.into_split();
    let sending = async move {
        // A write to a connection the server closed fails: the reader sees the close.
        if writer.write_all(HEAD).await.is_ok() && go.wait_for(|go| *go).await.is_ok() {
            for _ in 0..drip.pieces {
                tokio::time::sleep(drip.every).await;
                if writer.write_all(&PAD[..drip.piece]).await.is_err() {
                    break;
                }
            }
        }
        // The writing half stays open: only the server closes the connection.
        std::future::pending::<()>().await;
    };
    let mut answer = Vec::new();
    tokio::select! {
        // A reset after an answer still leaves the answer read.
        _ = reader.read_to_end(&mut answer) => {}
        () = sending => {}
    }
    let _ = closed.send(Fate {
        closed_after: opened.elapsed(),
        answer: String::from_utf8_lossy(&answer).into_owned(),
    });
}

/// [`FLOOD`] connections at once, each sending `drip`: those the server closed while they
/// opened, before any sent more than [`HEAD`] (closed at accept), and the others.
///
/// The connections open on the machine's clock, until as many as are beyond the cap are
/// closed; then time is paused, and the drips and the server's timeouts run on tokio's virtual
/// clock, which runs ahead whenever every task waits. (Paused from the start, it would also
/// run ahead while the connections are still being accepted.)
async fn flood(addr: SocketAddr, drip: Drip) -> (Vec<Fate>, Vec<Fate>) {
    let (go, going) = watch::channel(false);
    let (closed, mut fates) = mpsc::unbounded_channel();
    for i in 0..FLOOD {
        // One at a time, so that the listener's accept queue (128) never overflows: a
        // connection it dropped would wait a second for its SYN to be sent again.
        // Taken before connecting: the server's clock for the connection starts later.
        let opened = Instant::now();
        let source = u8::try_from(1 + i % SOURCES).expect("a loopback address");
        let stream = connect_from([127, 0, 0, source], addr).await;
        tokio::spawn(drip_head(
            (stream, opened),
            drip,
            going.clone(),
            closed.clone(),
        ));
    }
    drop(closed);
    let mut at_accept = Vec::new();
    let opening_limit = Instant::now() + HANG_LIMIT;
    while at_accept.len() < FLOOD - LIMITS.max_connections {
        match tokio::time::timeout_at(opening_limit, fates.recv()).await {
            Ok(Some(fate)) => at_accept.push(fate),
            Ok(None) | Err(_) => break,
        }
    }
    tokio::time::pause();
    go.send_replace(true);
    let mut later = Vec::new();
    let all_closed = async {
        while let Some(fate) = fates.recv().await {
            later.push(fate);
        }
    };
    // Virtual time: this only stops a connection that is never closed.
    let guard = Duration::from_secs(24 * 3600);
    let _ = tokio::time::timeout(guard, all_closed).await;
    (at_accept, later)
}

/// The connections beyond the cap: as many as the cap leaves out, each closed unanswered
/// before any of the flood sent a byte of its head (no time is asserted on the machine's
/// clock: the count and the order tell them apart from those held).
fn assert_closed_at_accept(turned_away: &[Fate]) {
    assert_eq!(
        turned_away.len(),
        FLOOD - LIMITS.max_connections,
        "closed at accept"
    );
    for fate in turned_away {
        assert!(fate.answer.is_empty(), "{}", fate.answer);
    }
}

async fn healthz(addr: SocketAddr) -> String {
    healthz_from([127, 0, 0, 1], addr).await
}

async fn healthz_from(source: [u8; 4], addr: SocketAddr) -> String {
    let mut stream = connect_from(source, addr).await;
    let request = "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer).await;
    answer
}

/// Heads within the size limit, a KiB a second, never finished: without the header timeout
/// each would hold its slot and its buffer for as long as it kept sending.
#[tokio::test]
async fn slow_heads_beyond_the_cap_are_closed_at_accept_and_the_held_ones_at_the_header_timeout() {
    let (addr, stop) = start().await;
    let drip = Drip {
        piece: 1024,
        pieces: 7,
        every: Duration::from_secs(1),
    };
    assert!(HEAD.len() + drip.piece * drip.pieces < LIMITS.max_header_bytes);
    let (turned_away, held) = flood(addr, drip).await;

    assert_closed_at_accept(&turned_away);
    assert_eq!(held.len(), LIMITS.max_connections, "the cap holds");
    let trickled_for = drip.every * u32::try_from(drip.pieces).expect("pieces");
    assert!(trickled_for < LIMITS.header_timeout && LIMITS.header_timeout < LIMITS.idle_timeout);
    for fate in &held {
        // Still trickling at the header timeout, yet closed then: bytes that keep coming do
        // not extend it, as they would the idle timeout.
        let closed = fate.closed_after;
        assert!(
            LIMITS.header_timeout <= closed && closed < LIMITS.header_timeout + drip.every,
            "closed after {closed:?}"
        );
        assert!(
            fate.answer.is_empty() || fate.answer.starts_with("HTTP/1.1 408"),
            "{}",
            fate.answer
        );
    }
    assert!(healthz(addr).await.starts_with("HTTP/1.1 200"));
    stop.cancel();
}

/// How much the peak resident set (`VmHWM`) of this process (server, flood and the other test
/// of this file) may grow during the flood of large heads. At most the cap's connections hold
/// a head, each within the 8 KiB limit: about 1 MiB with hyper's own state. Without the cap
/// and the limit, hyper buffers up to ~400 KiB of a head on every connection: the flood's
/// [`FLOOD`] heads of 256 KiB would hold 64 MiB (the peak grows by about 80 MiB).
const PEAK_GROWTH_BOUND_KIB: u64 = 8 * 1024;

/// Heads of 256 KiB, sent 2 KiB at a time: each is answered 431 once it passes the limit, long
/// before its header timeout, so no connection holds more than the limit of a head.
#[tokio::test]
async fn large_heads_sent_slowly_are_cut_at_the_header_limit_and_memory_stays_bounded() {
    let (addr, stop) = start().await;
    // The server's own first allocations happen before the baseline.
    assert!(healthz(addr).await.starts_with("HTTP/1.1 200"));
    let drip = Drip {
        piece: 2048,
        pieces: 128,
        every: Duration::from_millis(100),
    };
    let rss_before = status_kib("VmRSS");
    let (turned_away, held) = flood(addr, drip).await;
    let peak_growth = status_kib("VmHWM").saturating_sub(rss_before);
    eprintln!(
        "{FLOOD} connections sending 256 KiB heads: peak RSS growth {peak_growth} KiB \
         (RSS before {rss_before} KiB)"
    );

    assert_closed_at_accept(&turned_away);
    assert_eq!(held.len(), LIMITS.max_connections, "the cap holds");
    for fate in &held {
        assert!(fate.answer.starts_with("HTTP/1.1 431"), "{}", fate.answer);
        assert!(fate.closed_after < LIMITS.header_timeout, "{fate:?}");
    }
    assert!(
        peak_growth < PEAK_GROWTH_BOUND_KIB,
        "peak RSS grew by {peak_growth} KiB, over the {PEAK_GROWTH_BOUND_KIB} KiB bound"
    );
    assert!(healthz(addr).await.starts_with("HTTP/1.1 200"));
    stop.cancel();
}

/// One pod flooding the port (every connection from one address) holds its share of the cap
/// and no more: the kubelet's liveness probe, from the node's address, is answered while the
/// flood holds its connections.
#[tokio::test]
async fn a_flood_from_one_address_leaves_the_kubelets_probe_answered() {
    let (addr, stop) = start().await;
    let mut held = Vec::new();
    for _ in 0..LIMITS.max_connections {
        let mut stream = connect_from([127, 0, 0, 1], addr).await;
        // Part of a head, so that an admitted connection holds its slot.
        let _ = stream.write_all(HEAD).await;
        held.push(stream);
    }
    let probe = healthz_from([127, 0, 0, 2], addr).await;
    assert!(probe.starts_with("HTTP/1.1 200"), "{probe}");
    drop(held);
    stop.cancel();
}
