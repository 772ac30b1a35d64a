//! The one tonic `DevicePlugin` adapter over the published device state.
//!
//! Allocate and GetPreferredAllocation answer from the cached snapshot and
//! never call the backend, so an NVML hiccup at admission cannot fail a pod.

use std::collections::BTreeSet;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use futures::Stream;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use trainyard_api::gpu_labels::NVIDIA_VISIBLE_DEVICES;

use super::DeviceListStrategy;
use super::kubelet_api::{self as api, device_plugin_server::DevicePlugin};
use super::uds_authority::{ConnectionActivity, OpenCall};
use crate::metrics::Metrics;
use crate::rm::devices::{DeviceState, DeviceView, StateReceiver};

/// CDI kind of our devices.
pub(crate) const CDI_KIND: &str = "nvidia.com/gpu";
/// Control devices every CUDA process needs besides its `/dev/nvidiaN`.
pub(crate) const CONTROL_DEVICES: [&str; 3] =
    ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"];

/// How Allocate describes devices to the runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AllocateOptions {
    /// Which names to return.
    pub strategy: DeviceListStrategy,
    /// Whether to return `/dev/nvidia*` device specs.
    pub pass_device_specs: bool,
}

/// Why an Allocate request is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AllocateError {
    /// The kubelet asked for a device that is not ours.
    #[error("container request {container}: unknown device ID {id:?}")]
    UnknownDevice {
        /// Position of the container request.
        container: usize,
        /// The ID.
        id: String,
    },
    /// The kubelet listed a device twice for one container.
    #[error("container request {container}: device ID {id:?} is listed twice")]
    DuplicateDevice {
        /// Position of the container request.
        container: usize,
        /// The ID.
        id: String,
    },
    /// A container request without devices.
    #[error("container request {container}: no device IDs")]
    Empty {
        /// Position of the container request.
        container: usize,
    },
}

/// Builds the Allocate response for `request` from `state`.
pub(crate) fn allocate(
    state: &DeviceState,
    request: &api::AllocateRequest,
    options: AllocateOptions,
) -> Result<api::AllocateResponse, AllocateError> {
    let mut responses = Vec::with_capacity(request.container_requests.len());
    for (container, req) in request.container_requests.iter().enumerate() {
        if req.devices_ids.is_empty() {
            return Err(AllocateError::Empty { container });
        }
        let mut seen = BTreeSet::new();
        let mut gpus = Vec::with_capacity(req.devices_ids.len());
        for id in &req.devices_ids {
            let gpu = state.gpu(id).ok_or_else(|| AllocateError::UnknownDevice {
                container,
                id: id.clone(),
            })?;
            if !seen.insert(id.as_str()) {
                return Err(AllocateError::DuplicateDevice {
                    container,
                    id: id.clone(),
                });
            }
            gpus.push(gpu);
        }
        let mut response = api::ContainerAllocateResponse::default();
        if options.strategy.envvar {
            response.envs.insert(
                NVIDIA_VISIBLE_DEVICES.to_string(),
                req.devices_ids.join(","),
            );
        }
        if options.strategy.cdi {
            response.cdi_devices = req
                .devices_ids
                .iter()
                .map(|id| api::CdiDevice {
                    name: format!("{CDI_KIND}={id}"),
                })
                .collect();
        }
        if options.pass_device_specs {
            let spec = |path: String| api::DeviceSpec {
                container_path: path.clone(),
                host_path: path,
                permissions: "rw".into(),
            };
            response.devices = gpus
                .iter()
                .map(|g| spec(format!("/dev/nvidia{}", g.minor_number)))
                .chain(CONTROL_DEVICES.iter().map(|p| spec((*p).to_string())))
                .collect();
        }
        responses.push(response);
    }
    Ok(api::AllocateResponse {
        container_responses: responses,
    })
}

/// Builds the GetPreferredAllocation response for `request` from `state`.
pub(crate) fn preferred_allocation(
    state: &DeviceState,
    request: &api::PreferredAllocationRequest,
) -> Result<api::PreferredAllocationResponse, Status> {
    let mut responses = Vec::with_capacity(request.container_requests.len());
    for (container, req) in request.container_requests.iter().enumerate() {
        let size = usize::try_from(req.allocation_size).map_err(|_| {
            Status::invalid_argument(format!(
                "container request {container}: negative allocation_size {}",
                req.allocation_size
            ))
        })?;
        let ids = state
            .topology
            .preferred(
                &req.available_device_i_ds,
                &req.must_include_device_i_ds,
                size,
            )
            .map_err(|e| Status::invalid_argument(format!("container request {container}: {e}")))?;
        responses.push(api::ContainerPreferredAllocationResponse { device_i_ds: ids });
    }
    Ok(api::PreferredAllocationResponse {
        container_responses: responses,
    })
}

