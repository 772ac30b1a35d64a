//! GPU health as a pure state machine.
//!
//! The rules fix the failure modes users hit with other plugins:
//! - Only critical XIDs mark a GPU unhealthy; the XIDs an application causes
//!   (13, 31, 43, 45, 68, 109 by default) are counted but ignored.
//! - An unhealthy GPU recovers once it has been quiet for the recovery period
//!   *and* a probe succeeds, instead of staying unhealthy forever.
//! - An error that cannot be tied to one GPU is logged and never marks every
//!   GPU unhealthy.
//!
//! Time is passed in, so tests drive the machine without sleeping.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::backend::ProbeOutcome;

/// XIDs caused by applications rather than hardware, ignored by default.
pub const DEFAULT_IGNORED_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// Tunables of the health rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthPolicy {
    /// XIDs that never change health.
    pub ignored_xids: BTreeSet<u64>,
    /// How long an unhealthy GPU must stay quiet before a good probe recovers it.
    pub recovery_quiet_period: Duration,
}

impl Default for HealthPolicy {
    fn default() -> Self {
        Self {
            ignored_xids: DEFAULT_IGNORED_XIDS.into_iter().collect(),
            recovery_quiet_period: Duration::from_secs(30),
        }
    }
}

/// Health of one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// Usable.
    Healthy,
    /// Not advertised as usable.
    Unhealthy {
        /// Why, for logs and `discover`.
        reason: String,
        /// The last time something bad was observed; recovery waits from here.
        last_bad: Instant,
    },
}

impl Health {
    /// Whether the GPU is usable.
    pub fn is_healthy(&self) -> bool {
        matches!(self, Health::Healthy)
    }
}

/// What a GPU's health did in response to an input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    /// The GPU became unhealthy.
    BecameUnhealthy {
        /// The GPU.
        uuid: String,
        /// Why.
        reason: String,
    },
    /// The GPU recovered.
    Recovered {
        /// The GPU.
        uuid: String,
    },
}

/// What the tracker made of an XID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XidVerdict {
    /// Critical: the GPU was marked (or stays) unhealthy.
    Critical(Option<Transition>),
    /// Listed as an application error: counted, health unchanged.
    Ignored,
    /// Not tied to one GPU (or to an unknown one): logged, health unchanged.
    Unattributed,
}

/// Health of every GPU of the node.
#[derive(Debug, Clone)]
pub struct HealthTracker {
    policy: HealthPolicy,
    gpus: BTreeMap<String, Health>,
}

impl HealthTracker {
    /// A tracker with no GPUs.
    pub fn new(policy: HealthPolicy) -> Self {
        Self {
            policy,
            gpus: BTreeMap::new(),
        }
    }

    /// The policy in force.
    pub fn policy(&self) -> &HealthPolicy {
        &self.policy
    }

    /// Health of one GPU; unknown GPUs are `None`.
    pub fn health(&self, uuid: &str) -> Option<&Health> {
        self.gpus.get(uuid)
    }

