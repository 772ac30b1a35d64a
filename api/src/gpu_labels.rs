//! GPU node labels, under GPU Feature Discovery's names: the device plugin writes them, the
//! operator's placement reads them, so anything written for GFD schedules on them too.

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
/// Node label with the driver version's revision (absent when the version has none).
pub const LABEL_DRIVER_REV: &str = "nvidia.com/cuda.driver-version.rev";
