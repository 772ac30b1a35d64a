//! GPU health as a pure state machine.
//!
//! The rules fix the failure modes users hit with other plugins:
//! - Only critical XIDs mark a GPU unhealthy; the XIDs an application causes
//!   (13, 31, 43, 45, 68, 109 by default) are counted but ignored.
//! - An unhealthy GPU recovers once it has been quiet for the recovery period
//!   *and* a probe succeeds, instead of staying unhealthy forever.
//! - A fault that only a GPU reset repairs (XID 79, 48, 74, ..., see
//!   [`DEFAULT_RESET_XIDS`], and NVML `GpuLost`/`ResetRequired`) also needs
//!   evidence of that reset ([`ResetCheck`]): a GPU that merely answers a
//!   memory query again has not been shown to be repaired. The reset is shown
//!   by a *change*: a reset the backend counted since the fault, or a state
//!   seen after the fault (the GPU lost, a row remap pending, a recovery
//!   action asked) that has cleared. Evidence that merely reads clean, as it
//!   already did when the fault happened, shows nothing.
//! - A GPU whose evidence says it owes a reset (a pending row remap or page
//!   retirement, a failed remap, a recovery action the driver asks for) is
//!   Unhealthy whatever else is known, so a plugin that starts on a node
//!   where a reset is still owed never advertises that GPU as usable.
//! - An error that cannot be tied to one GPU is logged and never marks every
//!   GPU unhealthy, and a GPU that cannot be read is one unhealthy GPU, not
//!   a reason to stop serving the others.
//!
//! Time is passed in, so tests drive the machine without sleeping.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::{Duration, Instant};

use super::backend::{DeviceError, DeviceErrorKind, ProbeOutcome, RecoveryAction, ResetEvidence};

/// XIDs caused by applications rather than hardware, ignored by default.
pub(crate) const DEFAULT_IGNORED_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// XIDs after which a GPU stays Unhealthy until a probe shows the reset
/// they need, from NVIDIA's XID catalogue (immediate action `RESET_GPU`, or
/// a memory repair that only takes effect at the next reset):
///
/// | XID | meaning | why a reset |
/// |---|---|---|
/// | 48 | double-bit (uncorrectable) ECC error | the bad page/row is retired or remapped only at the next reset |
/// | 62 | internal micro-controller halt | the firmware is stopped until the GPU is reset |
/// | 63 | page retirement / row remapping recorded | the repair takes effect at the next reset |
/// | 64 | recording a page retirement / row remapping failed | reset; if it persists the GPU needs replacing |
/// | 74 | NVLink error | the link stays down until the GPU (or link) is reset |
/// | 79 | GPU has fallen off the bus | unusable until reset or reboot |
/// | 94 | contained uncorrectable ECC error | the row is remapped at the next reset; until then the next job may hit it again |
/// | 95 | uncontained uncorrectable ECC error | every context on the GPU is corrupt; reset |
/// | 119, 120 | GSP firmware RPC timeout / error | the GSP is only restarted by a reset |
/// | 140 | unrecovered ECC error | reset |
/// | 154 | the driver's recovery action changed | the driver itself says what is needed; the recovery-action field tells when it is done |
pub(crate) const DEFAULT_RESET_XIDS: [(u64, ResetCheck); 12] = [
    (48, ResetCheck::GpuReset),
    (62, ResetCheck::GpuReset),
    (63, ResetCheck::GpuReset),
    (64, ResetCheck::GpuReset),
    (74, ResetCheck::NvlinksUp),
    (79, ResetCheck::GpuReset),
    (94, ResetCheck::GpuReset),
    (95, ResetCheck::GpuReset),
    (119, ResetCheck::GpuReset),
    (120, ResetCheck::GpuReset),
    (140, ResetCheck::GpuReset),
    (154, ResetCheck::GpuReset),
];

/// Tunables of the health rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthPolicy {
    /// XIDs that never change health (this wins over `reset_xids`).
    pub ignored_xids: BTreeSet<u64>,
    /// How long an unhealthy GPU must stay quiet before a good probe recovers it.
    pub recovery_quiet_period: Duration,
    /// XIDs whose GPU also needs evidence of a reset before it recovers.
    pub reset_xids: BTreeMap<u64, ResetCheck>,
}

impl Default for HealthPolicy {
    fn default() -> Self {
        Self {
            ignored_xids: DEFAULT_IGNORED_XIDS.into_iter().collect(),
            recovery_quiet_period: Duration::from_secs(30),
            reset_xids: DEFAULT_RESET_XIDS.into_iter().collect(),
        }
    }
}

/// What must be observed, besides quiet and a good probe, before a GPU
/// that had a reset-requiring fault may serve again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ResetCheck {
    /// The GPU has been reset: it answers, the driver asks for no recovery
    /// action, nothing waits for page retirement or row remapping (which a
    /// reset carries out), and at least one of those could be read.
    GpuReset,
    /// Every NVLink lane that was up is up again, the GPU answers and the
    /// driver asks for no recovery action.
    NvlinksUp,
}

impl fmt::Display for ResetCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::GpuReset => "a GPU reset",
            Self::NvlinksUp => "its NVLinks to come back up",
        })
    }
}

