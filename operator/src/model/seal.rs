//! The operator's seal on the worker pods it makes: only such a pod speaks for a rank.
//!
//! Labels and owner references prove nothing: anyone who may create pods in a namespace can
//! copy them from a worker, and a TrainingJob's uid is public. So each worker pod the operator
//! creates or moves to an attempt carries [`SEAL_ANNOTATION`]: an HMAC-SHA256, under a key only
//! the operator holds (a Secret in its own namespace), of the pod's namespace, name, job uid,
//! rank and attempt. The progress channel takes a pod for a rank's worker only with a valid
//! seal, and its attempt only from what the seal covers. A pod created before the key was
//! (an upgrade to sealing) is taken on its labels as before: the API server sets
//! `creationTimestamp`, so no pod made later can pass for one of them.

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use ring::hmac;

/// The annotation that carries a worker pod's seal.
pub const SEAL_ANNOTATION: &str = "trainyard.dev/seal";

/// The length of a new key, in bytes.
pub const KEY_BYTES: usize = 32;

/// What a seal covers: one worker of one attempt of one job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Worker<'a> {
    /// The pod's namespace.
    pub namespace: &'a str,
    /// The pod's name.
    pub pod: &'a str,
    /// The uid of the TrainingJob it belongs to.
    pub job_uid: &'a str,
    /// Its rank.
    pub rank: u32,
    /// The attempt it runs.
    pub attempt: u32,
}

/// How a pod's seal reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sealed {
    /// The operator made the pod for this worker.
    Valid,
    /// The pod is older than the key: taken on its labels.
    BeforeSealing,
    /// No seal, or one the key did not make for this worker.
    Forged,
}

/// The key the operator seals with, and when it was made.
#[derive(Clone)]
pub struct SealKey {
    key: hmac::Key,
    /// Pods created before this are taken on their labels; `None`: none is.
    made: Option<Timestamp>,
    /// A short fingerprint of the key, to compare and log keys without showing them.
    id: String,
}

impl SealKey {
    /// A key from its bytes (the Secret's), made at `made`.
    pub fn new(bytes: &[u8], made: Option<Timestamp>) -> Self {
        let key = hmac::Key::new(hmac::HMAC_SHA256, bytes);
        let id = URL_SAFE_NO_PAD.encode(&hmac::sign(&key, b"trainyard seal key id").as_ref()[..6]);
        Self { key, made, id }
    }

    /// New random key bytes.
    pub fn generate() -> Result<[u8; KEY_BYTES], ring::error::Unspecified> {
        let mut bytes = [0u8; KEY_BYTES];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)?;
        Ok(bytes)
    }

    /// This process's own random key (no Secret: tests, a single replica run by hand); the
    /// same one each time it is asked for.
    pub fn ephemeral() -> Self {
        static KEY: std::sync::OnceLock<SealKey> = std::sync::OnceLock::new();
        KEY.get_or_init(|| {
            // No system randomness is no key worth having: the seal then holds for nothing.
            let bytes = Self::generate().unwrap_or([0u8; KEY_BYTES]);
            Self::new(&bytes, None)
        })
        .clone()
    }

    /// The key's fingerprint.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The seal of `worker`.
    pub fn seal(&self, worker: &Worker<'_>) -> String {
        URL_SAFE_NO_PAD.encode(hmac::sign(&self.key, &message(worker)).as_ref())
    }

    /// How the seal of the pod `meta` reads for `worker`.
    pub fn check(&self, meta: &ObjectMeta, worker: &Worker<'_>) -> Sealed {
        let seal = meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(SEAL_ANNOTATION))
            .and_then(|s| URL_SAFE_NO_PAD.decode(s).ok());
        if let Some(tag) = seal
            && hmac::verify(&self.key, &message(worker), &tag).is_ok()
        {
            return Sealed::Valid;
        }
        let created = meta.creation_timestamp.as_ref().map(|t| t.0);
        match (created, self.made) {
            (Some(created), Some(made)) if created < made => Sealed::BeforeSealing,
            _ => Sealed::Forged,
        }
    }
}

impl Default for SealKey {
    fn default() -> Self {
        Self::ephemeral()
    }
}

impl fmt::Debug for SealKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SealKey")
            .field("id", &self.id)
            .field("made", &self.made)
            .finish()
    }
}

impl PartialEq for SealKey {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id && self.made == other.made
    }
}

/// The bytes signed: every field, each ended by a NUL (no field holds one).
fn message(w: &Worker<'_>) -> Vec<u8> {
    let fields = [
        "trainyard.dev/seal/v1",
        w.namespace,
        w.pod,
        w.job_uid,
        &w.rank.to_string(),
        &w.attempt.to_string(),
    ];
    fields.iter().flat_map(|f| f.bytes().chain([0])).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    const W: Worker<'static> = Worker {
        namespace: "ml",
        pod: "train-worker-0",
        job_uid: "u-1",
        rank: 0,
        attempt: 3,
    };

    fn meta(seal: Option<String>, created: Option<&str>) -> ObjectMeta {
        ObjectMeta {
            annotations: seal.map(|s| [(SEAL_ANNOTATION.to_owned(), s)].into()),
            creation_timestamp: created.map(|c| Time(c.parse().expect("time"))),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn a_seal_holds_only_for_the_worker_it_was_made_for_under_the_key_that_made_it() {
        let key = SealKey::new(b"k1", None);
        let seal = key.seal(&W);
        assert_eq!(
            key.check(&meta(Some(seal.clone()), None), &W),
            Sealed::Valid
        );
        // A copy under another name, a later attempt, another rank or job: forged.
        for other in [
            Worker { pod: "copy", ..W },
            Worker {
                attempt: u32::MAX,
                ..W
            },
            Worker { rank: 1, ..W },
            Worker {
                job_uid: "u-2",
                ..W
            },
            Worker {
                namespace: "other",
                ..W
            },
        ] {
            assert_eq!(
                key.check(&meta(Some(seal.clone()), None), &other),
                Sealed::Forged
            );
        }
        assert_eq!(
            SealKey::new(b"k2", None).check(&meta(Some(seal), None), &W),
            Sealed::Forged
        );
        assert_eq!(
            key.check(&meta(Some("x!".into()), None), &W),
            Sealed::Forged
        );
        assert_eq!(key.check(&meta(None, None), &W), Sealed::Forged);
    }

    #[test]
    fn an_unsealed_pod_is_taken_on_its_labels_only_when_it_is_older_than_the_key() {
        let made = "2026-01-01T00:00:00Z".parse().expect("time");
        let key = SealKey::new(b"k1", Some(made));
        let old = meta(None, Some("2025-12-31T23:59:59Z"));
        let new = meta(None, Some("2026-01-01T00:00:00Z"));
        assert_eq!(key.check(&old, &W), Sealed::BeforeSealing);
        assert_eq!(key.check(&new, &W), Sealed::Forged);
        assert_eq!(key.check(&meta(None, None), &W), Sealed::Forged);
    }

    #[test]
    fn a_key_is_shown_only_by_its_fingerprint() {
        let key = SealKey::new(b"secret-bytes", None);
        let shown = format!("{key:?}");
        assert!(
            shown.contains(key.id()) && !shown.contains("secret"),
            "{shown}"
        );
        assert_eq!(key, SealKey::new(b"secret-bytes", None));
        assert_ne!(key, SealKey::new(b"other", None));
    }
}
