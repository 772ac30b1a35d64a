//! Lets kubelets older than 1.26 talk to our tonic server.
//!
//! Those kubelets dial a device plugin with grpc-go, passing the socket path
//! as the target, so every request carries `:authority:
//! /var/lib/kubelet/device-plugins/<plugin>.sock`. h2 (under tonic) rejects
//! that as a malformed authority and resets the stream with PROTOCOL_ERROR,
//! so ListAndWatch dies at once and the node never gets capacity
//! (hyperium/h2#487 is still open). Kubernetes 1.26 switched to `localhost`.
//!
//! [`normalize`] sits between an accepted unix-socket connection and the
//! HTTP/2 server: it decodes every client header block with HPACK, replaces
//! an authority that is not a valid URI authority with `localhost`, and
//! re-encodes the block with its own encoder. Every block is re-encoded (not
//! only the rewritten ones) so that the server's HPACK decoder state always
//! mirrors one encoder. All other frames, and the server's bytes, pass
//! through untouched.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use loona_hpack::{Decoder, Encoder};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADERS: u8 = 0x1;
const FRAME_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
/// SETTINGS_MAX_FRAME_SIZE's default; h2 never advertises less.
const MAX_FRAME: usize = 16_384;
/// Largest header block we accept from a client (gRPC headers are small).
const MAX_HEADER_BLOCK: usize = 1 << 20;
const PIPE_BUFFER: usize = 64 * 1024;

/// A connection whose client → server half has had its `:authority`
/// normalised. Hand it to the HTTP/2 server instead of the raw stream.
pub struct Normalized {
    inner: DuplexStream,
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
    type ConnectInfo = ();
    fn connect_info(&self) -> Self::ConnectInfo {}
}

/// Wraps `conn` (an accepted client connection). Spawns the pumps on the
/// current tokio runtime; they end when either side closes.
pub fn normalize<S>(conn: S) -> Normalized
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (ours, theirs) = tokio::io::duplex(PIPE_BUFFER);
    let (client_read, mut client_write) = tokio::io::split(conn);
    let (mut server_read, server_write) = tokio::io::split(theirs);
    tokio::spawn(async move {
        if let Err(e) = rewrite_client_stream(client_read, server_write).await {
            tracing::debug!(error = %e, "client connection ended");
        }
    });
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
        let _ = client_write.shutdown().await;
    });
    Normalized { inner: ours }
}

/// True when `value` can't be a URI authority (a socket path, say).
fn needs_rewrite(value: &[u8]) -> bool {
    std::str::from_utf8(value)
        .ok()
        .and_then(|s| s.parse::<http::uri::Authority>().ok())
        .is_none()
}

/// Copies the client's HTTP/2 byte stream to `out`, re-encoding header blocks.
pub async fn rewrite_client_stream<R, W>(mut input: R, mut out: W) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut preface = [0u8; PREFACE.len()];
    input.read_exact(&mut preface).await?;
    out.write_all(&preface).await?;
    if preface != PREFACE {
        // Not HTTP/2 prior knowledge: let the server reject it.
        tokio::io::copy(&mut input, &mut out).await?;
        return Ok(());
    }
    let mut decoder = Decoder::new();
    let mut encoder = Encoder::new();
    loop {
        let Some((kind, flags, stream, payload)) = read_frame(&mut input).await? else {
            out.shutdown().await?;
            return Ok(());
        };
        if kind != FRAME_HEADERS {
            write_frame(&mut out, kind, flags, stream, &payload).await?;
            out.flush().await?;
            continue;
        }
        let mut block = header_fragment(flags, &payload)?;
        let mut end_headers = flags & FLAG_END_HEADERS != 0;
        while !end_headers {
            let (k, f, s, p) = read_frame(&mut input)
                .await?
                .ok_or_else(|| invalid("connection closed inside a header block"))?;
            if k != FRAME_CONTINUATION || s != stream {
                return Err(invalid("header block interrupted by another frame"));
            }
            if block.len() + p.len() > MAX_HEADER_BLOCK {
                return Err(invalid("header block too large"));
            }
            block.extend_from_slice(&p);
            end_headers = f & FLAG_END_HEADERS != 0;
        }
        let mut headers = decoder
            .decode(&block)
            .map_err(|e| invalid(&format!("HPACK decoding failed: {e:?}")))?;
        for (name, value) in headers.iter_mut() {
            if name.as_slice() == b":authority" && needs_rewrite(value) {
                *value = b"localhost".to_vec();
            }
        }
        let encoded = encoder.encode(headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
        let chunks: Vec<&[u8]> = if encoded.is_empty() {
            vec![&[][..]]
        } else {
            encoded.chunks(MAX_FRAME).collect()
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
            write_frame(&mut out, kind, f, stream, chunk).await?;
        }
        out.flush().await?;
    }
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

async fn read_frame<R: AsyncRead + Unpin>(
    input: &mut R,
) -> io::Result<Option<(u8, u8, u32, Vec<u8>)>> {
    let mut head = [0u8; 9];
    match input.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    if len > MAX_HEADER_BLOCK {
        return Err(invalid(
            "frame larger than any SETTINGS_MAX_FRAME_SIZE we accept",
        ));
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
    let mut head = [0u8; 9];
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
}
