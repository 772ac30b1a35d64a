//! The operator's HTTP listeners (metrics and health, the progress channel): bind, then serve
//! a router until shutdown, within [`HttpLimits`].
//!
//! Pods the operator does not trust reach both ports (every pod the NetworkPolicy admits, or
//! every pod without one), so each connection costs a bounded amount of memory for a bounded
//! time, and their number is bounded:
//!
//! - at most `max_connections` at once: one more is closed as soon as it is accepted, before
//!   anything of it is read (never queued or buffered);
//! - a request head must be complete within `header_timeout` of the connection opening or of
//!   its previous answer, so the same bound closes a kept-alive connection that sits idle;
//! - a head holds at most `max_header_bytes` (larger: 431 and closed), and hyper's read buffer
//!   is capped to match (its default grows to ~400 KiB a connection);
//! - a connection on which no byte moves either way for `idle_timeout` while the server waits
//!   on its peer (a body that stops coming, an answer the peer stops reading) is closed.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::time::{Instant, Sleep};

use crate::error::Error;

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
    /// The default limits, with a cap of `max_connections`.
    pub const fn with_max_connections(max_connections: usize) -> Self {
        Self {
            max_connections,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
        }
    }

    /// The progress port's defaults.
    pub const PROGRESS: Self = Self::with_max_connections(DEFAULT_PROGRESS_CONNECTIONS);
    /// The metrics port's defaults.
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
) -> Result<(SocketAddr, impl Future<Output = io::Result<()>>), Error> {
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
) -> Result<(SocketAddr, impl Future<Output = io::Result<()>>), Error> {
    let failed = |source| Error::Listen { what, addr, source };
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
    let graceful = GracefulShutdown::new();
    let mut warned_at: Option<Instant> = None;
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    accept_failed(what, &e).await;
                    continue;
                }
            },
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            // Closed before anything of it is read: a full cap costs no buffer.
            drop(stream);
            if let Some(tell) = &turned_away {
                tell();
            }
            if warned_at.is_none_or(|at| at.elapsed() >= CAP_WARNING_INTERVAL) {
                tracing::warn!(
                    server = what,
                    max_connections = limits.max_connections,
                    "connection cap reached: closing new connections at once"
                );
                warned_at = Some(Instant::now());
            }
            continue;
        };
        let io = TokioIo::new(IdleTimeout::new(stream, limits.idle_timeout));
        let service = TowerToHyperService::new(app.clone());
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

/// A stream that fails with `TimedOut` once no byte has moved either way for `timeout` while
/// it is waited on: the server gives up on a peer that stopped sending or reading.
struct IdleTimeout<S> {
    inner: S,
    timeout: Duration,
    deadline: Pin<Box<Sleep>>,
}

impl<S> IdleTimeout<S> {
    fn new(inner: S, timeout: Duration) -> Self {
        Self {
            inner,
            timeout,
            deadline: Box::pin(tokio::time::sleep(timeout)),
        }
    }

    fn moved(&mut self) {
        let next = Instant::now() + self.timeout;
        self.deadline.as_mut().reset(next);
    }

    /// What a pending read or write answers: still pending, or the timeout.
    fn pending<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "no byte moved within the idle timeout",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn wrote(
        &mut self,
        cx: &mut Context<'_>,
        written: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        match written {
            Poll::Pending => self.pending(cx),
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.moved();
                }
                Poll::Ready(Ok(n))
            }
            failed => failed,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for IdleTimeout<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Pending => this.pending(cx),
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.moved();
                }
                Poll::Ready(Ok(()))
            }
            failed => failed,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for IdleTimeout<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.wrote(cx, written)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.wrote(cx, written)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_flush(cx) {
            Poll::Pending => this.pending(cx),
            done => done,
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_shutdown(cx) {
            Poll::Pending => this.pending(cx),
            done => done,
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;
    use crate::metrics::Metrics;

    /// The metrics server on a free port within `limits`, and what stops it.
    async fn metrics_within(limits: HttpLimits) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let metrics = Arc::new(Metrics::new());
        let addr = "127.0.0.1:0".parse().expect("addr");
        let (local, serving) = crate::metrics::serve(addr, metrics, limits, async {
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
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        let request = "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
        if stream.write_all(request.as_bytes()).await.is_err() {
            return String::new();
        }
        read_all(&mut stream).await
    }

    fn long_lived(max_connections: usize) -> HttpLimits {
        HttpLimits {
            header_timeout: Duration::from_secs(3600),
            idle_timeout: Duration::from_secs(3600),
            ..HttpLimits::with_max_connections(max_connections)
        }
    }

    #[tokio::test]
    async fn a_connection_beyond_the_cap_is_closed_at_accept_and_a_freed_slot_serves_again() {
        let (addr, _stop) = metrics_within(long_lived(2)).await;
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
        let told = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = told.clone();
        let tell: TurnedAway = Arc::new(move || {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let app = Router::new().route("/healthz", axum::routing::get(|| async { "ok" }));
        let addr = "127.0.0.1:0".parse().expect("addr");
        let (addr, serving) = serve_telling("test", addr, app, long_lived(1), Some(tell), async {
            let _ = stopped.await;
        })
        .await
        .expect("bind");
        tokio::spawn(serving);
        let _held = TcpStream::connect(addr).await.expect("connect");
        for _ in 0..3 {
            assert_eq!(healthz(addr).await, "");
        }
        assert_eq!(told.load(std::sync::atomic::Ordering::SeqCst), 3);
        drop(stop);
    }

    #[tokio::test]
    async fn a_head_over_the_limit_is_answered_431_and_closed() {
        let limits = HttpLimits {
            max_header_bytes: 2 * 1024,
            ..long_lived(4)
        };
        let (addr, _stop) = metrics_within(limits).await;
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
        let (addr, _stop) = metrics_within(limits).await;
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

    #[tokio::test(start_paused = true)]
    async fn a_stream_on_which_nothing_moves_for_the_idle_timeout_fails() {
        let timeout = Duration::from_secs(30);
        let (ours, mut peer) = tokio::io::duplex(64);
        let mut stream = IdleTimeout::new(ours, timeout);

        // Bytes that arrive keep it alive, longer than the timeout in all.
        for _ in 0..4 {
            tokio::time::sleep(Duration::from_secs(20)).await;
            peer.write_all(b"x").await.expect("write");
            let mut byte = [0u8; 1];
            stream.read_exact(&mut byte).await.expect("a byte");
        }
        // Then nothing: a read waits out the timeout and fails.
        let mut byte = [0u8; 1];
        let error = stream.read_exact(&mut byte).await.expect_err("timed out");
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);

        // A write that cannot proceed (the peer reads nothing) fails the same way.
        let (ours, _peer) = tokio::io::duplex(8);
        let mut stream = IdleTimeout::new(ours, timeout);
        let error = stream.write_all(&[0u8; 64]).await.expect_err("timed out");
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
    }
}
