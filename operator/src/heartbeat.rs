//! A node lost without notice, told from its kubelet's heartbeat: a pure judgement of the
//! node Leases and of the progress reports of the ranks that run there.
//!
//! A spot VM reclaimed without notice, or a node cut off by a partition, leaves its pod
//! objects Running: no kubelet reports otherwise, and the control plane marks the node
//! NotReady only after `--node-monitor-grace-period` (40 s and more). Its kubelet's Lease in
//! `kube-node-lease` says it much sooner: the kubelet renews it every quarter of its
//! duration (10 s of 40 s by default).
//!
//! - A node is **silent** when its Lease has gone one renewal interval and a little
//!   ([`CLOCK_SLACK`]) without renewal, on the operator's clock, while the Lease watch is
//!   live: another node's Lease was renewed within that same span, after this node's last
//!   renewal. A lagging watch or an operator clock that runs ahead makes every node look
//!   silent at once, so none is. A silent node takes no new pod of a job (the placement
//!   avoids it by name), and a pod already deleted there is removed at once: no kubelet
//!   will confirm it, and the checkpoint is fenced against its trainers
//!   (docs/env-contract.md).
//! - A silent node is **lost** to an attempt when the ranks of that attempt on it report
//!   progress and have all stopped reporting for a renewal interval: the node's pods cannot
//!   reach the operator either. A kubelet restarting alone (its Lease late, its trainers
//!   still reporting) loses nothing. A lost node's ranks are preempted: the gang restarts
//!   without waiting for NotReady. Without progress reports this rule decides nothing; the
//!   lost-peer rule (a peer's collective broke) and the NotReady timeout still do.
//!
//! A renewal that does not come is no event: the controller reads the Leases every 2 s and
//! wakes the jobs of a node that falls silent, stays silent or comes back
//! (`controller/triggers.rs`), so a running job costs no periodic reconcile for this.

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::coordination::v1::Lease;

use crate::lost_peer::Heartbeat;
use crate::plan::ObservedProgress;

/// Two clocks (a node's and the operator's) and a watch event's delivery.
pub const CLOCK_SLACK: SignedDuration = SignedDuration::from_secs(2);

/// A node Lease's name and heartbeat.
fn heartbeats(leases: &[&Lease]) -> Vec<(String, Heartbeat)> {
    leases
        .iter()
        .filter_map(|l| {
            let name = l.metadata.name.clone()?;
            let hb = crate::lost_peer::heartbeat([*l], &name)?;
            Some((name, hb))
        })
        .collect()
}

/// The kubelet renews its Lease every quarter of the Lease's duration.
fn interval(hb: &Heartbeat) -> SignedDuration {
    hb.duration / 4
}

/// The nodes whose kubelet went silent (above), each with how long ago it last renewed.
pub fn silent_nodes(leases: &[&Lease], now: Timestamp) -> BTreeMap<String, SignedDuration> {
    let beats = heartbeats(leases);
    let mut silent = BTreeMap::new();
    for (name, hb) in &beats {
        let renewed = hb.renewed.min(now);
        let limit = interval(hb) + CLOCK_SLACK;
        let since = now.duration_since(renewed);
        if since <= limit {
            continue;
        }
        let watch_live = beats.iter().any(|(other, o)| {
            other != name && {
                let o = o.renewed.min(now);
                o > renewed && now.duration_since(o) <= limit
            }
        });
        if watch_live {
            silent.insert(name.clone(), since);
        }
    }
    silent
}

