//! The resource manager: the GPUs behind [`backend::GpuBackend`], their health, the device
//! state published from both, and the allocator that picks GPUs from it.

pub mod allocator;
pub mod backend;
pub(crate) mod calls;
pub mod devices;
pub mod health;
pub(crate) mod owed;
