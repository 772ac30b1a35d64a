//! Kueue's `Workload` and `ResourceFlavor` (`kueue.x-k8s.io/v1beta1`), as much of them as
//! trainyard reads and writes, and what an admission means for a job's pods.
//!
//! A TrainingJob labelled `kueue.x-k8s.io/queue-name` is admitted by Kueue, as an external
//! framework (Kueue's `integrations.externalFrameworks: ["TrainingJob.v1alpha1.trainyard.dev"]`):
//! the operator plays the part Kueue's job integrations play for built-in kinds. It creates the
//! job's Workload (one pod set: the workers), creates no pod until Kueue admits it, starts the
//! workers with the admitted flavors' node labels and tolerations, stops them when Kueue evicts
//! the Workload (a preemption: the trainers get SIGTERM and their grace period to checkpoint)
//! and then gives the quota back (clears `status.admission`) so that Kueue queues it again,
//! and marks it `Finished` when the job ends. The Workload is owned by the job and goes with
//! it.
//!
//! The types are written here from Kueue's API reference, with the fields trainyard uses.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PodTemplateSpec, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The label that puts a job in a Kueue LocalQueue.
pub const QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";
/// The name of the Workload CRD, looked for when the operator starts.
pub const WORKLOAD_CRD: &str = "workloads.kueue.x-k8s.io";
/// The one pod set of a job's Workload.
pub const POD_SET: &str = "workers";
/// Workload condition: Kueue reserved quota in a ClusterQueue.
pub const QUOTA_RESERVED: &str = "QuotaReserved";
/// Workload condition: quota reserved and every admission check passed.
pub const ADMITTED: &str = "Admitted";
/// Workload condition: Kueue takes the admission back (preempted, deactivated, ...).
pub const EVICTED: &str = "Evicted";
/// Workload condition: the job ended.
pub const FINISHED: &str = "Finished";

/// A Workload's spec.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "kueue.x-k8s.io",
    version = "v1beta1",
    kind = "Workload",
    namespaced,
    status = "WorkloadStatus",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadSpec {
    /// Sets of alike pods; a TrainingJob's has one, its workers.
    pub pod_sets: Vec<PodSet>,
    /// The LocalQueue.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub queue_name: String,
    /// The priority class, from the pod template's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
}

/// One pod set of a Workload.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodSet {
    /// Its name.
    pub name: String,
    /// What each pod asks for.
    #[schemars(schema_with = "object_schema")]
    pub template: PodTemplateSpec,
    /// How many pods.
    pub count: i32,
    /// The fewest pods the set can run with, where Kueue's partial admission may admit fewer
    /// than `count`: an elastic job's `minWorkers`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_count: Option<i32>,
}

/// A Workload's status, as Kueue writes it.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadStatus {
    /// Where Kueue admitted it; absent while it waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<Admission>,
    /// `QuotaReserved`, `Admitted`, `Evicted`, `Finished`, ...
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// An admission.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Admission {
    /// The ClusterQueue that admitted it.
    pub cluster_queue: String,
    /// What each pod set got.
    #[serde(default)]
    pub pod_set_assignments: Vec<PodSetAssignment>,
}

/// What one pod set got.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodSetAssignment {
    /// The pod set.
    pub name: String,
    /// The ResourceFlavor of each resource.
    #[serde(default)]
    pub flavors: BTreeMap<String, String>,
    /// Pods admitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<i32>,
}

/// A ResourceFlavor's spec: what a pod of that flavor gets.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "kueue.x-k8s.io",
    version = "v1beta1",
    kind = "ResourceFlavor",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct ResourceFlavorSpec {
    /// Node labels the pods select.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_labels: BTreeMap<String, String>,
    /// Tolerations the pods get.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "array_of_objects_schema")]
    pub tolerations: Vec<Toleration>,
}

fn object_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})
}

fn array_of_objects_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
    })
}

/// Where a job's Workload stands, as one round sees it.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Queued {
    /// The job names a queue, and no Kueue is installed (no Workload CRD).
    #[default]
    NoKueue,
    /// No Workload yet.
    NoWorkload,
    /// The Workload: its name and what its status says.
    Workload(Box<WorkloadSeen>),
}

