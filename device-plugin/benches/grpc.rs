//! Device-plugin hot paths over real gRPC on a unix socket, against the real
//! binary: Allocate and GetPreferredAllocation latency on 8- and 16-GPU
//! topologies, ListAndWatch propagation of a health change in the fake file,
//! and peak RSS idle and after 1,000 allocations. Prints a markdown table.
//!
//! Run with `cargo bench -p trainyard-device-plugin --bench grpc`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::*;
use trainyard_device_plugin::plugin::kubelet_api::device_plugin_client::DevicePluginClient;
use trainyard_device_plugin::plugin::kubelet_api::{
    AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest, Empty,
    PreferredAllocationRequest,
};

const WARMUP: usize = 200;
const SAMPLES: usize = 3000;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn micros(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

struct Row {
    topology: String,
    what: String,
    p50: String,
    p99: String,
}

async fn measure<F, Fut>(mut call: F) -> (Duration, Duration)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for _ in 0..WARMUP {
        call().await;
    }
    let mut samples = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        let start = Instant::now();
        call().await;
        samples.push(start.elapsed());
    }
    samples.sort();
    (percentile(&samples, 0.50), percentile(&samples, 0.99))
}

fn preferred(n: usize, size: i32, must: Vec<String>) -> PreferredAllocationRequest {
    PreferredAllocationRequest {
        container_requests: vec![ContainerPreferredAllocationRequest {
            available_device_i_ds: (0..n).map(uuid).collect(),
            must_include_device_i_ds: must,
            allocation_size: size,
        }],
    }
}

type Client = DevicePluginClient<tonic::transport::Channel>;

fn allocate_two() -> AllocateRequest {
    AllocateRequest {
        container_requests: vec![ContainerAllocateRequest {
            devices_ids: vec![uuid(0), uuid(1)],
        }],
    }
}

/// p50 and p99 of GetPreferredAllocation with `req`.
async fn measure_preferred(
    client: &Client,
    req: PreferredAllocationRequest,
) -> (Duration, Duration) {
    measure(|| {
        let mut c = client.clone();
        let req = req.clone();
        async move {
            c.get_preferred_allocation(req).await.unwrap();
        }
    })
    .await
}

/// The RPC latencies of an `n`-GPU plugin, in the table's order.
async fn bench_rpcs(client: &Client, n: usize) -> Vec<(String, (Duration, Duration))> {
    let mut rows = Vec::new();
    let floor = measure(|| {
        let mut c = client.clone();
        async move {
            c.get_device_plugin_options(Empty {}).await.unwrap();
        }
    })
    .await;
    rows.push(("GetDevicePluginOptions (gRPC floor)".to_string(), floor));
    for size in [2, n / 2, n - 1] {
        let timing = measure_preferred(client, preferred(n, size as i32, vec![])).await;
        rows.push((format!("GetPreferredAllocation size {size} of {n}"), timing));
    }
    let must = preferred(n, (n / 2) as i32, vec![uuid(n - 1)]);
    rows.push((
        format!(
            "GetPreferredAllocation size {} of {n}, 1 must-include",
            n / 2
        ),
        measure_preferred(client, must).await,
    ));
    let req = allocate_two();
    let allocate = measure(|| {
        let mut c = client.clone();
        let req = req.clone();
        async move {
            c.allocate(req).await.unwrap();
        }
    })
    .await;
    rows.push(("Allocate 2 GPUs".to_string(), allocate));
    rows
}

/// ListAndWatch propagation: from a health flip written to the fake file
/// until the kubelet sees the new health, over 20 flips.
async fn bench_propagation(
    ws: &Workspace,
    kubelet: &mut FakeKubelet,
    n: usize,
) -> (Duration, Duration) {
    let mut propagation = Vec::new();
    for round in 0..20 {
        let healthy = if round % 2 == 0 { "false" } else { "true" };
        let start = Instant::now();
        ws.rewrite(|t| set_gpu_field(&t, 1, "healthy", healthy));
        let want = if healthy == "true" {
            "Healthy"
        } else {
            "Unhealthy"
        };
        kubelet
            .wait_devices(Duration::from_secs(10), |d| {
                d.len() == n && d[1].health == want
            })
            .await;
        propagation.push(start.elapsed());
    }
    propagation.sort();
    (
        percentile(&propagation, 0.5),
        percentile(&propagation, 0.99),
    )
}

