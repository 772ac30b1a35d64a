//! The kubelet's side of the plugin: the `DevicePlugin` gRPC service, the socket it is served
//! on and the registration that keeps the kubelet calling it.

pub mod kubelet_api;
pub mod registration;
pub mod service;
pub mod uds_authority;
