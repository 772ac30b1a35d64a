//! The kubelet's device-plugin API (v1beta1): the messages and the tonic
//! client and server that `build.rs` generates from the vendored
//! `proto/api.proto`.
//!
//! Only the gRPC edges use it: the `DevicePlugin` adapter in `service`, the
//! registration client in `registration`, and the tests that play the kubelet.
//! The device state and the allocator know nothing of it.

#![allow(missing_docs, clippy::all, clippy::pedantic)]

tonic::include_proto!("v1beta1");
