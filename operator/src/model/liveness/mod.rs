//! Whether a node and the ranks on it are alive: one pure index of what the operator saw of
//! the kubelets' Lease renewals, judged on one clock (the operator's own), and the rules that
//! the triggers, the decision and the lost-peer judgement all read from it.
//!
//! A spot VM reclaimed without notice, or a node cut off by a partition, leaves its pod
//! objects Running: the control plane marks the node NotReady only after
//! `--node-monitor-grace-period` (40 s and more). Its kubelet's Lease in `kube-node-lease`
//! says it sooner: the kubelet renews it every quarter of its duration (10 s of 40 s by
//! default). A cluster is noisy, though: the kubelet renews with a 4 % jitter, an API server
//! under load answers late, a watch delivers late or restarts, clocks disagree. The rules:
//!
//! - **One clock.** A renewal counts when the operator *sees* it (the watch event's arrival,
//!   on the operator's clock). The node's `renewTime` only tells that a renewal happened, so
//!   a node clock or an operator clock that runs ahead or behind moves nothing. The distance
//!   between two `renewTime`s of one kubelet is on one clock too: a distance of more than the
//!   interval and the margin is a span in which the node was **away** (lost, rebooted, its
//!   kubelet stopped), seen even when the operator was not watching then (a new leader, a
//!   broken stream). A renewal that ends an absence spanning a failure proves that the node
//!   came back, not that its ranks lived through the failure ([`SinceFailure::Returned`]).
//! - **A margin measured, not assumed.** Two things delay a renewal the operator sees: the
//!   kubelet renewing late (its jitter, a starved CPU), seen as a gap between seen renewals
//!   longer than the interval; and the delivery (the API server's latency, the watch's delay),
//!   seen as `seen - renewTime` above its smallest value for that node (which also absorbs
//!   the node clock's offset). The margin is [`MARGIN_FLOOR`] plus twice the largest of both
//!   over the recent renewals of every node, at most one interval. A node seen renewing
//!   fewer than [`MIN_GAPS`] + 1 times since the watch began gets a whole interval of margin.
//!   A gap of more than two intervals is a node that was away (lost, partitioned, its
//!   kubelet stopped), not noise, and is not learned from.
//! - A node is **silent** when it has not been seen renewing for its interval plus the margin,
//!   and another node, itself not stale, was seen renewing after this node was due: the
//!   Lease stream works, this node does not use it. When every heartbeat is stale together
//!   (a lagging watch, an API server away), nobody is silent; while the Lease watch is broken,
//!   and for one interval plus the margin after it resumes (or after a span of more than that
//!   with no renewal seen from any node), nobody is silent either: the kubelets retry on
//!   their own schedule.
//! - A silent node is **lost** to the attempt whose ranks report progress when every rank of
//!   it there has been *quiet*: no report for [`QUIET_CADENCES`] times the longest gap between
//!   two reports of one rank seen in this attempt, and at least one renewal interval, counted
//!   from the later of the report and the channel's last trouble (a report refused, a token
//!   that could not be reviewed, a connection closed at accept). A kubelet restarting alone
//!   (its trainers still report) loses nothing.
//! - A silent node is **gone for good** ([`Silence::lease_lost`]) once it has missed two
//!   renewals and the margin: without progress reports this is when its pods may be removed
//!   without its kubelet.
//! - A lost node's work stopped at its **last sign of life** ([`last_alive`]): the later of its
//!   last renewal and the last report of a rank on it. The renewal alone may be a whole
//!   interval early; the ledger dates the loss there, not at the decision nor at a survivor's
//!   exit.
//!
//! A pod is removed without its kubelet (a force delete) only on a node lost or gone for good
//! by these rules; a pod on a node whose kubelet renews is always deleted gracefully.

use std::collections::{BTreeMap, HashMap, VecDeque};

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::coordination::v1::Lease;

/// The least margin past the renewal interval: a kubelet's 4 % jitter and two API writes.
pub const MARGIN_FLOOR: SignedDuration = SignedDuration::from_secs(3);
/// Recent gaps kept per node: about 160 s of renewals at the default interval.
const GAPS: usize = 16;
/// Seen gaps a node needs before the measured margin applies to it.
pub const MIN_GAPS: usize = 3;
/// A rank is quiet after this many times its job's longest report gap.
pub const QUIET_CADENCES: i32 = 2;
/// The Lease duration a Lease that states none has (the kubelet's default).
const DEFAULT_DURATION: SignedDuration = SignedDuration::from_secs(40);