/// Why a [`ResetCheck`] is not met yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Unmet {
    /// The GPU does not answer.
    Unreachable(DeviceErrorKind),
    /// The driver still asks for this.
    RecoveryAction(RecoveryAction),
    /// Row remapping failed: no reset repairs this GPU's memory.
    RowRemapFailed,
    /// Pages still wait for retirement.
    RetiredPagesPending,
    /// A row remapping still waits for a reset.
    RowRemapPending,
    /// Fewer NVLink lanes are up than before.
    NvlinksDown {
        /// Lanes up now.
        active: u32,
        /// Lanes up before.
        expected: u32,
    },
    /// No query that could tell is supported by this GPU or driver.
    CannotTell,
    /// Nothing read since the fault differs from what a GPU that was never
    /// reset shows: no reset counted, nothing seen pending has cleared.
    NoChange,
}

impl fmt::Display for Unmet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unreachable(kind) => write!(f, "the GPU does not answer ({kind:?})"),
            Self::RecoveryAction(action) => write!(f, "the driver asks for: {action}"),
            Self::RowRemapFailed => f.write_str("row remapping failed; the GPU needs replacing"),
            Self::RetiredPagesPending => f.write_str("pages are waiting for retirement"),
            Self::RowRemapPending => f.write_str("a row remapping is waiting for a reset"),
            Self::NvlinksDown { active, expected } => {
                write!(f, "{active} of {expected} NVLink lanes are up")
            }
            Self::CannotTell => f.write_str("no query on this GPU can show a reset"),
            Self::NoChange => f.write_str(
                "nothing read since the fault shows a reset (none counted, nothing pending cleared)",
            ),
        }
    }
}

impl ResetCheck {
    /// Judges the evidence; `Ok` when the check is met.
    pub(crate) fn assess(self, evidence: &ResetEvidence) -> Result<(), Unmet> {
        if let Err(e) = &evidence.reachable {
            return Err(Unmet::Unreachable(e.kind));
        }
        if let Some(action) = evidence.recovery_action
            && action != RecoveryAction::None
        {
            return Err(Unmet::RecoveryAction(action));
        }
        match self {
            Self::GpuReset => {
                if evidence.row_remap_failed == Some(true) {
                    return Err(Unmet::RowRemapFailed);
                }
                if evidence.retired_pages_pending == Some(true) {
                    return Err(Unmet::RetiredPagesPending);
                }
                if evidence.row_remap_pending == Some(true) {
                    return Err(Unmet::RowRemapPending);
                }
                let told = evidence.recovery_action.is_some()
                    || evidence.retired_pages_pending.is_some()
                    || evidence.row_remap_pending.is_some();
                if told { Ok(()) } else { Err(Unmet::CannotTell) }
            }
            Self::NvlinksUp => match evidence.nvlink_lanes {
                None => Err(Unmet::CannotTell),
                Some(lanes) if lanes.active < lanes.expected => Err(Unmet::NvlinksDown {
                    active: lanes.active,
                    expected: lanes.expected,
                }),
                Some(_) => Ok(()),
            },
        }
    }
}

/// What a GPU's evidence says it still owes, whatever faults were seen or
/// missed (a plugin that starts after the XID never saw it): a recovery
/// action the driver asks for, a failed row remap, pages waiting for
/// retirement or a row remap waiting for a reset. `None` when nothing
/// readable is owed; a GPU that does not answer is the probe's business.
pub(crate) fn owed_reset(evidence: &ResetEvidence) -> Option<Unmet> {
    if evidence.reachable.is_err() {
        return None;
    }
    if let Some(action) = evidence.recovery_action
        && action != RecoveryAction::None
    {
        return Some(Unmet::RecoveryAction(action));
    }
    if evidence.row_remap_failed == Some(true) {
        return Some(Unmet::RowRemapFailed);
    }
    if evidence.retired_pages_pending == Some(true) {
        return Some(Unmet::RetiredPagesPending);
    }
    if evidence.row_remap_pending == Some(true) {
        return Some(Unmet::RowRemapPending);
    }
    None
}

/// What has been seen of one GPU since a fault that needs a GPU reset.
///
/// Evidence is a snapshot: after XID 62 on a driver without the
/// recovery-action field it reads clean before any reset. So the reset is
/// shown only by something a reset changes: the backend's reset count moved
/// past its value at the fault, or a state seen after the fault that only a
/// reset (or the driver) clears has cleared.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct SinceFault {
    /// The backend's reset count at the fault: the last read before it, else the first after.
    resets_at_fault: Option<u64>,
    /// Whether the GPU was seen lost, or owing a reset, after the fault.
    seen_owed: bool,
}

impl SinceFault {
    /// Whether `evidence` shows the reset; the first reading of the reset
    /// count after the fault becomes the one later readings are compared to.
    fn shown(&mut self, evidence: &ResetEvidence) -> Result<(), Unmet> {
        if self.resets_at_fault.is_none() {
            self.resets_at_fault = evidence.resets;
        }
        let counted = matches!(
            (self.resets_at_fault, evidence.resets),
            (Some(then), Some(now)) if now > then
        );
        match ResetCheck::GpuReset.assess(evidence) {
            Err(Unmet::CannotTell) if counted => Ok(()),
            Err(unmet) => Err(unmet),
            Ok(()) if counted || self.seen_owed => Ok(()),
            Ok(()) => Err(Unmet::NoChange),
        }
    }
}

/// The reset a per-GPU error needs, if any: a lost or refused GPU comes back only by a reset.
pub(crate) fn reset_check_for(kind: DeviceErrorKind) -> Option<ResetCheck> {
    match kind {
        DeviceErrorKind::GpuLost | DeviceErrorKind::ResetRequired => Some(ResetCheck::GpuReset),
        DeviceErrorKind::NotFound | DeviceErrorKind::Other => None,
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
        /// Resets it still waits for; empty when quiet and a good probe suffice.
        awaiting: BTreeSet<ResetCheck>,
    },
}

