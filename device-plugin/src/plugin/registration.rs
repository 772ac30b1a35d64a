//! Serving the plugin socket and staying registered with the kubelet.
//!
//! The kubelet deletes every socket in its device-plugin directory when it
//! starts and then recreates `kubelet.sock`. A plugin that registers once
//! keeps serving on an unlinked socket and the node's capacity drops to 0.
//! This loop therefore serves and registers again, without a process
//! restart, whenever
//! - `kubelet.sock` is recreated (its inode changes) or disappears,
//! - our own socket disappears or is replaced,
//! - ListAndWatch ends and the kubelet does not open a new one shortly after,
//!
//! with backoff between failed attempts and one log line per state change.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use notify::Watcher;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint, Server, Uri};

use super::kubelet_api::RegisterRequest;
use super::kubelet_api::device_plugin_server::DevicePluginServer;
use super::kubelet_api::registration_client::RegistrationClient;
use super::service::{AllocateOptions, DevicePluginService, StreamTracker, plugin_options};
use super::uds_authority::{Gate, IDLE_TIMEOUT, Limits, MAX_FRAME_PAYLOAD, MAX_HEADER_LIST_SIZE};
use crate::metrics::Metrics;
use crate::rm::devices::StateReceiver;

/// API version we implement.
pub(crate) const API_VERSION: &str = "v1beta1";
/// The kubelet's registration socket name.
pub(crate) const KUBELET_SOCKET: &str = "kubelet.sock";

const POLL_INTERVAL: Duration = Duration::from_millis(500);
const RPC_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the kubelet may take to reopen ListAndWatch before we register again.
const STREAM_REOPEN_GRACE: Duration = Duration::from_secs(2);
const BACKOFF_START: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(10);

/// Errors talking to the kubelet.
#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    /// Connecting to a unix socket failed.
    #[error("cannot connect to {path}: {source}")]
    Connect {
        /// The socket.
        path: PathBuf,
        /// The transport error.
        #[source]
        source: tonic::transport::Error,
    },
    /// The kubelet refused or failed the registration.
    #[error("kubelet refused registration: {0}")]
    Register(#[from] tonic::Status),
    /// Our socket could not be created.
    #[error("cannot serve on {path}: {source}")]
    Bind {
        /// The socket.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// Opens a gRPC channel over a unix socket (the URI is a placeholder).
pub async fn unix_channel(path: impl Into<PathBuf>) -> Result<Channel, KubeletError> {
    let path = path.into();
    let dial = path.clone();
    Endpoint::from_static("http://localhost")
        .connect_timeout(RPC_TIMEOUT)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let dial = dial.clone();
            async move { UnixStream::connect(dial).await.map(TokioIo::new) }
        }))
        .await
        .map_err(|source| KubeletError::Connect { path, source })
}

/// Registers `endpoint` (a socket name in the kubelet's directory) for `resource_name`.
pub(crate) async fn register(
    kubelet_socket: &Path,
    endpoint: &str,
    resource_name: &str,
) -> Result<(), KubeletError> {
    let channel = unix_channel(kubelet_socket).await?;
    let mut client = RegistrationClient::new(channel);
    let mut request = tonic::Request::new(RegisterRequest {
        version: API_VERSION.into(),
        endpoint: endpoint.into(),
        resource_name: resource_name.into(),
        options: Some(plugin_options()),
    });
    request.set_timeout(RPC_TIMEOUT);
    client.register(request).await?;
    Ok(())
}

/// Identity of a file: device, inode and change time, so a recreated socket
/// differs even when the filesystem hands out the same inode again.
type FileId = (u64, u64, i64, i64);

fn identity(path: &Path) -> Option<FileId> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino(), m.ctime(), m.ctime_nsec()))
}

/// Why a registration ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lost {
    Shutdown,
    KubeletSocketGone,
    KubeletRestarted,
    OwnSocketGone,
    StreamEnded,
    ServerStopped,
}

impl Lost {
    fn describe(self) -> &'static str {
        match self {
            Lost::Shutdown => "shutting down",
            Lost::KubeletSocketGone => "kubelet.sock disappeared",
            Lost::KubeletRestarted => "kubelet.sock was recreated (kubelet restarted)",
            Lost::OwnSocketGone => "our socket was removed",
            Lost::StreamEnded => "ListAndWatch ended and was not reopened",
            Lost::ServerStopped => "gRPC server stopped",
        }
    }
}

