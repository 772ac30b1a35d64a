//! The names under which the device plugin hands GPU facts to others, all NVIDIA's own: the
//! node labels, under GPU Feature Discovery's names (the operator's placement reads them, so
//! anything written for GFD schedules on them too), and the environment variable through which
//! Allocate tells the NVIDIA container toolkit which GPUs a container gets.

/// The variable Allocate sets on a container to the UUIDs of its GPUs, comma-separated (the
/// `envvar` device-list strategy); the NVIDIA container toolkit reads it. Not part of the
/// trainer's contract in [`crate::env`]: the device plugin sets it, not the operator.
pub const NVIDIA_VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";

/// The domain every GPU label lives under.
pub const LABEL_PREFIX: &str = "nvidia.com/";
/// Node label with the GPU product (GPU Feature Discovery name).
pub const LABEL_GPU_PRODUCT: &str = "nvidia.com/gpu.product";
/// Node label with the memory of GPU 0 in MiB.
pub const LABEL_GPU_MEMORY: &str = "nvidia.com/gpu.memory";
/// Node label with the number of GPUs.
pub const LABEL_GPU_COUNT: &str = "nvidia.com/gpu.count";
/// Node label with the major of the highest CUDA version the driver supports.
pub const LABEL_CUDA_MAJOR: &str = "nvidia.com/cuda.runtime-version.major";
/// Node label with the minor of the highest CUDA version the driver supports.
pub const LABEL_CUDA_MINOR: &str = "nvidia.com/cuda.runtime-version.minor";
/// Node label with the compute capability major.
pub const LABEL_COMPUTE_MAJOR: &str = "nvidia.com/gpu.compute.major";
/// Node label with the compute capability minor.
pub const LABEL_COMPUTE_MINOR: &str = "nvidia.com/gpu.compute.minor";
/// Node label with the full driver version, e.g. `550.54.15`.
pub const LABEL_DRIVER_FULL: &str = "nvidia.com/cuda.driver-version.full";
/// Node label with the driver version's major.
pub const LABEL_DRIVER_MAJOR: &str = "nvidia.com/cuda.driver-version.major";
/// Node label with the driver version's minor.
pub const LABEL_DRIVER_MINOR: &str = "nvidia.com/cuda.driver-version.minor";
/// Node label with the driver version's revision as the driver writes it (`04` of
/// `580.159.04`, as GPU Feature Discovery labels it); absent when the version has none.
pub const LABEL_DRIVER_REVISION: &str = "nvidia.com/cuda.driver-version.revision";
