//! What `/healthz` (the DaemonSet's liveness probe) answers.
//!
//! A restart is the right cure for two states that the plugin cannot leave
//! by itself: staying unregistered with the kubelet (every Allocate on the
//! node fails, the node's capacity reads 0) and a probe loop stuck in an
//! NVML call that never returns (health no longer follows the GPUs). Both
//! are judged from timestamps that the kubelet loop and the monitor record,
//! so the HTTP handler never waits on the kubelet or on NVML itself.
//!
//! The bounds are chosen so that a healthy plugin is not restarted by a
//! kubelet restart: the kubelet does not run probes while it is down, and
//! once it is up again the plugin registers within a second or two, well
//! inside the default grace of two minutes.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// When `/healthz` fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LivenessLimits {
    /// Longest time without a kubelet registration, since start or since
    /// the registration was lost (`--unregistered-grace`).
    pub unregistered_grace: Duration,
    /// Longest time without a completed GPU probe round (`--probe-stall-limit`).
    pub probe_stall_limit: Duration,
}

impl Default for LivenessLimits {
    fn default() -> Self {
        Self {
            unregistered_grace: Duration::from_secs(120),
            probe_stall_limit: Duration::from_secs(60),
        }
    }
}

/// What the loops last recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Observed {
    /// Registered with the kubelet right now.
    pub registered: bool,
    /// Start, or when the last registration was lost.
    pub unregistered_since: Instant,
    /// When the last GPU probe round completed (start counts as one).
    pub last_probe_round: Instant,
}

/// Why the plugin is not live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Problem {
    /// Not registered with the kubelet for this long.
    Unregistered(Duration),
    /// No probe round completed for this long.
    ProbeStalled(Duration),
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Problem::Unregistered(d) => {
                write!(f, "not registered with the kubelet for {}s", d.as_secs())
            }
            Problem::ProbeStalled(d) => write!(
                f,
                "no GPU probe round completed for {}s (an NVML call hangs?)",
                d.as_secs()
            ),
        }
    }
}

/// The problems of `observed` at `now`; empty when live.
pub(crate) fn problems(observed: &Observed, now: Instant, limits: &LivenessLimits) -> Vec<Problem> {
    let mut found = Vec::new();
    if !observed.registered {
        let unregistered = now.saturating_duration_since(observed.unregistered_since);
        if unregistered > limits.unregistered_grace {
            found.push(Problem::Unregistered(unregistered));
        }
    }
    let since_round = now.saturating_duration_since(observed.last_probe_round);
    if since_round > limits.probe_stall_limit {
        found.push(Problem::ProbeStalled(since_round));
    }
    found
}

/// The recorded state and the limits it is judged by.
#[derive(Debug)]
pub(crate) struct Liveness {
    limits: LivenessLimits,
    observed: Mutex<Observed>,
}

impl Liveness {
    /// Unregistered, and a probe round just completed, as of `now`.
    pub(crate) fn new(limits: LivenessLimits, now: Instant) -> Self {
        Self {
            limits,
            observed: Mutex::new(Observed {
                registered: false,
                unregistered_since: now,
                last_probe_round: now,
            }),
        }
    }

    fn update(&self, f: impl FnOnce(&mut Observed)) {
        f(&mut self.observed.lock().unwrap_or_else(PoisonError::into_inner));
    }

    /// The current snapshot.
    pub(crate) fn observed(&self) -> Observed {
        *self.observed.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records a registration, or its loss (the grace starts then).
    pub(crate) fn set_registered(&self, registered: bool) {
        let now = Instant::now();
        self.update(|o| {
            if o.registered && !registered {
                o.unregistered_since = now;
            }
            o.registered = registered;
        });
    }

    /// Records a completed probe round.
    pub(crate) fn probe_round_done(&self) {
        let now = Instant::now();
        self.update(|o| o.last_probe_round = now);
    }

    /// The problems right now; empty when live.
    pub(crate) fn check(&self) -> Vec<Problem> {
        problems(&self.observed(), Instant::now(), &self.limits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn limits() -> LivenessLimits {
        LivenessLimits {
            unregistered_grace: 120 * S,
            probe_stall_limit: 60 * S,
        }
    }

    #[test]
    fn liveness_table() {
        let t0 = Instant::now();
        let at = |secs: u32| t0 + S * secs;
        let observed = |registered, unregistered_at: u32, round_at: u32| Observed {
            registered,
            unregistered_since: at(unregistered_at),
            last_probe_round: at(round_at),
        };
        // (case, observed, now, expected)
        let cases = [
            ("fresh start", observed(false, 0, 0), 0, vec![]),
            ("registered long ago", observed(true, 0, 995), 1000, vec![]),
            (
                "unregistered within the grace",
                observed(false, 900, 995),
                1000,
                vec![],
            ),
            (
                "unregistered exactly the grace",
                observed(false, 880, 995),
                1000,
                vec![],
            ),
            (
                "unregistered past the grace",
                observed(false, 879, 995),
                1000,
                vec![Problem::Unregistered(121 * S)],
            ),
            (
                "probe round within the limit",
                observed(true, 0, 940),
                1000,
                vec![],
            ),
            (
                "probe loop stalled",
                observed(true, 0, 939),
                1000,
                vec![Problem::ProbeStalled(61 * S)],
            ),
            (
                "both",
                observed(false, 0, 0),
                1000,
                vec![
                    Problem::Unregistered(1000 * S),
                    Problem::ProbeStalled(1000 * S),
                ],
            ),
        ];
        for (case, observed, now, expected) in cases {
            assert_eq!(problems(&observed, at(now), &limits()), expected, "{case}");
        }
    }

    #[test]
    fn the_grace_restarts_when_a_registration_is_lost_not_when_it_stays_lost() {
        let liveness = Liveness::new(limits(), Instant::now());
        let started = liveness.observed().unregistered_since;
        liveness.set_registered(false);
        assert_eq!(liveness.observed().unregistered_since, started);
        liveness.set_registered(true);
        std::thread::sleep(Duration::from_millis(5));
        liveness.set_registered(false);
        let lost = liveness.observed();
        assert!(!lost.registered);
        assert!(lost.unregistered_since > started);
        liveness.set_registered(false);
        assert_eq!(
            liveness.observed().unregistered_since,
            lost.unregistered_since
        );
    }

    #[test]
    fn problems_name_what_is_wrong() {
        assert_eq!(
            Problem::Unregistered(130 * S).to_string(),
            "not registered with the kubelet for 130s"
        );
        assert!(
            Problem::ProbeStalled(61 * S)
                .to_string()
                .contains("probe round")
        );
    }
}
