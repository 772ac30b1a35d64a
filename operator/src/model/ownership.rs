//! Whether an object that holds a name a job needs is the job's own.
//!
//! The operator creates a job's pods, Service and checkpoint PVC under fixed names
//! (`<job>-worker-<rank>`, `<job>`, `<job>-checkpoints`). An object of such a name that was not
//! made for this job (a user's Service, another tool's PVC, a leftover of an earlier job of the
//! same name that the garbage collector has not removed yet) is never written to, mounted, or
//! given an owner reference that would let the garbage collector delete it with the job: the
//! job reports it with the condition `NameConflict` and creates no pods until the name is free.

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::model::cached_pod::CachedPod;
use crate::model::crd::{LABEL_ATTEMPT, LABEL_JOB};
use crate::model::seal::{SealKey, Sealed};
use crate::model::validate::ValidJob;

/// The kinds of object a job's names are given to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjectKind {
    /// A worker pod.
    Pod,
    /// The rendezvous Service.
    Service,
    /// The checkpoint PVC the operator creates.
    Claim,
}

impl ObjectKind {
    /// The Kubernetes kind.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pod => "Pod",
            Self::Service => "Service",
            Self::Claim => "PersistentVolumeClaim",
        }
    }
}

/// The kinds of object the operator writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Worker pods.
    Pod,
    /// The rendezvous Service.
    Service,
    /// The checkpoint PVC.
    Claim,
    /// The gang scheduler's PodGroup ([`crate::model::podgroup`]).
    PodGroup,
    /// Kueue's Workload ([`crate::model::kueue`]).
    Workload,
}

/// An object that holds one of a job's names and is not the job's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Foreign {
    /// Its kind.
    pub kind: ObjectKind,
    /// Its name.
    pub name: String,
    /// Whose it is, as far as its metadata says.
    pub holder: String,
}

impl fmt::Display for Foreign {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} ({})", self.kind.as_str(), self.name, self.holder)
    }
}

/// None when the object `meta` describes is the job's own, else what it is.
///
/// An object is the job's when it has an owner reference to the job's uid: the operator gives
/// every pod and Service one. A checkpoint PVC kept by `retainOnDelete` has none, by design, so
/// a PVC without any owner reference that carries the label `trainyard.dev/job: <job>` is also
/// the job's: a claim an earlier job of the same name left, whose checkpoints a new job of that
/// name continues from. Anything else is foreign, including an object owned by an earlier job
/// of the same name (another uid) that is still being garbage-collected.
///
/// A checkpoint PVC that is being deleted is no one's to use, the job's own or a retained one
/// included: it lingers only while pods still mount it (`kubernetes.io/pvc-protection`), so
/// pods created to mount it would wait for a claim that is then gone. The job waits until it
/// is, then creates its claim anew (a user who deleted the claim meant its checkpoints gone).
pub fn foreign(kind: ObjectKind, meta: &ObjectMeta, job: &ValidJob) -> Option<Foreign> {
    if kind == ObjectKind::Claim && meta.deletion_timestamp.is_some() {
        return Some(Foreign {
            kind,
            name: meta.name.clone().unwrap_or_default(),
            holder: "being deleted: the job creates its own once it is gone".to_owned(),
        });
    }
    let owners = meta.owner_references.as_deref().unwrap_or_default();
    if owners.iter().any(|o| o.uid == job.uid) {
        return None;
    }
    let retained_claim = kind == ObjectKind::Claim
        && owners.is_empty()
        && meta
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_JOB))
            .is_some_and(|j| *j == job.name);
    if retained_claim {
        return None;
    }
    // The controller owner says best whose it is; else any owner.
    let holder = match owners
        .iter()
        .find(|o| o.controller == Some(true))
        .or(owners.first())
    {
        Some(o) => format!("owned by {} {} with uid {}", o.kind, o.name, o.uid),
        None => "it has no owner reference".to_owned(),
    };
    Some(Foreign {
        kind,
        name: meta.name.clone().unwrap_or_default(),
        holder,
    })
}

/// A pod under the job's worker name for `rank` that the operator did not make: its owner
/// reference and labels say it is the job's (anyone who may create pods can copy them), but it
/// has no seal of the operator's for that rank and its attempt label ([`crate::model::seal`]).
pub fn unsealed_worker(
    meta: &ObjectMeta,
    job: &ValidJob,
    rank: u32,
    key: &SealKey,
) -> Option<Foreign> {
    let name = meta.name.clone().unwrap_or_default();
    let attempt = meta
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_ATTEMPT))
        .and_then(|a| a.parse().ok());
    let sealed = attempt.map(|attempt| key.check(meta, &job.sealed_worker(&name, rank, attempt)));
    (sealed.is_none() || sealed == Some(Sealed::Forged)).then(|| Foreign {
        kind: ObjectKind::Pod,
        name,
        holder: "it has the job's owner reference but not trainyard's seal: someone else made it"
            .to_owned(),
    })
}