/// Exponential backoff between failed attempts.
#[derive(Debug)]
struct Backoff {
    next: Duration,
}

impl Backoff {
    fn new() -> Self {
        Self {
            next: BACKOFF_START,
        }
    }

    fn reset(&mut self) {
        self.next = BACKOFF_START;
    }

    fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(BACKOFF_MAX);
        delay
    }
}

/// Where to serve and what to register.
#[derive(Debug, Clone)]
pub(crate) struct KubeletSettings {
    /// The kubelet's device-plugin directory.
    pub dir: PathBuf,
    /// Our socket's file name in `dir`.
    pub socket_name: String,
    /// The extended resource name.
    pub resource_name: String,
    /// When a client's connection to our socket is dropped.
    pub clients: ClientTimeouts,
}

/// When a connection to the plugin socket is dropped, so that dead or idle
/// clients never hold the connection slots (`uds_authority::MAX_CONNECTIONS`)
/// the kubelet needs to connect again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientTimeouts {
    /// How often the server sends each client an HTTP/2 PING.
    pub keepalive_interval: Duration,
    /// How long a PING may go unanswered before the connection is closed:
    /// a client that hangs, or stopped reading, is gone after interval + timeout.
    pub keepalive_timeout: Duration,
    /// How long a connection may have no call open (the kubelet always has
    /// its ListAndWatch open).
    pub idle_timeout: Duration,
}

impl Default for ClientTimeouts {
    fn default() -> Self {
        Self {
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            idle_timeout: IDLE_TIMEOUT,
        }
    }
}

/// The gRPC server of our socket: the limits uds_authority enforces,
/// advertised to clients, and keepalive PINGs to every client.
fn grpc_server(clients: ClientTimeouts) -> Server {
    Server::builder()
        .max_frame_size(MAX_FRAME_PAYLOAD as u32)
        .http2_max_header_list_size(MAX_HEADER_LIST_SIZE as u32)
        .http2_keepalive_interval(Some(clients.keepalive_interval))
        .http2_keepalive_timeout(Some(clients.keepalive_timeout))
}

/// Wakes the loop on any change in the directory; polling covers missed or
/// unavailable inotify events.
fn watch_dir(dir: &Path, wake: &Arc<Notify>) -> Option<notify::RecommendedWatcher> {
    let wake = Arc::clone(wake);
    let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        // Connecting to a socket raises access events; only changes matter.
        if res.is_ok_and(|e| !e.kind.is_access()) {
            wake.notify_one();
        }
    })
    .ok()?;
    watcher
        .watch(dir, notify::RecursiveMode::NonRecursive)
        .ok()?;
    Some(watcher)
}

/// Serves the device plugin and keeps it registered until `shutdown`; then removes the socket
/// it served on.
pub(crate) async fn run(
    settings: KubeletSettings,
    state: StateReceiver,
    options: AllocateOptions,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let mut bound = None;
    serve_until_shutdown(&settings, &state, options, &metrics, &shutdown, &mut bound).await;
    // Whichever way the loop saw the shutdown (cancelling it also ends the kubelet's stream,
    // which can read as a lost registration first), the socket it bound last goes.
    remove_own_socket(&settings.dir.join(&settings.socket_name), bound);
    tracing::info!("stopped serving the device plugin");
}