/// Counts open ListAndWatch streams of one registration, so the kubelet
/// module can tell when the kubelet stopped watching.
#[derive(Debug, Default)]
pub struct StreamTracker {
    active: AtomicUsize,
    opened: AtomicUsize,
    ended: Notify,
}

impl StreamTracker {
    /// Streams open now.
    pub(crate) fn active(&self) -> usize {
        self.active.load(Ordering::SeqCst)
    }

    /// Resolves when a stream ends.
    pub(crate) async fn ended(&self) {
        self.ended.notified().await;
    }
}

struct StreamGuard(Arc<StreamTracker>);

impl StreamGuard {
    fn new(tracker: Arc<StreamTracker>) -> Self {
        tracker.active.fetch_add(1, Ordering::SeqCst);
        tracker.opened.fetch_add(1, Ordering::SeqCst);
        Self(tracker)
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::SeqCst);
        // notify_one keeps a permit, so an end between two polls is not lost.
        self.0.ended.notify_one();
    }
}

/// The DevicePlugin service of one registration.
#[derive(Clone)]
pub struct DevicePluginService {
    state: StateReceiver,
    options: AllocateOptions,
    metrics: Arc<Metrics>,
    streams: Arc<StreamTracker>,
    stop: CancellationToken,
}

impl DevicePluginService {
    /// A service answering from `state`; its streams end when `stop` fires.
    pub fn new(
        state: StateReceiver,
        options: AllocateOptions,
        metrics: Arc<Metrics>,
        streams: Arc<StreamTracker>,
        stop: CancellationToken,
    ) -> Self {
        Self {
            state,
            options,
            metrics,
            streams,
            stop,
        }
    }
}

/// The kubelet's word for a device it may allocate.
const HEALTHY: &str = "Healthy";
/// The kubelet's word for a device it must not allocate.
const UNHEALTHY: &str = "Unhealthy";

/// A device as the kubelet reads it: the NUMA node becomes its topology
/// hint, health one of the kubelet's two words.
fn wire_device(view: &DeviceView) -> api::Device {
    api::Device {
        id: view.id.clone(),
        health: if view.healthy { HEALTHY } else { UNHEALTHY }.to_string(),
        topology: view.numa_node.map(|node| api::TopologyInfo {
            nodes: vec![api::NumaNode { id: node }],
        }),
    }
}

/// The ListAndWatch message for `devices`.
fn list_response(devices: &[DeviceView]) -> api::ListAndWatchResponse {
    api::ListAndWatchResponse {
        devices: devices.iter().map(wire_device).collect(),
    }
}

type DeviceStream = Pin<Box<dyn Stream<Item = Result<api::ListAndWatchResponse, Status>> + Send>>;

/// Marks a call open on the connection it came in on, so the connection is
/// not closed as idle while it runs; `None` off the plugin socket (tests).
fn open_call<T>(request: &Request<T>) -> Option<OpenCall> {
    request
        .extensions()
        .get::<ConnectionActivity>()
        .map(ConnectionActivity::open_call)
}

