//! The kubelet's side of the plugin: the `DevicePlugin` gRPC service, the socket it is served
//! on and the registration that keeps the kubelet calling it.

pub mod kubelet_api;
pub mod registration;
pub mod service;
pub mod uds_authority;

/// Which names Allocate returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceListStrategy {
    /// `NVIDIA_VISIBLE_DEVICES=<uuid>,...`.
    pub envvar: bool,
    /// CDI device names `nvidia.com/gpu=<uuid>`.
    pub cdi: bool,
}

impl Default for DeviceListStrategy {
    fn default() -> Self {
        Self {
            envvar: true,
            cdi: false,
        }
    }
}
