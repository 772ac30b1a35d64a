//! The local cluster's path from the pods to the API server: a TCP forwarder on the host side
//! of the pod bridge to the API server on loopback, that can hold every byte back for a while.
//! The operator and the device plugin reach the API server through it (kubelets do not), so
//! the chaos run's `ApiLatency` fault (e2e/src/chaos/faults.rs) and the hard-loss scenarios
//! give them what a loaded API server or a slow network gives: late answers and a lagging
//! watch, with TLS end to end (it forwards bytes, it reads none).
//!
//! The delay is read from `DELAY_FILE` (milliseconds; a missing or empty file is 0) every
//! 200 ms and applies to each chunk as it is written, in both directions, in order: a chunk
//! read at `t` is written at `t + delay`, so the delay adds latency without capping
//! throughput. `DELAY_FILE.blocked`, read as often, lists source addresses (one a line) cut off
//! from the API server: their connections are closed, and new ones refused, until they are
//! gone from it (the chaos run's `Node2CutFromApi`: node 2's kubelet alone loses the API).
//!
//! usage: `trainyard-api-delay LISTEN UPSTREAM DELAY_FILE`

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// How often the delay file is read.
const REREAD: Duration = Duration::from_millis(200);
/// Chunks in flight per direction before the reader waits for the writer.
const IN_FLIGHT: usize = 1024;

/// The delay in milliseconds the file holds: a missing or empty file is 0.
fn read_delay(file: &PathBuf) -> Result<u64> {
    match std::fs::read_to_string(file) {
        Ok(text) if text.trim().is_empty() => Ok(0),
        Ok(text) => text.trim().parse().with_context(|| {
            format!(
                "{}: {:?} is not a number of milliseconds",
                file.display(),
                text.trim()
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e).with_context(|| format!("reading {}", file.display())),
    }
}

/// The sources cut off from the API server.
type Blocked = Arc<RwLock<HashSet<IpAddr>>>;

/// The addresses the blocked file lists: a missing file lists none; a line that is not an
/// address is an error naming it.
fn read_blocked(file: &PathBuf) -> Result<HashSet<IpAddr>> {
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(HashSet::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", file.display())),
    };
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| {
            l.parse()
                .with_context(|| format!("{}: {l:?} is not an address", file.display()))
        })
        .collect()
}

fn is_blocked(blocked: &Blocked, source: IpAddr) -> bool {
    blocked
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .contains(&source)
}

/// Copies `from` to `to`, each chunk written `delay` after it was read, until the source is
/// cut off.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    delay: Arc<AtomicU64>,
    cut: impl Fn() -> bool,
) {
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(IN_FLIGHT);
    let reader = async move {
        let mut buf = vec![0_u8; 64 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx.send((Instant::now(), buf[..n].to_vec())).await.is_err() {
                        break;
                    }
                }
            }
        }
    };
    let writer = async move {
        while let Some((read_at, chunk)) = rx.recv().await {
            let ms = delay.load(Ordering::Relaxed);
            tokio::time::sleep_until(read_at + Duration::from_millis(ms)).await;
            if cut() || to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reader, writer);
}

async fn forward(client: TcpStream, upstream: SocketAddr, delay: Arc<AtomicU64>, blocked: Blocked) {
    let Ok(source) = client.peer_addr().map(|a| a.ip()) else {
        return;
    };
    if is_blocked(&blocked, source) {
        return;
    }
    let Ok(server) = TcpStream::connect(upstream).await else {
        // The API server is away (a restart): the client sees its connection closed, as it
        // would with the API server itself.
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let cut = || is_blocked(&blocked, source);
    tokio::join!(
        pump(client_read, server_write, delay.clone(), cut),
        pump(server_read, client_write, delay, cut),
    );
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: trainyard-api-delay LISTEN UPSTREAM DELAY_FILE";
    let listen: SocketAddr = args.next().context(usage)?.parse().context("LISTEN")?;
    let upstream: SocketAddr = args.next().context(usage)?.parse().context("UPSTREAM")?;
    let file = PathBuf::from(args.next().context(usage)?);
    let delay = Arc::new(AtomicU64::new(read_delay(&file)?));
    let blocked_file = PathBuf::from(format!("{}.blocked", file.display()));
    let blocked: Blocked = Arc::new(RwLock::new(read_blocked(&blocked_file)?));
    let watched = delay.clone();
    let watched_blocked = blocked.clone();
    tokio::spawn(async move {
        let mut said = None;
        loop {
            tokio::time::sleep(REREAD).await;
            match read_blocked(&blocked_file) {
                Ok(now) => {
                    let mut held = watched_blocked
                        .write()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    if *held != now {
                        eprintln!("trainyard-api-delay: cut off: {now:?}");
                        *held = now;
                    }
                }
                Err(e) => eprintln!("trainyard-api-delay: {e:#}"),
            }
            match read_delay(&file) {
                Ok(ms) => {
                    if said != Some(ms) {
                        eprintln!("trainyard-api-delay: {ms} ms");
                        said = Some(ms);
                    }
                    watched.store(ms, Ordering::Relaxed);
                }
                Err(e) => eprintln!("trainyard-api-delay: {e:#}"),
            }
        }
    });
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding {listen}"))?;
    eprintln!("trainyard-api-delay: {listen} -> {upstream}, delay from the file");
    loop {
        match listener.accept().await {
            Ok((client, _)) => {
                tokio::spawn(forward(client, upstream, delay.clone(), blocked.clone()));
            }
            Err(e) => {
                eprintln!("trainyard-api-delay: accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}