/// The registration loop: binds our socket, serves on it, registers and holds the
/// registration, and starts over when it is lost, until `shutdown`. `bound` is the identity
/// of the socket it bound last.
async fn serve_until_shutdown(
    settings: &KubeletSettings,
    state: &StateReceiver,
    options: AllocateOptions,
    metrics: &Arc<Metrics>,
    shutdown: &CancellationToken,
    bound: &mut Option<FileId>,
) {
    let kubelet_socket = settings.dir.join(KUBELET_SOCKET);
    let own_socket = settings.dir.join(&settings.socket_name);
    let wake = Arc::new(Notify::new());
    let mut watcher = watch_dir(&settings.dir, &wake);
    let mut backoff = Backoff::new();
    let mut waiting_logged = false;

    loop {
        if shutdown.is_cancelled() {
            return;
        }
        if watcher.is_none() {
            watcher = watch_dir(&settings.dir, &wake);
        }
        let Some(kubelet_id) = identity(&kubelet_socket) else {
            if wait_for_kubelet_socket(&kubelet_socket, &mut waiting_logged, &wake, shutdown).await
            {
                return;
            }
            continue;
        };
        waiting_logged = false;

        let listener = match bind_own_socket(&own_socket, &mut backoff, shutdown).await {
            Attempt::Done(listener) => listener,
            Attempt::Retry => continue,
            Attempt::Shutdown => return,
        };
        let sockets = Sockets {
            kubelet: &kubelet_socket,
            kubelet_id,
            own: &own_socket,
            own_id: identity(&own_socket),
        };
        *bound = sockets.own_id;
        let mut serving = Serving::start(
            listener,
            settings.clients,
            state,
            options,
            metrics,
            shutdown,
        );
        tracing::info!(socket = %own_socket.display(), "serving the device plugin");

        let lost = match register_and_hold(
            settings,
            &sockets,
            &mut serving,
            metrics,
            &mut backoff,
            &wake,
            shutdown,
        )
        .await
        {
            Attempt::Done(lost) => lost,
            Attempt::Retry => continue,
            Attempt::Shutdown => return,
        };
        serving.stop().await;
        if lost == Lost::Shutdown || shutdown.is_cancelled() {
            return;
        }
        tracing::warn!(
            reason = lost.describe(),
            "lost the kubelet registration; registering again"
        );
    }
}

/// How one step of the registration loop ended.
enum Attempt<T> {
    /// It succeeded with this.
    Done(T),
    /// It failed and its backoff has passed: start the loop over.
    Retry,
    /// Shutdown came first.
    Shutdown,
}

/// The two sockets of one registration and their identities when it began.
struct Sockets<'a> {
    kubelet: &'a Path,
    kubelet_id: FileId,
    own: &'a Path,
    own_id: Option<FileId>,
}

/// Logs once that the kubelet socket is missing, then waits for a change in the directory or
/// the next poll; returns true if shutdown came first.
async fn wait_for_kubelet_socket(
    kubelet_socket: &Path,
    waiting_logged: &mut bool,
    wake: &Notify,
    shutdown: &CancellationToken,
) -> bool {
    if !*waiting_logged {
        tracing::info!(socket = %kubelet_socket.display(), "waiting for the kubelet socket");
        *waiting_logged = true;
    }
    tokio::select! {
        () = shutdown.cancelled() => true,
        () = wake.notified() => false,
        () = tokio::time::sleep(POLL_INTERVAL) => false,
    }
}

/// Replaces whatever is at our socket's path with a fresh listener; on failure, waits out
/// the backoff.
async fn bind_own_socket(
    own_socket: &Path,
    backoff: &mut Backoff,
    shutdown: &CancellationToken,
) -> Attempt<UnixListener> {
    let _ = std::fs::remove_file(own_socket);
    match UnixListener::bind(own_socket) {
        Ok(listener) => Attempt::Done(listener),
        Err(source) => {
            let e = KubeletError::Bind {
                path: own_socket.to_path_buf(),
                source,
            };
            let delay = backoff.next_delay();
            tracing::error!(error = %e, retry_in = ?delay, "cannot serve the device plugin");
            if sleep_or_shutdown(delay, shutdown).await {
                Attempt::Shutdown
            } else {
                Attempt::Retry
            }
        }
    }
}