/// Whether the pod cache keeps `pod` when the operator seals its workers (`sealing`): only
/// under a name the operator gives the worker its labels claim to be (`<job>-worker-<rank>`,
/// or its twin `<job>-worker-<rank>-b`).
/// Any pod creator may label pods as a job's; one under another name is never a worker (the
/// operator names every pod it makes so), and keeping it would let anyone who may create pods
/// grow the operator's memory without bound.
pub fn cacheable(pod: &CachedPod, sealing: bool) -> bool {
    if !sealing {
        return true;
    }
    let labels = pod.metadata.labels.as_ref();
    let label = |key: &str| labels.and_then(|l| l.get(key));
    let (Some(job), Some(rank)) = (
        label(crate::model::crd::LABEL_JOB),
        label(crate::model::crd::LABEL_RANK).and_then(|r| r.parse::<u32>().ok()),
    ) else {
        return false;
    };
    let names = crate::model::validate::worker_pod_names(job, rank);
    pod.metadata
        .name
        .as_deref()
        .is_some_and(|n| names.iter().any(|w| w == n))
}

/// Whether the job's own object of `kind` exists, given the cached object of its name (if any);
/// a foreign one is added to `conflicts` instead. The PVC of `spec.checkpoint.existingClaim`
/// is the user's by design and only has to be there.
pub fn present(
    kind: ObjectKind,
    meta: Option<&ObjectMeta>,
    job: &ValidJob,
    conflicts: &mut Vec<Foreign>,
) -> bool {
    let Some(meta) = meta else {
        return false;
    };
    if kind == ObjectKind::Claim && !job.creates_claim {
        return true;
    }
    match foreign(kind, meta, job) {
        None => true,
        Some(f) => {
            conflicts.push(f);
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::job_yaml;
    use crate::model::seal;
    use crate::model::validate::validate;
    use serde_json::json;

    fn meta(value: serde_json::Value) -> ObjectMeta {
        serde_json::from_value(value).expect("meta")
    }

    fn job() -> ValidJob {
        validate(&job_yaml("workers: 1\n")).expect("valid")
    }

    fn owner(kind: &str, name: &str, uid: &str) -> serde_json::Value {
        json!({"apiVersion": "v1", "kind": kind, "name": name, "uid": uid, "controller": true})
    }

    #[test]
    fn an_object_with_an_owner_reference_to_the_job_is_its_own() {
        let ours = meta(json!({"name": "train", "ownerReferences": [
            owner("Deployment", "web", "uid-9"),
            {"apiVersion": "trainyard.dev/v1alpha1", "kind": "TrainingJob", "name": "train", "uid": "uid-1"}]}));
        for kind in [ObjectKind::Pod, ObjectKind::Service, ObjectKind::Claim] {
            assert_eq!(foreign(kind, &ours, &job()), None, "{kind:?}");
        }
    }

    #[test]
    fn an_object_without_owner_references_is_foreign_and_says_so() {
        let theirs = meta(json!({"name": "train", "labels": {"app": "theirs"}}));
        let f = foreign(ObjectKind::Service, &theirs, &job()).expect("foreign");
        assert_eq!(
            f.to_string(),
            "Service train (it has no owner reference)",
            "{f:?}"
        );
    }

    #[test]
    fn an_object_owned_by_someone_else_names_its_owner() {
        let theirs = meta(json!({"name": "train-checkpoints", "ownerReferences": [
            owner("StatefulSet", "db", "uid-7")]}));
        let f = foreign(ObjectKind::Claim, &theirs, &job()).expect("foreign");
        assert_eq!(
            f.to_string(),
            "PersistentVolumeClaim train-checkpoints (owned by StatefulSet db with uid uid-7)"
        );
    }

    #[test]
    fn an_earlier_job_of_the_same_name_still_owning_an_object_is_foreign() {
        let leftover = meta(json!({"name": "train", "labels": {LABEL_JOB: "train"},
            "ownerReferences": [owner("TrainingJob", "train", "uid-0")]}));
        for kind in [ObjectKind::Pod, ObjectKind::Service, ObjectKind::Claim] {
            assert!(foreign(kind, &leftover, &job()).is_some(), "{kind:?}");
        }
    }

    #[test]
    fn a_claim_retained_from_a_job_of_the_same_name_is_the_jobs_but_a_service_is_not() {
        let retained = meta(json!({"name": "train-checkpoints",
            "labels": {LABEL_JOB: "train"}}));
        assert_eq!(foreign(ObjectKind::Claim, &retained, &job()), None);
        // A Service is always created with an owner reference: without one it is not ours.
        assert!(foreign(ObjectKind::Service, &retained, &job()).is_some());
        // Another job's label does not make it ours.
        let other = meta(json!({"name": "train-checkpoints",
            "labels": {LABEL_JOB: "other"}}));
        assert!(foreign(ObjectKind::Claim, &other, &job()).is_some());
    }

    #[test]
    fn a_claim_being_deleted_is_never_the_jobs_to_mount_whoever_kept_or_owns_it() {
        let deleting = |extra: serde_json::Value| {
            let mut m = json!({"name": "train-checkpoints", "labels": {LABEL_JOB: "train"},
                "deletionTimestamp": "2026-11-29T20:00:00Z",
                "finalizers": ["kubernetes.io/pvc-protection"]});
            m.as_object_mut()
                .expect("object")
                .extend(extra.as_object().cloned().unwrap_or_default());
            meta(m)
        };
        let job = job();
        // Retained by an earlier job of the same name, then deleted while its pods still ran.
        let retained = deleting(json!({}));
        let f = foreign(ObjectKind::Claim, &retained, &job).expect("being deleted");
        assert_eq!(
            f.to_string(),
            "PersistentVolumeClaim train-checkpoints (being deleted: the job creates its own \
             once it is gone)"
        );
        // The job's own, deleted under it.
        let own = deleting(json!({"ownerReferences": [
            {"apiVersion": "trainyard.dev/v1alpha1", "kind": "TrainingJob", "name": "train",
             "uid": job.uid}]}));
        let mut conflicts = Vec::new();
        assert!(!present(
            ObjectKind::Claim,
            Some(&own),
            &job,
            &mut conflicts
        ));
        assert_eq!(conflicts.len(), 1, "{conflicts:?}");
        // A pod of the job's own being deleted is still its own: the restart waits for it.
        let pod = deleting(json!({"name": "train-worker-0", "ownerReferences": [
            {"apiVersion": "trainyard.dev/v1alpha1", "kind": "TrainingJob", "name": "train",
             "uid": job.uid}]}));
        assert_eq!(foreign(ObjectKind::Pod, &pod, &job), None);
    }

    /// With sealing on, the cache keeps a job-labelled pod only under the name of the worker
    /// its labels claim to be: a copy under another name (a namespace user's) is never cached.
    #[test]
    fn only_a_pod_under_its_workers_name_is_cached_when_the_operator_seals() {
        let pod = |name: &str, labels: serde_json::Value| -> CachedPod {
            serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))
                .expect("pod")
        };
        let worker = json!({crate::model::crd::LABEL_JOB: "j", crate::model::crd::LABEL_RANK: "3"});
        assert!(cacheable(&pod("j-worker-3", worker.clone()), true));
        // A standby's twin name, and no other.
        assert!(cacheable(&pod("j-worker-3-b", worker.clone()), true));
        assert!(!cacheable(&pod("j-worker-3-c", worker.clone()), true));
        assert!(!cacheable(&pod("j-worker-3-copy", worker.clone()), true));
        assert!(!cacheable(&pod("j-worker-4", worker.clone()), true));
        assert!(!cacheable(
            &pod("j-worker-3", json!({crate::model::crd::LABEL_JOB: "j"})),
            true
        ));
        assert!(
            cacheable(&pod("j-worker-3-copy", worker), false),
            "no sealing: as before"
        );
    }

    #[test]
    fn a_pod_under_a_workers_name_without_the_operators_seal_is_foreign() {
        let job = validate(&job_yaml("workers: 2\n")).expect("valid");
        let key = SealKey::new(b"k", None);
        let pod = |attempt: &str, seal: Option<String>| {
            meta(json!({"name": "train-worker-0", "namespace": job.namespace,
                        "labels": {LABEL_ATTEMPT: attempt},
                        "annotations": seal.map(|s| json!({seal::SEAL_ANNOTATION: s})),
                        "ownerReferences": [owner("TrainingJob", "train", &job.uid)]}))
        };
        let sealed = key.seal(&seal::Worker {
            namespace: &job.namespace,
            pod: "train-worker-0",
            job_uid: &job.uid,
            rank: 0,
            attempt: 2,
        });
        assert_eq!(
            unsealed_worker(&pod("2", Some(sealed.clone())), &job, 0, &key),
            None
        );
        for squatter in [
            pod("2", None),
            pod("3", Some(sealed.clone())),
            pod("x", Some(sealed)),
        ] {
            let found = unsealed_worker(&squatter, &job, 0, &key).expect("foreign");
            assert!(found.holder.contains("seal"), "{found:?}");
        }
    }

    #[test]
    fn the_existing_claim_a_job_names_is_used_whoever_owns_it() {
        let users = meta(
            json!({"name": "shared", "ownerReferences": [owner("StatefulSet", "db", "uid-7")]}),
        );
        let mounting = validate(&job_yaml("checkpoint: {existingClaim: shared}\n")).expect("valid");
        let mut conflicts = Vec::new();
        assert!(present(
            ObjectKind::Claim,
            Some(&users),
            &mounting,
            &mut conflicts
        ));
        assert!(!present(ObjectKind::Claim, None, &mounting, &mut conflicts));
        assert_eq!(conflicts, []);
        // The PVC the operator would create is another matter.
        assert!(!present(
            ObjectKind::Claim,
            Some(&users),
            &job(),
            &mut conflicts
        ));
        assert_eq!(conflicts.len(), 1);
    }
}
