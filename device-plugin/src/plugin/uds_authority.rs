//! Lets kubelets older than 1.26 talk to our tonic server, within bounds.
//!
//! Those kubelets dial a device plugin with grpc-go, passing the socket path
//! as the target, so every request carries `:authority:
//! /var/lib/kubelet/device-plugins/<plugin>.sock`. h2 (under tonic) rejects
//! that as a malformed authority and resets the stream with PROTOCOL_ERROR,
//! so ListAndWatch dies at once and the node never gets capacity
//! (hyperium/h2#487 is still open). Kubernetes 1.26 switched to `localhost`.
//!
//! [`Gate::admit`] sits between an accepted unix-socket connection and the
//! HTTP/2 server: it decodes every client header block with HPACK, replaces
//! an authority that is not a valid URI authority with `localhost`, and
//! re-encodes the block with its own encoder. Every block is re-encoded (not
//! only the rewritten ones) so that the server's HPACK decoder state always
//! mirrors one encoder. All other frames, and the server's bytes, pass
//! through untouched.
//!
//! Decoding a client's headers is work done before the HTTP/2 server's own
//! limits apply, so this module applies its own: at most
//! [`MAX_CONNECTIONS`] connections at once (more are refused), a preface and
//! first frame within [`FIRST_FRAME_TIMEOUT`], frames of at most
//! [`MAX_FRAME_PAYLOAD`] bytes, an HPACK dynamic table of at most
//! [`MAX_HPACK_TABLE_SIZE`] bytes and a decoded header list of at most
//! [`MAX_HEADER_LIST_SIZE`] bytes. A connection that breaks a limit is
//! closed at once, in both directions. What one connection can make this
//! module hold is bounded by [`MAX_BUFFERED_PER_CONNECTION`] (about 250 KiB,
//! most of it pipe space used only while bytes are in flight), and all of
//! them by that times [`MAX_CONNECTIONS`] (about 2 MiB).
//!
//! A client that completes the handshake and then stays silent keeps its
//! slot only while it is alive and in use: the kubelet's own ListAndWatch
//! connection looks exactly like that (the server streams, the client only
//! listens), but it answers the server's HTTP/2 PINGs (the kubelet module
//! turns keepalive on) and has a call open. A client that stops answering
//! PINGs is closed by the server, and the pump ends with it, whether or not
//! the client still reads; a connection with no call open for
//! [`Limits::idle_timeout`] is closed here. So a dead or idle client cannot
//! hold a slot the kubelet needs to connect again.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use loona_hpack::{Decoder, Encoder};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};
use tokio::net::UnixListener;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::{CancellationToken, DropGuard};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADERS: u8 = 0x1;
const FRAME_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
const FRAME_HEADER_LEN: usize = 9;
/// Bytes buffered in each direction between this module and the HTTP/2 server.
const PIPE_BUFFER: usize = 64 * 1024;

/// Largest frame payload a client may send: SETTINGS_MAX_FRAME_SIZE's
/// initial value (RFC 9113 §6.5.2), which the server never raises (the
/// kubelet module pins it with `Server::max_frame_size`). A larger frame is a
/// protocol error the server would refuse anyway; refusing it here means no
/// frame buffer is ever larger. Also the chunk size of re-encoded blocks.
pub const MAX_FRAME_PAYLOAD: usize = 16_384;

/// Largest HPACK dynamic table a client may make the decoder keep:
/// SETTINGS_HEADER_TABLE_SIZE's initial value (RFC 9113 §6.5.2), which the
/// server never changes. A client's table-size update above it is an HPACK
/// decoding error (RFC 7541 §4.2), so the table cannot grow past 4 KiB
/// however many headers a client asks it to index.
pub(crate) const MAX_HPACK_TABLE_SIZE: usize = 4_096;

/// Largest decoded header list of one request, counted as
/// SETTINGS_MAX_HEADER_LIST_SIZE is (name + value + 32 per field, RFC 9113
/// §6.5.2). A kubelet's request headers come to well under 1 KiB; 16 KiB
/// leaves room for tracing and other metadata. The cap is what makes HPACK
/// safe to decode: a block of a few bytes can refer to a 4 KiB table entry
/// thousands of times. The encoded block (HEADERS plus CONTINUATION) is held
/// to the same size, since an honest encoding is never larger than what it
/// decodes to. The server advertises this value too, so well-behaved
/// clients know it.
pub const MAX_HEADER_LIST_SIZE: usize = 16 * 1024;

