//! The device picture every part of the plugin reads: GPUs, their health and
//! the precomputed topology, published as one immutable snapshot through a
//! `tokio::sync::watch` channel.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::allocator::Topology;
use super::backend::{GpuInfo, Inventory};
use super::health::Health;

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

/// One device as the kubelet is to see it, before any wire format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeviceView {
    /// The device ID: the GPU's UUID, or a stand-in while none was read.
    pub id: String,
    /// Whether the device may be allocated.
    pub healthy: bool,
    /// The NUMA node the GPU is attached to, when known.
    pub numa_node: Option<i64>,
}

/// Receiving end of the published snapshots.
pub(crate) type StateReceiver = tokio::sync::watch::Receiver<Arc<DeviceState>>;

impl DeviceState {
    /// The GPU with this UUID.
    pub(crate) fn gpu(&self, uuid: &str) -> Option<&GpuInfo> {
        self.inventory.gpus.iter().find(|g| g.uuid == uuid)
    }

    /// Whether a GPU is healthy; unknown GPUs are not.
    pub(crate) fn is_healthy(&self, uuid: &str) -> bool {
        self.health.get(uuid).is_some_and(Health::is_healthy)
    }

    /// Every device the kubelet is told about, in index order: ID = UUID,
    /// with its NUMA node when known. A GPU that could not be read is
    /// listed too (unhealthy), so capacity still counts it and allocatable
    /// does not.
    pub(crate) fn devices(&self) -> Vec<DeviceView> {
        self.inventory
            .devices()
            .into_iter()
            .map(|(_, id, gpu)| DeviceView {
                healthy: self.is_healthy(&id),
                numa_node: gpu.and_then(|g| g.numa_node),
                id,
            })
            .collect()
    }

    /// Number of healthy and unhealthy devices.
    pub(crate) fn health_counts(&self) -> (usize, usize) {
        let ids = self.inventory.device_ids();
        let healthy = ids.iter().filter(|id| self.is_healthy(id)).count();
        (healthy, ids.len() - healthy)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::rm::allocator::tests::{dgx1, uuid};
    use crate::rm::backend::{DeviceError, DeviceErrorKind, DriverInfo, GpuFault};

    #[test]
    fn devices_list_every_gpu_in_index_order_and_an_unreadable_one_as_unhealthy() {
        let mut gpus = dgx1();
        gpus.truncate(3);
        gpus[2].numa_node = None;
        let mut health: BTreeMap<String, Health> = gpus
            .iter()
            .map(|g| (g.uuid.clone(), Health::Healthy))
            .collect();
        health.insert(
            uuid(1),
            Health::Unhealthy {
                reason: "XID 79".into(),
                last_bad: Instant::now(),
                awaiting: Default::default(),
            },
        );
        let state = DeviceState {
            topology: Arc::new(Topology::new(&gpus).unwrap()),
            health,
            inventory: Inventory {
                driver: DriverInfo {
                    driver_version: "550.54.15".into(),
                    cuda_version: "12.4".into(),
                },
                gpus,
                faults: vec![GpuFault {
                    index: 3,
                    uuid: None,
                    error: DeviceError {
                        kind: DeviceErrorKind::GpuLost,
                        detail: "scripted".into(),
                    },
                }],
            },
        };
        let view = |id: &str, healthy: bool, numa_node: Option<i64>| DeviceView {
            id: id.into(),
            healthy,
            numa_node,
        };
        assert_eq!(
            state.devices(),
            [
                view("GPU-00", true, Some(0)),
                view("GPU-01", false, Some(0)),
                view("GPU-02", true, None),
                view("unreadable-gpu-3", false, None),
            ]
        );
        assert_eq!(state.health_counts(), (2, 2));
    }
}
