//! trainyard-listen: the one HTTP listener of every port of trainyard's binaries (the
//! operator's metrics and progress ports, the device plugin's metrics and health port): bind,
//! then serve a router until shutdown, within [`HttpLimits`].
//!
//! Pods the binaries do not trust reach these ports (every pod the NetworkPolicy admits, or
//! every pod without one), and each binary runs under a small memory limit (the device plugin
//! on every GPU node, within 128 Mi), so each connection costs a bounded amount of memory for a
//! bounded time, and their number is bounded:
//!
//! - at most `max_connections` at once: one more is closed as soon as it is accepted, before
//!   anything of it is read (never queued or buffered), so a flood of connections holds no
//!   more than the cap's worth of buffers;
//! - at most `max_connections_per_source` of them from one IP address, closed the same way:
//!   one pod cannot take the whole cap, so the kubelet's probes (from the node's address) and
//!   the other pods' connections are still served while it floods;
//! - a request head must be complete within `header_timeout` of the connection opening or of
//!   its previous answer, so the same bound closes a kept-alive connection that sits idle, and
//!   a head sent a byte at a time holds its slot no longer than that;
//! - a head holds at most `max_header_bytes` (larger: 431 and closed), and hyper's read buffer
//!   is capped to match (its default grows to ~400 KiB a connection);
//! - a connection on which no byte moves either way for `idle_timeout` while the server waits
//!   on its peer (a body that stops coming, an answer the peer stops reading) is closed.
//!
//! Every request carries its connection's peer address as axum's `ConnectInfo<SocketAddr>`,
//! so that a handler can bound what one source may cost.
#![forbid(unsafe_code)]

mod idle_timeout;

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tower::ServiceExt as _;

use crate::idle_timeout::IdleTimeout;

/// Default of [`HttpLimits::header_timeout`]: a trainer's or a scraper's head arrives in one
/// packet; a kept-alive trainer reports every few seconds.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Default of [`HttpLimits::idle_timeout`]: above what a progress report may take with the
/// peer sending nothing (its body's 5 s and its token review's 10 s).
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Default of [`HttpLimits::max_header_bytes`]: a projected service-account token is about
/// 1 KiB, and a report's other headers a few hundred bytes.
pub const DEFAULT_MAX_HEADER_BYTES: usize = 8 * 1024;
/// Default connection cap of the progress port: one kept-alive connection per reporting
/// worker of 2,000, or many more trainers that connect per report.
pub const DEFAULT_PROGRESS_CONNECTIONS: usize = 2048;
/// Default connection cap of the metrics port: the kubelet's probes, a scraper or two.
pub const DEFAULT_METRICS_CONNECTIONS: usize = 64;
/// hyper refuses a read buffer smaller than this.
const MIN_READ_BUFFER: usize = 8 * 1024;
/// How long accepting pauses after an error that is not one connection's (out of file
/// descriptors), so that the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// How often at most the listener warns that its connection cap turns connections away.
const CAP_WARNING_INTERVAL: Duration = Duration::from_secs(60);

/// What one listener allows a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpLimits {
    /// Connections held at once; more are closed at accept.
    pub max_connections: usize,
    /// Connections held at once from one IP address; more from it are closed at accept.
    pub max_connections_per_source: usize,
    /// How long a request head may take, counted from the connection opening or its previous
    /// answer.
    pub header_timeout: Duration,
    /// How long a connection may stall, no byte moving either way, while the server waits on
    /// its peer.
    pub idle_timeout: Duration,
    /// The largest request head (request line and headers), bytes.
    pub max_header_bytes: usize,
}

impl HttpLimits {
    /// The default limits, with a cap of `max_connections`, an eighth of it (at least one)
    /// per source: the progress port's 2,048 leave 256 to one address (a node whose worker
    /// pods share its address with host networking holds a few), the metrics port's 64
    /// leave 8 (a probe or a scrape holds one, briefly).
    pub const fn with_max_connections(max_connections: usize) -> Self {
        let per_source = max_connections / 8;
        Self {
            max_connections,
            max_connections_per_source: if per_source == 0 { 1 } else { per_source },
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
        }
    }

    /// The progress port's defaults.
    pub const PROGRESS: Self = Self::with_max_connections(DEFAULT_PROGRESS_CONNECTIONS);
    /// The metrics port's defaults (the operator's, and the device plugin's metrics and health
    /// port).
    pub const METRICS: Self = Self::with_max_connections(DEFAULT_METRICS_CONNECTIONS);

    fn http1(&self) -> http1::Builder {
        let mut builder = http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(self.header_timeout)
            .max_header_size(self.max_header_bytes)
            .max_buf_size(self.max_header_bytes.max(MIN_READ_BUFFER));
        builder
    }
}

/// A listener that could not start: which server, on which address, and why.
#[derive(Debug, thiserror::Error)]
#[error("{what} server on {addr}: {source}")]
pub struct ListenError {
    /// Which server.
    pub what: &'static str,
    /// The address.
    pub addr: SocketAddr,
    /// The I/O error.
    #[source]
    pub source: io::Error,
}

/// Called for each connection closed at accept because the cap is full: the progress port
/// counts it as trouble of the channel (a rank whose reports stop then is not quiet).
pub type TurnedAway = Arc<dyn Fn() + Send + Sync>;

