//! The listener against a small router on a real loopback port.

use std::sync::atomic::{AtomicUsize, Ordering};

use axum::routing::get;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

use std::net::IpAddr;

use super::admission::{Admission, Cap};
use super::testing::connect_from;
use super::*;

/// A router that answers `GET /healthz` "ok".
fn healthz_router() -> Router {
    Router::new().route("/healthz", get(|| async { "ok" }))
}

/// [`healthz_router`] on a free loopback port within `limits`, telling `turned_away`; the
/// address, and what stops it.
async fn serving_within(
    limits: HttpLimits,
    turned_away: Option<TurnedAway>,
) -> (SocketAddr, oneshot::Sender<()>) {
    let (stop, stopped) = oneshot::channel::<()>();
    let addr = "127.0.0.1:0".parse().expect("addr");
    let app = healthz_router();
    let (local, serving) = serve_telling("test", addr, app, limits, turned_away, async {
        let _ = stopped.await;
    })
    .await
    .expect("bind");
    tokio::spawn(serving);
    (local, stop)
}

/// What the server sent on `stream` until it closed it.
async fn read_all(stream: &mut TcpStream) -> String {
    let mut out = Vec::new();
    // A reset after an answer still leaves the answer read.
    let _ = stream.read_to_end(&mut out).await;
    String::from_utf8_lossy(&out).into_owned()
}

async fn healthz(addr: SocketAddr) -> String {
    healthz_from([127, 0, 0, 1], addr).await
}

/// Every request knows the connection's peer, as axum's `ConnectInfo` (for per-source
/// limits).
#[tokio::test]
async fn a_request_carries_its_peer() {
    let app = Router::new().route(
        "/healthz",
        get(|ConnectInfo(peer): ConnectInfo<SocketAddr>| async move { peer.ip().to_string() }),
    );
    let (stop, stopped) = oneshot::channel::<()>();
    let addr = "127.0.0.1:0".parse().expect("addr");
    let (addr, serving) = serve("test", addr, app, long_lived(4), async {
        let _ = stopped.await;
    })
    .await
    .expect("bind");
    tokio::spawn(serving);
    let answer = healthz(addr).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("127.0.0.1"), "{answer}");
    drop(stop);
}

fn long_lived(max_connections: usize) -> HttpLimits {
    HttpLimits {
        header_timeout: Duration::from_secs(3600),
        idle_timeout: Duration::from_secs(3600),
        ..HttpLimits::with_max_connections(max_connections)
    }
    .with_per_source(max_connections)
}

async fn healthz_from(source: [u8; 4], addr: SocketAddr) -> String {
    let mut stream = connect_from(source, addr).await;
    let request = "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    if stream.write_all(request.as_bytes()).await.is_err() {
        return String::new();
    }
    read_all(&mut stream).await
}

/// A counter of the connections turned away, and the callback that counts them.
fn counting() -> (Arc<AtomicUsize>, TurnedAway) {
    let told = Arc::new(AtomicUsize::new(0));
    let counter = told.clone();
    let tell: TurnedAway = Arc::new(move || {
        counter.fetch_add(1, Ordering::SeqCst);
    });
    (told, tell)
}