/// Runs the binary on the fake file `file` of `n` GPUs, adds its rows and
/// returns its peak RSS in KiB idle and after 1,000 Allocate calls.
async fn bench_topology(file: &str, n: usize, rows: &mut Vec<Row>) -> (u64, u64) {
    let ws = Workspace::new(&example(file));
    let mut kubelet = FakeKubelet::start(&ws.dir).await;
    let plugin = Plugin::start(&ws.dir, &ws.fake_file, &["--health-recovery-seconds", "0"]);
    kubelet
        .wait_devices(Duration::from_secs(30), |d| d.len() == n)
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle_kib = plugin.peak_rss_kib().unwrap_or(0);
    let mut client = plugin_client(&ws.dir).await;
    let topology = format!("{n} GPUs ({})", file.trim_end_matches(".yaml"));
    let mut timings = bench_rpcs(&client, n).await;
    timings.push((
        "ListAndWatch propagation of a fake-file health flip".into(),
        bench_propagation(&ws, &mut kubelet, n).await,
    ));
    rows.extend(timings.into_iter().map(|(what, (p50, p99))| Row {
        topology: topology.clone(),
        what,
        p50: micros(p50),
        p99: micros(p99),
    }));
    let req = allocate_two();
    for _ in 0..1000 {
        client.allocate(req.clone()).await.unwrap();
    }
    let busy_kib = plugin.peak_rss_kib().unwrap_or(0);
    drop(plugin);
    kubelet.stop().await;
    (idle_kib, busy_kib)
}

/// The allocator alone, in-process: what GetPreferredAllocation costs
/// without the gRPC round trip, on topologies harder than all-to-all.
fn bench_allocator(rows: &mut Vec<Row>) {
    use trainyard_device_plugin::rm::allocator::Topology;
    let cases: Vec<(&str, Vec<trainyard_device_plugin::rm::backend::GpuInfo>)> = vec![
        ("8 GPUs (DGX-1 cube-mesh)", cube_mesh_8()),
        (
            "16 GPUs (two cube-meshes, 4 NUMA nodes)",
            cube_mesh_pair_16(),
        ),
    ];
    for (name, gpus) in cases {
        let n = gpus.len();
        let topology = Topology::new(&gpus).expect("topology");
        let all: Vec<String> = (0..n).map(uuid).collect();
        let none: [&str; 0] = [];
        for size in [2, n / 2, n - 1] {
            let mut samples: Vec<Duration> = (0..WARMUP + SAMPLES)
                .map(|_| {
                    let start = Instant::now();
                    std::hint::black_box(topology.preferred(&all, &none, size).expect("preferred"));
                    start.elapsed()
                })
                .skip(WARMUP)
                .collect();
            samples.sort();
            rows.push(Row {
                topology: name.into(),
                what: format!("allocator only (in-process), size {size} of {n}"),
                p50: micros(percentile(&samples, 0.5)),
                p99: micros(percentile(&samples, 0.99)),
            });
        }
    }
}

fn main() {
    // Cargo passes `--bench`; any other argument filters nothing here.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let mut rows = Vec::new();
        let (idle8, busy8) = bench_topology("fake-gpus-8.yaml", 8, &mut rows).await;
        let (idle16, busy16) = bench_topology("fake-gpus-16.yaml", 16, &mut rows).await;
        bench_allocator(&mut rows);
        println!("| topology | measurement | p50 | p99 |");
        println!("|---|---|---|---|");
        for row in &rows {
            println!(
                "| {} | {} | {} | {} |",
                row.topology, row.what, row.p50, row.p99
            );
        }
        println!();
        println!("| topology | peak RSS idle (VmHWM) | peak RSS after 1,000 Allocate (VmHWM) |");
        println!("|---|---|---|");
        let mib = |kib: u64| format!("{:.1} MiB", kib as f64 / 1024.0);
        println!("| 8 GPUs | {} | {} |", mib(idle8), mib(busy8));
        println!("| 16 GPUs | {} | {} |", mib(idle16), mib(busy16));
    });
}
