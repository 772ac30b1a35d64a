//! A seconds-long timing guard on the hot paths, run by `make bench`
//! (`cargo test -p trainyard-device-plugin --features timing-guards --test regression_guard`).
//! Its verdict depends on the machine's load, so `make test` never runs it.
//!
//! It asserts no absolute time. Each check compares two timings taken in the
//! same run on the same machine and fails only when their ratio grows to
//! three times the recorded baseline, i.e. when the guarded path got about
//! 3× slower relative to its reference. The full numbers come from
//! `cargo bench -p trainyard-device-plugin --bench grpc`.

mod common;

use std::time::{Duration, Instant};

use common::*;
use trainyard_device_plugin::plugin::kubelet_api::{
    ContainerPreferredAllocationRequest, Empty, PreferredAllocationRequest,
};
use trainyard_device_plugin::rm::allocator::Topology;

const REGRESSION_FACTOR: f64 = 3.0;

/// p50(GetPreferredAllocation 8 of 16) / p50(GetDevicePluginOptions), both over gRPC:
/// the search is noise next to a gRPC round trip, so the ratio sits just above 1. The
/// baseline is the ratio on the 2-core development machine, debug build, rounded up.
const BASELINE_PREFERRED_VS_TRIVIAL_RPC: f64 = 1.1;

/// Branch-and-bound search / exhaustive enumeration of all C(16,8) subsets,
/// in-process on an irregular 16-GPU topology; the baseline is taken the same way.
const BASELINE_SEARCH_VS_EXHAUSTIVE: f64 = 0.01;

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn exhaustive_best(topology: &Topology, size: usize) -> u64 {
    let n = topology.len();
    let mut best = 0;
    for mask in 0u32..(1 << n) {
        if mask.count_ones() as usize == size {
            let set: Vec<usize> = (0..n).filter(|&i| mask & (1 << i) != 0).collect();
            best = best.max(topology.set_score(&set));
        }
    }
    best
}

fn check(name: &str, ratio: f64, baseline: f64) {
    eprintln!(
        "{name}: ratio {ratio:.4} (baseline {baseline}, limit {:.4})",
        baseline * REGRESSION_FACTOR
    );
    assert!(
        ratio <= baseline * REGRESSION_FACTOR,
        "{name} regressed: ratio {ratio:.4} is more than {REGRESSION_FACTOR}x the baseline {baseline}"
    );
}

#[test]
fn allocator_search_stays_far_cheaper_than_exhaustive_enumeration() {
    let topology = Topology::new(&cube_mesh_pair_16()).unwrap();
    let all: Vec<String> = (0..16).map(uuid).collect();
    let none: [&str; 0] = [];
    let chosen = topology.preferred(&all, &none, 8).unwrap();
    let positions: Vec<usize> = chosen
        .iter()
        .map(|id| all.iter().position(|a| a == id).unwrap())
        .collect();
    assert_eq!(
        topology.set_score(&positions),
        exhaustive_best(&topology, 8),
        "search is optimal"
    );

    let search = median(
        (0..51)
            .map(|_| {
                let start = Instant::now();
                std::hint::black_box(topology.preferred(&all, &none, 8).unwrap());
                start.elapsed()
            })
            .collect(),
    );
    let exhaustive = median(
        (0..5)
            .map(|_| {
                let start = Instant::now();
                std::hint::black_box(exhaustive_best(&topology, 8));
                start.elapsed()
            })
            .collect(),
    );
    check(
        "search / exhaustive",
        search.as_secs_f64() / exhaustive.as_secs_f64(),
        BASELINE_SEARCH_VS_EXHAUSTIVE,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preferred_allocation_rpc_stays_close_to_a_trivial_rpc() {
    let ws = Workspace::new(&example("fake-gpus-16.yaml"));
    let mut kubelet = FakeKubelet::start(&ws.dir).await;
    let plugin = Plugin::start(&ws.dir, &ws.fake_file, &[]);
    kubelet
        .wait_devices(Duration::from_secs(20), |d| d.len() == 16)
        .await;
    let mut client = plugin_client(&ws.dir).await;
    let request = PreferredAllocationRequest {
        container_requests: vec![ContainerPreferredAllocationRequest {
            available_device_i_ds: (0..16).map(uuid).collect(),
            must_include_device_i_ds: vec![uuid(15)],
            allocation_size: 8,
        }],
    };
    // Interleave the two calls so load changes hit both alike.
    let mut trivial = Vec::new();
    let mut preferred = Vec::new();
    for round in 0..400 {
        let start = Instant::now();
        client.get_device_plugin_options(Empty {}).await.unwrap();
        let t = start.elapsed();
        let start = Instant::now();
        let response = client
            .get_preferred_allocation(request.clone())
            .await
            .unwrap();
        let p = start.elapsed();
        assert_eq!(
            response.into_inner().container_responses[0]
                .device_i_ds
                .len(),
            8
        );
        if round >= 50 {
            trivial.push(t);
            preferred.push(p);
        }
    }
    check(
        "GetPreferredAllocation / GetDevicePluginOptions",
        median(preferred).as_secs_f64() / median(trivial).as_secs_f64(),
        BASELINE_PREFERRED_VS_TRIVIAL_RPC,
    );
    drop(plugin);
    kubelet.stop().await;
}