/// One source flooding the port holds its share of the cap and no more: its connections
/// past the share are closed before any answer, while another source (the kubelet's probes
/// come from the node's address) is still answered. A stranger turned away at its own share is
/// no trouble of the port: none of it is told (a pod holding its share open must not make
/// every rank of every job look "not quiet").
#[tokio::test]
async fn a_source_over_its_share_is_closed_at_accept_and_not_told_while_another_is_served() {
    let (told, tell) = counting();
    let (addr, _stop) = serving_within(long_lived(8).with_per_source(2), Some(tell)).await;
    let flood = [127, 0, 0, 1];
    // Two connections that send nothing yet hold the source's share.
    let mut held = [
        connect_from(flood, addr).await,
        connect_from(flood, addr).await,
    ];
    for _ in 0..3 {
        assert_eq!(
            healthz_from(flood, addr).await,
            "",
            "over its share: closed before anything was read or answered"
        );
    }
    assert_eq!(
        told.load(Ordering::SeqCst),
        0,
        "a source over its own share is not the port's trouble"
    );
    let probe = healthz_from([127, 0, 0, 2], addr).await;
    assert!(probe.starts_with("HTTP/1.1 200"), "{probe}");
    // The held ones were admitted: each is answered once it asks.
    for stream in &mut held {
        let request = "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
        stream.write_all(request.as_bytes()).await.expect("write");
        let answer = read_all(stream).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
    assert_eq!(told.load(Ordering::SeqCst), 0, "none served is told");
}

/// A source's closed connections give its share back, so a pod that flooded the port is
/// served again once its flood ends.
#[tokio::test]
async fn a_source_whose_connections_closed_is_admitted_again() {
    let (addr, _stop) = serving_within(long_lived(8).with_per_source(2), None).await;
    let flood = [127, 0, 0, 1];
    let held = [
        connect_from(flood, addr).await,
        connect_from(flood, addr).await,
    ];
    assert_eq!(healthz_from(flood, addr).await, "", "at its share");
    drop(held);
    let mut served = false;
    // The server sees the close a moment after the client makes it.
    for _ in 0..1000 {
        if healthz_from(flood, addr).await.starts_with("HTTP/1.1 200") {
            served = true;
            break;
        }
        tokio::task::yield_now().await;
    }
    assert!(
        served,
        "the source's closed connections gave its share back"
    );
}

/// A source at its share is refused before it takes a slot of the cap, so it leaves the
/// whole rest of the cap to the others; a connection refused by either cap counts nowhere.
#[test]
fn a_source_at_its_share_takes_no_slot_of_the_cap() {
    let admission = Admission::new(3, 1);
    let [one, two, three, four] = [1, 2, 3, 4].map(|n| IpAddr::from([127, 0, 0, n]));
    let first = admission.admit(one).expect("within the share");
    for _ in 0..5 {
        assert_eq!(admission.admit(one).err(), Some(Cap::PerSource));
    }
    assert_eq!(admission.free_slots(), 2, "the refused took no slot");
    let others = [two, three].map(|source| admission.admit(source).expect("a free slot"));
    assert_eq!(admission.admit(four).err(), Some(Cap::Global));
    assert_eq!(
        admission.held_from(four),
        None,
        "a refused source is not counted"
    );
    assert_eq!(admission.held_from(one), Some(1));
    drop((first, others));
    assert_eq!(admission.free_slots(), 3);
}

/// A source leaves the count with its last connection, so the map stays as small as the
/// connections held, and both its slots of the cap and its share are back.
#[test]
fn a_source_leaves_the_count_with_its_last_connection() {
    let admission = Admission::new(8, 2);
    let source = IpAddr::from([127, 0, 0, 1]);
    let held = [(); 2].map(|()| admission.admit(source).expect("within the share"));
    assert_eq!(admission.held_from(source), Some(2));
    assert_eq!(admission.free_slots(), 6);
    let [first, second] = held;
    drop(first);
    assert_eq!(admission.held_from(source), Some(1));
    drop(second);
    assert_eq!(admission.held_from(source), None, "no entry is kept");
    assert_eq!(admission.free_slots(), 8);
    let again = [(); 2].map(|()| admission.admit(source).expect("its share again"));
    assert_eq!(admission.admit(source).err(), Some(Cap::PerSource));
    drop(again);
}

#[test]
fn each_source_gets_an_eighth_of_the_cap_at_least_one_and_at_most_64() {
    assert_eq!(HttpLimits::PROGRESS.max_connections_per_source, 64);
    assert_eq!(HttpLimits::METRICS.max_connections_per_source, 8);
    let per_source = |cap| HttpLimits::with_max_connections(cap).max_connections_per_source;
    assert_eq!(per_source(3), 1);
    assert_eq!(per_source(256), 32);
    assert_eq!(per_source(1_000_000), DEFAULT_MAX_CONNECTIONS_PER_SOURCE);
    let chosen = HttpLimits::METRICS.with_per_source(2);
    assert_eq!(chosen.max_connections_per_source, 2);
    assert_eq!(chosen.max_connections, HttpLimits::METRICS.max_connections);
}

#[tokio::test]
async fn a_connection_beyond_the_cap_is_closed_at_accept_and_a_freed_slot_serves_again() {
    let (addr, _stop) = serving_within(long_lived(2), None).await;
    // Two connections that send nothing hold both slots.
    let held = [
        TcpStream::connect(addr).await.expect("connect"),
        TcpStream::connect(addr).await.expect("connect"),
    ];
    for _ in 0..3 {
        assert_eq!(
            healthz(addr).await,
            "",
            "closed before anything was read or answered"
        );
    }
    drop(held);
    let mut answers = 0;
    for _ in 0..1000 {
        if healthz(addr).await.starts_with("HTTP/1.1 200") {
            answers += 1;
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(answers, 1, "a freed slot serves the next connection");
}

/// A flood that fills the progress port's cap: each connection turned away is told, so
/// the ranks whose reports it closed are not taken for quiet.
#[tokio::test]
async fn a_connection_turned_away_at_accept_is_told() {
    let (told, tell) = counting();
    // The whole cap (one connection) full, its source well within a share of its own.
    let (addr, _stop) = serving_within(long_lived(1).with_per_source(4), Some(tell)).await;
    let _held = TcpStream::connect(addr).await.expect("connect");
    for _ in 0..3 {
        assert_eq!(healthz(addr).await, "");
    }
    assert_eq!(told.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_head_over_the_limit_is_answered_431_and_closed() {
    let limits = HttpLimits {
        max_header_bytes: 2 * 1024,
        ..long_lived(4)
    };
    let (addr, _stop) = serving_within(limits, None).await;
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\n\r\n",
        "a".repeat(4096)
    );
    let _ = stream.write_all(head.as_bytes()).await;
    let answer = read_all(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    // One within the limit is served.
    assert!(healthz(addr).await.starts_with("HTTP/1.1 200"));
}

#[tokio::test(start_paused = true)]
async fn a_head_that_is_not_complete_in_time_and_an_idle_kept_alive_connection_are_closed() {
    let limits = HttpLimits {
        header_timeout: Duration::from_secs(10),
        ..long_lived(4)
    };
    let (addr, _stop) = serving_within(limits, None).await;
    // The guard only stops a connection that is never closed: paused time runs ahead.
    let guard = Duration::from_secs(24 * 3600);

    let mut partial = TcpStream::connect(addr).await.expect("connect");
    partial
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .expect("write");
    let answer = tokio::time::timeout(guard, read_all(&mut partial)).await;
    let answer = answer.expect("the connection is closed");
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 408"),
        "{answer}"
    );

    let mut kept = TcpStream::connect(addr).await.expect("connect");
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let answer = tokio::time::timeout(guard, read_all(&mut kept)).await;
    let answer = answer.expect("the idle connection is closed");
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "answered first: {answer}"
    );
}

#[tokio::test]
async fn shutdown_stops_accepting_and_the_serving_future_ends() {
    let (stop, stopped) = oneshot::channel::<()>();
    let addr = "127.0.0.1:0".parse().expect("addr");
    let (addr, serving) = serve("test", addr, healthz_router(), long_lived(4), async {
        let _ = stopped.await;
    })
    .await
    .expect("bind");
    let serving = tokio::spawn(serving);
    assert!(healthz(addr).await.starts_with("HTTP/1.1 200"));
    let _ = stop.send(());
    let ended = serving.await.expect("the serving task");
    assert!(ended.is_ok());
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "the port is closed"
    );
}

#[tokio::test]
async fn a_taken_address_fails_naming_the_server_and_the_address() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr");
    let Err(error) = serve("metrics", addr, healthz_router(), long_lived(4), async {}).await else {
        panic!("bound a taken address");
    };
    assert_eq!((error.what, error.addr), ("metrics", addr));
    assert_eq!(error.source.kind(), io::ErrorKind::AddrInUse);
    assert_eq!(
        error.to_string(),
        format!("metrics server on {addr}: {}", error.source)
    );
}