/// What the operator saw of one kubelet's renewals.
#[derive(Clone, Debug)]
struct NodeBeat {
    /// The latest `renewTime`, on the node's clock: only compared with the next one.
    renewed: Timestamp,
    /// When the operator saw that renewal, on its own clock.
    seen: Timestamp,
    /// The kubelet renews every quarter of the Lease's duration.
    interval: SignedDuration,
    /// Recent gaps between seen renewals, none spanning a break of the Lease stream.
    gaps: VecDeque<SignedDuration>,
    /// Recent `seen - renewTime`, the same renewals.
    lags: VecDeque<SignedDuration>,
    /// The smallest `seen - renewTime`: the node clock's offset from the operator's plus the
    /// shortest delivery. Puts a time the node stamped onto the operator's clock.
    lag_min: SignedDuration,
    /// `seen` is when the renewal arrived on a live watch. A renewal first seen in a list (a
    /// new leader's, or after the stream broke) was made at some time before `seen`: it
    /// proves nothing about what the node did after a failure that came before the list.
    live: bool,
    /// The latest span in which the kubelet renewed nothing for longer than its interval and
    /// the margin, as two `renewTime`s (the node's clock): the node was away and came back.
    away: Option<(Timestamp, Timestamp)>,
    /// The Lease's resourceVersion at that renewal: a new one is a new renewal, whatever its
    /// `renewTime` says (a node clock stepped back still renews).
    version: Option<String>,
}

impl NodeBeat {
    /// Whether a renewal stamped `renewed`, of Lease version `version`, is new.
    fn is_new(&self, renewed: Timestamp, version: Option<&str>) -> bool {
        match (version, self.version.as_deref()) {
            (Some(v), Some(known)) => v != known,
            _ => renewed > self.renewed,
        }
    }

    /// Whether the node's clock moved against the operator's between its last renewal and one
    /// stamped `renewed`, seen at `now`: the two clocks' steps differ by more than two
    /// intervals (a step of the node's clock, not a late delivery or an absence, which move
    /// both alike).
    fn clock_stepped(&self, renewed: Timestamp, now: Timestamp) -> bool {
        let node_step = renewed.duration_since(self.renewed);
        let seen_step = now.duration_since(self.seen);
        (node_step - seen_step).abs() > self.interval * 2
    }

    /// Forgets what the node's old clock taught: its offset and the lags measured on it.
    fn restart_clock(&mut self, lag: SignedDuration) {
        self.gaps.clear();
        self.lags.clear();
        self.lag_min = lag;
    }

    /// When the kubelet made its last renewal, on the operator's clock, never after it was
    /// seen: a renewal that arrived late does not stretch the node's life by the delay.
    fn renewed_on_operator_clock(&self) -> Timestamp {
        stamp_on_operator_clock(self.renewed, self.lag_min).min(self.seen)
    }

    /// The largest lateness of a recent renewal: a gap's excess over the interval, or a
    /// delivery slower than the fastest one seen.
    fn excess(&self) -> SignedDuration {
        let late = self.gaps.iter().map(|g| *g - self.interval);
        let slow = self.lags.iter().map(|l| *l - self.lag_min);
        late.chain(slow)
            .max()
            .unwrap_or(SignedDuration::ZERO)
            .max(SignedDuration::ZERO)
    }
}

/// The index: every node's seen renewals and the state of the Lease stream. The controller
/// feeds it from its Lease watch ([`Heartbeats::observe`], [`Heartbeats::interrupted`],
/// [`Heartbeats::resumed`]); readers judge it at a time ([`Heartbeats::silent`],
/// [`Heartbeats::view`]).
#[derive(Clone, Debug, Default)]
pub struct Heartbeats {
    nodes: HashMap<String, NodeBeat>,
    /// When any renewal was last seen.
    last_seen: Option<Timestamp>,
    /// When the Lease stream last resumed after a break.
    resumed_at: Option<Timestamp>,
    /// The Lease watch is broken now.
    interrupted: bool,
}

/// A node whose kubelet went silent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Silence {
    /// How long since its last renewal was seen.
    pub since: SignedDuration,
    /// When the kubelet made that renewal: its `renewTime` on the operator's clock
    /// ([`Liveness::on_operator_clock`]), never after it was seen. What the ledger takes for
    /// the moment the node's work stopped: a renewal that arrived late (a loaded API server,
    /// a lagging watch) does not stretch the node's life by the delay.
    pub renewed: Timestamp,
    /// It has missed two renewals and the margin: gone for good, whatever its ranks say.
    pub lease_lost: bool,
}