/// How long a new connection has to send the HTTP/2 preface and its first
/// frame (its SETTINGS, which RFC 9113 §3.4 requires at once). grpc-go sends
/// both right after connecting, microseconds on a local socket; 10 s is
/// generous for a loaded node and short enough that a client that connects
/// and says nothing frees its slot quickly.
pub const FIRST_FRAME_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections served at once. A kubelet makes every call over one
/// connection (two while it re-dials after a restart); 8 leave room for a
/// debugging client or two and keep the worst case to 8 ×
/// [`MAX_BUFFERED_PER_CONNECTION`], about 2 MiB, against the plugin's 10 MiB
/// resident-set target. More connections are accepted and closed at once,
/// so a client learns right away instead of hanging.
pub const MAX_CONNECTIONS: usize = 8;

/// How long a connection may have no call open before it is closed. The
/// kubelet opens ListAndWatch right after it connects and keeps it open,
/// so its connection is never idle; a debugging client that connected and
/// walked away frees its slot.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(120);

/// How long what the server wrote last (its GOAWAY) may take to reach the
/// client once the server has closed the connection; a client that does
/// not read is not waited for longer.
const SERVER_CLOSE_FLUSH: Duration = Duration::from_secs(1);

/// An upper estimate of what this module holds for one connection: the
/// pipe to the server both ways, one frame being read, the header block
/// being assembled, the decoded names and values, their per-field `Vec`
/// headers (48 bytes per field, a field counting at least 32 bytes, doubled
/// for the list's growth: 3 × the cap), the re-encoded block, and the
/// decoder's and encoder's dynamic tables.
pub(crate) const MAX_BUFFERED_PER_CONNECTION: usize = 2 * PIPE_BUFFER
    + FRAME_HEADER_LEN
    + MAX_FRAME_PAYLOAD
    + MAX_HEADER_LIST_SIZE
    + MAX_HEADER_LIST_SIZE
    + 3 * MAX_HEADER_LIST_SIZE
    + MAX_HEADER_LIST_SIZE
    + 2 * MAX_HPACK_TABLE_SIZE;

// The bounds fit together: any frame fits in a header block, and all
// connections together stay within 2 MiB. Checked when compiling.
const _: () = assert!(MAX_HEADER_LIST_SIZE >= MAX_FRAME_PAYLOAD);
const _: () = assert!(MAX_CONNECTIONS * MAX_BUFFERED_PER_CONNECTION <= 2 * 1024 * 1024);

/// The bounds applied to clients of the plugin socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once.
    pub max_connections: usize,
    /// Time for the preface and the first frame.
    pub first_frame_timeout: Duration,
    /// Largest decoded (and encoded) header list of one request.
    pub max_header_list_size: usize,
    /// Longest time a connection may have no call open.
    pub idle_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: MAX_CONNECTIONS,
            first_frame_timeout: FIRST_FRAME_TIMEOUT,
            max_header_list_size: MAX_HEADER_LIST_SIZE,
            idle_timeout: IDLE_TIMEOUT,
        }
    }
}

/// The calls open on one connection. The server hands it to every request
/// as the connection's connect info; each RPC handler holds an [`OpenCall`]
/// while it runs (ListAndWatch for as long as its stream lasts), and the
/// connection's pump closes the connection once none has been open for
/// [`Limits::idle_timeout`].
#[derive(Debug, Clone, Default)]
pub struct ConnectionActivity(Arc<Activity>);

#[derive(Debug, Default)]
struct Activity {
    open: AtomicUsize,
    changed: Notify,
}

/// One call open on a connection; dropping it ends the call.
#[derive(Debug)]
pub(crate) struct OpenCall(Arc<Activity>);

impl Drop for OpenCall {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
        self.0.changed.notify_one();
    }
}

impl ConnectionActivity {
    /// Marks a call open until the returned guard is dropped.
    pub(crate) fn open_call(&self) -> OpenCall {
        self.0.open.fetch_add(1, Ordering::SeqCst);
        self.0.changed.notify_one();
        OpenCall(Arc::clone(&self.0))
    }

    /// Calls open now.
    pub(crate) fn open_calls(&self) -> usize {
        self.0.open.load(Ordering::SeqCst)
    }

    /// Resolves once no call has been open for `limit` in a row.
    async fn idle_for(&self, limit: Duration) {
        loop {
            if self.open_calls() > 0 {
                self.0.changed.notified().await;
                continue;
            }
            tokio::select! {
                () = tokio::time::sleep(limit) => if self.open_calls() == 0 {
                    return;
                },
                // A call opened or ended: the idle time starts again.
                () = self.0.changed.notified() => {}
            }
        }
    }
}

/// A connection whose client → server half has had its `:authority`
/// normalised. Hand it to the HTTP/2 server instead of the raw stream.
pub struct Normalized {
    inner: DuplexStream,
    activity: ConnectionActivity,
    /// Tells the pump, when the server drops the connection, that it is over.
    _closed: DropGuard,
}

