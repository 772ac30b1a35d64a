//! The library's `run` starts the whole plugin in-process, as benches and
//! other crates' tests do, and returns cleanly when its token is cancelled.

mod common;

use std::time::Duration;

use common::*;
use tokio_util::sync::CancellationToken;
use trainyard_device_plugin::RunConfig;
use trainyard_device_plugin::api::Empty;

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
