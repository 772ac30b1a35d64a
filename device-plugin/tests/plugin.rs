//! The real binary against an in-test fake kubelet on a temp-dir socket.

mod common;

use std::time::Duration;

use common::*;
use trainyard_api::crd::DEFAULT_GPU_RESOURCE;
use trainyard_api::gpu_labels::{LABEL_CUDA_MAJOR, LABEL_GPU_PRODUCT, NVIDIA_VISIBLE_DEVICES};
use trainyard_device_plugin::plugin::kubelet_api::{
    AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest, Empty,
    PreferredAllocationRequest,
};

const START_LIMIT: Duration = Duration::from_secs(20);
/// How long a test waits for a change to show: a bound on a hang, never a latency claim (on
/// a loaded machine a verdict must not depend on speed). The benchmark in `make bench`
/// measures how fast a change propagates.
const HANG_LIMIT: Duration = Duration::from_secs(30);

fn all_healthy(devices: &[trainyard_device_plugin::plugin::kubelet_api::Device]) -> bool {
    devices.len() == 8 && devices.iter().all(|d| d.health == "Healthy")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_streams_every_gpu_and_serves_allocate() {
    let ws = Workspace::new(&example("fake-gpus-8.yaml"));
    let mut kubelet = FakeKubelet::start(&ws.dir).await;
    let plugin = Plugin::start(&ws.dir, &ws.fake_file, &[]);

    assert!(
        wait_until(START_LIMIT, || kubelet.registration_count() == 1).await,
        "no registration; log:\n{}",
        plugin.log_text()
    );
    let request = kubelet.registrations.lock().unwrap()[0].clone();
    assert_eq!(request.version, "v1beta1");
    assert_eq!(request.endpoint, SOCKET);
    assert_eq!(request.resource_name, DEFAULT_GPU_RESOURCE);
    assert!(request.options.unwrap().get_preferred_allocation_available);

    let devices = kubelet.wait_devices(START_LIMIT, all_healthy).await;
    for (i, device) in devices.iter().enumerate() {
        assert_eq!(device.id, uuid(i));
        let numa = device.topology.as_ref().unwrap().nodes[0].id;
        assert_eq!(numa, if i < 4 { 0 } else { 1 });
    }

    let mut client = plugin_client(&ws.dir).await;
    let options = client
        .get_device_plugin_options(Empty {})
        .await
        .unwrap()
        .into_inner();
    assert!(options.get_preferred_allocation_available);
    assert!(!options.pre_start_required);

    let allocate = |ids: Vec<String>| AllocateRequest {
        container_requests: vec![ContainerAllocateRequest { devices_ids: ids }],
    };
    let response = client
        .allocate(allocate(vec![uuid(2), uuid(5)]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        response.container_responses[0].envs[NVIDIA_VISIBLE_DEVICES],
        format!("{},{}", uuid(2), uuid(5))
    );
    let unknown = client
        .allocate(allocate(vec!["GPU-does-not-exist".into()]))
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::InvalidArgument);
    let duplicate = client
        .allocate(allocate(vec![uuid(1), uuid(1)]))
        .await
        .unwrap_err();
    assert_eq!(duplicate.code(), tonic::Code::InvalidArgument);

    let preferred = client
        .get_preferred_allocation(PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: (0..8).map(uuid).collect(),
                must_include_device_i_ds: vec![uuid(6)],
                allocation_size: 3,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    // All pairs have 12 links; the tie goes to GPU 6's NUMA node.
    assert_eq!(
        preferred.container_responses[0].device_i_ds,
        vec![uuid(4), uuid(5), uuid(6)]
    );
    drop(plugin);
    kubelet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_flip_in_the_fake_file_reaches_list_and_watch() {
    let ws = Workspace::new(&example("fake-gpus-8.yaml"));
    let mut kubelet = FakeKubelet::start(&ws.dir).await;
    let plugin = Plugin::start(&ws.dir, &ws.fake_file, &["--health-recovery-seconds", "0"]);
    kubelet.wait_devices(START_LIMIT, all_healthy).await;

    ws.rewrite(|t| set_gpu_field(&t, 3, "healthy", "false"));
    let devices = kubelet
        .wait_devices(HANG_LIMIT, |d| {
            d.len() == 8 && d.iter().filter(|x| x.health == "Unhealthy").count() == 1
        })
        .await;
    assert_eq!(devices[3].health, "Unhealthy", "only GPU 3 is unhealthy");

    // With no quiet period the GPU recovers as soon as the file says so.
    ws.rewrite(|t| set_gpu_field(&t, 3, "healthy", "true"));
    kubelet.wait_devices(HANG_LIMIT, all_healthy).await;

    // Removing a GPU (and the links to it) from the file removes it from the list.
    ws.rewrite(|t| {
        let cut = t.find(&format!("  - uuid: {}", uuid(7))).unwrap();
        t[..cut]
            .lines()
            .filter(|l| !l.contains(&uuid(7)))
            .map(|l| format!("{l}\n"))
            .collect()
    });
    kubelet.wait_devices(HANG_LIMIT, |d| d.len() == 7).await;
    assert!(plugin.log_text().contains("GPU is now unhealthy"));
    drop(plugin);
    kubelet.stop().await;
}

fn remove_every_socket(dir: &std::path::Path) {
    use std::os::unix::fs::FileTypeExt;
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_socket() {
            std::fs::remove_file(entry.path()).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn re_registers_after_every_kubelet_restart_ten_times_in_a_row() {
    let ws = Workspace::new(&example("fake-gpus-8.yaml"));
    let mut kubelet = FakeKubelet::start(&ws.dir).await;
    let plugin = Plugin::start(&ws.dir, &ws.fake_file, &[]);
    kubelet.wait_devices(START_LIMIT, all_healthy).await;

    for restart in 1..=10 {
        // What the kubelet does on start: stop, wipe every socket, listen anew.
        kubelet.stop().await;
        remove_every_socket(&ws.dir);
        kubelet = FakeKubelet::start(&ws.dir).await;
        assert!(
            wait_until(Duration::from_secs(10), || kubelet.registration_count()
                >= 1)
            .await,
            "restart {restart}: no re-registration; log:\n{}",
            plugin.log_text()
        );
        kubelet
            .wait_devices(Duration::from_secs(10), all_healthy)
            .await;
        assert!(
            ws.dir.join(SOCKET).exists(),
            "restart {restart}: plugin socket missing"
        );
        let mut client = plugin_client(&ws.dir).await;
        client.get_device_plugin_options(Empty {}).await.unwrap();
    }
    assert!(plugin.log_text().contains("registering again"));
    drop(plugin);
    kubelet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn re_registers_when_list_and_watch_ends_and_is_not_reopened() {
    let ws = Workspace::new(&example("fake-gpus-8.yaml"));
    let mut kubelet = FakeKubelet::start(&ws.dir).await;
    let plugin = Plugin::start(&ws.dir, &ws.fake_file, &[]);
    kubelet.wait_devices(START_LIMIT, all_healthy).await;
    assert_eq!(kubelet.registration_count(), 1);
    kubelet.drop_watches();
    assert!(
        wait_until(Duration::from_secs(10), || kubelet.registration_count()
            == 2)
        .await,
        "no re-registration after the stream ended; log:\n{}",
        plugin.log_text()
    );
    kubelet
        .wait_devices(Duration::from_secs(10), all_healthy)
        .await;
    assert!(
        plugin
            .log_text()
            .contains("ListAndWatch ended and was not reopened")
    );
    drop(plugin);
    kubelet.stop().await;
}

fn metric(text: &str, name_and_labels: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(name_and_labels)
                .and_then(|rest| rest.strip_prefix(' '))
        })
        .and_then(|v| v.trim().parse().ok())
}

/// GPU 0 reports every telemetry field; GPU 1 has XID 48 waiting.
fn with_telemetry(t: String) -> String {
    let t = set_gpu_field(&t, 0, "utilizationPercent", "87");
    let t = set_gpu_field(&t, 0, "memoryUtilizationPercent", "40");
    let t = set_gpu_field(&t, 0, "memoryUsedMiB", "30000");
    let t = set_gpu_field(&t, 0, "temperatureC", "64");
    let t = set_gpu_field(&t, 0, "powerW", "310");
    let t = set_gpu_field(&t, 0, "powerLimitW", "400");
    let t = set_gpu_field(&t, 0, "smClockMHz", "1410");
    let t = set_gpu_field(&t, 0, "memClockMHz", "1593");
    let t = set_gpu_field(&t, 0, "throttleReasons", "[thermal, power_cap]");
    set_gpu_field(&t, 1, "xid", "48")
}

/// The per-GPU series the scrape must show, for the series labels of GPU 0
/// and GPU 1, once GPU 1 went bad with XID 48.
fn expected_gpu_metrics(gpu0: &str, gpu1: &str) -> Vec<(String, f64)> {
    vec![
        (format!("trainyard_gpu_utilization_percent{{{gpu0}}}"), 87.0),
        (
            format!("trainyard_gpu_memory_utilization_percent{{{gpu0}}}"),
            40.0,
        ),
        (
            format!("trainyard_gpu_memory_used_bytes{{{gpu0}}}"),
            30000.0 * 1048576.0,
        ),
        (
            format!("trainyard_gpu_memory_total_bytes{{{gpu0}}}"),
            81920.0 * 1048576.0,
        ),
        (format!("trainyard_gpu_temperature_celsius{{{gpu0}}}"), 64.0),
        (format!("trainyard_gpu_power_draw_watts{{{gpu0}}}"), 310.0),
        (format!("trainyard_gpu_power_limit_watts{{{gpu0}}}"), 400.0),
        (format!("trainyard_gpu_sm_clock_hertz{{{gpu0}}}"), 1410e6),
        (
            format!("trainyard_gpu_memory_clock_hertz{{{gpu0}}}"),
            1593e6,
        ),
        (
            format!("trainyard_gpu_throttle_reason{{{gpu0},reason=\"thermal\"}}"),
            1.0,
        ),
        (
            format!("trainyard_gpu_throttle_reason{{{gpu0},reason=\"power_cap\"}}"),
            1.0,
        ),
        (
            format!("trainyard_gpu_throttle_reason{{{gpu0},reason=\"idle\"}}"),
            0.0,
        ),
        (
            format!("trainyard_gpu_throttle_reason{{{gpu1},reason=\"idle\"}}"),
            1.0,
        ),
        (format!("trainyard_gpu_health{{{gpu0}}}"), 1.0),
        (format!("trainyard_gpu_health{{{gpu1}}}"), 0.0),
        (
            format!("trainyard_gpu_xid_events_total{{{gpu1},xid=\"48\"}}"),
            1.0,
        ),
    ]
}

/// The plugin-wide series the scrape must show after one registration, one
/// Allocate of two GPUs and one GPU gone bad.
fn expected_plugin_metrics() -> Vec<(String, f64)> {
    vec![
        (
            r#"trainyard_device_plugin_devices{health="healthy"}"#.into(),
            7.0,
        ),
        (
            r#"trainyard_device_plugin_devices{health="unhealthy"}"#.into(),
            1.0,
        ),
        (
            r#"trainyard_device_plugin_allocations_total{result="success"}"#.into(),
            1.0,
        ),
        (
            "trainyard_device_plugin_allocated_devices_total".into(),
            2.0,
        ),
        (
            r#"trainyard_device_plugin_registrations_total{result="success"}"#.into(),
            1.0,
        ),
        (
            r#"trainyard_device_plugin_rpc_duration_seconds_count{method="Allocate"}"#.into(),
            1.0,
        ),
    ]
}

/// Scrapes `/metrics` until every `expected` series has its value and
/// returns that scrape; panics naming the mismatches after `HANG_LIMIT`.
async fn scrape_until_matching(port: u16, expected: &[(String, f64)]) -> String {
    let mut text = String::new();
    let all_match = |text: &str| expected.iter().all(|(k, v)| metric(text, k) == Some(*v));
    let ok = wait_until(HANG_LIMIT, || {
        text = http_get(port, "/metrics")
            .map(|(_, b)| b)
            .unwrap_or_default();
        all_match(&text)
    })
    .await;
    if !ok {
        let missing: Vec<_> = expected
            .iter()
            .filter(|(k, v)| metric(&text, k) != Some(*v))
            .map(|(k, v)| format!("{k} = {v} (got {:?})", metric(&text, k)))
            .collect();
        panic!("metrics mismatch: {missing:#?}\n{text}");
    }
    text
}

/// The series labels of GPU `i` of the 8-GPU example on node `node-a`.
fn gpu_series(i: usize) -> String {
    format!(
        r#"gpu="{}",index="{i}",product="NVIDIA A100-SXM4-80GB",node="node-a""#,
        uuid(i)
    )
}

/// Starts the binary on node `node-a` with metrics on a free port, checks
/// that `/healthz` answers 200 at once and `/readyz` 503 until a kubelet
/// has registered the plugin, then 200; returns the plugin, the kubelet and
/// the port.
async fn start_serving_metrics(ws: &Workspace) -> (Plugin, FakeKubelet, u16) {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let plugin = Plugin::start(
        &ws.dir,
        &ws.fake_file,
        &[
            "--metrics-addr",
            &addr,
            "--metrics-interval",
            "2s",
            // No API server is reachable: labelling must fail quietly.
            "--node-name",
            "node-a",
        ],
    );
    assert!(
        wait_until(START_LIMIT, || http_get(port, "/healthz")
            .is_some_and(|(s, _)| s == 200))
        .await,
        "metrics server did not come up; log:\n{}",
        plugin.log_text()
    );
    // Not registered yet: not ready.
    assert_eq!(http_get(port, "/readyz").unwrap().0, 503);
    let mut kubelet = FakeKubelet::start(&ws.dir).await;
    kubelet.wait_devices(START_LIMIT, all_healthy).await;
    assert!(
        wait_until(HANG_LIMIT, || http_get(port, "/readyz")
            .is_some_and(|(s, _)| s == 200))
        .await
    );
    (plugin, kubelet, port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_report_every_family_and_follow_file_changes() {
    let ws = Workspace::new(&example("fake-gpus-8.yaml"));
    ws.rewrite(with_telemetry);
    let (plugin, mut kubelet, port) = start_serving_metrics(&ws).await;
    let mut client = plugin_client(&ws.dir).await;
    client
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec![uuid(0), uuid(1)],
            }],
        })
        .await
        .unwrap();
    // GPU 1 goes bad with XID 48: counted and shown as health 0.
    ws.rewrite(|t| set_gpu_field(&t, 1, "healthy", "false"));
    kubelet
        .wait_devices(HANG_LIMIT, |d| d.len() == 8 && d[1].health == "Unhealthy")
        .await;

    let (gpu0, gpu1) = (gpu_series(0), gpu_series(1));
    let mut expected = expected_gpu_metrics(&gpu0, &gpu1);
    expected.extend(expected_plugin_metrics());
    let text = scrape_until_matching(port, &expected).await;
    let families = text.lines().filter(|l| l.starts_with("# TYPE ")).count();
    // Every family but `trainyard_gpu_call_timeouts`, which has no series
    // until a call runs out its deadline.
    assert_eq!(families, 18, "every metric family is exported:\n{text}");

    // A telemetry change in the file shows up in a later scrape.
    ws.rewrite(|t| set_gpu_field(&t, 0, "utilizationPercent", "12"));
    let key = format!("trainyard_gpu_utilization_percent{{{gpu0}}}");
    let seen = wait_until(HANG_LIMIT, || {
        http_get(port, "/metrics").is_some_and(|(_, b)| metric(&b, &key) == Some(12.0))
    })
    .await;
    assert!(
        seen,
        "utilization change not scraped within {HANG_LIMIT:?}; log:\n{}",
        plugin.log_text()
    );
    assert!(
        plugin.log_text().contains("cannot apply node labels"),
        "{}",
        plugin.log_text()
    );
    drop(plugin);
    kubelet.stop().await;
}

#[test]
fn invalid_fake_file_exits_non_zero_naming_the_file_and_field() {
    let root = tempfile::tempdir().unwrap();
    let file = root.path().join("broken-gpus.yaml");
    std::fs::write(
        &file,
        "gpus:\n  - {uuid: GPU-a, name: x, memoryMiB: 1}\n  - {uuid: GPU-a, name: x, memoryMiB: 1}\n",
    )
    .unwrap();
    for subcommand in ["run", "discover"] {
        let out = std::process::Command::new(BIN)
            .args([subcommand, "--fake-gpus"])
            .arg(&file)
            .args(if subcommand == "run" {
                vec![
                    "--device-plugin-dir".to_string(),
                    root.path().display().to_string(),
                ]
            } else {
                vec![]
            })
            .output()
            .unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(&file.display().to_string()), "{stderr}");
        assert!(stderr.contains("gpus[1].uuid"), "{stderr}");
        assert!(stderr.contains("duplicate uuid"), "{stderr}");
    }
}

fn nvml_present() -> bool {
    [
        "/dev/nvidiactl",
        "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        "/usr/lib64/libnvidia-ml.so.1",
    ]
    .iter()
    .any(|p| std::path::Path::new(p).exists())
}

#[test]
fn nvml_backend_without_a_driver_exits_non_zero_with_a_clear_error() {
    if nvml_present() {
        eprintln!("an NVIDIA driver is present; this test checks the driverless case only");
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().display().to_string();
    for args in [
        vec!["run", "--backend", "nvml", "--device-plugin-dir", &dir],
        vec!["run", "--device-plugin-dir", &dir],
        vec!["discover", "--backend", "nvml"],
    ] {
        let out = std::process::Command::new(BIN)
            .args(&args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("NVIDIA driver/NVML not found"),
            "{args:?}: {stderr}"
        );
    }
}

#[test]
fn discover_prints_gpus_topology_health_and_driver_facts() {
    let out = std::process::Command::new(BIN)
        .args(["discover", "--fake-gpus"])
        .arg(example("fake-gpus-8.yaml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["backend"], "fake");
    assert_eq!(report["driverVersion"], "550.54.15");
    assert_eq!(report["cudaVersion"], "12.4");
    let gpus = report["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 8);
    assert_eq!(gpus[0]["uuid"], uuid(0));
    assert_eq!(gpus[0]["computeCapability"], "8.0");
    assert_eq!(gpus[0]["memoryMiB"], 81920);
    assert_eq!(gpus[0]["health"], "Healthy");
    let matrix = report["topology"]["nvlinks"].as_array().unwrap();
    assert_eq!(matrix.len(), 8);
    assert_eq!(matrix[0][1], 12);
    assert_eq!(matrix[0][0], 0);
    assert_eq!(report["labels"][LABEL_GPU_PRODUCT], "NVIDIA-A100-SXM4-80GB");
    assert_eq!(report["labels"][LABEL_CUDA_MAJOR], "12");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_the_plugin_and_removes_its_socket() {
    let ws = Workspace::new(&example("fake-gpus-8.yaml"));
    let mut kubelet = FakeKubelet::start(&ws.dir).await;
    let mut plugin = Plugin::start(&ws.dir, &ws.fake_file, &[]);
    kubelet.wait_devices(START_LIMIT, all_healthy).await;
    let status = std::process::Command::new("kill")
        .args(["-TERM", &plugin.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let mut exited = None;
    assert!(
        wait_until(Duration::from_secs(10), || {
            exited = plugin.child.try_wait().unwrap();
            exited.is_some()
        })
        .await
    );
    assert!(exited.unwrap().success());
    assert!(!ws.dir.join(SOCKET).exists());
    kubelet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_returns_cdi_names_and_device_specs_when_the_flags_ask() {
    let ws = Workspace::new(&example("fake-gpus-8.yaml"));
    let mut kubelet = FakeKubelet::start(&ws.dir).await;
    let plugin = Plugin::start(
        &ws.dir,
        &ws.fake_file,
        &[
            "--device-list-strategy",
            "envvar,cdi",
            "--pass-device-specs",
        ],
    );
    kubelet.wait_devices(START_LIMIT, all_healthy).await;
    let mut client = plugin_client(&ws.dir).await;
    let response = client
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec![uuid(4), uuid(7)],
            }],
        })
        .await
        .unwrap()
        .into_inner();
    let container = &response.container_responses[0];
    assert_eq!(
        container.envs[NVIDIA_VISIBLE_DEVICES],
        format!("{},{}", uuid(4), uuid(7))
    );
    let cdi: Vec<&str> = container
        .cdi_devices
        .iter()
        .map(|d| d.name.as_str())
        .collect();
    assert_eq!(
        cdi,
        [
            format!("nvidia.com/gpu={}", uuid(4)),
            format!("nvidia.com/gpu={}", uuid(7))
        ]
    );
    let specs: Vec<&str> = container
        .devices
        .iter()
        .map(|d| d.container_path.as_str())
        .collect();
    assert_eq!(
        specs,
        [
            "/dev/nvidia4",
            "/dev/nvidia7",
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools"
        ]
    );
    drop(plugin);
    kubelet.stop().await;
}

fn healthz(port: u16) -> Option<u16> {
    http_get(port, "/healthz").map(|(status, _)| status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_fails_while_unregistered_past_the_grace_and_recovers_on_registration() {
    let ws = Workspace::new(&example("fake-gpus-8.yaml"));
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let plugin = Plugin::start(
        &ws.dir,
        &ws.fake_file,
        &["--metrics-addr", &addr, "--unregistered-grace", "2s"],
    );
    // No kubelet yet: live within the grace, then not.
    assert!(
        wait_until(START_LIMIT, || healthz(port) == Some(503)).await,
        "/healthz stayed {:?} with no kubelet past the grace; log:\n{}",
        http_get(port, "/healthz"),
        plugin.log_text()
    );
    let body = http_get(port, "/healthz").unwrap().1;
    assert!(body.contains("not registered with the kubelet"), "{body}");

    let mut kubelet = FakeKubelet::start(&ws.dir).await;
    kubelet.wait_devices(START_LIMIT, all_healthy).await;
    assert!(
        wait_until(Duration::from_secs(10), || healthz(port) == Some(200)).await,
        "/healthz did not recover after registration; log:\n{}",
        plugin.log_text()
    );

    // The kubelet goes away and stays away: the grace starts at the loss.
    kubelet.stop().await;
    remove_every_socket(&ws.dir);
    assert!(
        wait_until(Duration::from_secs(20), || healthz(port) == Some(503)).await,
        "/healthz stayed {:?} after the registration was lost; log:\n{}",
        http_get(port, "/healthz"),
        plugin.log_text()
    );
    let mut kubelet = FakeKubelet::start(&ws.dir).await;
    kubelet.wait_devices(START_LIMIT, all_healthy).await;
    assert!(
        wait_until(Duration::from_secs(10), || healthz(port) == Some(200)).await,
        "/healthz did not recover after re-registration; log:\n{}",
        plugin.log_text()
    );
    drop(plugin);
    kubelet.stop().await;
}

fn health_of(devices: &[trainyard_device_plugin::plugin::kubelet_api::Device]) -> Vec<&str> {
    devices.iter().map(|d| d.health.as_str()).collect()
}

/// The health list of 8 GPUs where exactly the GPUs at `unhealthy` are Unhealthy.
fn only_unhealthy(unhealthy: &[usize]) -> Vec<&'static str> {
    (0..8)
        .map(|i| {
            if unhealthy.contains(&i) {
                "Unhealthy"
            } else {
                "Healthy"
            }
        })
        .collect()
}

fn scraped(port: u16, name_and_labels: &str) -> Option<f64> {
    http_get(port, "/metrics").and_then(|(_, body)| metric(&body, name_and_labels))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_whose_probe_blocks_goes_unhealthy_alone_while_the_others_are_probed_and_healthz_stays_ok()
 {
    let ws = Workspace::new(&example("fake-gpus-8.yaml"));
    let mut kubelet = FakeKubelet::start(&ws.dir).await;
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let plugin = Plugin::start(
        &ws.dir,
        &ws.fake_file,
        &[
            "--metrics-addr",
            &addr,
            "--probe-interval",
            "200ms",
            "--gpu-call-timeout",
            "1s",
            "--probe-stall-limit",
            "3s",
            "--health-recovery-seconds",
            "0",
        ],
    );
    kubelet.wait_devices(START_LIMIT, all_healthy).await;
    assert!(
        wait_until(START_LIMIT, || healthz(port) == Some(200)).await,
        "/healthz not 200 when registered and probing; log:\n{}",
        plugin.log_text()
    );

    // Every probe of GPU 2 now blocks its thread, as a hung NVML call does.
    ws.rewrite(|t| set_gpu_field(&t, 2, "probeDelaySeconds", "3600"));
    kubelet
        .wait_devices(HANG_LIMIT, |d| health_of(d) == only_unhealthy(&[2]))
        .await;

    // Rounds keep completing while the call hangs, so the plugin stays live.
    let rounds = "trainyard_device_plugin_probe_rounds_total";
    let before = scraped(port, rounds).expect("the rounds counter is exported");
    assert!(
        wait_until(HANG_LIMIT, || scraped(port, rounds)
            .is_some_and(|n| n >= before + 5.0))
        .await,
        "probe rounds stopped at {before} while GPU 2 hangs; log:\n{}",
        plugin.log_text()
    );
    assert_eq!(
        healthz(port),
        Some(200),
        "one hung GPU is no reason to restart"
    );
    let timeouts = format!(
        r#"trainyard_gpu_call_timeouts_total{{gpu="{}",index="2",product="NVIDIA A100-SXM4-80GB",node=""}}"#,
        uuid(2)
    );
    assert!(scraped(port, &timeouts).is_some_and(|n| n >= 1.0));
    assert!(plugin.log_text().contains("did not return within"));
    // The hung call holds neither the other endpoints nor the kubelet's.
    assert_eq!(http_get(port, "/readyz").map(|(s, _)| s), Some(200));
    let mut client = plugin_client(&ws.dir).await;
    client.get_device_plugin_options(Empty {}).await.unwrap();

    // Every other GPU is still probed: GPU 5 goes bad and recovers meanwhile.
    ws.rewrite(|t| set_gpu_field(&t, 5, "healthy", "false"));
    kubelet
        .wait_devices(HANG_LIMIT, |d| health_of(d) == only_unhealthy(&[2, 5]))
        .await;
    ws.rewrite(|t| set_gpu_field(&t, 5, "healthy", "true"));
    kubelet
        .wait_devices(HANG_LIMIT, |d| health_of(d) == only_unhealthy(&[2]))
        .await;

    // The call returns: GPU 2 answers again and recovers.
    ws.rewrite(|t| set_gpu_field(&t, 2, "probeDelaySeconds", "0"));
    kubelet.wait_devices(HANG_LIMIT, all_healthy).await;
    assert_eq!(healthz(port), Some(200));
    drop(plugin);
    kubelet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_plugin_never_advertises_a_gpu_that_still_owes_a_reset() {
    let ws = Workspace::new(&example("fake-gpus-8.yaml"));
    let mut kubelet = FakeKubelet::start(&ws.dir).await;
    let args = ["--health-recovery-seconds", "0"];
    let plugin = Plugin::start(&ws.dir, &ws.fake_file, &args);
    kubelet.wait_devices(START_LIMIT, all_healthy).await;
    // XID 63 on GPU 3 (a row remap recorded, applied at the next reset) and
    // XID 62 on GPU 6, where the driver asks for a reset.
    ws.rewrite(|t| {
        let t = set_gpu_field(&t, 3, "healthy", "false");
        let t = set_gpu_field(&t, 3, "xid", "63");
        let t = set_gpu_field(&t, 3, "rowRemapPending", "true");
        let t = set_gpu_field(&t, 6, "healthy", "false");
        let t = set_gpu_field(&t, 6, "xid", "62");
        set_gpu_field(&t, 6, "recoveryAction", "gpu_reset")
    });
    kubelet
        .wait_devices(HANG_LIMIT, |d| health_of(d) == only_unhealthy(&[3, 6]))
        .await;

    // The plugin is restarted (OOM, rollout) before anyone resets the GPUs;
    // the XIDs are history, the owed resets are not.
    drop(plugin);
    kubelet.stop().await;
    remove_every_socket(&ws.dir);
    ws.rewrite(|t| {
        let t = set_gpu_field(&t, 3, "healthy", "true");
        set_gpu_field(&t, 6, "healthy", "true")
    });
    let mut kubelet = FakeKubelet::start(&ws.dir).await;
    let plugin = Plugin::start(&ws.dir, &ws.fake_file, &args);
    let first = kubelet.wait_devices(START_LIMIT, |d| d.len() == 8).await;
    assert_eq!(
        health_of(&first),
        only_unhealthy(&[3, 6]),
        "the first list after the restart; log:\n{}",
        plugin.log_text()
    );
    assert!(
        plugin.log_text().contains("waiting for a GPU reset"),
        "{}",
        plugin.log_text()
    );
    // discover says the same.
    let out = std::process::Command::new(BIN)
        .args(["discover", "--fake-gpus"])
        .arg(&ws.fake_file)
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["gpus"][3]["health"], "Unhealthy", "{report}");
    assert_eq!(report["gpus"][6]["health"], "Unhealthy", "{report}");
    assert_eq!(report["gpus"][0]["health"], "Healthy", "{report}");

    // The GPUs are reset: nothing owed any more, and both come back.
    ws.rewrite(|t| {
        let t = set_gpu_field(&t, 3, "rowRemapPending", "false");
        set_gpu_field(&t, 6, "recoveryAction", "none")
    });
    kubelet.wait_devices(HANG_LIMIT, all_healthy).await;
    drop(plugin);
    kubelet.stop().await;
}