impl AsyncRead for Normalized {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Normalized {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Normalized {
    type ConnectInfo = ConnectionActivity;
    fn connect_info(&self) -> Self::ConnectInfo {
        self.activity.clone()
    }
}

/// Admits the connections of one listener, at most `max_connections` at once.
#[derive(Debug, Clone)]
pub struct Gate {
    limits: Limits,
    permits: Arc<Semaphore>,
}

impl Gate {
    /// A gate with no connection open.
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            permits: Arc::new(Semaphore::new(limits.max_connections)),
        }
    }

    /// Connections admitted and not yet closed.
    pub fn open_connections(&self) -> usize {
        self.limits.max_connections - self.permits.available_permits()
    }

    /// Wraps `conn` (an accepted client connection) and spawns its pumps on
    /// the current tokio runtime; they end when either side closes or the
    /// client breaks a limit. Over the connection limit `conn` is dropped,
    /// which closes it, and `None` is returned.
    pub(crate) fn admit<S>(&self, conn: S) -> Option<Normalized>
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let Ok(permit) = Arc::clone(&self.permits).try_acquire_owned() else {
            tracing::warn!(
                limit = self.limits.max_connections,
                "refusing a connection to the plugin socket: too many open connections"
            );
            return None;
        };
        let (ours, theirs) = tokio::io::duplex(PIPE_BUFFER);
        let activity = ConnectionActivity::default();
        let closed = CancellationToken::new();
        let ends = Ends {
            limits: self.limits,
            activity: activity.clone(),
            server_closed: closed.clone(),
            _permit: permit,
        };
        tokio::spawn(pump(conn, theirs, ends));
        Some(Normalized {
            inner: ours,
            activity,
            _closed: closed.drop_guard(),
        })
    }

    /// Admitted connections of `listener`, for `serve_with_incoming`; refused ones never get there.
    pub fn incoming(
        self,
        listener: UnixListener,
    ) -> impl Stream<Item = io::Result<Normalized>> + Send + 'static {
        UnixListenerStream::new(listener).filter_map(move |conn| match conn {
            Ok(conn) => self.admit(conn).map(Ok),
            Err(e) => Some(Err(e)),
        })
    }
}

/// What ends one connection's pump besides its bytes, and the slot it holds.
struct Ends {
    limits: Limits,
    /// The calls open on the connection: none for the idle timeout ends it.
    activity: ConnectionActivity,
    /// Cancelled when the server drops its end (keepalive timeout, shutdown).
    server_closed: CancellationToken,
    _permit: OwnedSemaphorePermit,
}

/// Moves bytes between the client and the server until the connection is
/// over, holding the connection's permit. Returning drops every half: the
/// client's socket closes and the server reads end-of-stream, so the
/// connection ends both ways.
async fn pump<S>(conn: S, theirs: DuplexStream, ends: Ends)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (client_read, mut client_write) = tokio::io::split(conn);
    let (mut server_read, server_write) = tokio::io::split(theirs);
    let to_server = rewrite_client_stream_with(client_read, server_write, ends.limits);
    let to_client = async move {
        let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
        let _ = client_write.shutdown().await;
    };
    tokio::pin!(to_server, to_client);
    // The server is done once its bytes are through, or once it dropped the
    // connection even while a client that does not read keeps `to_client`
    // waiting: what is left then gets a short flush.
    let server_done = async {
        tokio::select! {
            () = &mut to_client => {}
            () = ends.server_closed.cancelled() => {
                let _ = tokio::time::timeout(SERVER_CLOSE_FLUSH, &mut to_client).await;
            }
        }
    };
    tokio::pin!(server_done);
    tokio::select! {
        result = &mut to_server => match result {
            // The client is done sending; the server may still answer.
            Ok(()) => server_done.await,
            Err(e) => tracing::debug!(error = %e, "closing a plugin socket connection"),
        },
        () = &mut server_done => {}
        () = ends.activity.idle_for(ends.limits.idle_timeout) => {
            tracing::debug!(
                idle = ?ends.limits.idle_timeout,
                "closing a plugin socket connection with no call open"
            );
        }
    }
}

/// True when `value` can't be a URI authority (a socket path, say).
fn needs_rewrite(value: &[u8]) -> bool {
    std::str::from_utf8(value)
        .ok()
        .and_then(|s| s.parse::<http::uri::Authority>().ok())
        .is_none()
}

/// One frame: type, flags, stream id, payload.
type Frame = (u8, u8, u32, Vec<u8>);

/// [`rewrite_client_stream_with`] under the default [`Limits`].
#[cfg(test)]
pub(crate) async fn rewrite_client_stream<R, W>(input: R, out: W) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    rewrite_client_stream_with(input, out, Limits::default()).await
}

