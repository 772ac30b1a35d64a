//! The PodGroups of the gang schedulers trainyard works with, as much of them as it writes.
//!
//! A job whose pod template names a gang scheduler (`schedulerName`) gets one PodGroup of that
//! scheduler, named after the job and owned by it, and every worker pod says it belongs to it,
//! so that the scheduler places the gang all or nothing:
//!
//! - **Volcano** (`scheduling.volcano.sh/v1beta1`): the pods carry the annotation
//!   `scheduling.k8s.io/group-name`;
//! - **coscheduling** of kubernetes-sigs/scheduler-plugins (`scheduling.x-k8s.io/v1alpha1`):
//!   the pods carry the label `scheduling.x-k8s.io/pod-group`.
//!
//! The types are written here from the projects' API documentation, with the fields trainyard
//! sets; the schedulers' own CRDs define more, which a server-side apply of these leaves alone.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The pod annotation that puts a pod in a Volcano PodGroup.
pub const VOLCANO_GROUP_ANNOTATION: &str = "scheduling.k8s.io/group-name";
/// The pod label that puts a pod in a coscheduling PodGroup.
pub const COSCHEDULING_GROUP_LABEL: &str = "scheduling.x-k8s.io/pod-group";

/// A Volcano PodGroup's spec.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "scheduling.volcano.sh",
    version = "v1beta1",
    kind = "PodGroup",
    root = "VolcanoPodGroup",
    namespaced,
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct VolcanoPodGroupSpec {
    /// Pods that must be placed together before any runs.
    pub min_member: i32,
    /// Resources the whole group needs before any of it is placed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_resources: Option<BTreeMap<String, Quantity>>,
    /// The Volcano queue; absent: the scheduler's default queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
}

/// A coscheduling (scheduler-plugins) PodGroup's spec.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "scheduling.x-k8s.io",
    version = "v1alpha1",
    kind = "PodGroup",
    root = "CoschedulingPodGroup",
    namespaced,
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct CoschedulingPodGroupSpec {
    /// Pods that must be placed together before any runs.
    pub min_member: i32,
    /// Resources the whole group needs before any of it is placed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_resources: Option<BTreeMap<String, Quantity>>,
    /// How long the scheduler waits for the whole group before it gives the placed members
    /// back and tries again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule_timeout_seconds: Option<i32>,
}

/// The PodGroup of one job, of whichever scheduler.
#[derive(Clone, Debug, PartialEq)]
pub enum PodGroup {
    /// Volcano's.
    Volcano(VolcanoPodGroup),
    /// coscheduling's.
    Coscheduling(CoschedulingPodGroup),
}

impl PodGroup {
    /// The object's metadata.
    pub fn metadata(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        match self {
            Self::Volcano(g) => &g.metadata,
            Self::Coscheduling(g) => &g.metadata,
        }
    }
}
