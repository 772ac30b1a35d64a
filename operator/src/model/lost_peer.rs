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
//!    `node.kubernetes.io/unreachable` or with a termination taint of the config, or its
//!    kubelet is silent by the [`crate::model::liveness`] rule and the peer's trainer reports
//!    progress), the round is a **preemption** caused by that node. Without reports a late
//!    Lease proves nothing (a kubelet paused for a while): the Node object decides, after
//!    Kubernetes' own grace.
//! 2. If every silent peer's trainer reported progress after the failure (by more than the
//!    liveness margin), or its node was seen renewing its Lease after the failure (by more
//!    than the margin) or reported a failed rank itself (its kubelet is alive, so its rank was
//!    not taken away), or there is no silent peer, it is a **failure**. A renewal that ends
//!    an absence spanning the failure ([`SinceFailure::Returned`]: the node was lost or
//!    rebooted and came back) proves nothing about the ranks that ran there: their pods tell
//!    (a container lost with its node makes the round a preemption) or their reports do.
//! 3. Otherwise the verdict is **held** (no restart, no budget spent) until one of the two
//!    becomes true, for at most `lostPeerWindowSeconds` after the failure; then a failure.
//!
//! The failure's time is the failed trainer's `finishedAt`, stamped by its node's kubelet and
//! put on the operator's clock through that node's Lease ([`crate::model::liveness`]), so the window
//! does not move while it is held and no clock skew decides it. A Lease that is late but
//! within the measured margin proves nothing either way: the verdict waits for the renewal
//! (a failure) or for the silence (a preemption).

use crate::model::cached_pod::CachedPod;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Node;

use crate::model::liveness::SinceFailure;
use crate::model::nodes::{self, Readiness};
use crate::model::preemption::NodeView;
use crate::model::trainer::trainer_container;

/// The taint the node lifecycle controller puts on a node it cannot reach.
pub const UNREACHABLE_TAINT: &str = "node.kubernetes.io/unreachable";

/// How often a held verdict looks again: Lease renewals do not wake a job by themselves.
const HOLD_RECHECK: SignedDuration = SignedDuration::from_secs(2);

/// A rank whose pod still appears to run, with its node and that node's heartbeat.
#[derive(Clone, Copy, Debug)]
pub struct SilentPeer<'a> {
    /// The peer's rank.
    pub rank: u32,
    /// Its node as the cache sees it.
    pub node: NodeView<'a>,
    /// What its node's Lease says since the failure ([`crate::model::liveness::Liveness::since_failure`]).
    pub lease: SinceFailure,
    /// A failed rank ran on the same node: its kubelet reported that failure, so the node
    /// was alive after it.
    pub beside_failure: bool,
    /// The peer's trainer reported progress after the failure (by more than the liveness
    /// margin): it was alive after it, whatever its kubelet's Lease says.
    pub heard_after: bool,
    /// The peer's trainer reports progress (it did in this attempt): only then does a late
    /// Lease, before Kubernetes' own grace marks the node, say its node is lost.
    pub reports: bool,
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
    /// The earliest failure of the round ([`failed_at`]), on the operator's clock.
    pub failed_at: Timestamp,
    /// Taints that announce a node's termination (the provider table of the config).
    pub termination_taints: &'a [String],
    /// `lostPeerWindowSeconds`: how long a verdict may be held.
    pub window: SignedDuration,
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
                recheck = crate::model::preemption::min_time(recheck, at);
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
    let node = match peer.node {
        // Never placed: it was not part of a collective that a node loss broke.
        NodeView::Unscheduled => return NodeState::Alive,
        NodeView::Missing(name) => return NodeState::Lost(format!("node {name} is gone")),
        NodeView::Present(node) => node,
    };
    if let Some(why) = node_down(node, judging.termination_taints) {
        return NodeState::Lost(why);
    }
    let name = nodes::name(node);
    if peer.beside_failure || peer.heard_after {
        return NodeState::Alive;
    }
    match peer.lease {
        SinceFailure::Silent(since) if peer.reports => NodeState::Lost(format!(
            "node {name}'s Lease not renewed for {}s while other nodes renewed theirs",
            since.as_secs()
        )),
        // A trainer that never reports cannot back a late Lease up: a kubelet paused for a
        // while is not a lost node. The Node object (NotReady, unreachable) decides.
        SinceFailure::Silent(_) => NodeState::Unknown(None),
        SinceFailure::Renewed => NodeState::Alive,
        SinceFailure::Waiting(at) => NodeState::Unknown(Some(at)),
        // Back from an absence that spanned the failure: the peer's pod will say what became
        // of its rank (a container lost with the node is a preemption), or its report will.
        SinceFailure::Returned(_) | SinceFailure::NoLease => NodeState::Unknown(None),
    }
}