impl Health {
    /// Whether the GPU is usable.
    pub(crate) fn is_healthy(&self) -> bool {
        matches!(self, Health::Healthy)
    }
}

/// What a GPU's health did in response to an input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Transition {
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
pub(crate) enum XidVerdict {
    /// Critical: the GPU was marked (or stays) unhealthy.
    Critical(Option<Transition>),
    /// Listed as an application error: counted, health unchanged.
    Ignored,
    /// Not tied to one GPU (or to an unknown one): logged, health unchanged.
    Unattributed,
}

/// What the tracker made of reset evidence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ResetVerdict {
    /// The GPU waited for no reset (unknown, healthy, or none needed).
    NotAwaiting,
    /// Every awaited reset is now shown; quiet and a good probe recover it.
    Shown,
    /// These checks are still unmet.
    Pending(Vec<(ResetCheck, Unmet)>),
    /// The evidence says a reset is owed by a GPU that was not waiting for
    /// one: it now waits for a GPU reset.
    Owed(Transition),
}

/// A GPU reset a GPU owes, as the node keeps it across plugin restarts.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct OwedReset {
    /// Why the reset is owed (the first reason the GPU became Unhealthy).
    pub reason: String,
    /// The backend's reset count at the fault, when one was read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resets_at_fault: Option<u64>,
    /// Whether the GPU was seen in a state only a reset clears after the fault.
    #[serde(default)]
    pub seen_owed: bool,
}

/// Health of every GPU of the node.
#[derive(Debug, Clone)]
pub(crate) struct HealthTracker {
    policy: HealthPolicy,
    gpus: BTreeMap<String, Health>,
    /// The last reset count read for each GPU, so a fault knows the count before it.
    resets: BTreeMap<String, u64>,
    /// For each GPU that waits for a GPU reset: what has been seen since the fault.
    since_fault: BTreeMap<String, SinceFault>,
}

impl HealthTracker {
    /// A tracker with no GPUs.
    pub(crate) fn new(policy: HealthPolicy) -> Self {
        Self {
            policy,
            gpus: BTreeMap::new(),
            resets: BTreeMap::new(),
            since_fault: BTreeMap::new(),
        }
    }

    /// Health of one GPU; unknown GPUs are `None`.
    pub(crate) fn health(&self, uuid: &str) -> Option<&Health> {
        self.gpus.get(uuid)
    }

