//! The library's `run` starts the whole plugin in-process, as benches and
//! other crates' tests do, and returns cleanly when its token is cancelled.

mod common;

use std::time::Duration;

use common::*;
use tokio_util::sync::CancellationToken;
use trainyard_device_plugin::RunConfig;
use trainyard_device_plugin::plugin::kubelet_api::{
    AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest, Device, Empty,
    PreferredAllocationRequest,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_serves_in_process_and_stops_on_cancel_removing_its_socket() {
    let ws = Workspace::new(&example("fake-gpus-8.yaml"));
    let mut kubelet = FakeKubelet::start(&ws.dir).await;
    let config = RunConfig::fake(&ws.fake_file, &ws.dir);
    let shutdown = CancellationToken::new();
    let plugin = tokio::spawn(trainyard_device_plugin::run(config, shutdown.clone()));

    let devices = kubelet
        .wait_devices(Duration::from_secs(20), |d| d.len() == 8)
        .await;
    assert!(devices.iter().all(|d| d.health == "Healthy"));
    let mut client = plugin_client(&ws.dir).await;
    let options = client.get_device_plugin_options(Empty {}).await.unwrap();
    assert!(options.into_inner().get_preferred_allocation_available);

    shutdown.cancel();
    let result = tokio::time::timeout(Duration::from_secs(10), plugin)
        .await
        .expect("run returns after cancel")
        .expect("run task did not panic");
    assert!(result.is_ok(), "{result:?}");
    assert!(!ws.dir.join(SOCKET).exists());
    kubelet.stop().await;
}

#[tokio::test]
async fn run_fails_fast_on_an_invalid_fake_file() {
    let root = tempfile::tempdir().unwrap();
    let file = root.path().join("gpus.yaml");
    std::fs::write(&file, "gpus:\n  - {uuid: GPU-a, name: x, memoryMiB: 0}\n").unwrap();
    let config = RunConfig::fake(&file, root.path());
    let err = trainyard_device_plugin::run(config, CancellationToken::new())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("gpus.yaml") && err.contains("gpus[0].memoryMiB"),
        "{err}"
    );
}

/// Waits until the kubelet's list has all 8 GPUs and exactly the ones in
/// `unhealthy` are Unhealthy.
async fn wait_unhealthy(kubelet: &mut FakeKubelet, unhealthy: &[usize]) -> Vec<Device> {
    let wanted: Vec<String> = unhealthy.iter().map(|&i| uuid(i)).collect();
    kubelet
        .wait_devices(Duration::from_secs(20), |d| {
            d.len() == 8
                && d.iter()
                    .all(|x| (x.health == "Unhealthy") == wanted.contains(&x.id))
        })
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_with_a_per_device_error_is_advertised_unhealthy_while_the_rest_are_served() {
    let ws = Workspace::new(&example("fake-gpus-8.yaml"));
    // NVML answers GpuLost for GPU 3 (after XID 79) at start-up.
    ws.rewrite(|t| set_gpu_field(&t, 3, "error", "GpuLost"));
    let mut kubelet = FakeKubelet::start(&ws.dir).await;
    let mut config = RunConfig::fake(&ws.fake_file, &ws.dir);
    config.health.recovery_quiet_period = Duration::ZERO;
    let shutdown = CancellationToken::new();
    let plugin = tokio::spawn(trainyard_device_plugin::run(config, shutdown.clone()));

    wait_unhealthy(&mut kubelet, &[3]).await;
    let mut client = plugin_client(&ws.dir).await;
    let healthy: Vec<String> = [0, 1, 2, 4, 5, 6, 7].into_iter().map(uuid).collect();
    let preferred = client
        .get_preferred_allocation(PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: healthy.clone(),
                must_include_device_i_ds: vec![],
                allocation_size: 7,
            }],
        })
        .await
        .expect("the healthy GPUs are still allocatable")
        .into_inner();
    assert_eq!(preferred.container_responses[0].device_i_ds.len(), 7);
    client
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: healthy,
            }],
        })
        .await
        .expect("Allocate serves the healthy GPUs");

    // GPU 3 answers again, but its row remapping is still pending: answering
    // is not proof of the reset that GpuLost needs. GPU 5 going unhealthy in
    // the same edit shows that the edit has been through a health round.
    ws.rewrite(|t| {
        let t = set_gpu_field(&t, 3, "error", "null");
        let t = set_gpu_field(&t, 3, "rowRemapPending", "true");
        set_gpu_field(&t, 5, "healthy", "false")
    });
    wait_unhealthy(&mut kubelet, &[3, 5]).await;

    // Reset done: nothing pending any more, and GPU 5 is fine again.
    ws.rewrite(|t| {
        let t = set_gpu_field(&t, 3, "rowRemapPending", "false");
        set_gpu_field(&t, 5, "healthy", "true")
    });
    wait_unhealthy(&mut kubelet, &[]).await;

    shutdown.cancel();
    let result = tokio::time::timeout(Duration::from_secs(10), plugin)
        .await
        .expect("run returns after cancel")
        .expect("run task did not panic");
    assert!(result.is_ok(), "{result:?}");
    kubelet.stop().await;
}
