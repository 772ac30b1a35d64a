//! The device picture every part of the plugin reads: GPUs, their health and
//! the precomputed topology, published as one immutable snapshot through a
//! `tokio::sync::watch` channel.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::allocator::Topology;
use crate::api;
use crate::backend::{GpuInfo, Inventory};
use crate::health::Health;

/// Health string the kubelet expects for a usable device.
pub const HEALTHY: &str = "Healthy";
/// Health string the kubelet expects for an unusable device.
pub const UNHEALTHY: &str = "Unhealthy";

/// One consistent view of the node's GPUs.
#[derive(Debug, Clone)]
pub struct DeviceState {
    /// What the backend reported.
    pub inventory: Inventory,
    /// Health by device ID; every device of the inventory has an entry.
    pub health: BTreeMap<String, Health>,
    /// The allocator's matrix for this inventory.
    pub topology: Arc<Topology>,
}

/// Receiving end of the published snapshots.
pub type StateReceiver = tokio::sync::watch::Receiver<Arc<DeviceState>>;

impl DeviceState {
    /// The GPU with this UUID.
    pub fn gpu(&self, uuid: &str) -> Option<&GpuInfo> {
        self.inventory.gpus.iter().find(|g| g.uuid == uuid)
    }

    /// Whether a GPU is healthy; unknown GPUs are not.
    pub fn is_healthy(&self, uuid: &str) -> bool {
        self.health.get(uuid).is_some_and(Health::is_healthy)
    }

    /// The ListAndWatch device list: ID = UUID, NUMA node as topology; a
    /// GPU that could not be read is listed too (Unhealthy), so capacity
    /// still counts it and allocatable does not.
    pub fn devices(&self) -> Vec<api::Device> {
        let device = |id: &str, numa: Option<i64>| api::Device {
            id: id.to_string(),
            health: if self.is_healthy(id) {
                HEALTHY
            } else {
                UNHEALTHY
            }
            .to_string(),
            topology: numa.map(|node| api::TopologyInfo {
                nodes: vec![api::NumaNode { id: node }],
            }),
        };
        self.inventory
            .devices()
            .into_iter()
            .map(|(_, id, gpu)| device(&id, gpu.and_then(|g| g.numa_node)))
            .collect()
    }

    /// Number of healthy and unhealthy devices.
    pub fn health_counts(&self) -> (usize, usize) {
        let ids = self.inventory.device_ids();
        let healthy = ids.iter().filter(|id| self.is_healthy(id)).count();
        (healthy, ids.len() - healthy)
    }
}