/// Why the Node object itself says `node` is lost, if it does: NotReady, tainted
/// [`UNREACHABLE_TAINT`], or under one of `termination_taints` (the provider table).
pub fn node_down(node: &Node, termination_taints: &[String]) -> Option<String> {
    let name = nodes::name(node);
    if let Readiness::NotReady { .. } = nodes::readiness(node) {
        return Some(format!("node {name} is NotReady"));
    }
    let taints = [UNREACHABLE_TAINT.to_owned()];
    nodes::termination_taint(node, &taints)
        .or_else(|| nodes::termination_taint(node, termination_taints))
        .map(|t| format!("node {name} has taint {t}"))
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

    fn judging(now: &str) -> Judging<'static> {
        const TAINTS: &[String] = &[];
        Judging {
            failed_at: ts(FAILED),
            termination_taints: TAINTS,
            window: SignedDuration::from_secs(60),
            now: ts(now),
        }
    }

    fn peer(rank: u32, node: NodeView<'_>, lease: SinceFailure) -> SilentPeer<'_> {
        SilentPeer {
            rank,
            node,
            lease,
            beside_failure: false,
            heard_after: false,
            reports: true,
        }
    }

    /// A peer whose trainer never reported: its node's late Lease is no loss; its Node object
    /// is, once Kubernetes marks it; else the window ends in a failure.
    #[test]
    fn a_late_lease_under_a_trainer_that_never_reported_is_no_loss() {
        let up = ready("n2");
        let not_ready = node("n2").not_ready_since("2026-01-01T00:00:05Z").build();
        let silent = SinceFailure::Silent(SignedDuration::from_secs(14));
        let quiet = |node| SilentPeer {
            reports: false,
            ..peer(1, node, silent)
        };
        let at = |now: &str| Judging {
            termination_taints: &[],
            ..judging(now)
        };
        let held = judge(
            &[quiet(NodeView::Present(&up))],
            &at("2026-01-01T00:00:15Z"),
        );
        assert!(matches!(held, Verdict::Hold(_)), "{held:?}");
        let over = judge(
            &[quiet(NodeView::Present(&up))],
            &at("2026-01-01T00:01:00Z"),
        );
        assert_eq!(over, Verdict::Failure);
        let marked = judge(
            &[quiet(NodeView::Present(&not_ready))],
            &at("2026-01-01T00:00:45Z"),
        );
        assert!(matches!(marked, Verdict::Preemption(_)), "{marked:?}");
    }

    /// One silent peer, judged at `now`.
    fn judge_one(node: NodeView<'_>, lease: SinceFailure, now: &str) -> Verdict {
        let taints = [KARPENTER_DISRUPTED.to_owned()];
        let judging = Judging {
            termination_taints: &taints,
            ..judging(now)
        };
        judge(&[peer(1, node, lease)], &judging)
    }

    fn ready(name: &str) -> Node {
        node(name).build()
    }

    /// (case, peer's node, its Lease since the failure, now, expected verdict).
    type Case<'a> = (
        &'static str,
        NodeView<'a>,
        SinceFailure,
        &'static str,
        &'a dyn Fn(&Verdict) -> bool,
    );

    /// The rule as a table: (case, peer's node, its Lease since the failure, now) -> verdict.
    #[expect(clippy::too_many_lines, reason = "a table of cases, a few lines each")]
    #[test]
    fn a_failure_beside_a_lost_node_is_a_preemption_and_beside_a_live_one_a_failure() {
        let up = ready("n2");
        let not_ready = node("n2").not_ready_since("2026-01-01T00:00:05Z").build();
        let unreachable = node("n2").taint(UNREACHABLE_TAINT).build();
        let disrupted = node("n2").taint(KARPENTER_DISRUPTED).build();
        let waiting = SinceFailure::Waiting(ts("2026-01-01T00:00:03Z"));
        let silent = SinceFailure::Silent(SignedDuration::from_secs(14));
        let lost = |v: &Verdict| matches!(v, Verdict::Preemption(_));
        let cases: Vec<Case<'_>> = vec![
            (
                "node object gone",
                NodeView::Missing("n2"),
                SinceFailure::NoLease,
                "2026-01-01T00:00:01Z",
                &lost,
            ),
            (
                "node NotReady",
                NodeView::Present(&not_ready),
                SinceFailure::NoLease,
                "2026-01-01T00:00:06Z",
                &lost,
            ),
            (
                "unreachable taint",
                NodeView::Present(&unreachable),
                waiting,
                "2026-01-01T00:00:01Z",
                &lost,
            ),
            (
                "termination taint",
                NodeView::Present(&disrupted),
                waiting,
                "2026-01-01T00:00:01Z",
                &lost,
            ),
            (
                "kubelet silent",
                NodeView::Present(&up),
                silent,
                "2026-01-01T00:00:15Z",
                &lost,
            ),
            (
                "Lease renewed after the failure: alive",
                NodeView::Present(&up),
                SinceFailure::Renewed,
                "2026-01-01T00:00:09Z",
                &|v| *v == Verdict::Failure,
            ),
            (
                "back from an absence spanning the failure: hold, polling, for its pods to tell",
                NodeView::Present(&up),
                SinceFailure::Returned(SignedDuration::from_secs(15)),
                "2026-01-01T00:00:16Z",
                &|v| *v == Verdict::Hold(ts("2026-01-01T00:00:18Z")),
            ),
            (
                "back from an absence, window over: failure",
                NodeView::Present(&up),
                SinceFailure::Returned(SignedDuration::from_secs(15)),
                "2026-01-01T00:01:00Z",
                &|v| *v == Verdict::Failure,
            ),
            (
                "Lease late but within the margin: hold until it would be silent",
                NodeView::Present(&up),
                waiting,
                "2026-01-01T00:00:01Z",
                &|v| *v == Verdict::Hold(ts("2026-01-01T00:00:03Z")),
            ),
            (
                "no Lease: hold, polling",
                NodeView::Present(&up),
                SinceFailure::NoLease,
                "2026-01-01T00:00:30Z",
                &|v| *v == Verdict::Hold(ts("2026-01-01T00:00:32Z")),
            ),
            (
                "no Lease, window over: failure",
                NodeView::Present(&up),
                SinceFailure::NoLease,
                "2026-01-01T00:01:00Z",
                &|v| *v == Verdict::Failure,
            ),
            (
                "Lease late, window over: failure",
                NodeView::Present(&up),
                waiting,
                "2026-01-01T00:01:00Z",
                &|v| *v == Verdict::Failure,
            ),
            (
                "a peer never scheduled was in no collective",
                NodeView::Unscheduled,
                SinceFailure::NoLease,
                "2026-01-01T00:00:01Z",
                &|v| *v == Verdict::Failure,
            ),
        ];
        for (case, view, lease, now, expect) in cases {
            let v = judge_one(view, lease, now);
            assert!(expect(&v), "{case}: {v:?}");
        }
    }

    #[test]
    fn the_preemption_names_the_lost_rank_and_why() {
        let not_ready = node("spot-1")
            .not_ready_since("2026-01-01T00:00:05Z")
            .build();
        let v = judge_one(
            NodeView::Present(&not_ready),
            SinceFailure::NoLease,
            "2026-01-01T00:00:06Z",
        );
        assert_eq!(
            v,
            Verdict::Preemption("worker 1 lost with its node: node spot-1 is NotReady".into())
        );
        let up = ready("spot-1");
        let v = judge_one(
            NodeView::Present(&up),
            SinceFailure::Silent(SignedDuration::from_secs(13)),
            "2026-01-01T00:00:12Z",
        );
        assert!(
            matches!(v, Verdict::Preemption(ref d) if d.contains("spot-1's Lease not renewed for 13s")),
            "{v:?}"
        );
    }

    #[test]
    fn no_silent_peer_means_the_whole_gang_failed_on_its_own() {
        let v = judge(&[], &judging("2026-01-01T00:00:01Z"));
        assert_eq!(v, Verdict::Failure);
    }

    #[test]
    fn a_peer_beside_the_failure_is_alive_whatever_its_lease_says() {
        let up = ready("n2");
        let mut p = peer(
            1,
            NodeView::Present(&up),
            SinceFailure::Silent(SignedDuration::from_secs(30)),
        );
        p.beside_failure = true;
        assert_eq!(
            judge(&[p], &judging("2026-01-01T00:00:30Z")),
            Verdict::Failure
        );
    }

    /// A kubelet cut off from the API server (or restarting) falls silent while its ranks run
    /// on and report: a failure beside it is the job's own.
    #[test]
    fn a_peer_heard_after_the_failure_is_alive_whatever_its_lease_says() {
        let up = ready("n2");
        let mut p = peer(
            1,
            NodeView::Present(&up),
            SinceFailure::Silent(SignedDuration::from_secs(30)),
        );
        assert!(matches!(
            judge(&[p], &judging("2026-01-01T00:00:30Z")),
            Verdict::Preemption(_)
        ));
        p.heard_after = true;
        assert_eq!(
            judge(&[p], &judging("2026-01-01T00:00:30Z")),
            Verdict::Failure
        );
        // A kubelet restarted across the failure while its ranks reported: a failure too,
        // without waiting for the peer's pod.
        p.lease = SinceFailure::Returned(SignedDuration::from_secs(15));
        assert_eq!(
            judge(&[p], &judging("2026-01-01T00:00:16Z")),
            Verdict::Failure
        );
    }

    #[test]
    fn one_lost_peer_among_live_ones_decides() {
        let up = ready("n1");
        let peers = [
            peer(1, NodeView::Present(&up), SinceFailure::Renewed),
            peer(2, NodeView::Missing("n3"), SinceFailure::NoLease),
        ];
        let v = judge(&peers, &judging("2026-01-01T00:00:06Z"));
        assert!(
            matches!(v, Verdict::Preemption(ref d) if d.contains("worker 2")),
            "{v:?}"
        );
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
}