/// Copies the client's HTTP/2 byte stream to `out`, re-encoding header
/// blocks. Ends `Ok` when the client closes; any broken limit or protocol
/// violation is an error, on which the caller closes the connection.
pub(crate) async fn rewrite_client_stream_with<R, W>(
    mut input: R,
    mut out: W,
    limits: Limits,
) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let first = tokio::time::timeout(limits.first_frame_timeout, async {
        let mut preface = [0u8; PREFACE.len()];
        input.read_exact(&mut preface).await?;
        if preface != PREFACE {
            // Not HTTP/2 with prior knowledge, which is all the server speaks.
            return Err(invalid("not an HTTP/2 connection preface"));
        }
        read_frame(&mut input).await
    })
    .await
    .map_err(|_| {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "no HTTP/2 preface and first frame within {:?}",
                limits.first_frame_timeout
            ),
        )
    })??;
    out.write_all(PREFACE).await?;
    let mut rewriter = Rewriter::new(limits.max_header_list_size);
    let mut next = first;
    loop {
        let Some(frame) = next else {
            out.shutdown().await?;
            return Ok(());
        };
        rewriter.forward(frame, &mut input, &mut out).await?;
        next = read_frame(&mut input).await?;
    }
}

/// The HPACK state of one connection.
struct Rewriter {
    decoder: Decoder<'static>,
    encoder: Encoder<'static>,
    max_header_list_size: usize,
}

impl Rewriter {
    fn new(max_header_list_size: usize) -> Self {
        let mut decoder = Decoder::new();
        decoder.set_max_allowed_table_size(MAX_HPACK_TABLE_SIZE);
        Self {
            decoder,
            encoder: Encoder::new(),
            max_header_list_size,
        }
    }

    /// Passes one frame on; a HEADERS frame is completed with its
    /// CONTINUATION frames from `input`, decoded, rewritten and re-encoded.
    async fn forward<R, W>(&mut self, frame: Frame, input: &mut R, out: &mut W) -> io::Result<()>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let (kind, flags, stream, payload) = frame;
        if kind != FRAME_HEADERS {
            write_frame(out, kind, flags, stream, &payload).await?;
            return out.flush().await;
        }
        let mut block = header_fragment(flags, &payload)?;
        let mut end_headers = flags & FLAG_END_HEADERS != 0;
        while !end_headers {
            let (k, f, s, p) = read_frame(input)
                .await?
                .ok_or_else(|| invalid("connection closed inside a header block"))?;
            if k != FRAME_CONTINUATION || s != stream {
                return Err(invalid("header block interrupted by another frame"));
            }
            if block.len() + p.len() > self.max_header_list_size {
                return Err(invalid("header block larger than the header list cap"));
            }
            block.extend_from_slice(&p);
            end_headers = f & FLAG_END_HEADERS != 0;
        }
        let mut headers = decode_capped(&mut self.decoder, &block, self.max_header_list_size)?;
        for (name, value) in headers.iter_mut() {
            if name.as_slice() == b":authority" && needs_rewrite(value) {
                *value = b"localhost".to_vec();
            }
        }
        let encoded = self
            .encoder
            .encode(headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
        let chunks: Vec<&[u8]> = if encoded.is_empty() {
            vec![&[][..]]
        } else {
            encoded.chunks(MAX_FRAME_PAYLOAD).collect()
        };
        let last = chunks.len() - 1;
        for (i, chunk) in chunks.into_iter().enumerate() {
            let (kind, mut f) = if i == 0 {
                (FRAME_HEADERS, flags & FLAG_END_STREAM)
            } else {
                (FRAME_CONTINUATION, 0)
            };
            if i == last {
                f |= FLAG_END_HEADERS;
            }
            write_frame(out, kind, f, stream, chunk).await?;
        }
        out.flush().await
    }
}

/// Decodes one header block, keeping at most `cap` bytes of headers
/// (counted as SETTINGS_MAX_HEADER_LIST_SIZE is); a larger list is an error.
/// Past the cap nothing more is copied, so decoding a hostile block costs
/// time in proportion to its (capped) encoded size and no memory.
fn decode_capped(
    decoder: &mut Decoder<'_>,
    block: &[u8],
    cap: usize,
) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut headers = Vec::new();
    let mut size = 0usize;
    let mut over = false;
    decoder
        .decode_with_cb(block, |name, value| {
            if over {
                return;
            }
            size = size.saturating_add(name.len() + value.len() + 32);
            if size > cap {
                over = true;
                headers = Vec::new();
                return;
            }
            headers.push((name.into_owned(), value.into_owned()));
        })
        .map_err(|e| invalid(&format!("HPACK decoding failed: {e}")))?;
    if over {
        return Err(invalid(&format!(
            "decoded header list larger than {cap} bytes"
        )));
    }
    Ok(headers)
}