impl Heartbeats {
    /// A Lease as the watch delivers it at `now`.
    pub fn observe(&mut self, lease: &Lease, now: Timestamp) {
        let Some(name) = lease.metadata.name.as_deref() else {
            return;
        };
        let Some(spec) = lease.spec.as_ref() else {
            return;
        };
        let Some(renewed) = spec.renew_time.as_ref().map(|t| t.0) else {
            return;
        };
        let duration = spec
            .lease_duration_seconds
            .filter(|&s| s > 0)
            .map_or(DEFAULT_DURATION, |s| {
                SignedDuration::from_secs(i64::from(s))
            });
        let version = lease.metadata.resource_version.as_deref();
        self.versioned_renewal(name, renewed, version, duration, now);
    }

    /// `node`'s kubelet renewed its Lease (stamped `renewed`, lasting `duration`), seen at `now`.
    /// A `renewed` not newer than the one known (a re-list repeats it) is no renewal.
    #[cfg(test)]
    pub fn renewal(
        &mut self,
        node: &str,
        renewed: Timestamp,
        duration: SignedDuration,
        now: Timestamp,
    ) {
        self.versioned_renewal(node, renewed, None, duration, now);
    }

    /// [`Self::renewal`] of Lease version `version`: a new version is a new renewal, whatever
    /// its `renewTime` (a kubelet whose clock stepped back renews all the same), and a step of
    /// the node's clock restarts what its clock taught, so neither direction changes a verdict.
    pub fn versioned_renewal(
        &mut self,
        node: &str,
        renewed: Timestamp,
        version: Option<&str>,
        duration: SignedDuration,
        now: Timestamp,
    ) {
        let interval = duration / 4;
        // The threshold costs a pass over every node; a gap within the margin's floor (every
        // renewal of a busy cluster) cannot pass it.
        let broke = |gap: SignedDuration| {
            gap > MARGIN_FLOOR && gap > self.stream_interval() + self.margin()
        };
        if self
            .last_seen
            .is_some_and(|last| broke(now.duration_since(last)))
        {
            // Nothing from any node for longer than any kubelet should take: the stream broke.
            self.resumed_at = Some(now);
        }
        let lag = now.duration_since(renewed);
        let resumed_at = self.resumed_at;
        let counts = !self.interrupted;
        // Two `renewTime`s of one kubelet, both on its clock: no delivery and no clock offset
        // is in their distance. Seen across a break of the stream or an operator restart too.
        let stepped = self
            .nodes
            .get(node)
            .is_some_and(|beat| beat.clock_stepped(renewed, now));
        let away = self.nodes.get(node).filter(|_| !stepped).and_then(|beat| {
            let step = renewed.duration_since(beat.renewed);
            let long = step > interval + MARGIN_FLOOR && step > interval + self.margin();
            long.then_some((beat.renewed, renewed))
        });
        match self.nodes.get_mut(node) {
            Some(beat) if !beat.is_new(renewed, version) => return,
            Some(beat) => {
                if stepped {
                    beat.restart_clock(lag);
                }
                let gap = now.duration_since(beat.seen);
                // A gap of more than two intervals is the node away (lost, partitioned, its
                // kubelet stopped), not the noise of one that renews: it teaches no margin.
                let noise = gap <= interval * 2;
                if counts && noise && resumed_at.is_none_or(|r| beat.seen >= r) {
                    if beat.gaps.len() == GAPS {
                        beat.gaps.pop_front();
                        beat.lags.pop_front();
                    }
                    beat.gaps.push_back(gap);
                    beat.lags.push_back(lag);
                }
                beat.renewed = renewed;
                beat.seen = now;
                beat.interval = interval;
                beat.lag_min = beat.lag_min.min(lag);
                beat.live = counts;
                beat.away = away.or(beat.away);
                beat.version = version.map(str::to_owned);
            }
            None => {
                self.nodes.insert(
                    node.to_owned(),
                    NodeBeat {
                        renewed,
                        seen: now,
                        interval,
                        gaps: VecDeque::with_capacity(GAPS),
                        lags: VecDeque::with_capacity(GAPS),
                        lag_min: lag,
                        live: counts,
                        away: None,
                        version: version.map(str::to_owned),
                    },
                );
            }
        }
        self.last_seen = Some(self.last_seen.map_or(now, |l| l.max(now)));
    }

