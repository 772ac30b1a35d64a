//! A lost peer is a preemption, not a failure: a pure judgement of the ranks that are still
//! running when one rank of the same attempt has failed.
//!
//! When a spot node vanishes, the ranks on other nodes see their collective break within
//! seconds (the peer's sockets close) and their trainers exit non-zero, usually before the
//! control plane marks the lost node NotReady (40 s by default). Judged alone, such a rank
//! looks like a real failure: it would spend `maxFailures` and back off. The rule:
//!
//! A round in which some ranks failed and none is yet seen preempted looks at the *silent
//! peers*: ranks of the same attempt whose pods still appear to run on a node.
//! 1. If a silent peer's node is lost (the Node is gone, NotReady, tainted
//!    `node.kubernetes.io/unreachable` or with a termination taint of the config, its
//!    kubelet went silent (`heartbeat`: a renewal missed that the others made), or its
//!    kubelet's Lease has missed two renewals since the failure while other kubelets renewed
//!    theirs), the round is a **preemption** caused by that node.
//! 2. If every silent peer's node has renewed its Lease after the failure or reported a
//!    failed rank itself (its kubelet is alive, so its rank was not taken away), or there is
//!    no silent peer, it is a **failure**.
//! 3. Otherwise the verdict is **held** (no restart, no budget spent) until one of the two
//!    becomes true, for at most `lostPeerWindowSeconds` after the failure; then a failure.
//!
//! The failure's time is the failed trainer's `finishedAt`, so the window does not move
//! while it is held. A kubelet renews its Lease every quarter of the Lease's duration (10 s
//! of 40 s by default), so a live node is told apart within about 10 s and a lost one within
//! about half the duration; without Leases (no RBAC for them) the window decides.
//!
//! A missed renewal is read on the clock of the Leases themselves ([`lease_clock`]: the
//! freshest renewal among every node's Lease), not on the operator's: a Lease watch that
//! lags, or an operator clock that runs ahead, makes every node look equally stale, and a
//! node is lost only when the others renewed and it did not. A renewal stamped later than the
//! operator's clock (a node clock that runs ahead) counts as made now.

use crate::cached_pod::CachedPod;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::coordination::v1::Lease;

use crate::nodes::{self, Readiness};
use crate::preemption::NodeView;
use crate::trainer::trainer_container;

/// The taint the node lifecycle controller puts on a node it cannot reach.
pub const UNREACHABLE_TAINT: &str = "node.kubernetes.io/unreachable";

/// A renewal counts as "after the failure" only this long after it: clocks of two nodes.
const CLOCK_SLACK: SignedDuration = SignedDuration::from_secs(2);

/// How often a held verdict looks again: Lease renewals do not wake a job by themselves.
const HOLD_RECHECK: SignedDuration = SignedDuration::from_secs(2);

/// What a node's kubelet last said through its Lease in `kube-node-lease`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heartbeat {
    /// `spec.renewTime`.
    pub renewed: Timestamp,
    /// `spec.leaseDurationSeconds`: the kubelet renews every quarter of it.
    pub duration: SignedDuration,
}

/// The heartbeat of the node `node` among the node Leases (named after their nodes).
pub fn heartbeat<'a>(leases: impl IntoIterator<Item = &'a Lease>, node: &str) -> Option<Heartbeat> {
    let lease = leases
        .into_iter()
        .find(|l| l.metadata.name.as_deref() == Some(node))?;
    let spec = lease.spec.as_ref()?;
    Some(Heartbeat {
        renewed: spec.renew_time.as_ref()?.0,
        duration: SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(40))),
    })
}

/// The time Lease staleness is read on: the freshest renewal among `leases` (every node's
/// Lease the operator sees), never later than `now`. None without a Lease.
pub fn lease_clock<'a>(
    leases: impl IntoIterator<Item = &'a Lease>,
    now: Timestamp,
) -> Option<Timestamp> {
    leases
        .into_iter()
        .filter_map(|l| Some(l.spec.as_ref()?.renew_time.as_ref()?.0))
        .max()
        .map(|freshest| freshest.min(now))
}

/// A rank whose pod still appears to run, with its node and that node's heartbeat.
#[derive(Clone, Copy, Debug)]
pub struct SilentPeer<'a> {
    /// The peer's rank.
    pub rank: u32,
    /// Its node as the cache sees it.
    pub node: NodeView<'a>,
    /// Its node's Lease, when the operator sees one.
    pub heartbeat: Option<Heartbeat>,
    /// A failed rank ran on the same node: its kubelet reported that failure, so the node
    /// was alive after it.
    pub beside_failure: bool,
    /// How long its node's kubelet has been silent, when it is (`heartbeat::silent_nodes`:
    /// one renewal missed that the other nodes made, on a live Lease watch).
    pub silent: Option<SignedDuration>,
}