/// The header block fragment of a HEADERS frame, without padding and
/// priority fields (priority is advisory and dropped).
fn header_fragment(flags: u8, payload: &[u8]) -> io::Result<Vec<u8>> {
    let mut start = 0;
    let mut end = payload.len();
    if flags & FLAG_PADDED != 0 {
        let pad = *payload
            .first()
            .ok_or_else(|| invalid("PADDED HEADERS without pad length"))?
            as usize;
        start += 1;
        end = end
            .checked_sub(pad)
            .ok_or_else(|| invalid("HEADERS padding longer than the frame"))?;
    }
    if flags & FLAG_PRIORITY != 0 {
        start += 5;
    }
    if start > end {
        return Err(invalid("HEADERS frame too short"));
    }
    Ok(payload[start..end].to_vec())
}

async fn read_frame<R: AsyncRead + Unpin>(input: &mut R) -> io::Result<Option<Frame>> {
    let mut head = [0u8; FRAME_HEADER_LEN];
    match input.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    if len > MAX_FRAME_PAYLOAD {
        return Err(invalid("frame larger than SETTINGS_MAX_FRAME_SIZE"));
    }
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    let mut payload = vec![0u8; len];
    input.read_exact(&mut payload).await?;
    Ok(Some((head[3], head[4], stream, payload)))
}

async fn write_frame<W: AsyncWrite + Unpin>(
    out: &mut W,
    kind: u8,
    flags: u8,
    stream: u32,
    payload: &[u8],
) -> io::Result<()> {
    let len = payload.len() as u32;
    let mut head = [0u8; FRAME_HEADER_LEN];
    head[..3].copy_from_slice(&len.to_be_bytes()[1..]);
    head[3] = kind;
    head[4] = flags;
    head[5..].copy_from_slice(&stream.to_be_bytes());
    out.write_all(&head).await?;
    out.write_all(payload).await
}