#[tonic::async_trait]
impl DevicePlugin for DevicePluginService {
    async fn get_device_plugin_options(
        &self,
        request: Request<api::Empty>,
    ) -> Result<Response<api::DevicePluginOptions>, Status> {
        let _call = open_call(&request);
        let started = Instant::now();
        let options = plugin_options();
        self.metrics.observe_rpc("GetDevicePluginOptions", started);
        Ok(Response::new(options))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(
        &self,
        request: Request<api::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let mut state = self.state.clone();
        let stop = self.stop.clone();
        let guard = StreamGuard::new(Arc::clone(&self.streams));
        // Open for as long as the stream lasts.
        let call = open_call(&request);
        tracing::info!("kubelet opened ListAndWatch");
        let stream = async_stream::stream! {
            let _guard = guard;
            let _call = call;
            let mut last = state.borrow_and_update().devices();
            yield Ok(list_response(&last));
            loop {
                tokio::select! {
                    () = stop.cancelled() => break,
                    changed = state.changed() => {
                        if changed.is_err() {
                            break;
                        }
                        let devices = state.borrow_and_update().devices();
                        if devices != last {
                            yield Ok(list_response(&devices));
                            last = devices;
                        }
                    }
                }
            }
        };
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<api::PreferredAllocationRequest>,
    ) -> Result<Response<api::PreferredAllocationResponse>, Status> {
        let _call = open_call(&request);
        let started = Instant::now();
        let state = Arc::clone(&self.state.borrow());
        let result = preferred_allocation(&state, request.get_ref());
        self.metrics.observe_rpc("GetPreferredAllocation", started);
        if let Err(status) = &result {
            tracing::warn!(error = %status.message(), "refusing GetPreferredAllocation");
        }
        result.map(Response::new)
    }

    async fn allocate(
        &self,
        request: Request<api::AllocateRequest>,
    ) -> Result<Response<api::AllocateResponse>, Status> {
        let _call = open_call(&request);
        let started = Instant::now();
        let state = Arc::clone(&self.state.borrow());
        let request = request.into_inner();
        let result = allocate(&state, &request, self.options);
        for req in &request.container_requests {
            self.metrics
                .record_allocation(result.is_ok(), req.devices_ids.len());
            if result.is_ok() {
                for id in &req.devices_ids {
                    if !state.is_healthy(id) {
                        // The kubelet only hands out healthy devices; a race
                        // with a health flip is possible and is not fatal.
                        tracing::warn!(device = %id, "allocating a device that just became unhealthy");
                    }
                }
            }
        }
        self.metrics.observe_rpc("Allocate", started);
        match result {
            Ok(response) => {
                tracing::debug!(containers = request.container_requests.len(), "allocated");
                Ok(Response::new(response))
            }
            Err(e) => {
                tracing::warn!(error = %e, "refusing Allocate");
                Err(Status::invalid_argument(e.to_string()))
            }
        }
    }

    async fn pre_start_container(
        &self,
        request: Request<api::PreStartContainerRequest>,
    ) -> Result<Response<api::PreStartContainerResponse>, Status> {
        let _call = open_call(&request);
        Ok(Response::new(api::PreStartContainerResponse {}))
    }
}

/// The options sent at registration and by GetDevicePluginOptions.
pub(crate) fn plugin_options() -> api::DevicePluginOptions {
    api::DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::rm::allocator::Topology;
    use crate::rm::allocator::tests::{dgx1, uuid};
    use crate::rm::backend::{DeviceError, DeviceErrorKind, DriverInfo, GpuFault, Inventory};
    use crate::rm::health::Health;

    fn state() -> DeviceState {
        let gpus = dgx1();
        DeviceState {
            topology: Arc::new(Topology::new(&gpus).unwrap()),
            health: gpus
                .iter()
                .map(|g| (g.uuid.clone(), Health::Healthy))
                .collect::<BTreeMap<_, _>>(),
            inventory: Inventory {
                driver: DriverInfo {
                    driver_version: "550.54.15".into(),
                    cuda_version: "12.4".into(),
                },
                gpus,
                faults: vec![],
            },
        }
    }

    fn request(ids: &[&[usize]]) -> api::AllocateRequest {
        api::AllocateRequest {
            container_requests: ids
                .iter()
                .map(|c| api::ContainerAllocateRequest {
                    devices_ids: c.iter().map(|&i| uuid(i)).collect(),
                })
                .collect(),
        }
    }

    /// The dgx1 state with GPU 1 unhealthy, GPU 2 on no known NUMA node,
    /// and a ninth GPU the driver counts whose UUID was never read.
    fn mixed_state() -> DeviceState {
        let mut s = state();
        s.inventory.gpus[2].numa_node = None;
        s.topology = Arc::new(Topology::new(&s.inventory.gpus).unwrap());
        s.health.insert(
            uuid(1),
            Health::Unhealthy {
                reason: "XID 79".into(),
                last_bad: std::time::Instant::now(),
                awaiting: std::collections::BTreeSet::new(),
            },
        );
        s.inventory.faults.push(GpuFault {
            index: 8,
            uuid: None,
            error: DeviceError {
                kind: DeviceErrorKind::GpuLost,
                detail: "scripted".into(),
            },
        });
        s
    }

    #[test]
    fn list_and_watch_sends_every_device_with_kubelet_health_and_its_numa_node() {
        let device = |id: &str, health: &str, numa: Option<i64>| api::Device {
            id: id.into(),
            health: health.into(),
            topology: numa.map(|id| api::TopologyInfo {
                nodes: vec![api::NumaNode { id }],
            }),
        };
        let sent = list_response(&mixed_state().devices());
        assert_eq!(
            sent,
            api::ListAndWatchResponse {
                devices: vec![
                    device("GPU-00", "Healthy", Some(0)),
                    device("GPU-01", "Unhealthy", Some(0)),
                    device("GPU-02", "Healthy", None),
                    device("GPU-03", "Healthy", Some(0)),
                    device("GPU-04", "Healthy", Some(1)),
                    device("GPU-05", "Healthy", Some(1)),
                    device("GPU-06", "Healthy", Some(1)),
                    device("GPU-07", "Healthy", Some(1)),
                    device("unreadable-gpu-8", "Unhealthy", None),
                ]
            }
        );
    }

    #[test]
    fn envvar_strategy_lists_uuids_in_request_order() {
        let r = allocate(
            &state(),
            &request(&[&[3, 1], &[5]]),
            AllocateOptions::default(),
        )
        .unwrap();
        assert_eq!(r.container_responses.len(), 2);
        assert_eq!(
            r.container_responses[0].envs[NVIDIA_VISIBLE_DEVICES],
            "GPU-03,GPU-01"
        );
        assert_eq!(
            r.container_responses[1].envs[NVIDIA_VISIBLE_DEVICES],
            "GPU-05"
        );
        assert!(r.container_responses[0].cdi_devices.is_empty());
        assert!(r.container_responses[0].devices.is_empty());
    }

    #[test]
    fn cdi_strategy_names_devices_and_sets_no_env() {
        let options = AllocateOptions {
            strategy: DeviceListStrategy {
                envvar: false,
                cdi: true,
            },
            pass_device_specs: false,
        };
        let r = allocate(&state(), &request(&[&[2]]), options).unwrap();
        let c = &r.container_responses[0];
        assert!(c.envs.is_empty());
        assert_eq!(
            c.cdi_devices,
            vec![api::CdiDevice {
                name: "nvidia.com/gpu=GPU-02".into()
            }]
        );
    }

    #[test]
    fn device_specs_include_gpu_nodes_and_control_devices() {
        let options = AllocateOptions {
            strategy: DeviceListStrategy::default(),
            pass_device_specs: true,
        };
        let r = allocate(&state(), &request(&[&[6, 7]]), options).unwrap();
        let paths: Vec<&str> = r.container_responses[0]
            .devices
            .iter()
            .map(|d| d.host_path.as_str())
            .collect();
        assert_eq!(
            paths,
            [
                "/dev/nvidia6",
                "/dev/nvidia7",
                "/dev/nvidiactl",
                "/dev/nvidia-uvm",
                "/dev/nvidia-uvm-tools"
            ]
        );
        assert!(
            r.container_responses[0]
                .devices
                .iter()
                .all(|d| d.permissions == "rw")
        );
    }

    #[test]
    fn unknown_duplicate_and_empty_requests_are_refused() {
        let s = state();
        let unknown = api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: vec!["GPU-00".into(), "GPU-nope".into()],
            }],
        };
        assert_eq!(
            allocate(&s, &unknown, AllocateOptions::default()),
            Err(AllocateError::UnknownDevice {
                container: 0,
                id: "GPU-nope".into()
            })
        );
        assert_eq!(
            allocate(&s, &request(&[&[1], &[2, 2]]), AllocateOptions::default()),
            Err(AllocateError::DuplicateDevice {
                container: 1,
                id: "GPU-02".into()
            })
        );
        assert_eq!(
            allocate(&s, &request(&[&[]]), AllocateOptions::default()),
            Err(AllocateError::Empty { container: 0 })
        );
    }

    #[test]
    fn preferred_allocation_has_exact_size_and_must_include() {
        let s = state();
        let req = api::PreferredAllocationRequest {
            container_requests: vec![api::ContainerPreferredAllocationRequest {
                available_device_i_ds: (0..8).map(uuid).collect(),
                must_include_device_i_ds: vec![uuid(6)],
                allocation_size: 4,
            }],
        };
        let r = preferred_allocation(&s, &req).unwrap();
        let ids = &r.container_responses[0].device_i_ds;
        assert_eq!(ids.len(), 4);
        assert!(ids.contains(&uuid(6)));
        assert_eq!(ids, &vec![uuid(4), uuid(5), uuid(6), uuid(7)]);
    }

    #[test]
    fn preferred_allocation_rejects_negative_sizes_and_unknown_ids() {
        let s = state();
        let bad = |ids: Vec<String>, size: i32| api::PreferredAllocationRequest {
            container_requests: vec![api::ContainerPreferredAllocationRequest {
                available_device_i_ds: ids,
                must_include_device_i_ds: vec![],
                allocation_size: size,
            }],
        };
        let e = preferred_allocation(&s, &bad(vec![uuid(0)], -1)).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        let e = preferred_allocation(&s, &bad(vec!["GPU-x".into()], 1)).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains("GPU-x"));
    }
}