/// What a Workload's status says, with the flavors it was admitted to.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WorkloadSeen {
    /// Its name.
    pub name: String,
    /// Its resourceVersion: the precondition of a status write.
    pub resource_version: Option<String>,
    /// Its conditions as they are (a write keeps the others).
    pub conditions: Vec<Condition>,
    /// Admitted (quota reserved, every check passed) and not evicted.
    pub admitted: bool,
    /// `status.admission` is set (quota held).
    pub holds_quota: bool,
    /// Evicted: the condition's reason and message.
    pub evicted: Option<String>,
    /// Marked finished.
    pub finished: bool,
    /// Why it waits, from `QuotaReserved=False`'s message.
    pub waiting: Option<String>,
    /// The admitting ClusterQueue.
    pub cluster_queue: String,
    /// The workers admitted, where the admission says (a partial admission admits fewer than
    /// the Workload asks for).
    pub admitted_count: Option<u32>,
    /// The node labels and tolerations of the admitted flavors; flavors not found are named.
    pub placement: FlavorPlacement,
}

/// What the admitted flavors put on the pods.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FlavorPlacement {
    /// Node labels the pods must match (`nodeSelector`).
    pub node_selector: BTreeMap<String, String>,
    /// Tolerations added to the pods.
    pub tolerations: Vec<Toleration>,
    /// Flavors the admission names that the operator does not know (yet).
    pub missing: Vec<String>,
}

/// Puts the admitted flavors on `pod`: their node labels in its `nodeSelector`, their
/// tolerations beside its own.
pub fn place(pod: &mut k8s_openapi::api::core::v1::Pod, placement: &FlavorPlacement) {
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    if !placement.node_selector.is_empty() {
        spec.node_selector
            .get_or_insert_with(BTreeMap::new)
            .extend(placement.node_selector.clone());
    }
    for t in &placement.tolerations {
        let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
        if !tolerations.contains(t) {
            tolerations.push(t.clone());
        }
    }
}

fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

fn is_true(conditions: &[Condition], type_: &str) -> bool {
    condition(conditions, type_).is_some_and(|c| c.status == "True")
}

/// What `workload`'s status says, with `flavor` to look up the flavors it names.
pub fn seen(
    workload: &Workload,
    flavor: impl Fn(&str) -> Option<ResourceFlavorSpec>,
) -> WorkloadSeen {
    let status = workload.status.clone().unwrap_or_default();
    let conditions = status.conditions;
    let evicted = condition(&conditions, EVICTED)
        .filter(|c| c.status == "True")
        .map(|c| format!("{}: {}", c.reason, c.message));
    let mut placement = FlavorPlacement::default();
    let admission = status.admission.as_ref();
    let names: std::collections::BTreeSet<&String> = admission
        .iter()
        .flat_map(|a| &a.pod_set_assignments)
        .flat_map(|p| p.flavors.values())
        .collect();
    for name in names {
        match flavor(name) {
            Some(spec) => {
                placement.node_selector.extend(spec.node_labels);
                for t in spec.tolerations {
                    if !placement.tolerations.contains(&t) {
                        placement.tolerations.push(t);
                    }
                }
            }
            None => placement.missing.push(name.clone()),
        }
    }
    let waiting = condition(&conditions, QUOTA_RESERVED)
        .filter(|c| c.status != "True" && !c.message.is_empty())
        .map(|c| c.message.clone());
    WorkloadSeen {
        name: workload.metadata.name.clone().unwrap_or_default(),
        resource_version: workload.metadata.resource_version.clone(),
        admitted: admission.is_some() && is_true(&conditions, ADMITTED) && evicted.is_none(),
        holds_quota: admission.is_some(),
        evicted,
        finished: is_true(&conditions, FINISHED),
        waiting,
        cluster_queue: admission
            .map(|a| a.cluster_queue.clone())
            .unwrap_or_default(),
        admitted_count: admission
            .iter()
            .flat_map(|a| &a.pod_set_assignments)
            .find(|p| p.name == POD_SET)
            .and_then(|p| p.count)
            .and_then(|c| u32::try_from(c).ok()),
        placement,
        conditions,
    }
}

/// `conditions` with `type_` set as given (its transition time moved only when its status
/// changes): a whole list to write back under the resourceVersion it was read at.
pub fn with_condition(
    conditions: &[Condition],
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    now: jiff::Timestamp,
) -> Vec<Condition> {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    let status = if status { "True" } else { "False" };
    let mut out: Vec<Condition> = conditions.to_vec();
    let fresh = Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message: message.to_owned(),
        last_transition_time: Time(now),
        observed_generation: None,
    };
    match out.iter_mut().find(|c| c.type_ == type_) {
        Some(c) if c.status == status => {
            c.reason = fresh.reason;
            c.message = fresh.message;
        }
        Some(c) => *c = fresh,
        None => out.push(fresh),
    }
    out
}