    /// The node's Lease is gone (the node was deleted).
    pub fn forget(&mut self, node: &str) {
        self.nodes.remove(node);
    }

    /// The Lease watch broke (an error, or a re-list began): judgment waits.
    pub fn interrupted(&mut self) {
        self.interrupted = true;
    }

    /// The Lease watch works again at `now`: every node has an interval and the margin from
    /// now to be seen renewing.
    pub fn resumed(&mut self, now: Timestamp) {
        self.interrupted = false;
        self.resumed_at = Some(now);
    }

    /// Whether the watch is broken now.
    pub fn is_interrupted(&self) -> bool {
        self.interrupted
    }

    /// The longest renewal interval of any node.
    fn stream_interval(&self) -> SignedDuration {
        self.nodes
            .values()
            .map(|b| b.interval)
            .max()
            .unwrap_or(DEFAULT_DURATION / 4)
    }

    /// The measured margin of the nodes seen renewing often enough (the module doc).
    pub fn margin(&self) -> SignedDuration {
        let warm = self.nodes.values().filter(|b| b.gaps.len() >= MIN_GAPS);
        let (excess, cap) = warm.fold((SignedDuration::ZERO, SignedDuration::ZERO), |(e, c), b| {
            (e.max(b.excess()), c.max(b.interval))
        });
        (MARGIN_FLOOR + excess * 2).min(cap.max(MARGIN_FLOOR))
    }

    fn node_margin(&self, beat: &NodeBeat, margin: SignedDuration) -> SignedDuration {
        if beat.gaps.len() < MIN_GAPS {
            beat.interval.max(margin)
        } else {
            margin
        }
    }

    /// The nodes silent at `now` (the module doc).
    pub fn silent(&self, now: Timestamp) -> BTreeMap<String, Silence> {
        self.silent_with(self.margin(), now)
    }

    /// [`Self::silent`], with the margin already measured.
    fn silent_with(&self, margin: SignedDuration, now: Timestamp) -> BTreeMap<String, Silence> {
        let mut silent = BTreeMap::new();
        if self.interrupted {
            return silent;
        }
        // The two freshest nodes, and whether each is itself fresh: a node's witness is the
        // freshest other one.
        type Seen<'n> = Option<(&'n str, Timestamp, bool)>;
        let (mut first, mut second): (Seen<'_>, Seen<'_>) = (None, None);
        for (name, b) in &self.nodes {
            let entry = Some((name.as_str(), b.seen, !self.stale(b, margin, now, 1)));
            if first.is_none_or(|f| b.seen > f.1) {
                second = first;
                first = entry;
            } else if second.is_none_or(|s| b.seen > s.1) {
                second = entry;
            }
        }
        for (name, b) in &self.nodes {
            if !self.stale(b, margin, now, 1) {
                continue;
            }
            let witness = first.filter(|f| f.0 != name.as_str()).or(second);
            let due = b.seen.saturating_add(b.interval).unwrap_or(b.seen);
            let witnessed = witness.is_some_and(|(_, seen, fresh)| fresh && seen > due);
            if witnessed {
                silent.insert(
                    name.clone(),
                    Silence {
                        since: now.duration_since(b.seen),
                        renewed: b.renewed_on_operator_clock(),
                        lease_lost: self.stale(b, margin, now, 2),
                    },
                );
            }
        }
        silent
    }

    /// Whether `b` has gone `renewals` intervals and its margin without a seen renewal,
    /// counted from the stream's last resume when that is later.
    fn stale(&self, b: &NodeBeat, margin: SignedDuration, now: Timestamp, renewals: i32) -> bool {
        now.duration_since(self.counted_from(b))
            > b.interval * renewals + self.node_margin(b, margin)
    }

    /// Where `b`'s silence counts from: its last renewal seen, or the stream's last resume
    /// when that is later.
    fn counted_from(&self, b: &NodeBeat) -> Timestamp {
        self.resumed_at.map_or(b.seen, |r| r.max(b.seen))
    }

    /// What one decision reads: the silent nodes, and the heartbeats of `nodes` (the nodes of
    /// a job's pods).
    pub fn view<'a>(&self, nodes: impl IntoIterator<Item = &'a str>, now: Timestamp) -> Liveness {
        let margin = self.margin();
        let beats = nodes
            .into_iter()
            .filter_map(|n| {
                let b = self.nodes.get(n)?;
                let from = self.counted_from(b);
                Some((
                    n.to_owned(),
                    Beat {
                        seen: b.seen,
                        renewed: b.renewed_on_operator_clock(),
                        interval: b.interval,
                        lag_min: b.lag_min,
                        live: b.live,
                        away: b.away.map(|(from, to)| {
                            (
                                stamp_on_operator_clock(from, b.lag_min),
                                stamp_on_operator_clock(to, b.lag_min),
                            )
                        }),
                        silent_at: from
                            .saturating_add(b.interval + self.node_margin(b, margin))
                            .unwrap_or(from),
                    },
                ))
            })
            .collect();
        Liveness {
            silent: self.silent_with(margin, now),
            beats,
            margin,
        }
    }
}

