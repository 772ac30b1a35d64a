//! The idle timeout of a connection: a stream that fails once nothing moves on it.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// A stream that fails with `TimedOut` once no byte has moved either way for `timeout` while
/// it is waited on: the server gives up on a peer that stopped sending or reading.
pub(crate) struct IdleTimeout<S> {
    inner: S,
    timeout: Duration,
    deadline: Pin<Box<Sleep>>,
}

impl<S> IdleTimeout<S> {
    pub(crate) fn new(inner: S, timeout: Duration) -> Self {
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

    use super::*;

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
