//! Shared harness for the integration tests and the gRPC benchmark: an
//! in-process fake kubelet and the real plugin binary in a temp directory.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use trainyard_device_plugin::plugin::kubelet_api::device_plugin_client::DevicePluginClient;
use trainyard_device_plugin::plugin::kubelet_api::registration_server::{
    Registration, RegistrationServer,
};
use trainyard_device_plugin::plugin::kubelet_api::{Device, Empty, RegisterRequest};
use trainyard_device_plugin::plugin::registration::unix_channel;

pub const BIN: &str = env!("CARGO_BIN_EXE_trainyard-device-plugin");
pub const SOCKET: &str = "trainyard-nvidia-com-gpu.sock";

/// The 8-GPU example file shipped with the crate.
pub fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(name)
}

pub fn uuid(i: usize) -> String {
    format!("GPU-11111111-2222-3333-4444-{i:012}")
}

/// Polls `check` every 20 ms until it is true or `limit` passes.
pub async fn wait_until(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if check() {
            return true;
        }
        if start.elapsed() > limit {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[derive(Clone)]
struct RegistrationService {
    dir: PathBuf,
    registrations: Arc<Mutex<Vec<RegisterRequest>>>,
    devices: Arc<watch::Sender<Vec<Device>>>,
    stop: CancellationToken,
    watch_stop: Arc<Mutex<CancellationToken>>,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let request = request.into_inner();
        let endpoint = self.dir.join(&request.endpoint);
        self.registrations.lock().unwrap().push(request);
        // Like the kubelet: dial the plugin back and watch its devices.
        let devices = Arc::clone(&self.devices);
        let stop = self.stop.clone();
        let watch_stop = self.watch_stop.lock().unwrap().clone();
        tokio::spawn(async move {
            let Ok(channel) = unix_channel(&endpoint).await else {
                return;
            };
            let mut client = DevicePluginClient::new(channel);
            let Ok(response) = client.list_and_watch(Empty {}).await else {
                return;
            };
            let mut stream = response.into_inner();
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = watch_stop.cancelled() => return,
                    message = stream.message() => match message {
                        Ok(Some(list)) => { devices.send_replace(list.devices); }
                        _ => return,
                    },
                }
            }
        });
        Ok(Response::new(Empty {}))
    }
}

/// A kubelet that accepts registrations on `<dir>/kubelet.sock` and then
/// follows the plugin's ListAndWatch stream.
pub struct FakeKubelet {
    pub registrations: Arc<Mutex<Vec<RegisterRequest>>>,
    pub devices: watch::Receiver<Vec<Device>>,
    stop: CancellationToken,
    watch_stop: Arc<Mutex<CancellationToken>>,
    server: tokio::task::JoinHandle<()>,
}

impl FakeKubelet {
    pub async fn start(dir: &Path) -> Self {
        let (tx, devices) = watch::channel(Vec::new());
        let registrations = Arc::new(Mutex::new(Vec::new()));
        let stop = CancellationToken::new();
        let watch_stop = Arc::new(Mutex::new(CancellationToken::new()));
        let service = RegistrationService {
            dir: dir.to_path_buf(),
            registrations: Arc::clone(&registrations),
            devices: Arc::new(tx),
            stop: stop.clone(),
            watch_stop: Arc::clone(&watch_stop),
        };
        let listener = UnixListener::bind(dir.join("kubelet.sock")).expect("bind kubelet.sock");
        let signal = stop.clone();
        let server = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(RegistrationServer::new(service))
                .serve_with_incoming_shutdown(
                    UnixListenerStream::new(listener),
                    signal.cancelled_owned(),
                )
                .await;
        });
        Self {
            registrations,
            devices,
            stop,
            watch_stop,
            server,
        }
    }

    /// Ends every ListAndWatch stream without stopping the server.
    pub fn drop_watches(&self) {
        let mut token = self.watch_stop.lock().unwrap();
        token.cancel();
        *token = CancellationToken::new();
    }

    pub fn registration_count(&self) -> usize {
        self.registrations.lock().unwrap().len()
    }

    /// Waits until the latest device list satisfies `check`.
    pub async fn wait_devices(
        &mut self,
        limit: Duration,
        check: impl Fn(&[Device]) -> bool,
    ) -> Vec<Device> {
        let found = match tokio::time::timeout(limit, self.devices.wait_for(|d| check(d))).await {
            Ok(Ok(devices)) => Some(devices.clone()),
            _ => None,
        };
        found.unwrap_or_else(|| {
            panic!(
                "device list did not reach the expected state; last: {:?}",
                *self.devices.borrow()
            )
        })
    }

    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.server.await;
    }
}

/// The real plugin binary, killed by PID when dropped.
pub struct Plugin {
    pub child: Child,
    pub log: PathBuf,
}

impl Plugin {
    pub fn start(dir: &Path, fake_file: &Path, extra: &[&str]) -> Self {
        // No cluster: the label loop must keep retrying without stopping the plugin.
        Self::start_with_kubeconfig(dir, fake_file, extra, &dir.join("no-kubeconfig"))
    }

    pub fn start_with_kubeconfig(
        dir: &Path,
        fake_file: &Path,
        extra: &[&str],
        kubeconfig: &Path,
    ) -> Self {
        let log = dir.with_extension("log");
        let stderr = std::fs::File::create(&log).expect("create log");
        let child = Command::new(BIN)
            .arg("run")
            .arg("--fake-gpus")
            .arg(fake_file)
            .arg("--device-plugin-dir")
            .arg(dir)
            .args(extra)
            .env("RUST_LOG", "info")
            .env("KUBECONFIG", kubeconfig)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("NODE_NAME")
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start the plugin binary");
        Self { child, log }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Peak resident set size (VmHWM) in KiB.
    pub fn peak_rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    }