/// A time a node's kubelet stamped, put on the operator's clock by that node's `lag_min` (its
/// clock's offset plus the shortest delivery).
fn stamp_on_operator_clock(at: Timestamp, lag_min: SignedDuration) -> Timestamp {
    at.saturating_add(lag_min).unwrap_or(at)
}

/// One node's heartbeat as a decision reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Beat {
    /// When its last renewal was seen (the operator's clock).
    pub seen: Timestamp,
    /// When its kubelet made that renewal, on the operator's clock ([`Silence::renewed`]).
    renewed: Timestamp,
    /// Its renewal interval.
    pub interval: SignedDuration,
    /// Its clock's offset plus the shortest delivery ([`NodeBeat::lag_min`]).
    lag_min: SignedDuration,
    /// When it falls silent if no renewal is seen before.
    pub silent_at: Timestamp,
    /// The last renewal arrived on a live watch, not in a list ([`NodeBeat::live`]).
    live: bool,
    /// The latest span without a renewal ([`NodeBeat::away`]), on the operator's clock.
    away: Option<(Timestamp, Timestamp)>,
}

/// The liveness judgement one decision reads: built by [`Heartbeats::view`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Liveness {
    /// The silent nodes.
    pub silent: BTreeMap<String, Silence>,
    /// The heartbeats of the nodes the decision asked for.
    beats: BTreeMap<String, Beat>,
    /// The margin in force.
    pub margin: SignedDuration,
}

/// What a peer's Lease says about its node since a failure (the lost-peer rule).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SinceFailure {
    /// Silent for this long: the node is lost.
    Silent(SignedDuration),
    /// A renewal was seen after the failure and the margin: its kubelet is alive.
    Renewed,
    /// A renewal was seen after the failure, but it ended a span of this long without one
    /// that began before the failure: the node was away when the failure happened (lost,
    /// rebooted, its kubelet restarted) and came back. Its kubelet proves nothing about the
    /// ranks that ran there: their pods tell (a container lost with its node) or their
    /// reports do.
    Returned(SignedDuration),
    /// Not known yet; it falls silent at this time if no renewal comes.
    Waiting(Timestamp),
    /// No Lease of it is seen.
    NoLease,
}

impl Liveness {
    /// The heartbeat of `node`, if the decision asked for it and its Lease is seen.
    pub fn beat(&self, node: &str) -> Option<&Beat> {
        self.beats.get(node)
    }

    /// A time the kubelet of `node` stamped, on the operator's clock: shifted by that node's
    /// offset (late by its shortest delivery, which errs towards "not yet"). Unshifted when
    /// the node's Lease is not seen.
    pub fn on_operator_clock(&self, node: Option<&str>, at: Timestamp) -> Timestamp {
        let lag = node
            .and_then(|n| self.beats.get(n))
            .map_or(SignedDuration::ZERO, |b| b.lag_min);
        stamp_on_operator_clock(at, lag)
    }

    /// When `node`'s kubelet last renewed its Lease, on the operator's clock
    /// ([`Silence::renewed`]): the last sign of life its kubelet gave, silent or not.
    pub fn last_renewal(&self, node: &str) -> Option<Timestamp> {
        self.silent
            .get(node)
            .map(|s| s.renewed)
            .or_else(|| self.beats.get(node).map(|b| b.renewed))
    }