    /// Makes the tracked set equal to `uuids`: new GPUs start healthy (the
    /// first probe says otherwise if needed), vanished ones are forgotten.
    pub(crate) fn sync<'a>(&mut self, uuids: impl IntoIterator<Item = &'a str>) {
        let wanted: BTreeSet<&str> = uuids.into_iter().collect();
        self.gpus.retain(|uuid, _| wanted.contains(uuid.as_str()));
        self.resets.retain(|uuid, _| wanted.contains(uuid.as_str()));
        self.since_fault
            .retain(|uuid, _| wanted.contains(uuid.as_str()));
        for uuid in wanted {
            self.gpus.entry(uuid.to_string()).or_insert(Health::Healthy);
        }
    }

    /// Moves the health of device `from` to device `to`, for a GPU first
    /// advertised under a stand-in ID whose UUID could now be read: the
    /// reset it waits for is still owed.
    pub(crate) fn rename(&mut self, from: &str, to: &str) {
        if from != to
            && !self.gpus.contains_key(to)
            && let Some(health) = self.gpus.remove(from)
        {
            self.gpus.insert(to.to_string(), health);
            if let Some(resets) = self.resets.remove(from) {
                self.resets.insert(to.to_string(), resets);
            }
            if let Some(since) = self.since_fault.remove(from) {
                self.since_fault.insert(to.to_string(), since);
            }
        }
    }

    fn mark_unhealthy(
        &mut self,
        uuid: &str,
        reason: String,
        reset: Option<ResetCheck>,
        now: Instant,
    ) -> Option<Transition> {
        let health = self.gpus.get_mut(uuid)?;
        let newly_owed = reset == Some(ResetCheck::GpuReset)
            && !matches!(health, Health::Unhealthy { awaiting, .. }
                if awaiting.contains(&ResetCheck::GpuReset));
        let transition = match health {
            Health::Healthy => {
                *health = Health::Unhealthy {
                    reason: reason.clone(),
                    last_bad: now,
                    awaiting: reset.into_iter().collect(),
                };
                Some(Transition::BecameUnhealthy {
                    uuid: uuid.to_string(),
                    reason,
                })
            }
            Health::Unhealthy {
                last_bad, awaiting, ..
            } => {
                // Still bad: the quiet period starts over, the first reason
                // stays, and every reset owed stays owed.
                *last_bad = now;
                awaiting.extend(reset);
                None
            }
        };
        if newly_owed {
            let resets_at_fault = self.resets.get(uuid).copied();
            self.since_fault.insert(
                uuid.to_string(),
                SinceFault {
                    resets_at_fault,
                    seen_owed: false,
                },
            );
        }
        transition
    }

    /// Records that a GPU waiting for a GPU reset was seen in a state only
    /// a reset clears (lost, or owing a reset), so clean evidence later is a change.
    fn witness_owed(&mut self, uuid: &str) {
        if let Some(since) = self.since_fault.get_mut(uuid) {
            since.seen_owed = true;
        }
    }

    /// Applies an XID reported for `uuid` (or for no particular GPU).
    pub(crate) fn on_xid(&mut self, uuid: Option<&str>, xid: u64, now: Instant) -> XidVerdict {
        let Some(uuid) = uuid.filter(|u| self.gpus.contains_key(*u)) else {
            return XidVerdict::Unattributed;
        };
        if self.policy.ignored_xids.contains(&xid) {
            return XidVerdict::Ignored;
        }
        let reset = self.policy.reset_xids.get(&xid).copied();
        let reason = match reset {
            Some(check) => format!("critical XID {xid}; waiting for {check}"),
            None => format!("critical XID {xid}"),
        };
        XidVerdict::Critical(self.mark_unhealthy(uuid, reason, reset, now))
    }

    /// Applies a per-GPU error met while reading the inventory: the GPU
    /// cannot be vouched for, so it is Unhealthy until it reads again (and
    /// any reset the error needs is shown).
    pub(crate) fn on_fault(
        &mut self,
        id: &str,
        error: &DeviceError,
        now: Instant,
    ) -> Option<Transition> {
        let reset = reset_check_for(error.kind);
        let transition = self.mark_unhealthy(id, format!("cannot be read: {error}"), reset, now);
        if reset.is_some() {
            self.witness_owed(id);
        }
        transition
    }

    /// The GPUs that wait for evidence of a reset.
    #[cfg(test)]
    pub(crate) fn awaiting_reset(&self) -> Vec<String> {
        self.gpus
            .iter()
            .filter(
                |(_, h)| matches!(h, Health::Unhealthy { awaiting, .. } if !awaiting.is_empty()),
            )
            .map(|(uuid, _)| uuid.clone())
            .collect()
    }

    /// Applies reset evidence gathered for `uuid`, healthy or not: evidence
    /// that owes a reset makes the GPU wait for one, and every check the
    /// evidence meets is no longer awaited.
    pub(crate) fn on_reset_evidence(
        &mut self,
        uuid: &str,
        evidence: &ResetEvidence,
        now: Instant,
    ) -> ResetVerdict {
        if !self.gpus.contains_key(uuid) {
            return ResetVerdict::NotAwaiting;
        }
        let mut became = None;
        if let Some(owed) = owed_reset(evidence) {
            let reason = format!("{owed}; waiting for {}", ResetCheck::GpuReset);
            became = self.mark_unhealthy(uuid, reason, Some(ResetCheck::GpuReset), now);
            self.witness_owed(uuid);
        } else if let Err(e) = &evidence.reachable
            && reset_check_for(e.kind).is_some()
        {
            self.witness_owed(uuid);
        }
        let verdict = self.judge_reset(uuid, evidence);
        if let Some(resets) = evidence.resets {
            self.resets.insert(uuid.to_string(), resets);
        }
        match became {
            Some(transition) => ResetVerdict::Owed(transition),
            None => verdict,
        }
    }

    /// Drops every awaited check that `evidence` meets.
    fn judge_reset(&mut self, uuid: &str, evidence: &ResetEvidence) -> ResetVerdict {
        let Some(Health::Unhealthy { awaiting, .. }) = self.gpus.get_mut(uuid) else {
            return ResetVerdict::NotAwaiting;
        };
        if awaiting.is_empty() {
            return ResetVerdict::NotAwaiting;
        }
        let since = self.since_fault.entry(uuid.to_string()).or_default();
        let mut pending = Vec::new();
        awaiting.retain(|check| {
            let judged = match check {
                ResetCheck::GpuReset => since.shown(evidence),
                ResetCheck::NvlinksUp => check.assess(evidence),
            };
            match judged {
                Ok(()) => false,
                Err(unmet) => {
                    pending.push((*check, unmet));
                    true
                }
            }
        });
        if !awaiting.contains(&ResetCheck::GpuReset) {
            self.since_fault.remove(uuid);
        }
        if pending.is_empty() {
            ResetVerdict::Shown
        } else {
            ResetVerdict::Pending(pending)
        }
    }

    /// Applies the outcome of probing `uuid`.
    pub(crate) fn on_probe(
        &mut self,
        uuid: &str,
        outcome: &ProbeOutcome,
        now: Instant,
    ) -> Option<Transition> {
        match outcome {
            ProbeOutcome::Unhealthy(error) => {
                let reset = reset_check_for(error.kind);
                let transition = self.mark_unhealthy(uuid, error.to_string(), reset, now);
                if reset.is_some() {
                    self.witness_owed(uuid);
                }
                transition
            }
            ProbeOutcome::Inconclusive(_) => None,
            ProbeOutcome::Healthy => {
                let quiet = self.policy.recovery_quiet_period;
                let health = self.gpus.get_mut(uuid)?;
                match health {
                    Health::Unhealthy {
                        last_bad, awaiting, ..
                    } if awaiting.is_empty()
                        && now.saturating_duration_since(*last_bad) >= quiet =>
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

    /// The GPU resets still owed, by GPU: what the node keeps across plugin restarts
    /// ([`crate::rm::owed`]), so that a restarted plugin does not advertise a GPU whose fault
    /// left no evidence it could read again (XID 62, 119 or 120 on a driver without the
    /// recovery-action field).
    pub(crate) fn owed_resets(&self) -> BTreeMap<String, OwedReset> {
        self.gpus
            .iter()
            .filter_map(|(uuid, health)| match health {
                Health::Unhealthy {
                    reason, awaiting, ..
                } if awaiting.contains(&ResetCheck::GpuReset) => {
                    let since = self.since_fault.get(uuid).cloned().unwrap_or_default();
                    Some((
                        uuid.clone(),
                        OwedReset {
                            reason: reason.clone(),
                            resets_at_fault: since.resets_at_fault,
                            seen_owed: since.seen_owed,
                        },
                    ))
                }
                _ => None,
            })
            .collect()
    }

    /// Takes back the resets a previous run of the plugin recorded as owed: each GPU of
    /// `owed` that is tracked waits for a GPU reset again, judged against the reset count
    /// at its fault; GPUs no longer present are ignored.
    pub(crate) fn restore_owed(
        &mut self,
        owed: &BTreeMap<String, OwedReset>,
        now: Instant,
    ) -> Vec<Transition> {
        let mut transitions = Vec::new();
        for (uuid, reset) in owed {
            if !self.gpus.contains_key(uuid) {
                continue;
            }
            let reason = format!("{} (owed before the plugin restarted)", reset.reason);
            transitions.extend(self.mark_unhealthy(uuid, reason, Some(ResetCheck::GpuReset), now));
            self.since_fault.insert(
                uuid.clone(),
                SinceFault {
                    resets_at_fault: reset.resets_at_fault,
                    seen_owed: reset.seen_owed,
                },
            );
        }
        transitions
    }

    /// Number of healthy and unhealthy GPUs.
    #[cfg(test)]
    pub(crate) fn counts(&self) -> (usize, usize) {
        let healthy = self.gpus.values().filter(|h| h.is_healthy()).count();
        (healthy, self.gpus.len() - healthy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rm::backend::NvlinkLanes;

    /// A critical XID that needs no reset.
    const PLAIN_XID: u64 = 61;

    fn error(kind: DeviceErrorKind) -> DeviceError {
        DeviceError {
            kind,
            detail: format!("NVML memory_info failed: {kind:?}"),
        }
    }

    /// What a freshly reset GPU with row remapping support shows.
    fn clean() -> ResetEvidence {
        ResetEvidence {
            reachable: Ok(()),
            recovery_action: None,
            retired_pages_pending: None,
            row_remap_pending: Some(false),
            row_remap_failed: Some(false),
            nvlink_lanes: Some(NvlinkLanes {
                active: 12,
                expected: 12,
            }),
            resets: Some(0),
        }
    }

    /// `clean()` after the backend counted `n` resets.
    fn reset_counted(n: u64) -> ResetEvidence {
        ResetEvidence {
            resets: Some(n),
            ..clean()
        }
    }

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
                reason: "critical XID 79; waiting for a GPU reset".into()
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
        t.on_xid(Some("GPU-a"), PLAIN_XID, start);
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
        t.on_xid(Some("GPU-a"), PLAIN_XID, start + Duration::from_secs(20));
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
    fn a_reset_xid_keeps_the_gpu_unhealthy_through_good_probes_past_the_quiet_period() {
        for xid in [48, 62, 63, 64, 74, 79, 94, 95, 119, 120, 140] {
            let (mut t, start) = tracker(30);
            // The monitor reads every GPU's evidence every round.
            t.on_reset_evidence("GPU-a", &clean(), start);
            t.on_xid(Some("GPU-a"), xid, start);
            let later = start + Duration::from_secs(3600);
            assert_eq!(
                t.on_probe("GPU-a", &ProbeOutcome::Healthy, later),
                None,
                "XID {xid}: a plain probe is no evidence of a reset"
            );
            assert!(!t.health("GPU-a").unwrap().is_healthy(), "XID {xid}");
            // Evidence of the reset (a counted reset; NVLinks up after XID 74),
            // then a good probe: recovered.
            assert_eq!(
                t.on_reset_evidence("GPU-a", &reset_counted(1), later),
                ResetVerdict::Shown,
                "XID {xid}"
            );
            assert!(matches!(
                t.on_probe("GPU-a", &ProbeOutcome::Healthy, later),
                Some(Transition::Recovered { .. })
            ));
        }
    }

    #[test]
    fn clean_evidence_after_a_reset_xid_is_no_reset_until_a_reset_is_counted() {
        // XID 62/119/120 on a driver without the recovery-action field:
        // nothing is pending before the reset either.
        for xid in [62, 119, 120] {
            let (mut t, now) = tracker(0);
            // Read every round while healthy: 4 resets counted since start-up.
            assert_eq!(
                t.on_reset_evidence("GPU-a", &reset_counted(4), now),
                ResetVerdict::NotAwaiting
            );
            t.on_xid(Some("GPU-a"), xid, now);
            for _ in 0..3 {
                assert_eq!(
                    t.on_reset_evidence("GPU-a", &reset_counted(4), now),
                    ResetVerdict::Pending(vec![(ResetCheck::GpuReset, Unmet::NoChange)]),
                    "XID {xid}: the first clean reading is no reset"
                );
                assert_eq!(t.on_probe("GPU-a", &ProbeOutcome::Healthy, now), None);
            }
            assert_eq!(
                t.on_reset_evidence("GPU-a", &reset_counted(5), now),
                ResetVerdict::Shown,
                "XID {xid}"
            );
            assert!(matches!(
                t.on_probe("GPU-a", &ProbeOutcome::Healthy, now),
                Some(Transition::Recovered { .. })
            ));
        }
    }

    #[test]
    fn with_no_reading_before_the_fault_the_first_one_after_it_is_the_baseline() {
        let (mut t, now) = tracker(0);
        t.on_xid(Some("GPU-a"), 119, now);
        let pending = ResetVerdict::Pending(vec![(ResetCheck::GpuReset, Unmet::NoChange)]);
        assert_eq!(
            t.on_reset_evidence("GPU-a", &reset_counted(7), now),
            pending
        );
        assert_eq!(
            t.on_reset_evidence("GPU-a", &reset_counted(7), now),
            pending
        );
        assert_eq!(
            t.on_reset_evidence("GPU-a", &reset_counted(8), now),
            ResetVerdict::Shown
        );
        // A backend that counts no resets and finds nothing pending cannot
        // show one: the GPU stays Unhealthy.
        let (mut t, now) = tracker(0);
        t.on_xid(Some("GPU-a"), 62, now);
        let uncounted = ResetEvidence {
            resets: None,
            ..clean()
        };
        for _ in 0..3 {
            assert_eq!(t.on_reset_evidence("GPU-a", &uncounted, now), pending);
        }
        // A counted reset with nothing else readable still shows it.
        let (mut t, now) = tracker(0);
        t.on_reset_evidence("GPU-a", &reset_counted(0), now);
        t.on_xid(Some("GPU-a"), 62, now);
        let only_counted = ResetEvidence {
            row_remap_pending: None,
            row_remap_failed: None,
            ..reset_counted(1)
        };
        assert_eq!(
            t.on_reset_evidence("GPU-a", &only_counted, now),
            ResetVerdict::Shown
        );
    }

    /// XID 62 on a driver without the recovery-action field leaves evidence that reads
    /// clean: only the tracker knows the reset is owed. What it owes goes to the node's file
    /// and comes back in the next run, which waits for the same reset (a count past the one
    /// at the fault), not for evidence that merely reads clean.
    #[test]
    fn an_owed_reset_is_taken_over_by_the_next_run_and_cleared_only_by_the_reset() {
        let (mut t, now) = tracker(0);
        t.on_reset_evidence("GPU-a", &reset_counted(4), now);
        t.on_xid(Some("GPU-a"), 62, now);
        let owed = t.owed_resets();
        assert_eq!(owed.keys().collect::<Vec<_>>(), ["GPU-a"]);
        assert_eq!(owed["GPU-a"].resets_at_fault, Some(4));

        // The next run: everything starts Healthy, and clean evidence alone would keep it so.
        let (mut next, now) = tracker(0);
        assert!(next.owed_resets().is_empty());
        let restored = next.restore_owed(&owed, now);
        assert_eq!(restored.len(), 1, "GPU-a becomes Unhealthy again");
        assert!(!next.health("GPU-a").is_some_and(Health::is_healthy));
        assert!(next.health("GPU-b").is_some_and(Health::is_healthy));
        assert_eq!(next.awaiting_reset(), ["GPU-a"]);
        assert!(matches!(
            next.on_reset_evidence("GPU-a", &reset_counted(4), now),
            ResetVerdict::Pending(_)
        ));
        assert_eq!(
            next.on_reset_evidence("GPU-a", &reset_counted(5), now),
            ResetVerdict::Shown
        );
        assert!(next.owed_resets().is_empty(), "the reset cleared it");
        // A GPU the node no longer has is not restored.
        let gone = BTreeMap::from([("GPU-z".to_owned(), owed["GPU-a"].clone())]);
        assert!(next.restore_owed(&gone, now).is_empty());
    }

    #[test]
    fn evidence_that_owes_a_reset_makes_a_healthy_gpu_unhealthy_until_it_clears() {
        type Edit = fn(&mut ResetEvidence);
        let owed: [(&str, Edit, Unmet); 5] = [
            (
                "row remap pending",
                |e| e.row_remap_pending = Some(true),
                Unmet::RowRemapPending,
            ),
            (
                "pages pending retirement",
                |e| e.retired_pages_pending = Some(true),
                Unmet::RetiredPagesPending,
            ),
            (
                "row remap failed",
                |e| e.row_remap_failed = Some(true),
                Unmet::RowRemapFailed,
            ),
            (
                "the driver asks for a reset",
                |e| e.recovery_action = Some(RecoveryAction::GpuReset),
                Unmet::RecoveryAction(RecoveryAction::GpuReset),
            ),
            (
                "the driver asks to drain peer-to-peer work",
                |e| e.recovery_action = Some(RecoveryAction::DrainP2p),
                Unmet::RecoveryAction(RecoveryAction::DrainP2p),
            ),
        ];
        for (name, edit, unmet) in owed {
            let (mut t, now) = tracker(0);
            let mut evidence = clean();
            edit(&mut evidence);
            assert_eq!(owed_reset(&evidence), Some(unmet.clone()), "{name}");
            assert_eq!(
                t.on_reset_evidence("GPU-a", &evidence, now),
                ResetVerdict::Owed(Transition::BecameUnhealthy {
                    uuid: "GPU-a".into(),
                    reason: format!("{unmet}; waiting for a GPU reset"),
                }),
                "{name}"
            );
            assert_eq!(t.awaiting_reset(), vec!["GPU-a".to_string()], "{name}");
            assert_eq!(t.on_probe("GPU-a", &ProbeOutcome::Healthy, now), None);
            // Still owed next round: no new transition, still waiting.
            assert_eq!(
                t.on_reset_evidence("GPU-a", &evidence, now),
                ResetVerdict::Pending(vec![(ResetCheck::GpuReset, unmet)]),
                "{name}"
            );
            // Cleared: that change is the reset.
            assert_eq!(
                t.on_reset_evidence("GPU-a", &clean(), now),
                ResetVerdict::Shown,
                "{name}"
            );
            assert!(matches!(
                t.on_probe("GPU-a", &ProbeOutcome::Healthy, now),
                Some(Transition::Recovered { .. })
            ));
        }
    }

    #[test]
    fn a_healthy_gpu_stays_healthy_when_its_evidence_owes_nothing() {
        // Whatever else reads badly: an unreachable GPU is the probe's
        // business, NVLink lanes matter only after XID 74.
        type Owes = fn(&mut ResetEvidence);
        let fine: [Owes; 4] = [
            |_| {},
            |e| e.recovery_action = Some(RecoveryAction::None),
            |e| e.reachable = Err(error(DeviceErrorKind::GpuLost)),
            |e| {
                e.nvlink_lanes = Some(NvlinkLanes {
                    active: 6,
                    expected: 12,
                })
            },
        ];
        for edit in fine {
            let (mut t, now) = tracker(0);
            let mut evidence = clean();
            edit(&mut evidence);
            assert_eq!(
                t.on_reset_evidence("GPU-a", &evidence, now),
                ResetVerdict::NotAwaiting
            );
            assert_eq!(t.counts(), (2, 0), "{evidence:?}");
        }
    }

    #[test]
    fn a_gpu_seen_lost_after_the_fault_shows_its_reset_by_reading_clean_again() {
        let (mut t, now) = tracker(0);
        t.on_reset_evidence("GPU-a", &clean(), now);
        t.on_xid(Some("GPU-a"), 79, now);
        // The probe finds it off the bus, then it answers again with nothing
        // pending: only a reset brings a lost GPU back.
        let lost = ProbeOutcome::Unhealthy(error(DeviceErrorKind::GpuLost));
        t.on_probe("GPU-a", &lost, now);
        assert_eq!(
            t.on_reset_evidence("GPU-a", &clean(), now),
            ResetVerdict::Shown
        );
        // Seen unreachable by the evidence itself counts the same way.
        let (mut t, now) = tracker(0);
        t.on_xid(Some("GPU-a"), 79, now);
        let unreachable = ResetEvidence::unreachable(error(DeviceErrorKind::GpuLost));
        assert!(matches!(
            t.on_reset_evidence("GPU-a", &unreachable, now),
            ResetVerdict::Pending(_)
        ));
        assert_eq!(
            t.on_reset_evidence("GPU-a", &clean(), now),
            ResetVerdict::Shown
        );
        // A transient error is not a lost GPU.
        let (mut t, now) = tracker(0);
        t.on_xid(Some("GPU-a"), 79, now);
        let flaky = ResetEvidence::unreachable(error(DeviceErrorKind::Other));
        t.on_reset_evidence("GPU-a", &flaky, now);
        assert_eq!(
            t.on_reset_evidence("GPU-a", &clean(), now),
            ResetVerdict::Pending(vec![(ResetCheck::GpuReset, Unmet::NoChange)])
        );
    }

    #[test]
    fn the_default_reset_xids_are_nvidias_reset_required_ones_and_not_application_xids() {
        let policy = HealthPolicy::default();
        for xid in [48, 62, 63, 64, 79, 94, 95, 119, 120, 140, 154] {
            assert_eq!(
                policy.reset_xids.get(&xid),
                Some(&ResetCheck::GpuReset),
                "{xid}"
            );
        }
        assert_eq!(policy.reset_xids.get(&74), Some(&ResetCheck::NvlinksUp));
        for xid in DEFAULT_IGNORED_XIDS {
            assert!(!policy.reset_xids.contains_key(&xid), "{xid}");
        }
    }

    /// An edit of clean evidence.
    type Edit = fn(&mut ResetEvidence);
    /// A case of the reset-check table: name, check, edit, verdict.
    type CheckCase = (&'static str, ResetCheck, Edit, Result<(), Unmet>);

    fn gpu_reset_cases() -> [CheckCase; 9] {
        [
            ("clean after reset", ResetCheck::GpuReset, |_| {}, Ok(())),
            (
                "GPU still lost",
                ResetCheck::GpuReset,
                |e| e.reachable = Err(error(DeviceErrorKind::GpuLost)),
                Err(Unmet::Unreachable(DeviceErrorKind::GpuLost)),
            ),
            (
                "driver still wants a reset",
                ResetCheck::GpuReset,
                |e| e.recovery_action = Some(RecoveryAction::GpuReset),
                Err(Unmet::RecoveryAction(RecoveryAction::GpuReset)),
            ),
            (
                "row remap pending",
                ResetCheck::GpuReset,
                |e| e.row_remap_pending = Some(true),
                Err(Unmet::RowRemapPending),
            ),
            (
                "row remap failed",
                ResetCheck::GpuReset,
                |e| e.row_remap_failed = Some(true),
                Err(Unmet::RowRemapFailed),
            ),
            (
                "pages pending retirement (pre-Ampere)",
                ResetCheck::GpuReset,
                |e| {
                    e.row_remap_pending = None;
                    e.retired_pages_pending = Some(true);
                },
                Err(Unmet::RetiredPagesPending),
            ),
            (
                "pre-Ampere, nothing pending",
                ResetCheck::GpuReset,
                |e| {
                    e.row_remap_pending = None;
                    e.retired_pages_pending = Some(false);
                },
                Ok(()),
            ),
            (
                "only the driver's recovery action can be read, and it is none",
                ResetCheck::GpuReset,
                |e| {
                    e.row_remap_pending = None;
                    e.recovery_action = Some(RecoveryAction::None);
                },
                Ok(()),
            ),
            (
                "a GPU that answers but supports no query that tells",
                ResetCheck::GpuReset,
                |e| e.row_remap_pending = None,
                Err(Unmet::CannotTell),
            ),
        ]
    }

    fn nvlinks_up_cases() -> [CheckCase; 3] {
        [
            (
                "NVLink lanes still down",
                ResetCheck::NvlinksUp,
                |e| {
                    e.nvlink_lanes = Some(NvlinkLanes {
                        active: 10,
                        expected: 12,
                    })
                },
                Err(Unmet::NvlinksDown {
                    active: 10,
                    expected: 12,
                }),
            ),
            (
                "NVLinks back, an unrelated row remap pending",
                ResetCheck::NvlinksUp,
                |e| e.row_remap_pending = Some(true),
                Ok(()),
            ),
            (
                "NVLink state unreadable",
                ResetCheck::NvlinksUp,
                |e| e.nvlink_lanes = None,
                Err(Unmet::CannotTell),
            ),
        ]
    }

    #[test]
    fn reset_checks_need_evidence_that_can_tell() {
        for (name, check, edit, expected) in gpu_reset_cases().into_iter().chain(nvlinks_up_cases())
        {
            let mut evidence = clean();
            edit(&mut evidence);
            assert_eq!(check.assess(&evidence), expected, "{name}");
        }
    }

    #[test]
    fn pending_evidence_keeps_the_gpu_unhealthy_and_checks_clear_one_by_one() {
        let (mut t, start) = tracker(0);
        t.on_xid(Some("GPU-a"), 48, start);
        t.on_xid(Some("GPU-a"), 74, start);
        let mut evidence = clean();
        evidence.row_remap_pending = Some(true);
        assert_eq!(
            t.on_reset_evidence("GPU-a", &evidence, start),
            ResetVerdict::Pending(vec![(ResetCheck::GpuReset, Unmet::RowRemapPending)])
        );
        assert_eq!(t.awaiting_reset(), vec!["GPU-a".to_string()]);
        assert_eq!(t.on_probe("GPU-a", &ProbeOutcome::Healthy, start), None);
        assert_eq!(
            t.on_reset_evidence("GPU-a", &clean(), start),
            ResetVerdict::Shown
        );
        assert!(t.awaiting_reset().is_empty());
        assert!(matches!(
            t.on_probe("GPU-a", &ProbeOutcome::Healthy, start),
            Some(Transition::Recovered { .. })
        ));
        // A healthy GPU waits for nothing.
        assert_eq!(
            t.on_reset_evidence("GPU-a", &clean(), start),
            ResetVerdict::NotAwaiting
        );
    }

    #[test]
    fn a_lost_gpu_needs_a_reset_and_other_read_errors_only_quiet_and_a_good_probe() {
        let (mut t, now) = tracker(0);
        assert!(matches!(
            t.on_fault("GPU-a", &error(DeviceErrorKind::GpuLost), now),
            Some(Transition::BecameUnhealthy { .. })
        ));
        assert!(matches!(
            t.on_fault("GPU-b", &error(DeviceErrorKind::Other), now),
            Some(Transition::BecameUnhealthy { .. })
        ));
        assert_eq!(t.counts(), (0, 2));
        assert_eq!(t.awaiting_reset(), vec!["GPU-a".to_string()]);
        // The GPU reads again: the lost one still owes its reset.
        assert_eq!(t.on_probe("GPU-a", &ProbeOutcome::Healthy, now), None);
        assert!(matches!(
            t.on_probe("GPU-b", &ProbeOutcome::Healthy, now),
            Some(Transition::Recovered { .. })
        ));
        // A probe that finds the GPU lost also owes a reset.
        let (mut t, now) = tracker(0);
        let lost = ProbeOutcome::Unhealthy(error(DeviceErrorKind::ResetRequired));
        t.on_probe("GPU-b", &lost, now);
        assert_eq!(t.on_probe("GPU-b", &ProbeOutcome::Healthy, now), None);
    }

    #[test]
    fn ignored_xids_win_over_reset_xids_and_rename_keeps_the_owed_reset() {
        let mut t = HealthTracker::new(HealthPolicy {
            ignored_xids: BTreeSet::from([94]),
            recovery_quiet_period: Duration::ZERO,
            ..HealthPolicy::default()
        });
        t.sync(["unreadable-gpu-3"]);
        let now = Instant::now();
        assert_eq!(
            t.on_xid(Some("unreadable-gpu-3"), 94, now),
            XidVerdict::Ignored
        );
        t.on_fault("unreadable-gpu-3", &error(DeviceErrorKind::GpuLost), now);
        t.rename("unreadable-gpu-3", "GPU-d");
        t.sync(["GPU-d"]);
        assert_eq!(t.awaiting_reset(), vec!["GPU-d".to_string()]);
        assert_eq!(t.on_probe("GPU-d", &ProbeOutcome::Healthy, now), None);
        // It was seen lost under its stand-in ID: answering clean under its
        // UUID is a change.
        assert_eq!(
            t.on_reset_evidence("GPU-d", &clean(), now),
            ResetVerdict::Shown
        );
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
            t.on_probe(
                "GPU-b",
                &ProbeOutcome::Unhealthy(error(DeviceErrorKind::NotFound)),
                now
            ),
            Some(Transition::BecameUnhealthy { .. })
        ));
        // A repeated failure is not a new transition.
        assert_eq!(
            t.on_probe(
                "GPU-b",
                &ProbeOutcome::Unhealthy(error(DeviceErrorKind::NotFound)),
                now
            ),
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
