//! Which container of a worker pod is the trainer: the one named `trainer`, else the first.
//! The template is validated, the trainer gets the job's GPUs and environment, and its exit
//! decides how the worker ended.

use k8s_openapi::api::core::v1::{Container, Pod};

/// The position of the trainer among a pod's containers (`None` when there are none).
pub fn trainer_index(containers: &[Container]) -> Option<usize> {
    if containers.is_empty() {
        return None;
    }
    Some(
        containers
            .iter()
            .position(|c| c.name == "trainer")
            .unwrap_or(0),
    )
}

/// The trainer container's name.
pub fn trainer_container(pod: &Pod) -> Option<&str> {
    let containers = &pod.spec.as_ref()?.containers;
    trainer_index(containers).map(|i| containers[i].name.as_str())
}