    /// What `node`'s Lease says since a failure that happened at `failed_at` (operator's clock,
    /// [`Self::on_operator_clock`]).
    pub fn since_failure(&self, node: &str, failed_at: Timestamp) -> SinceFailure {
        if let Some(s) = self.silent.get(node) {
            return SinceFailure::Silent(s.since);
        }
        let Some(beat) = self.beats.get(node) else {
            return SinceFailure::NoLease;
        };
        let after = failed_at.saturating_add(self.margin).unwrap_or(failed_at);
        // A renewal listed, not watched, was made at some time before it was seen: it may
        // be the last one of a node lost before the failure (found by make chaos, seed 16: a
        // new leader's first list took a node lost 15 s before for one renewed after a
        // survivor's failure, and counted that failure).
        if beat.live && beat.seen >= after {
            match beat.away {
                Some((from, to)) if from <= failed_at && to >= failed_at => {
                    SinceFailure::Returned(to.duration_since(from))
                }
                _ => SinceFailure::Renewed,
            }
        } else {
            SinceFailure::Waiting(beat.silent_at)
        }
    }

    /// Whether `node` is silent and has missed two renewals and the margin.
    pub fn gone_for_good(&self, node: &str) -> bool {
        self.silent.get(node).is_some_and(|s| s.lease_lost)
    }
}

/// When a lost node last showed it was alive: its kubelet's last renewal (`renewed`, on the
/// operator's clock: [`Silence::renewed`]), or a later progress report of a rank on it
/// (`reported`: when each rank of the attempt on that node last reported, on the operator's
/// clock). The kubelet
/// renews every interval (10 s by default), so its last renewal may be a whole interval
/// before the node went; a rank that reports every second dates it to the second.
pub fn last_alive(renewed: Timestamp, reported: impl IntoIterator<Item = Timestamp>) -> Timestamp {
    reported.into_iter().fold(renewed, Timestamp::max)
}

/// What the trainers of one attempt reported, as the quiet rule reads it.
#[derive(Clone, Copy, Debug)]
pub struct Reports<'a> {
    /// Each rank that reported and when it last did.
    pub ranks: &'a [(u32, Timestamp)],
    /// The longest gap between two reports of one rank in this attempt.
    pub cadence: Option<SignedDuration>,
    /// When the channel last had trouble of its own (a report refused, a review that failed,
    /// a connection closed at accept).
    pub channel_trouble_at: Option<Timestamp>,
}

/// How long a rank may go without reporting before it is quiet: [`QUIET_CADENCES`] times its
/// job's longest report gap, and at least `floor` (the node's renewal interval).
pub fn quiet_after(cadence: Option<SignedDuration>, floor: SignedDuration) -> SignedDuration {
    cadence.map_or(floor, |c| (c * QUIET_CADENCES).max(floor))
}

/// The silent nodes lost to the attempt whose reports are `reports`: every rank of it on the
/// node (`ranks`: rank and node) that ever reported is quiet, and one did. Each with the
/// detail the restart names.
pub fn lost_nodes(
    liveness: &Liveness,
    ranks: &[(u32, &str)],
    reports: Option<Reports<'_>>,
    now: Timestamp,
) -> BTreeMap<String, String> {
    let Some(reports) = reports else {
        return BTreeMap::new();
    };
    let mut lost = BTreeMap::new();
    for (node, silence) in &liveness.silent {
        let reported: Vec<(u32, Timestamp)> = ranks
            .iter()
            .filter(|(_, n)| n == node)
            .filter_map(|(rank, _)| reports.ranks.iter().find(|(r, _)| r == rank).copied())
            .collect();
        let floor = liveness
            .beat(node)
            .map_or(DEFAULT_DURATION / 4, |b| b.interval);
        let patience = quiet_after(reports.cadence, floor);
        let heard = |at: Timestamp| reports.channel_trouble_at.map_or(at, |t| t.max(at));
        let quiet = |at: Timestamp| now.duration_since(heard(at)) > patience;
        if reported.is_empty() || !reported.iter().all(|(_, at)| quiet(*at)) {
            continue;
        }
        let newest = reported.iter().map(|(_, at)| *at).max().unwrap_or(now);
        let names: Vec<String> = reported.iter().map(|(r, _)| r.to_string()).collect();
        lost.insert(
            node.clone(),
            format!(
                "node {node} lost: its kubelet's Lease not renewed for {}s while other nodes \
                 renewed theirs, and its worker(s) {} silent for {}s",
                silence.since.as_secs(),
                names.join(", "),
                now.duration_since(newest).as_secs()
            ),
        );
    }
    lost
}

#[cfg(test)]
mod tests;
