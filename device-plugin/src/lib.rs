//! trainyard device plugin.

/// Generated kubelet device-plugin API (v1beta1).
pub mod api {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("v1beta1");
}

pub mod allocator;
pub mod backend;
