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
//! - at most `max_connections_per_source` of them from one IP address (whatever its ports),
//!   closed the same way and taking no slot of the cap: one pod cannot take the whole cap, so
//!   the kubelet's probes (from the node's address) and the other pods' connections are still
//!   served while it floods;
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

mod admission;
mod idle_timeout;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::time::Instant;
use tower::ServiceExt as _;

use crate::admission::{Admission, Cap};
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
/// The most connections one source address is given by default, whatever the cap: a worker
/// pod holds one kept-alive connection to the progress port, and a node whose worker pods
/// share its address (host networking) one per worker, so 64 leaves room for a node of 8 or
/// 16 GPUs several times over (a trainer that reconnects while its old connection drains),
/// and a flooding pod holds no more than 1/32 of the progress port's 2,048.
pub const DEFAULT_MAX_CONNECTIONS_PER_SOURCE: usize = 64;
/// hyper refuses a read buffer smaller than this.
const MIN_READ_BUFFER: usize = 8 * 1024;
/// How long accepting pauses after an error that is not one connection's (out of file
/// descriptors), so that the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// How often at most the listener warns that a connection cap (each of the two on its own)
/// turns connections away.
const CAP_WARNING_INTERVAL: Duration = Duration::from_secs(60);

/// What one listener allows a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpLimits {
    /// Connections held at once; more are closed at accept.
    pub max_connections: usize,
    /// Connections held at once from one IP address, its ports all counted together (a pod
    /// opens each connection from a new port); more from it are closed at accept, and take
    /// no slot of `max_connections`. 0 closes every connection, as a cap of 0 does.
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
    /// The default limits, with a cap of `max_connections`, and per source an eighth of it,
    /// at least one and at most [`DEFAULT_MAX_CONNECTIONS_PER_SOURCE`]. An eighth, so that a
    /// small cap takes eight sources to fill: the metrics port's 64 leave 8 to one address (a
    /// probe or a scrape holds one, briefly). At most 64, as no source needs more: the
    /// progress port's 2,048 leave 64 to one address, one kept-alive connection per worker.
    pub const fn with_max_connections(max_connections: usize) -> Self {
        let per_source = max_connections / 8;
        let per_source = if per_source > DEFAULT_MAX_CONNECTIONS_PER_SOURCE {
            DEFAULT_MAX_CONNECTIONS_PER_SOURCE
        } else if per_source == 0 {
            1
        } else {
            per_source
        };
        Self {
            max_connections,
            max_connections_per_source: per_source,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
        }
    }

    /// These limits, with `max_connections_per_source` connections per source address.
    #[must_use]
    pub const fn with_per_source(self, max_connections_per_source: usize) -> Self {
        Self {
            max_connections_per_source,
            ..self
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

/// Called for each connection closed at accept because the whole cap is full: the progress
/// port counts it as trouble of the channel (a rank whose reports stop then is not quiet). A
/// connection closed because its own source is over its share is not told: that source alone
/// is turned away, every other one is still served.
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

/// [`serve`], telling `turned_away` of every connection closed at accept for the whole cap.
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
    let admission = Admission::new(limits.max_connections, limits.max_connections_per_source);
    let graceful = GracefulShutdown::new();
    let mut warnings = CapWarnings::default();
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
        let admitted = match admission.admit(peer.ip()) {
            Ok(admitted) => admitted,
            Err(cap) => {
                // Closed before anything of it is read: a full cap costs no buffer.
                drop(stream);
                if let (Cap::Global, Some(tell)) = (cap, &turned_away) {
                    tell();
                }
                warnings.turned_away(what, cap, peer, &limits);
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
            // Its slot of the cap and its place in its source's count, together.
            drop(admitted);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// When each cap last warned: each on its own clock, so that one pod at its share, warned
/// of, does not hide the whole cap filling up.
#[derive(Default)]
struct CapWarnings {
    global: Option<Instant>,
    per_source: Option<Instant>,
}

impl CapWarnings {
    /// Warns that `cap` closed a connection from `peer`, unless it did within the interval.
    fn turned_away(&mut self, what: &'static str, cap: Cap, peer: SocketAddr, limits: &HttpLimits) {
        let warned_at = match cap {
            Cap::Global => &mut self.global,
            Cap::PerSource => &mut self.per_source,
        };
        if warned_at.is_some_and(|at| at.elapsed() < CAP_WARNING_INTERVAL) {
            return;
        }
        *warned_at = Some(Instant::now());
        match cap {
            Cap::Global => tracing::warn!(
                server = what,
                %cap,
                max_connections = limits.max_connections,
                "connection cap reached: closing new connections at once"
            ),
            Cap::PerSource => tracing::warn!(
                server = what,
                %cap,
                source = %peer.ip(),
                max_connections_per_source = limits.max_connections_per_source,
                "connection cap of one source address reached: closing its new connections at once"
            ),
        }
    }
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
