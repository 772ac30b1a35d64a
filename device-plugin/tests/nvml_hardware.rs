//! The real binary with the NVML backend on a machine with NVIDIA GPUs, against the in-test
//! fake kubelet. Ignored everywhere else: run it where a driver is installed with
//! `cargo test -p trainyard-device-plugin --test nvml_hardware -- --ignored --nocapture`
//! (docs/device-plugin.md, "On real GPUs"). It prints what it saw so that a run can be
//! recorded, and asserts what must hold on any NVIDIA machine.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use trainyard_api::gpu_labels::NVIDIA_VISIBLE_DEVICES;
use trainyard_device_plugin::plugin::kubelet_api::{
    AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest, Empty,
    PreferredAllocationRequest,
};

const LIMIT: Duration = Duration::from_secs(30);

/// The plugin binary: `TRAINYARD_PLUGIN_BIN` when set (a binary carried to the GPU machine).
fn plugin_bin() -> String {
    std::env::var("TRAINYARD_PLUGIN_BIN").unwrap_or_else(|_| BIN.to_string())
}

fn discover() -> serde_json::Value {
    let out = Command::new(plugin_bin())
        .args(["discover", "--backend", "nvml"])
        .output()
        .expect("run discover");
    assert!(
        out.status.success(),
        "discover --backend nvml failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("discover prints JSON")
}

/// Runs `discover --backend nvml`, checks the facts every NVIDIA GPU has
/// and returns the UUIDs.
fn discovered_uuids() -> Vec<String> {
    let facts = discover();
    println!(
        "discover --backend nvml:\n{}",
        serde_json::to_string_pretty(&facts).unwrap()
    );
    assert_eq!(facts["backend"], "nvml");
    let gpus = facts["gpus"].as_array().expect("gpus is a list");
    assert!(!gpus.is_empty(), "NVML found no GPU");
    let uuids: Vec<String> = gpus
        .iter()
        .map(|g| g["uuid"].as_str().expect("uuid").to_string())
        .collect();
    for gpu in gpus {
        assert!(gpu["uuid"].as_str().unwrap().starts_with("GPU-"), "{gpu}");
        assert!(gpu["memoryMiB"].as_u64().unwrap() > 0, "{gpu}");
        assert!(
            gpu["computeCapability"]
                .as_str()
                .is_some_and(|c| c.contains('.')),
            "{gpu}"
        );
    }
    assert!(
        facts["driverVersion"]
            .as_str()
            .is_some_and(|v| !v.is_empty())
    );
    uuids
}

/// Starts `run --backend nvml` on the plugin directory `dir`, with metrics
/// on `port` and its log in `log`, and no API server to label.
fn spawn_nvml_plugin(dir: &Path, port: u16, log: &Path) -> Child {
    Command::new(plugin_bin())
        .args(["run", "--backend", "nvml", "--device-plugin-dir"])
        .arg(dir)
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .args(["--metrics-interval", "1s"])
        .env("RUST_LOG", "info")
        .env("KUBECONFIG", dir.join("no-kubeconfig"))
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("NODE_NAME")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("start the plugin")
}

/// Asks for a preferred single GPU among `uuids` and allocates it: the
/// plugin offers a preference, picks one GPU and hands it to the container.
async fn prefer_and_allocate_one(dir: &Path, uuids: &[String]) {
    let mut client = plugin_client(dir).await;
    let options = client
        .get_device_plugin_options(Empty {})
        .await
        .unwrap()
        .into_inner();
    assert!(options.get_preferred_allocation_available);
    let preferred = client
        .get_preferred_allocation(PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: uuids.to_vec(),
                must_include_device_i_ds: vec![],
                allocation_size: 1,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    let chosen = preferred.container_responses[0].device_i_ds.clone();
    println!("GetPreferredAllocation(1 of {}): {chosen:?}", uuids.len());
    assert_eq!(chosen.len(), 1);
    let response = client
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: chosen.clone(),
            }],
        })
        .await
        .unwrap()
        .into_inner();
    let envs = &response.container_responses[0].envs;
    println!("Allocate envs: {envs:?}");
    assert_eq!(envs[NVIDIA_VISIBLE_DEVICES], chosen[0]);
}

/// Scrapes `/metrics` on `port` until every GPU of `uuids` shows up (at
/// most 30 tries a second apart) and asserts that it did.
async fn assert_every_gpu_scraped(port: u16, uuids: &[String], log: &Path) {
    let mut metrics = String::new();
    for _ in 0..30 {
        if let Some((200, body)) = http_get(port, "/metrics")
            && uuids.iter().all(|u| body.contains(u.as_str()))
        {
            metrics = body;
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let gpu_lines: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("trainyard_gpu_"))
        .collect();
    println!("/metrics trainyard_gpu_* lines:\n{}", gpu_lines.join("\n"));
    assert!(
        uuids.iter().all(|u| metrics.contains(u.as_str())),
        "every GPU in /metrics; log:\n{}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an NVIDIA driver and at least one GPU"]
async fn nvml_backend_advertises_allocates_and_exports_every_gpu() {
    let uuids = discovered_uuids();
    let ws_root = tempfile::tempdir().unwrap();
    let dir = ws_root.path().join("device-plugins");
    std::fs::create_dir(&dir).unwrap();
    let mut kubelet = FakeKubelet::start(&dir).await;
    let port = free_port();
    let log = ws_root.path().join("plugin.log");
    let mut child = spawn_nvml_plugin(&dir, port, &log);

    let n = uuids.len();
    let devices = kubelet
        .wait_devices(LIMIT, |d| {
            d.len() == n && d.iter().all(|d| d.health == "Healthy")
        })
        .await;
    println!("ListAndWatch: {devices:?}");
    let mut advertised: Vec<String> = devices.iter().map(|d| d.id.clone()).collect();
    advertised.sort();
    let mut expected = uuids.clone();
    expected.sort();
    assert_eq!(advertised, expected);

    prefer_and_allocate_one(&dir, &uuids).await;
    assert_every_gpu_scraped(port, &uuids, &log).await;
    let _ = child.kill();
    let _ = child.wait();
    println!(
        "plugin log:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    kubelet.stop().await;
}