/// Binds `addr` for the `what` server; the returned future serves `app` within `limits` until
/// `shutdown` completes, then lets the connections in flight finish. Returns the bound address
/// (port 0 picks one).
pub async fn serve(
    what: &'static str,
    addr: SocketAddr,
    app: Router,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(SocketAddr, impl Future<Output = io::Result<()>>), ListenError> {
    serve_telling(what, addr, app, limits, None, shutdown).await
}

/// [`serve`], telling `turned_away` of every connection closed at accept.
pub async fn serve_telling(
    what: &'static str,
    addr: SocketAddr,
    app: Router,
    limits: HttpLimits,
    turned_away: Option<TurnedAway>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(SocketAddr, impl Future<Output = io::Result<()>>), ListenError> {
    let failed = |source| ListenError { what, addr, source };
    let listener = TcpListener::bind(addr).await.map_err(failed)?;
    let local = listener.local_addr().map_err(failed)?;
    let accepting = accept_loop(what, listener, app, limits, turned_away, shutdown);
    Ok((local, accepting))
}

async fn accept_loop(
    what: &'static str,
    listener: TcpListener,
    app: Router,
    limits: HttpLimits,
    turned_away: Option<TurnedAway>,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let builder = limits.http1();
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let sources = Sources::new(limits.max_connections_per_source);
    let graceful = GracefulShutdown::new();
    let mut warned_at: Option<Instant> = None;
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    accept_failed(what, &e).await;
                    continue;
                }
            },
        };
        // The source's share first, so that a source at its cap takes no global slot.
        let admitted = sources
            .admit(peer.ip())
            .map_err(|()| "per-source")
            .and_then(|held| {
                let slot = slots.clone().try_acquire_owned().map_err(|_| "total")?;
                Ok((held, slot))
            });
        let slot = match admitted {
            Ok(slot) => slot,
            Err(cap) => {
                // Closed before anything of it is read: a full cap costs no buffer.
                drop(stream);
                if let Some(tell) = &turned_away {
                    tell();
                }
                if warned_at.is_none_or(|at| at.elapsed() >= CAP_WARNING_INTERVAL) {
                    tracing::warn!(
                        server = what,
                        cap,
                        source = %peer.ip(),
                        max_connections = limits.max_connections,
                        max_connections_per_source = limits.max_connections_per_source,
                        "connection cap reached: closing new connections at once"
                    );
                    warned_at = Some(Instant::now());
                }
                continue;
            }
        };
        let io = TokioIo::new(IdleTimeout::new(stream, limits.idle_timeout));
        // The peer rides on every request of the connection (axum's `ConnectInfo`), so that
        // a handler can bound what one source may cost.
        let app = app
            .clone()
            .map_request(move |mut request: hyper::Request<Incoming>| {
                request.extensions_mut().insert(ConnectInfo(peer));
                request
            });
        let service = TowerToHyperService::new(app);
        let connection = graceful.watch(builder.serve_connection(io, service));
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(server = what, error = %e, "connection closed");
            }
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// The connections held per source address, each at most `cap`. A source leaves the map
/// with its last connection, so the map holds no more entries than there are connections.
struct Sources {
    held: Arc<Mutex<HashMap<IpAddr, usize>>>,
    cap: usize,
}

/// One admitted connection's place in its source's count, given back when dropped.
struct SourceSlot {
    held: Arc<Mutex<HashMap<IpAddr, usize>>>,
    source: IpAddr,
}

impl Sources {
    fn new(cap: usize) -> Self {
        Self {
            held: Arc::default(),
            cap,
        }
    }

    /// A place for one more connection from `source`, unless it holds its cap already.
    fn admit(&self, source: IpAddr) -> Result<SourceSlot, ()> {
        let mut held = lock(&self.held);
        let count = held.entry(source).or_default();
        if *count >= self.cap {
            return Err(());
        }
        *count += 1;
        Ok(SourceSlot {
            held: self.held.clone(),
            source,
        })
    }
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut held = lock(&self.held);
        if let Some(count) = held.get_mut(&self.source) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                held.remove(&self.source);
            }
        }
    }
}

/// The map's lock: each update is whole, so a panic elsewhere cannot leave it torn.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Waits out an accept error that is not one connection's own (those need no wait).
async fn accept_failed(what: &'static str, e: &io::Error) {
    use io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        e.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    ) {
        return;
    }
    tracing::warn!(server = what, error = %e, "accepting a connection failed");
    tokio::time::sleep(ACCEPT_BACKOFF).await;
}

/// For tests of the servers behind the listener.
#[cfg(any(test, feature = "test-util"))]
pub mod testing {
    use std::net::SocketAddr;

    use tokio::net::{TcpSocket, TcpStream};

    /// A connection to `addr` from the loopback address `source`: Linux answers on all of
    /// 127.0.0.0/8, so one test can be several sources.
    ///
    /// # Panics
    /// When the socket cannot be made, bound or connected: a test's failure.
    pub async fn connect_from(source: [u8; 4], addr: SocketAddr) -> TcpStream {
        let socket = TcpSocket::new_v4().expect("socket");
        socket
            .bind(SocketAddr::from((source, 0)))
            .expect("bind the source");
        socket.connect(addr).await.expect("connect")
    }
}

#[cfg(test)]
mod tests;