/// One generation of the gRPC server on our socket; stopping it cancels only this
/// generation's streams.
struct Serving {
    generation: CancellationToken,
    streams: Arc<StreamTracker>,
    server: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Serving {
    fn start(
        listener: UnixListener,
        clients: ClientTimeouts,
        state: &StateReceiver,
        options: AllocateOptions,
        metrics: &Arc<Metrics>,
        shutdown: &CancellationToken,
    ) -> Self {
        let generation = shutdown.child_token();
        let streams = Arc::new(StreamTracker::default());
        let service = DevicePluginService::new(
            state.clone(),
            options,
            Arc::clone(metrics),
            Arc::clone(&streams),
            generation.clone(),
        );
        // kubelets before 1.26 send the socket path as :authority, which h2
        // rejects; uds_authority rewrites it, within bounds.
        let limits = Limits {
            idle_timeout: clients.idle_timeout,
            ..Limits::default()
        };
        let incoming = Gate::new(limits).incoming(listener);
        let server = tokio::spawn(
            grpc_server(clients)
                .add_service(DevicePluginServer::new(service))
                .serve_with_incoming_shutdown(incoming, generation.clone().cancelled_owned()),
        );
        Self {
            generation,
            streams,
            server,
        }
    }

    /// Cancels this generation and waits for its server to finish.
    async fn stop(self) {
        self.generation.cancel();
        if !self.server.is_finished() {
            let _ = self.server.await;
        }
    }
}

/// Registers with the kubelet and holds the registration until it is lost; a failed
/// registration stops the server and waits out the backoff.
async fn register_and_hold(
    settings: &KubeletSettings,
    sockets: &Sockets<'_>,
    serving: &mut Serving,
    metrics: &Metrics,
    backoff: &mut Backoff,
    wake: &Notify,
    shutdown: &CancellationToken,
) -> Attempt<Lost> {
    let registered = register(
        sockets.kubelet,
        &settings.socket_name,
        &settings.resource_name,
    )
    .await;
    metrics.record_registration(registered.is_ok());
    match registered {
        Ok(()) => {
            backoff.reset();
            metrics.set_ready(true);
            tracing::info!(resource = %settings.resource_name, endpoint = %settings.socket_name, "registered with the kubelet");
            let lost = watch_registration(sockets, serving, wake, shutdown).await;
            metrics.set_ready(false);
            Attempt::Done(lost)
        }
        Err(e) => {
            let delay = backoff.next_delay();
            tracing::warn!(error = %e, retry_in = ?delay, "registration with the kubelet failed");
            serving.generation.cancel();
            let _ = (&mut serving.server).await;
            if sleep_or_shutdown(delay, shutdown).await {
                Attempt::Shutdown
            } else {
                Attempt::Retry
            }
        }
    }
}

fn remove_own_socket(path: &Path, own_id: Option<FileId>) {
    // Only remove the socket we created, never a successor's.
    if own_id.is_some() && identity(path) == own_id {
        let _ = std::fs::remove_file(path);
    }
}

/// Sleeps; returns true if shutdown came first.
async fn sleep_or_shutdown(delay: Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        () = shutdown.cancelled() => true,
        () = tokio::time::sleep(delay) => false,
    }
}

/// Watches the sockets, the ListAndWatch streams and the server until the registration is
/// lost, and says why.
async fn watch_registration(
    sockets: &Sockets<'_>,
    serving: &mut Serving,
    wake: &Notify,
    shutdown: &CancellationToken,
) -> Lost {
    let streams = &serving.streams;
    let server = &mut serving.server;
    let mut stream_ended_at: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return Lost::Shutdown,
            () = wake.notified() => {}
            () = tokio::time::sleep(POLL_INTERVAL) => {}
            () = streams.ended() => {
                stream_ended_at.get_or_insert_with(tokio::time::Instant::now);
            }
            result = &mut *server => {
                if let Ok(Err(e)) = result {
                    tracing::error!(error = %e, "device plugin gRPC server failed");
                }
                return Lost::ServerStopped;
            }
        }
        match identity(sockets.kubelet) {
            None => return Lost::KubeletSocketGone,
            Some(id) if id != sockets.kubelet_id => return Lost::KubeletRestarted,
            Some(_) => {}
        }
        if identity(sockets.own) != sockets.own_id {
            return Lost::OwnSocketGone;
        }
        if let Some(at) = stream_ended_at {
            if streams.active() > 0 {
                stream_ended_at = None;
            } else if at.elapsed() >= STREAM_REOPEN_GRACE {
                return Lost::StreamEnded;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap_and_resets() {
        let mut b = Backoff::new();
        assert_eq!(b.next_delay(), BACKOFF_START);
        assert_eq!(b.next_delay(), BACKOFF_START * 2);
        for _ in 0..20 {
            b.next_delay();
        }
        assert_eq!(b.next_delay(), BACKOFF_MAX);
        b.reset();
        assert_eq!(b.next_delay(), BACKOFF_START);
    }

    #[test]
    fn recreated_files_have_a_new_identity() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubelet.sock");
        assert_eq!(identity(&path), None);
        let first = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let a = identity(&path);
        drop(first);
        std::fs::remove_file(&path).unwrap();
        // File times are coarse (a jiffy); make sure the clock moved on.
        std::thread::sleep(Duration::from_millis(20));
        let _second = std::os::unix::net::UnixListener::bind(&path).unwrap();
        assert!(a.is_some());
        assert_ne!(identity(&path), a);
    }
}