fn invalid(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_owned())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
        v.push(kind);
        v.push(flags);
        v.extend_from_slice(&stream.to_be_bytes());
        v.extend_from_slice(payload);
        v
    }

    fn parse_frames(mut bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        let mut out = Vec::new();
        while bytes.len() >= 9 {
            let len = u32::from_be_bytes([0, bytes[0], bytes[1], bytes[2]]) as usize;
            let stream = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]);
            out.push((bytes[3], bytes[4], stream, bytes[9..9 + len].to_vec()));
            bytes = &bytes[9 + len..];
        }
        out
    }

    async fn run(input: Vec<u8>) -> Vec<u8> {
        let mut out = Vec::new();
        rewrite_client_stream(&input[..], &mut out)
            .await
            .expect("rewrite");
        out
    }

    fn request_headers(authority: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/v1beta1.DevicePlugin/ListAndWatch"),
            (":authority", authority),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
        .iter()
        .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect()
    }

    #[tokio::test]
    async fn socket_path_authority_becomes_localhost_and_other_headers_survive() {
        let mut client = Encoder::new();
        let sent = request_headers("/var/lib/kubelet/device-plugins/trainyard.sock");
        let block = client.encode(sent.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
        let mut input = PREFACE.to_vec();
        input.extend(frame(0x4, 0, 0, &[])); // SETTINGS passes through
        input.extend(frame(FRAME_HEADERS, FLAG_END_HEADERS, 1, &block));
        input.extend(frame(0x0, FLAG_END_STREAM, 1, b"\0\0\0\0\0")); // DATA passes through

        let out = run(input).await;
        assert_eq!(&out[..PREFACE.len()], PREFACE);
        let frames = parse_frames(&out[PREFACE.len()..]);
        assert_eq!(frames.len(), 3);
        assert_eq!((frames[0].0, frames[0].3.len()), (0x4, 0));
        assert_eq!(frames[1].0, FRAME_HEADERS);
        assert_eq!(frames[1].1, FLAG_END_HEADERS);
        let got = Decoder::new().decode(&frames[1].3).expect("decodes");
        assert_eq!(got, request_headers("localhost"));
        assert_eq!(frames[2], (0x0, FLAG_END_STREAM, 1, b"\0\0\0\0\0".to_vec()));
    }

    #[tokio::test]
    async fn valid_authority_is_kept_and_decoder_state_stays_in_step_across_requests() {
        // The client's encoder indexes headers in its dynamic table; the second
        // request refers to those entries, so decoding it needs the first.
        let mut client = Encoder::new();
        let mut server = Decoder::new();
        let mut input = PREFACE.to_vec();
        for (i, authority) in ["/run/a.sock", "localhost:1234", "/run/a.sock"]
            .iter()
            .enumerate()
        {
            let h = request_headers(authority);
            let block = client.encode(h.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
            input.extend(frame(
                FRAME_HEADERS,
                FLAG_END_HEADERS | FLAG_END_STREAM,
                1 + 2 * i as u32,
                &block,
            ));
        }
        let out = run(input).await;
        let frames = parse_frames(&out[PREFACE.len()..]);
        let decoded: Vec<_> = frames
            .iter()
            .map(|f| server.decode(&f.3).expect("decodes"))
            .collect();
        assert_eq!(decoded[0], request_headers("localhost"));
        assert_eq!(decoded[1], request_headers("localhost:1234"));
        assert_eq!(decoded[2], request_headers("localhost"));
        assert!(
            frames.iter().all(|f| f.1 & FLAG_END_STREAM != 0),
            "END_STREAM kept"
        );
    }

    #[tokio::test]
    async fn padded_prioritised_and_continued_header_blocks_are_reassembled() {
        let mut client = Encoder::new();
        let block = client.encode(
            request_headers("/x.sock")
                .iter()
                .map(|(n, v)| (n.as_slice(), v.as_slice())),
        );
        let (a, b) = block.split_at(block.len() / 2);
        let mut payload = vec![3u8]; // pad length
        payload.extend_from_slice(&[0, 0, 0, 0, 16]); // priority fields
        payload.extend_from_slice(a);
        payload.extend_from_slice(&[0, 0, 0]);
        let mut input = PREFACE.to_vec();
        input.extend(frame(
            FRAME_HEADERS,
            FLAG_PADDED | FLAG_PRIORITY,
            5,
            &payload,
        ));
        input.extend(frame(FRAME_CONTINUATION, FLAG_END_HEADERS, 5, b));
        let out = run(input).await;
        let frames = parse_frames(&out[PREFACE.len()..]);
        assert_eq!(frames.len(), 1);
        assert_eq!(frames[0].1, FLAG_END_HEADERS);
        assert_eq!(
            Decoder::new().decode(&frames[0].3).expect("decodes"),
            request_headers("localhost")
        );
    }

    #[tokio::test]
    async fn garbage_and_truncated_blocks_are_errors_not_panics() {
        let mut input = PREFACE.to_vec();
        input.extend(frame(FRAME_HEADERS, FLAG_PADDED, 1, &[200, 1, 2]));
        assert!(
            rewrite_client_stream(&input[..], &mut Vec::new())
                .await
                .is_err()
        );
        let mut input = PREFACE.to_vec();
        input.extend(frame(FRAME_HEADERS, 0, 1, &[0x82]));
        input.extend(frame(0x0, 0, 1, b"x"));
        assert!(
            rewrite_client_stream(&input[..], &mut Vec::new())
                .await
                .is_err()
        );
        let mut input = PREFACE.to_vec();
        input.extend(frame(
            FRAME_HEADERS,
            FLAG_END_HEADERS,
            1,
            &[0xff, 0xff, 0xff, 0xff],
        ));
        assert!(
            rewrite_client_stream(&input[..], &mut Vec::new())
                .await
                .is_err()
        );
    }

    #[test]
    fn only_invalid_authorities_are_rewritten() {
        assert!(needs_rewrite(b"/var/lib/kubelet/device-plugins/x.sock"));
        assert!(!needs_rewrite(b"localhost"));
        assert!(!needs_rewrite(b"localhost:50051"));
    }

    /// A block that indexes one big header, then refers to it `refs` times:
    /// a few bytes on the wire, `refs` times the header once decoded.
    fn amplifying_block(refs: usize) -> Vec<u8> {
        let mut client = Encoder::new();
        let big = vec![b'x'; 4000];
        // Literal with incremental indexing: it becomes dynamic entry 62.
        let mut block = client.encode([(&b"x-big"[..], &big[..])]);
        block.extend(std::iter::repeat_n(0x80 | 62, refs));
        block
    }

    #[tokio::test]
    async fn a_header_block_that_decodes_past_the_cap_is_refused() {
        let mut input = PREFACE.to_vec();
        input.extend(frame(0x4, 0, 0, &[]));
        let block = amplifying_block(10);
        assert!(block.len() < 4_200, "small on the wire");
        input.extend(frame(FRAME_HEADERS, FLAG_END_HEADERS, 1, &block));
        let mut out = Vec::new();
        let err = rewrite_client_stream(&input[..], &mut out)
            .await
            .expect_err("11 × 4 KiB of headers is past the cap");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        // Nothing of the block reached the server.
        assert_eq!(parse_frames(&out[PREFACE.len()..]).len(), 1);
    }

    #[tokio::test]
    async fn a_dynamic_table_larger_than_the_protocol_default_is_refused() {
        // Dynamic table size update to 1 MiB (prefix 0b001, 5-bit integer).
        let mut block = vec![0x3f];
        let mut rest = (1usize << 20) - 31;
        while rest >= 128 {
            block.push((rest % 128) as u8 | 0x80);
            rest /= 128;
        }
        block.push(rest as u8);
        block.extend(
            Encoder::new().encode(
                request_headers("localhost")
                    .iter()
                    .map(|(n, v)| (n.as_slice(), v.as_slice())),
            ),
        );
        let mut input = PREFACE.to_vec();
        input.extend(frame(FRAME_HEADERS, FLAG_END_HEADERS, 1, &block));
        let err = rewrite_client_stream(&input[..], &mut Vec::new())
            .await
            .expect_err("a client may not grow the table past SETTINGS_HEADER_TABLE_SIZE");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_sends_nothing_is_dropped_after_the_first_frame_timeout() {
        for sent in [&[][..], PREFACE] {
            let (mut client, conn) = tokio::io::duplex(1024);
            client.write_all(sent).await.unwrap();
            let start = tokio::time::Instant::now();
            let ended = tokio::time::timeout(
                Duration::from_secs(3600),
                rewrite_client_stream(conn, tokio::io::sink()),
            )
            .await
            .expect("a silent client must not hold the connection for an hour");
            assert_eq!(ended.unwrap_err().kind(), io::ErrorKind::TimedOut);
            assert_eq!(start.elapsed(), FIRST_FRAME_TIMEOUT);
            drop(client);
        }
    }

    #[tokio::test]
    async fn a_header_list_up_to_the_cap_is_served() {
        // One field of exactly the cap: name + value + 32 = 16 KiB.
        let value = vec![b'v'; MAX_HEADER_LIST_SIZE - 32 - 5];
        let sent = vec![(b"x-big".to_vec(), value)];
        let block = Encoder::new().encode(sent.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
        let (a, b) = block.split_at(block.len() / 2);
        let mut input = PREFACE.to_vec();
        input.extend(frame(FRAME_HEADERS, 0, 1, a));
        input.extend(frame(FRAME_CONTINUATION, FLAG_END_HEADERS, 1, b));
        let out = run(input).await;
        let frames = parse_frames(&out[PREFACE.len()..]);
        let block: Vec<u8> = frames.iter().flat_map(|f| f.3.clone()).collect();
        assert_eq!(Decoder::new().decode(&block).expect("decodes"), sent);
        // One byte more is refused.
        let mut big = sent[0].clone();
        big.1.push(b'v');
        let block = Encoder::new().encode([(big.0.as_slice(), big.1.as_slice())]);
        let (a, b) = block.split_at(block.len() / 2);
        let mut input = PREFACE.to_vec();
        input.extend(frame(FRAME_HEADERS, 0, 1, a));
        input.extend(frame(FRAME_CONTINUATION, FLAG_END_HEADERS, 1, b));
        assert!(
            rewrite_client_stream(&input[..], &mut Vec::new())
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn indexing_many_headers_keeps_the_table_at_its_size() {
        // Each block indexes a new 1 KiB header, as a client within the
        // default table size may: the table evicts, old entries are gone.
        let mut client = Encoder::new();
        let mut input = PREFACE.to_vec();
        for i in 0..100u32 {
            let value = vec![b'a' + (i % 26) as u8; 1024];
            let name = format!("x-{i}");
            let block = client.encode([(name.as_bytes(), value.as_slice())]);
            input.extend(frame(FRAME_HEADERS, FLAG_END_HEADERS, 1 + 2 * i, &block));
        }
        // Then a reference to the 5th-newest entry: it no longer fits in
        // 4 KiB with four newer 1 KiB entries, so it must be out of range.
        input.extend(frame(
            FRAME_HEADERS,
            FLAG_END_HEADERS,
            201,
            &[0x80 | (62 + 4)],
        ));
        let mut out = Vec::new();
        let err = rewrite_client_stream(&input[..], &mut out)
            .await
            .expect_err("an evicted entry cannot be referred to");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert_eq!(parse_frames(&out[PREFACE.len()..]).len(), 100);
        // A 5 KiB header cannot be indexed at all: it decodes, and is evicted.
        let mut block = Encoder::new().encode([(&b"x-huge"[..], &[b'h'; 5 * 1024][..])]);
        block.push(0x80 | 62); // ...so a reference to it is out of bounds.
        let mut input = PREFACE.to_vec();
        input.extend(frame(FRAME_HEADERS, FLAG_END_HEADERS, 1, &block));
        assert!(
            rewrite_client_stream(&input[..], &mut Vec::new())
                .await
                .is_err()
        );
    }

    /// Reads from `conn` until the peer closes it; the bytes read.
    async fn read_to_close(conn: &mut (impl AsyncRead + Unpin)) -> usize {
        let mut total = 0;
        let mut buf = [0u8; 4096];
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return total,
                Ok(n) => total += n,
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn connections_over_the_limit_are_refused_and_a_closed_one_frees_its_slot() {
        let limits = Limits {
            max_connections: 3,
            ..Limits::default()
        };
        let gate = Gate::new(limits);
        let mut clients = Vec::new();
        let mut admitted = Vec::new();
        let mut refused = Vec::new();
        for _ in 0..3 * limits.max_connections {
            let (client, conn) = tokio::io::duplex(1024);
            match gate.admit(conn) {
                Some(normalized) => {
                    admitted.push(normalized);
                    clients.push(client);
                }
                None => refused.push(client),
            }
            assert!(gate.open_connections() <= limits.max_connections);
        }
        assert_eq!(admitted.len(), limits.max_connections);
        assert_eq!(refused.len(), 2 * limits.max_connections);
        for client in &mut refused {
            assert_eq!(read_to_close(client).await, 0, "refused at once");
        }
        // One client hangs up: its slot is free again.
        drop(clients.pop());
        drop(admitted.pop());
        tokio::time::timeout(Duration::from_secs(1), async {
            while gate.open_connections() == limits.max_connections {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the slot is released");
        let (_client, conn) = tokio::io::duplex(1024);
        assert!(gate.admit(conn).is_some());
        assert_eq!(gate.open_connections(), limits.max_connections);
        // Silent clients are dropped after the first-frame timeout, freeing
        // every slot.
        tokio::time::sleep(FIRST_FRAME_TIMEOUT).await;
        tokio::time::timeout(Duration::from_secs(1), async {
            while gate.open_connections() > 0 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("silent connections are dropped");
        for client in &mut clients {
            assert_eq!(read_to_close(client).await, 0);
        }
    }

    #[tokio::test]
    async fn a_connection_that_breaks_a_limit_is_closed_both_ways() {
        let gate = Gate::new(Limits::default());
        let (mut client, conn) = tokio::io::duplex(64 * 1024);
        let mut server = gate.admit(conn).expect("admitted");
        let mut input = PREFACE.to_vec();
        input.extend(frame(0x4, 0, 0, &[]));
        input.extend(frame(
            FRAME_HEADERS,
            FLAG_END_HEADERS,
            1,
            &amplifying_block(10),
        ));
        client.write_all(&input).await.unwrap();
        // The server sees the preface and the SETTINGS frame, then the end.
        let forwarded = tokio::time::timeout(Duration::from_secs(10), read_to_close(&mut server))
            .await
            .expect("the server side is closed");
        assert_eq!(forwarded, PREFACE.len() + 9);
        // The client's connection is closed too.
        tokio::time::timeout(Duration::from_secs(10), read_to_close(&mut client))
            .await
            .expect("the client side is closed");
        tokio::time::timeout(Duration::from_secs(10), async {
            while gate.open_connections() > 0 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("its slot is released");
    }

    /// Waits, polling, until `gate` has no connection open.
    async fn all_closed(gate: &Gate) {
        tokio::time::timeout(Duration::from_secs(30), async {
            while gate.open_connections() > 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("every connection is closed and its slot released");
    }

    /// A client that has said hello and then neither reads nor writes,
    /// under limits where only the server or idleness can end it.
    async fn silent_client(gate: &Gate) -> (DuplexStream, Normalized) {
        let (mut client, conn) = tokio::io::duplex(64);
        let server = gate.admit(conn).expect("admitted");
        let mut hello = PREFACE.to_vec();
        hello.extend(frame(0x4, 0, 0, &[]));
        client.write_all(&hello).await.unwrap();
        (client, server)
    }

    #[tokio::test]
    async fn a_server_that_closes_frees_the_slot_even_when_the_client_does_not_read() {
        let gate = Gate::new(Limits {
            first_frame_timeout: Duration::from_secs(3600),
            idle_timeout: Duration::from_secs(3600),
            ..Limits::default()
        });
        let (_client, mut server) = silent_client(&gate).await;
        // The server reads the hello, so the pump waits on the client...
        let mut hello = vec![0u8; PREFACE.len() + 9];
        server.read_exact(&mut hello).await.unwrap();
        // ...writes more than the client's buffer holds (a PING it never
        // answers, a stream it never reads), then gives up on it.
        server.write_all(&[0u8; 8 * 1024]).await.unwrap();
        drop(server);
        all_closed(&gate).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_with_no_call_open_for_the_idle_timeout_is_closed() {
        let idle = Duration::from_secs(5);
        let gate = Gate::new(Limits {
            first_frame_timeout: Duration::from_secs(3600),
            idle_timeout: idle,
            ..Limits::default()
        });
        let (mut client, server) = silent_client(&gate).await;
        let activity = tonic::transport::server::Connected::connect_info(&server);
        // A call open (ListAndWatch, say) keeps it however long it lasts.
        let call = activity.open_call();
        assert_eq!(activity.open_calls(), 1);
        tokio::time::sleep(idle * 5).await;
        assert_eq!(gate.open_connections(), 1, "a connection in use stays");
        // The call ends; idle for the timeout, the connection is closed.
        drop(call);
        assert_eq!(activity.open_calls(), 0);
        all_closed(&gate).await;
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(30), client.read_to_end(&mut rest))
            .await
            .expect("the client's side is closed")
            .unwrap();
        drop(server);
    }
}
