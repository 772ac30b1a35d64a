//! The `TrainingJob` custom resource: the types live in the contract crate
//! ([`trainyard_api::crd`]) and are re-exported here, so `crate::model::crd::...` paths keep working.
//! `trainyard-operator crd` ([`crate::build::crdgen`]) prints the CRD generated from them; the
//! generated file's header still names this module, since the YAML is kept byte-identical.

pub use trainyard_api::crd::*;
