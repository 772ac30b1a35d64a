//! Pure rules over a job and the cluster: no client, no clock of its own, nothing above it.

pub mod cached_pod;
pub mod condition;
pub mod crd;
pub mod events;
pub mod kueue;
pub mod ledger;
pub mod liveness;
pub mod lost_peer;
pub mod nodes;
pub mod ownership;
pub mod placement;
pub mod podgroup;
pub mod preemption;
pub mod reason;
pub mod rejection;
pub mod scheduling;
pub mod seal;
pub mod supervision;
pub mod trainer;
pub mod validate;