    /// Makes the tracked set equal to `uuids`: new GPUs start healthy (the
    /// first probe says otherwise if needed), vanished ones are forgotten.
    pub fn sync<'a>(&mut self, uuids: impl IntoIterator<Item = &'a str>) {
        let wanted: BTreeSet<&str> = uuids.into_iter().collect();
        self.gpus.retain(|uuid, _| wanted.contains(uuid.as_str()));
        for uuid in wanted {
            self.gpus.entry(uuid.to_string()).or_insert(Health::Healthy);
        }
    }

    fn mark_unhealthy(&mut self, uuid: &str, reason: String, now: Instant) -> Option<Transition> {
        let health = self.gpus.get_mut(uuid)?;
        match health {
            Health::Healthy => {
                *health = Health::Unhealthy {
                    reason: reason.clone(),
                    last_bad: now,
                };
                Some(Transition::BecameUnhealthy {
                    uuid: uuid.to_string(),
                    reason,
                })
            }
            Health::Unhealthy { last_bad, .. } => {
                // Still bad: the quiet period starts over, the first reason stays.
                *last_bad = now;
                None
            }
        }
    }

    /// Applies an XID reported for `uuid` (or for no particular GPU).
    pub fn on_xid(&mut self, uuid: Option<&str>, xid: u64, now: Instant) -> XidVerdict {
        let Some(uuid) = uuid.filter(|u| self.gpus.contains_key(*u)) else {
            return XidVerdict::Unattributed;
        };
        if self.policy.ignored_xids.contains(&xid) {
            return XidVerdict::Ignored;
        }
        XidVerdict::Critical(self.mark_unhealthy(uuid, format!("critical XID {xid}"), now))
    }

    /// Applies the outcome of probing `uuid`.
    pub fn on_probe(
        &mut self,
        uuid: &str,
        outcome: &ProbeOutcome,
        now: Instant,
    ) -> Option<Transition> {
        match outcome {
            ProbeOutcome::Unhealthy(reason) => self.mark_unhealthy(uuid, reason.clone(), now),
            ProbeOutcome::Inconclusive(_) => None,
            ProbeOutcome::Healthy => {
                let quiet = self.policy.recovery_quiet_period;
                let health = self.gpus.get_mut(uuid)?;
                match health {
                    Health::Unhealthy { last_bad, .. }
                        if now.saturating_duration_since(*last_bad) >= quiet =>
                    {
                        *health = Health::Healthy;
                        Some(Transition::Recovered {
                            uuid: uuid.to_string(),
                        })
                    }
                    _ => None,
                }
            }
        }
    }

    /// Number of healthy and unhealthy GPUs.
    pub fn counts(&self) -> (usize, usize) {
        let healthy = self.gpus.values().filter(|h| h.is_healthy()).count();
        (healthy, self.gpus.len() - healthy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tracker(quiet_secs: u64) -> (HealthTracker, Instant) {
        let mut t = HealthTracker::new(HealthPolicy {
            recovery_quiet_period: Duration::from_secs(quiet_secs),
            ..HealthPolicy::default()
        });
        t.sync(["GPU-a", "GPU-b"]);
        (t, Instant::now())
    }

    #[test]
    fn critical_xid_marks_only_that_gpu_unhealthy() {
        let (mut t, now) = tracker(30);
        let verdict = t.on_xid(Some("GPU-a"), 79, now);
        assert_eq!(
            verdict,
            XidVerdict::Critical(Some(Transition::BecameUnhealthy {
                uuid: "GPU-a".into(),
                reason: "critical XID 79".into()
            }))
        );
        assert!(!t.health("GPU-a").unwrap().is_healthy());
        assert!(t.health("GPU-b").unwrap().is_healthy());
        assert_eq!(t.counts(), (1, 1));
    }

    #[test]
    fn application_xids_are_ignored_by_default() {
        let (mut t, now) = tracker(30);
        for xid in DEFAULT_IGNORED_XIDS {
            assert_eq!(t.on_xid(Some("GPU-a"), xid, now), XidVerdict::Ignored);
        }
        assert_eq!(t.counts(), (2, 0));
    }

    #[test]
    fn ignored_xid_list_is_configurable() {
        let mut t = HealthTracker::new(HealthPolicy {
            ignored_xids: BTreeSet::from([79]),
            ..HealthPolicy::default()
        });
        t.sync(["GPU-a"]);
        let now = Instant::now();
        assert_eq!(t.on_xid(Some("GPU-a"), 79, now), XidVerdict::Ignored);
        assert!(matches!(
            t.on_xid(Some("GPU-a"), 13, now),
            XidVerdict::Critical(Some(_))
        ));
    }

    #[test]
    fn unattributed_errors_never_mark_any_gpu_unhealthy() {
        let (mut t, now) = tracker(30);
        assert_eq!(t.on_xid(None, 79, now), XidVerdict::Unattributed);
        assert_eq!(
            t.on_xid(Some("GPU-unknown"), 79, now),
            XidVerdict::Unattributed
        );
        assert_eq!(t.counts(), (2, 0));
    }

    #[test]
    fn recovery_needs_the_quiet_period_and_a_good_probe() {
        let (mut t, start) = tracker(30);
        t.on_xid(Some("GPU-a"), 79, start);
        // A good probe too early does not recover.
        assert_eq!(
            t.on_probe(
                "GPU-a",
                &ProbeOutcome::Healthy,
                start + Duration::from_secs(10)
            ),
            None
        );
        // A new bad observation restarts the quiet period.
        t.on_xid(Some("GPU-a"), 48, start + Duration::from_secs(20));
        assert_eq!(
            t.on_probe(
                "GPU-a",
                &ProbeOutcome::Healthy,
                start + Duration::from_secs(40)
            ),
            None
        );
        // Quiet long enough but the probe cannot tell: stays unhealthy.
        let later = start + Duration::from_secs(60);
        assert_eq!(
            t.on_probe("GPU-a", &ProbeOutcome::Inconclusive("busy".into()), later),
            None
        );
        assert!(!t.health("GPU-a").unwrap().is_healthy());
        // Quiet long enough and a good probe: recovered.
        assert_eq!(
            t.on_probe("GPU-a", &ProbeOutcome::Healthy, later),
            Some(Transition::Recovered {
                uuid: "GPU-a".into()
            })
        );
        assert!(t.health("GPU-a").unwrap().is_healthy());
    }

    #[test]
    fn failed_probe_marks_unhealthy_and_inconclusive_probe_changes_nothing() {
        let (mut t, now) = tracker(0);
        assert_eq!(
            t.on_probe("GPU-b", &ProbeOutcome::Inconclusive("timeout".into()), now),
            None
        );
        assert!(t.health("GPU-b").unwrap().is_healthy());
        assert!(matches!(
            t.on_probe("GPU-b", &ProbeOutcome::Unhealthy("lost".into()), now),
            Some(Transition::BecameUnhealthy { .. })
        ));
        // A repeated failure is not a new transition.
        assert_eq!(
            t.on_probe("GPU-b", &ProbeOutcome::Unhealthy("lost".into()), now),
            None
        );
        // With no quiet period the next good probe recovers.
        assert!(matches!(
            t.on_probe("GPU-b", &ProbeOutcome::Healthy, now),
            Some(Transition::Recovered { .. })
        ));
    }

    #[test]
    fn sync_adds_new_gpus_healthy_and_forgets_removed_ones() {
        let (mut t, now) = tracker(30);
        t.on_xid(Some("GPU-a"), 79, now);
        t.sync(["GPU-a", "GPU-c"]);
        assert!(t.health("GPU-b").is_none());
        assert!(t.health("GPU-c").unwrap().is_healthy());
        assert!(!t.health("GPU-a").unwrap().is_healthy());
    }
}