/// The judgement of one round with failed ranks and no preempted one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// A peer's node is lost: the failures are part of its preemption. The detail names it.
    Preemption(String),
    /// Not known yet: decide nothing and look again at this time.
    Hold(Timestamp),
    /// A failure of the job's own.
    Failure,
}

/// What the judgement reads besides the peers.
#[derive(Clone, Copy, Debug)]
pub struct Judging<'a> {
    /// The earliest failure of the round ([`failed_at`]).
    pub failed_at: Timestamp,
    /// Taints that announce a node's termination (the provider table of the config).
    pub termination_taints: &'a [String],
    /// `lostPeerWindowSeconds`: how long a verdict may be held.
    pub window: SignedDuration,
    /// The clock of the node Leases ([`lease_clock`]).
    pub lease_clock: Option<Timestamp>,
    /// The operator's clock.
    pub now: Timestamp,
}

/// The rule above.
pub fn judge(peers: &[SilentPeer<'_>], judging: &Judging<'_>) -> Verdict {
    let Judging {
        failed_at,
        window,
        now,
        ..
    } = *judging;
    let window_end = failed_at.saturating_add(window).unwrap_or(failed_at);
    let mut recheck = None;
    let mut all_alive = true;
    for peer in peers {
        match node_state(peer, judging) {
            NodeState::Lost(why) => {
                return Verdict::Preemption(format!(
                    "worker {} lost with its node: {why}",
                    peer.rank
                ));
            }
            NodeState::Alive => {}
            NodeState::Unknown(at) => {
                all_alive = false;
                recheck = crate::preemption::min_time(recheck, at);
            }
        }
    }
    if all_alive || now >= window_end {
        return Verdict::Failure;
    }
    let poll = now.saturating_add(HOLD_RECHECK).unwrap_or(now);
    let at = [recheck, Some(poll), Some(window_end)]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(window_end);
    Verdict::Hold(at)
}

enum NodeState {
    Lost(String),
    Alive,
    /// Unknown; it may become Lost at this time (when the Lease would be stale).
    Unknown(Option<Timestamp>),
}

fn node_state(peer: &SilentPeer<'_>, judging: &Judging<'_>) -> NodeState {
    let Judging {
        failed_at,
        termination_taints,
        now,
        ..
    } = *judging;
    let node = match peer.node {
        // Never placed: it was not part of a collective that a node loss broke.
        NodeView::Unscheduled => return NodeState::Alive,
        NodeView::Missing(name) => return NodeState::Lost(format!("node {name} is gone")),
        NodeView::Present(node) => node,
    };
    let name = nodes::name(node);
    if let Readiness::NotReady { .. } = nodes::readiness(node) {
        return NodeState::Lost(format!("node {name} is NotReady"));
    }
    let taints = [UNREACHABLE_TAINT.to_owned()];
    if let Some(t) = nodes::termination_taint(node, &taints)
        .or_else(|| nodes::termination_taint(node, termination_taints))
    {
        return NodeState::Lost(format!("node {name} has taint {t}"));
    }
    if peer.beside_failure {
        return NodeState::Alive;
    }
    if let Some(since) = peer.silent {
        return NodeState::Lost(format!(
            "node {name}'s Lease not renewed for {}s while other nodes renewed theirs",
            since.as_secs()
        ));
    }
    let Some(hb) = peer.heartbeat else {
        return NodeState::Unknown(None);
    };
    let renewed = hb.renewed.min(now);
    if renewed >= failed_at.saturating_add(CLOCK_SLACK).unwrap_or(failed_at) {
        return NodeState::Alive;
    }
    // Two missed renewals (the kubelet renews every quarter of the duration), read on the
    // Leases' own clock: the others renewed since.
    let clock = judging.lease_clock.unwrap_or(renewed).max(renewed);
    let stale_at = renewed.saturating_add(hb.duration / 2).unwrap_or(renewed);
    if clock >= stale_at {
        return NodeState::Lost(format!(
            "node {name}'s Lease not renewed for {}s while other nodes renewed theirs",
            clock.duration_since(renewed).as_secs()
        ));
    }
    // Stale once the Leases' clock reaches `stale_at`: as soon as now moves as far, if the
    // others keep renewing.
    let wait = stale_at.duration_since(clock);
    NodeState::Unknown(Some(now.saturating_add(wait).unwrap_or(now)))
}

/// When a failed worker failed: its trainer's `finishedAt`, else the pod's Ready condition's
/// last transition, else when it started. A stable time, so a held verdict cannot slide.
pub fn failed_at(pod: &CachedPod, now: Timestamp) -> Timestamp {
    let status = pod.status.as_ref();
    let finished = trainer_container(pod).and_then(|name| {
        status
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.name == name))
            .and_then(|c| c.state.as_ref()?.terminated.as_ref()?.finished_at.as_ref())
            .map(|t| t.0)
    });
    let not_ready = || {
        status
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready" && c.status != "True"))
            .and_then(|c| c.last_transition_time.as_ref())
            .map(|t| t.0)
    };
    let started = || {
        status
            .and_then(|s| s.start_time.as_ref())
            .or(pod.metadata.creation_timestamp.as_ref())
            .map(|t| t.0)
    };
    finished.or_else(not_ready).or_else(started).unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{node, pod_json, ts};
    use k8s_openapi::api::core::v1::Node;
    use trainyard_api::spot::KARPENTER_DISRUPTED;

    const FAILED: &str = "2026-01-01T00:00:00Z";

    fn hb(renewed: &str) -> Option<Heartbeat> {
        Some(Heartbeat {
            renewed: ts(renewed),
            duration: SignedDuration::from_secs(40),
        })
    }

    const TAINTS: &[String] = &[];

    /// How the rule is judged at `now`, the other nodes' Leases renewed at `leases` (None: no
    /// Lease seen).
    fn judging(now: &str, leases: Option<&str>) -> Judging<'static> {
        Judging {
            failed_at: ts(FAILED),
            termination_taints: TAINTS,
            window: SignedDuration::from_secs(60),
            lease_clock: leases.map(ts),
            now: ts(now),
        }
    }

    /// One silent peer, judged at `now` while the other kubelets renew their Leases on time.
    fn judge_one(node: NodeView<'_>, heartbeat: Option<Heartbeat>, now: &str) -> Verdict {
        let peers = [SilentPeer {
            rank: 1,
            node,
            heartbeat,
            beside_failure: false,
            silent: None,
        }];
        let taints = [KARPENTER_DISRUPTED.to_owned()];
        let judging = Judging {
            termination_taints: &taints,
            ..judging(now, Some(now))
        };
        judge(&peers, &judging)
    }

    fn ready(name: &str) -> Node {
        node(name).build()
    }

    /// (case, peer's node, its Lease, now, expected verdict).
    type Case<'a> = (
        &'static str,
        NodeView<'a>,
        Option<Heartbeat>,
        &'static str,
        &'a dyn Fn(&Verdict) -> bool,
    );

    /// The rule as a table: (case, peer's node, its Lease, now) -> verdict.
    #[expect(clippy::too_many_lines, reason = "a table of cases, a few lines each")]
    #[test]
    fn a_failure_beside_a_lost_node_is_a_preemption_and_beside_a_live_one_a_failure() {
        let up = ready("n2");
        let not_ready = node("n2").not_ready_since("2026-01-01T00:00:05Z").build();
        let unreachable = node("n2").taint(UNREACHABLE_TAINT).build();
        let disrupted = node("n2").taint(KARPENTER_DISRUPTED).build();
        let lost = |v: &Verdict| matches!(v, Verdict::Preemption(_));
        let cases: Vec<Case<'_>> = vec![
            (
                "node object gone",
                NodeView::Missing("n2"),
                None,
                "2026-01-01T00:00:01Z",
                &lost,
            ),
            (
                "node NotReady",
                NodeView::Present(&not_ready),
                None,
                "2026-01-01T00:00:06Z",
                &lost,
            ),
            (
                "unreachable taint",
                NodeView::Present(&unreachable),
                None,
                "2026-01-01T00:00:01Z",
                &lost,
            ),
            (
                "termination taint",
                NodeView::Present(&disrupted),
                None,
                "2026-01-01T00:00:01Z",
                &lost,
            ),
            (
                "Lease missed two renewals",
                NodeView::Present(&up),
                hb("2025-12-31T23:59:55Z"),
                "2026-01-01T00:00:15Z",
                &lost,
            ),
            (
                "Lease renewed after the failure: alive",
                NodeView::Present(&up),
                hb("2026-01-01T00:00:08Z"),
                "2026-01-01T00:00:09Z",
                &|v| *v == Verdict::Failure,
            ),
            (
                "Lease renewed within the clock slack: not proof",
                NodeView::Present(&up),
                hb("2026-01-01T00:00:01Z"),
                "2026-01-01T00:00:02Z",
                &|v| matches!(v, Verdict::Hold(_)),
            ),
            (
                "Lease fresh, not renewed since: hold until it would be stale",
                NodeView::Present(&up),
                hb("2025-12-31T23:59:58Z"),
                "2026-01-01T00:00:01Z",
                &|v| *v == Verdict::Hold(ts("2026-01-01T00:00:03Z")),
            ),
            (
                "no Lease: hold, polling",
                NodeView::Present(&up),
                None,
                "2026-01-01T00:00:30Z",
                &|v| *v == Verdict::Hold(ts("2026-01-01T00:00:32Z")),
            ),
            (
                "no Lease, window over: failure",
                NodeView::Present(&up),
                None,
                "2026-01-01T00:01:00Z",
                &|v| *v == Verdict::Failure,
            ),
            (
                "a peer never scheduled was in no collective",
                NodeView::Unscheduled,
                None,
                "2026-01-01T00:00:01Z",
                &|v| *v == Verdict::Failure,
            ),
        ];
        for (case, view, heartbeat, now, expect) in cases {
            let v = judge_one(view, heartbeat, now);
            assert!(expect(&v), "{case}: {v:?}");
        }
    }

    #[test]
    fn the_preemption_names_the_lost_rank_and_why() {
        let not_ready = node("spot-1")
            .not_ready_since("2026-01-01T00:00:05Z")
            .build();
        let v = judge_one(NodeView::Present(&not_ready), None, "2026-01-01T00:00:06Z");
        assert_eq!(
            v,
            Verdict::Preemption("worker 1 lost with its node: node spot-1 is NotReady".into())
        );
    }

    #[test]
    fn no_silent_peer_means_the_whole_gang_failed_on_its_own() {
        let v = judge(&[], &judging("2026-01-01T00:00:01Z", None));
        assert_eq!(v, Verdict::Failure);
    }

    /// A peer whose kubelet went silent is lost at once, before its Lease is two renewals
    /// late on the Leases' clock.
    #[test]
    fn a_peer_on_a_silent_node_is_lost() {
        let n2 = ready("n2");
        let peer = |silent| SilentPeer {
            rank: 1,
            node: NodeView::Present(&n2),
            heartbeat: hb("2025-12-31T23:59:59Z"),
            beside_failure: false,
            silent,
        };
        let at = judging("2026-01-01T00:00:12Z", Some("2026-01-01T00:00:10Z"));
        assert!(matches!(judge(&[peer(None)], &at), Verdict::Hold(_)));
        let v = judge(&[peer(Some(SignedDuration::from_secs(13)))], &at);
        assert!(
            matches!(v, Verdict::Preemption(ref d) if d.contains("not renewed for 13s")),
            "{v:?}"
        );
    }

    #[test]
    fn one_lost_peer_among_live_ones_decides() {
        let up = ready("n1");
        let gone = NodeView::Missing("n3");
        let peers = [
            SilentPeer {
                rank: 1,
                node: NodeView::Present(&up),
                heartbeat: hb("2026-01-01T00:00:05Z"),
                beside_failure: false,
                silent: None,
            },
            SilentPeer {
                rank: 2,
                node: gone,
                heartbeat: None,
                beside_failure: false,
                silent: None,
            },
        ];
        let v = judge(
            &peers,
            &judging("2026-01-01T00:00:06Z", Some("2026-01-01T00:00:05Z")),
        );
        assert!(
            matches!(v, Verdict::Preemption(ref d) if d.contains("worker 2")),
            "{v:?}"
        );
    }

    /// Two silent peers on live nodes whose Leases were renewed at `a` and `b`, judged at `now`
    /// with the freshest renewal the operator sees at `freshest`.
    fn judge_two(a: &str, b: &str, freshest: &str, now: &str) -> Verdict {
        let (n2, n3) = (ready("n2"), ready("n3"));
        let peers = [
            SilentPeer {
                rank: 1,
                node: NodeView::Present(&n2),
                heartbeat: hb(a),
                beside_failure: false,
                silent: None,
            },
            SilentPeer {
                rank: 2,
                node: NodeView::Present(&n3),
                heartbeat: hb(b),
                beside_failure: false,
                silent: None,
            },
        ];
        let clock = lease_clock_of(&[a, b, freshest], now);
        judge(&peers, &judging(now, clock.as_deref()))
    }

    /// [`lease_clock`] over Leases renewed at `renewals`, as RFC 3339.
    fn lease_clock_of(renewals: &[&str], now: &str) -> Option<String> {
        let leases: Vec<Lease> = renewals
            .iter()
            .enumerate()
            .map(|(i, at)| {
                serde_json::from_value(serde_json::json!({
                    "metadata": {"name": format!("node-{i}"), "namespace": "kube-node-lease"},
                    "spec": {"leaseDurationSeconds": 40, "renewTime": at},
                }))
                .expect("lease")
            })
            .collect();
        lease_clock(&leases, ts(now)).map(|t| t.to_string())
    }

    #[test]
    fn every_lease_equally_stale_is_a_lagging_watch_and_the_failure_stays_a_failure() {
        // The operator sees no renewal for 30 s on any node: its Lease watch lags (or its
        // clock runs ahead), not every node lost at once.
        let renewed = "2025-12-31T23:59:58Z";
        let held = judge_two(renewed, renewed, renewed, "2026-01-01T00:00:30Z");
        assert!(matches!(held, Verdict::Hold(_)), "{held:?}");
        let after_window = judge_two(renewed, renewed, renewed, "2026-01-01T00:01:00Z");
        assert_eq!(after_window, Verdict::Failure);
    }

    #[test]
    fn one_lease_stale_among_fresh_ones_is_still_a_lost_node() {
        let v = judge_two(
            "2025-12-31T23:59:58Z",
            "2026-01-01T00:00:01Z",
            "2026-01-01T00:00:19Z",
            "2026-01-01T00:00:30Z",
        );
        assert!(
            matches!(v, Verdict::Preemption(ref d) if d.contains("worker 1") && d.contains("n2's Lease not renewed for 21s")),
            "{v:?}"
        );
    }

    #[test]
    fn a_renewal_stamped_in_the_future_counts_as_made_now() {
        // A node clock 10 min ahead: its renewal does not make the others look stale.
        assert_eq!(
            lease_clock_of(
                &["2026-01-01T00:10:00Z", "2026-01-01T00:00:28Z"],
                "2026-01-01T00:00:30Z"
            )
            .as_deref(),
            Some("2026-01-01T00:00:30Z")
        );
        // Judged on it, two peers that have not renewed since the failure would look 10 min
        // stale 5 s after it.
        let v = judge_two(
            "2026-01-01T00:00:01Z",
            "2026-01-01T00:00:01Z",
            "2026-01-01T00:10:00Z",
            "2026-01-01T00:00:05Z",
        );
        assert!(matches!(v, Verdict::Hold(_)), "{v:?}");
    }

    #[test]
    fn the_failure_time_is_the_trainers_finish_and_does_not_slide() {
        let pod = pod_json(
            "w-0",
            &serde_json::json!({
                "phase": "Failed",
                "startTime": "2025-12-31T23:00:00Z",
                "conditions": [{"type": "Ready", "status": "False",
                                "lastTransitionTime": "2026-01-01T00:00:03Z"}],
                "containerStatuses": [{"name": "trainer", "ready": false, "restartCount": 0,
                    "image": "i", "imageID": "", "state": {"terminated": {
                        "exitCode": 1, "finishedAt": "2026-01-01T00:00:02Z"}}}],
            }),
        );
        let now = ts("2026-01-01T00:05:00Z");
        assert_eq!(failed_at(&pod, now), ts("2026-01-01T00:00:02Z"));
        let bare = pod_json(
            "w-0",
            &serde_json::json!({"startTime": "2025-12-31T23:00:00Z"}),
        );
        assert_eq!(failed_at(&bare, now), ts("2025-12-31T23:00:00Z"));
    }

    #[test]
    fn heartbeat_reads_the_nodes_lease() {
        let lease: Lease = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n2", "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": "n2", "leaseDurationSeconds": 40,
                     "renewTime": "2026-01-01T00:00:00.000000Z"},
        }))
        .expect("lease");
        assert_eq!(
            heartbeat([&lease], "n2"),
            Some(Heartbeat {
                renewed: ts(FAILED),
                duration: SignedDuration::from_secs(40)
            })
        );
        assert_eq!(heartbeat([&lease], "n1"), None);
    }
}