    /// Current resident set size (VmRSS) in KiB.
    pub fn rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A DevicePlugin client on the plugin's socket in `dir`.
pub async fn plugin_client(dir: &Path) -> DevicePluginClient<tonic::transport::Channel> {
    let channel = unix_channel(dir.join(SOCKET))
        .await
        .expect("connect to the plugin socket");
    DevicePluginClient::new(channel)
}

/// A free loopback port (bound and released; good enough for tests).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// GET over plain HTTP/1.0; returns (status, body). The read timeout only bounds a hung
/// server: a slow answer on a loaded machine is still an answer.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())?;
    Some((status, body))
}

/// A temp dir holding the device-plugin dir (`dir`) and a copy of a fake file.
pub struct Workspace {
    pub root: tempfile::TempDir,
    pub dir: PathBuf,
    pub fake_file: PathBuf,
}

impl Workspace {
    pub fn new(fake_source: &Path) -> Self {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("device-plugins");
        std::fs::create_dir(&dir).expect("mkdir");
        let fake_file = root.path().join("fake-gpus.yaml");
        std::fs::copy(fake_source, &fake_file).expect("copy fake file");
        Self {
            root,
            dir,
            fake_file,
        }
    }

    /// Rewrites the fake file atomically, as a ConfigMap update would.
    pub fn rewrite(&self, edit: impl FnOnce(String) -> String) {
        let text = std::fs::read_to_string(&self.fake_file).expect("read fake file");
        let tmp = self.root.path().join("fake-gpus.yaml.tmp");
        std::fs::write(&tmp, edit(text)).expect("write fake file");
        std::fs::rename(&tmp, &self.fake_file).expect("replace fake file");
    }
}

/// Sets `field: value` in the block of GPU `index` of a fake file in the
/// example layout (one `  - uuid:` line per GPU, fields indented by 4).
pub fn set_gpu_field(text: &str, index: usize, field: &str, value: &str) -> String {
    let start_marker = format!("  - uuid: {}", uuid(index));
    let mut out = Vec::new();
    let mut in_block = false;
    let mut done = false;
    for line in text.lines() {
        if line.starts_with("  - uuid:") {
            if in_block && !done {
                out.push(format!("    {field}: {value}"));
                done = true;
            }
            in_block = line == start_marker;
        }
        if in_block && !done && line.starts_with(&format!("    {field}:")) {
            out.push(format!("    {field}: {value}"));
            done = true;
            continue;
        }
        out.push(line.to_string());
    }
    if in_block && !done {
        out.push(format!("    {field}: {value}"));
    }
    out.join("\n") + "\n"
}

/// GPUs with the given undirected links, NUMA node `i / numa_width`.
pub fn gpus_with_links(
    n: usize,
    numa_width: usize,
    links: &[(usize, usize, u32)],
) -> Vec<trainyard_device_plugin::rm::backend::GpuInfo> {
    use trainyard_device_plugin::rm::backend::{ComputeCapability, GpuInfo};
    (0..n)
        .map(|i| GpuInfo {
            uuid: uuid(i),
            index: i as u32,
            minor_number: i as u32,
            name: "NVIDIA Test".into(),
            memory_mib: 1,
            pci_bus_id: None,
            numa_node: Some((i / numa_width) as i64),
            compute_capability: ComputeCapability { major: 8, minor: 0 },
            nvlinks: links
                .iter()
                .filter_map(|&(a, b, c)| match (a == i, b == i) {
                    (true, _) => Some((uuid(b), c)),
                    (_, true) => Some((uuid(a), c)),
                    _ => None,
                })
                .collect(),
        })
        .collect()
}

/// DGX-1 (V100) hybrid cube-mesh links.
#[rustfmt::skip]
pub const CUBE_MESH: [(usize, usize, u32); 16] = [
    (0, 1, 1), (0, 2, 1), (0, 3, 2), (0, 4, 2), (1, 2, 2), (1, 3, 1), (1, 5, 2), (2, 3, 2),
    (2, 6, 1), (3, 7, 1), (4, 5, 1), (4, 6, 1), (4, 7, 2), (5, 6, 2), (5, 7, 1), (6, 7, 2),
];

/// A DGX-1 cube-mesh, NUMA halves.
pub fn cube_mesh_8() -> Vec<trainyard_device_plugin::rm::backend::GpuInfo> {
    gpus_with_links(8, 4, &CUBE_MESH)
}

/// Two DGX-1 cube-meshes joined GPU i to GPU i+8 by one link, four NUMA
/// nodes: irregular enough that the search has to work for its answer.
pub fn cube_mesh_pair_16() -> Vec<trainyard_device_plugin::rm::backend::GpuInfo> {
    let mut links: Vec<(usize, usize, u32)> = Vec::new();
    for half in [0, 8] {
        links.extend(CUBE_MESH.iter().map(|&(a, b, c)| (a + half, b + half, c)));
    }
    links.extend((0..8).map(|i| (i, i + 8, 1)));
    gpus_with_links(16, 4, &links)
}

/// A field (KiB) of this process's `/proc/self/status`, e.g. `VmRSS` or `VmHWM`.
pub fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}
