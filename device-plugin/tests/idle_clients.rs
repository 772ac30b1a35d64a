//! The real binary drops clients of its socket that are dead or idle, so
//! the kubelet can always connect again: the socket serves at most
//! `MAX_CONNECTIONS` at once, and without these rules a client that hung
//! (or stopped reading) or one that connected and walked away would hold a
//! slot for good.

mod common;

use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use trainyard_device_plugin::plugin::kubelet_api::Empty;
use trainyard_device_plugin::plugin::uds_authority::MAX_CONNECTIONS;

const START_LIMIT: Duration = Duration::from_secs(20);
/// A bound on a hang, never a latency claim.
const HANG_LIMIT: Duration = Duration::from_secs(30);
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const ACK: u8 = 0x1;

fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    v.push(kind);
    v.push(flags);
    v.extend_from_slice(&0u32.to_be_bytes());
    v.extend_from_slice(payload);
    v
}

/// A raw HTTP/2 client that has said hello (preface and SETTINGS) and makes no call.
async fn connect_raw(ws: &Workspace) -> UnixStream {
    let mut conn = UnixStream::connect(ws.dir.join(SOCKET))
        .await
        .expect("connect to the plugin socket");
    let mut hello = PREFACE.to_vec();
    hello.extend(frame(SETTINGS, 0, &[]));
    conn.write_all(&hello).await.expect("say hello");
    conn
}

/// Reads until the plugin closes the connection, answering its SETTINGS
/// and PINGs as any live HTTP/2 client does when `alive`; a client that is
/// not alive only reads. Returns once closed.
async fn read_until_closed(conn: &mut UnixStream, alive: bool) {
    let mut head = [0u8; 9];
    loop {
        if conn.read_exact(&mut head).await.is_err() {
            return;
        }
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let mut payload = vec![0u8; len];
        if conn.read_exact(&mut payload).await.is_err() {
            return;
        }
        let (kind, flags) = (head[3], head[4]);
        let answer = match kind {
            SETTINGS if flags & ACK == 0 => frame(SETTINGS, ACK, &[]),
            PING if flags & ACK == 0 => frame(PING, ACK, &payload),
            _ => continue,
        };
        if alive && conn.write_all(&answer).await.is_err() {
            return;
        }
    }
}

fn all_healthy(devices: &[trainyard_device_plugin::plugin::kubelet_api::Device]) -> bool {
    devices.len() == 8 && devices.iter().all(|d| d.health == "Healthy")
}

/// The kubelet's connection (a call open, PINGs answered) was never
/// dropped: still one registration, and a health change still reaches it.
async fn kubelet_still_watching(ws: &Workspace, kubelet: &mut FakeKubelet, plugin: &Plugin) {
    ws.rewrite(|t| set_gpu_field(&t, 4, "healthy", "false"));
    kubelet
        .wait_devices(HANG_LIMIT, |d| d.len() == 8 && d[4].health == "Unhealthy")
        .await;
    assert_eq!(
        kubelet.registration_count(),
        1,
        "the kubelet's connection was dropped; log:\n{}",
        plugin.log_text()
    );
}

/// A new client is served.
async fn served(ws: &Workspace) {
    let mut client = plugin_client(&ws.dir).await;
    client
        .get_device_plugin_options(Empty {})
        .await
        .expect("a new client is served");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_stop_answering_pings_are_dropped_and_free_every_slot() {
    let ws = Workspace::new(&example("fake-gpus-8.yaml"));
    let mut kubelet = FakeKubelet::start(&ws.dir).await;
    let plugin = Plugin::start(
        &ws.dir,
        &ws.fake_file,
        &[
            "--grpc-keepalive-interval",
            "1s",
            "--grpc-keepalive-timeout",
            "1s",
            "--grpc-idle-timeout",
            "1h",
        ],
    );
    kubelet.wait_devices(START_LIMIT, all_healthy).await;
    // Every slot the kubelet does not hold is taken by a client that hung:
    // it never reads what the plugin sends and never answers a PING.
    let mut hung = Vec::new();
    for _ in 1..MAX_CONNECTIONS {
        hung.push(connect_raw(&ws).await);
    }
    for (i, conn) in hung.iter_mut().enumerate() {
        let closed = tokio::time::timeout(HANG_LIMIT, read_until_closed(conn, false)).await;
        assert!(
            closed.is_ok(),
            "hung client {i} was never dropped; log:\n{}",
            plugin.log_text()
        );
    }
    served(&ws).await;
    kubelet_still_watching(&ws, &mut kubelet, &plugin).await;
    drop(plugin);
    kubelet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_with_no_call_open_are_dropped_and_free_every_slot() {
    let ws = Workspace::new(&example("fake-gpus-8.yaml"));
    let mut kubelet = FakeKubelet::start(&ws.dir).await;
    let plugin = Plugin::start(
        &ws.dir,
        &ws.fake_file,
        &[
            "--grpc-keepalive-interval",
            "500ms",
            "--grpc-keepalive-timeout",
            "1h",
            "--grpc-idle-timeout",
            "2s",
        ],
    );
    kubelet.wait_devices(START_LIMIT, all_healthy).await;
    // Every other slot is taken by a live client (it answers every PING)
    // that connected and makes no call.
    let mut idle = Vec::new();
    for _ in 1..MAX_CONNECTIONS {
        idle.push(connect_raw(&ws).await);
    }
    for (i, conn) in idle.iter_mut().enumerate() {
        let closed = tokio::time::timeout(HANG_LIMIT, read_until_closed(conn, true)).await;
        assert!(
            closed.is_ok(),
            "idle client {i} was never dropped; log:\n{}",
            plugin.log_text()
        );
    }
    served(&ws).await;
    kubelet_still_watching(&ws, &mut kubelet, &plugin).await;
    drop(plugin);
    kubelet.stop().await;
}