/// The silent nodes lost to the attempt whose progress is `progress`: every rank of it on the
/// node (`ranks`: rank and node) that ever reported has not for a renewal interval, and one
/// did. Each with the detail the restart names.
pub fn lost_nodes(
    silent: &BTreeMap<String, SignedDuration>,
    leases: &[&Lease],
    ranks: &[(u32, &str)],
    progress: Option<&ObservedProgress>,
    now: Timestamp,
) -> BTreeMap<String, String> {
    let Some(progress) = progress else {
        return BTreeMap::new();
    };
    let mut lost = BTreeMap::new();
    for (node, since) in silent {
        let Some(hb) = crate::lost_peer::heartbeat(leases.iter().copied(), node) else {
            continue;
        };
        let reported: Vec<(u32, Timestamp)> = ranks
            .iter()
            .filter(|(_, n)| n == node)
            .filter_map(|(rank, _)| {
                let p = progress.ranks.iter().find(|p| p.rank == *rank)?;
                Some((*rank, p.reported_at))
            })
            .collect();
        // A report refused by the endpoint itself (its token could not be reviewed while the
        // API server was away) is no silence of the rank: quiet counts from the later of its
        // last report and the channel's last refusal.
        let heard = |at: &Timestamp| progress.channel_refused_at.map_or(*at, |r| r.max(*at));
        let quiet = |at: &Timestamp| now.duration_since(heard(at)) > interval(&hb);
        if reported.is_empty() || !reported.iter().all(|(_, at)| quiet(at)) {
            continue;
        }
        let newest = reported.iter().map(|(_, at)| *at).max().unwrap_or(now);
        let ranks: Vec<String> = reported.iter().map(|(r, _)| r.to_string()).collect();
        lost.insert(
            node.clone(),
            format!(
                "node {node} lost: its kubelet's Lease not renewed for {}s while other nodes \
                 renewed theirs, and its worker(s) {} silent for {}s",
                since.as_secs(),
                ranks.join(", "),
                now.duration_since(newest).as_secs()
            ),
        );
    }
    lost
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::ts;
    use crate::plan::RankProgress;
    use serde_json::json;

    const T: &str = "2026-01-01T00:01:00Z";

    fn lease(node: &str, renewed: &str) -> Lease {
        serde_json::from_value(json!({
            "metadata": {"name": node, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": renewed},
        }))
        .expect("Lease")
    }

    fn at(secs: i64) -> Timestamp {
        ts(T)
            .saturating_add(SignedDuration::from_secs(secs))
            .expect("time")
    }

    fn stamp(secs: i64) -> String {
        at(secs).strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
    }

    fn progress(ranks: &[(u32, i64)]) -> ObservedProgress {
        ObservedProgress {
            attempt: 0,
            ranks: ranks
                .iter()
                .map(|&(rank, reported)| RankProgress {
                    rank,
                    step: 10,
                    advanced_at: at(reported),
                    reported_at: at(reported),
                })
                .collect(),
            checkpoint: None,
            resumed_from: None,
            previous_attempt_step: None,
            checkpoint_requested: None,
            checkpoint_saved_on_request: None,
            channel_refused_at: None,
        }
    }

    #[test]
    fn a_node_that_missed_a_renewal_others_made_is_silent() {
        let (a, b) = (lease("a", &stamp(-13)), lease("b", &stamp(-1)));
        let silent = silent_nodes(&[&a, &b], at(0));
        assert_eq!(silent.keys().collect::<Vec<_>>(), vec!["a"]);
        assert_eq!(silent["a"], SignedDuration::from_secs(13));
        // Within one interval and the slack, nobody is silent.
        let a = lease("a", &stamp(-11));
        assert!(silent_nodes(&[&a, &b], at(0)).is_empty());
    }

    #[test]
    fn a_lagging_watch_makes_no_node_silent() {
        // Every Lease looks 30 s old: the watch (or the operator's clock) is behind.
        let (a, b) = (lease("a", &stamp(-35)), lease("b", &stamp(-30)));
        assert!(silent_nodes(&[&a, &b], at(0)).is_empty());
        // A lone node has nobody to be compared with.
        assert!(silent_nodes(&[&a], at(0)).is_empty());
    }

    #[test]
    fn a_silent_node_is_lost_only_when_its_reporting_ranks_went_quiet_too() {
        let (a, b) = (lease("a", &stamp(-14)), lease("b", &stamp(-2)));
        let leases = [&a, &b];
        let silent = silent_nodes(&leases, at(0));
        let ranks = [(0, "b"), (1, "a"), (2, "a")];
        // Ranks 1 and 2 on a last reported 13 s ago: lost.
        let lost = lost_nodes(
            &silent,
            &leases,
            &ranks,
            Some(&progress(&[(0, -1), (1, -13), (2, -13)])),
            at(0),
        );
        let detail = lost.get("a").expect("a is lost");
        assert!(detail.contains("worker(s) 1, 2 silent for 13s"), "{detail}");
        // A kubelet restarting alone: its trainers still report.
        let lost = lost_nodes(
            &silent,
            &leases,
            &ranks,
            Some(&progress(&[(0, -1), (1, -13), (2, -2)])),
            at(0),
        );
        assert!(lost.is_empty());
        // No progress channel, or nothing reported from that node: not decided here.
        assert!(lost_nodes(&silent, &leases, &ranks, None, at(0)).is_empty());
        let lost = lost_nodes(&silent, &leases, &ranks, Some(&progress(&[(0, -1)])), at(0));
        assert!(lost.is_empty());
    }

    /// Found by the chaos run (seed 3): the API server restarted while node 1's kubelet
    /// restarted too. The endpoint could not review the new attempt's tokens, so every rank's
    /// reports stopped; node 1's Lease came back after node 2's, and node 1 was taken for lost
    /// (a gang restart, and force deletions of pods whose kubelet was alive).
    #[test]
    fn ranks_are_not_quiet_while_the_endpoint_itself_refused_reports() {
        let (a, b) = (lease("a", &stamp(-14)), lease("b", &stamp(-2)));
        let leases = [&a, &b];
        let silent = silent_nodes(&leases, at(0));
        let ranks = [(0, "b"), (1, "a")];
        let mut reports = progress(&[(0, -1), (1, -13)]);
        // Reports refused until 5 s ago: rank 1 may have sent its reports all along.
        reports.channel_refused_at = Some(at(-5));
        assert!(lost_nodes(&silent, &leases, &ranks, Some(&reports), at(0)).is_empty());
        // A refusal before the rank's last report changes nothing.
        reports.channel_refused_at = Some(at(-20));
        let lost = lost_nodes(&silent, &leases, &ranks, Some(&reports), at(0));
        assert_eq!(lost.keys().collect::<Vec<_>>(), vec!["a"]);
        // Quiet for a whole renewal interval after the endpoint took reports again: lost.
        reports.channel_refused_at = Some(at(-5));
        let a = lease("a", &stamp(-20));
        let b = lease("b", &stamp(3));
        let silent = silent_nodes(&[&a, &b], at(6));
        let lost = lost_nodes(&silent, &[&a, &b], &ranks, Some(&reports), at(6));
        assert_eq!(lost.keys().collect::<Vec<_>>(), vec!["a"]);
    }
}
