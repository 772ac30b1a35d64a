//! Desired objects from a valid job: worker pods, the rendezvous Service, the checkpoint PVC,
//! and the CRD itself.

pub mod crdgen;
pub mod podgroup;
pub mod pods;
pub mod pvc;
pub mod service;
pub mod workload;
