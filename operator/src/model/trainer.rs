//! Which container of a worker pod is the trainer: the one named `trainer`, else the first.
//! The template is validated, the trainer gets the job's GPUs and environment, and its exit
//! decides how the worker ended.

use k8s_openapi::api::core::v1::Container;

use crate::model::cached_pod::CachedPod;

/// The position of the trainer among a pod's containers (`None` when there are none).
pub fn trainer_index(containers: &[Container]) -> Option<usize> {
    index_by_name(containers.iter().map(|c| c.name.as_str()))
}

/// The trainer's position among containers with these names.
fn index_by_name<'a>(names: impl ExactSizeIterator<Item = &'a str>) -> Option<usize> {
    if names.len() == 0 {
        return None;
    }
    Some(names.into_iter().position(|n| n == "trainer").unwrap_or(0))
}

/// The trainer container's name.
pub fn trainer_container(pod: &CachedPod) -> Option<&str> {
    let containers = &pod.spec.containers;
    index_by_name(containers.iter().map(|c| c.name.as_str())).map(|i| containers[i].name.as_str())
}
