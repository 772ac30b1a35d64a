//! A seeded schedule of faults: the same seed always yields the same faults, in the same
//! order, at the same offsets, so a failing run is replayed by its seed.
//!
//! Faults overlap in time as they do in production (the operator is killed while a node is
//! being lost), except where two faults act on the same thing: node 2 is lost or partitioned
//! by one fault at a time, the control plane is restarted by one at a time, and the job is
//! suspended or has a worker deleted by one at a time. A fault that is undone (a node brought
//! back, a partition healed, a taint removed, a GPU made healthy again, a job resumed) is
//! undone `hold` after it was injected, always before the schedule ends.

use std::fmt;
use std::time::Duration;

/// What a fault does; each is a real action against the local cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    /// `kill -9` of the operator leader's process; the standby replica takes over.
    KillOperatorLeader,
    /// The API server is stopped and started again.
    RestartApiServer,
    /// etcd is stopped and started again (briefly).
    RestartEtcd,
    /// Node 1's kubelet is restarted.
    RestartKubelet,
    /// A node's device plugin pod is deleted (the DaemonSet brings it back).
    RestartDevicePlugin,
    /// A GPU is marked unhealthy in the fake GPU file, and healthy again after `hold`.
    GpuUnhealthy,
    /// Node 2 is lost hard (`node2.sh lose`) and brought back after `hold`.
    LoseNode2,
    /// Node 2's link goes down with its processes alive, and heals after `hold`.
    PartitionNode2,
    /// A Karpenter termination taint on a worker's node, removed after `hold`.
    TerminationTaint,
    /// A worker pod is deleted, as a user would.
    DeleteWorkerPod,
    /// The job is suspended, and resumed after `hold`.
    SuspendResume,
    /// A running worker's training process is killed (`SIGKILL`, as the kernel's OOM killer
    /// would): its torchrun exits 1. A genuine failure of the job's own.
    TrainerFailure,
    /// Every byte between the pods (the operator, the device plugins, node 2's kubelet) and
    /// the API server held back 0.5 to 2 s each way (`trainyard-api-delay`), for `hold`:
    /// late answers and a lagging watch.
    ApiLatency,
    /// The cluster DNS (dnsmasq) stopped, and started again after `hold`: trainers cannot
    /// resolve their rendezvous or the progress Service meanwhile.
    DnsOutage,
    /// Both nodes' kubelets restarted at the same time: every Lease late together.
    KubeletsRestart,
    /// 256 connections held open to the operator's progress endpoint for `hold`, each opened
    /// again as soon as it is closed: reports are turned away at accept.
    ProgressFlood,
    /// Node 2's kubelet cut off from the API server for `hold` (its connections through
    /// `trainyard-api-delay` closed, new ones refused), its trainers still reaching each other
    /// and the operator: its Lease stops, its ranks go on reporting.
    Node2CutFromApi,
    /// 256 connections held open to a device plugin's metrics port for `hold`, each opened
    /// again as soon as it is closed: the plugin must go on serving the kubelet.
    PluginMetricsFlood,
    /// etcd's writes to its disk throttled to 20 to 60 operations a second (a blkio cgroup) for
    /// `hold`: every write through the API server waits for a slow fsync.
    SlowEtcdDisk,
    /// The trainer image hidden on both nodes (its name untagged in containerd) for `hold`,
    /// and a worker pod deleted: the restart's pods cannot get their image until it is back.
    ImagePullFailure,
    /// Both operator replicas rolled onto a clock 2 to 5 s ahead of or behind the cluster's
    /// (libfaketime), and back after `hold`.
    OperatorClockSkew,
    /// A copy of a running worker (its labels, the job's ownerReference, the seal, the token
    /// volume) under another name, as a namespace user could make it, posting that rank's
    /// reports (step 999999, a checkpoint that does not exist) and its supervisor's "exited 1"
    /// every second for `hold`: every one must be refused and move nothing.
    ForgedWorker,
}

impl FaultKind {
    /// Every kind, in a fixed order (the schedule's shuffles start from it).
    pub const ALL: [FaultKind; 22] = [
        FaultKind::KillOperatorLeader,
        FaultKind::RestartApiServer,
        FaultKind::RestartEtcd,
        FaultKind::RestartKubelet,
        FaultKind::RestartDevicePlugin,
        FaultKind::GpuUnhealthy,
        FaultKind::LoseNode2,
        FaultKind::PartitionNode2,
        FaultKind::TerminationTaint,
        FaultKind::DeleteWorkerPod,
        FaultKind::SuspendResume,
        FaultKind::TrainerFailure,
        FaultKind::ApiLatency,
        FaultKind::DnsOutage,
        FaultKind::KubeletsRestart,
        FaultKind::ProgressFlood,
        FaultKind::Node2CutFromApi,
        FaultKind::PluginMetricsFlood,
        FaultKind::SlowEtcdDisk,
        FaultKind::ImagePullFailure,
        FaultKind::OperatorClockSkew,
        // Last: runs that exclude it draw the same schedules as before it existed.
        FaultKind::ForgedWorker,
    ];

    /// The things the fault acts on: two faults on one resource never overlap.
    pub fn resources(self) -> &'static [Resource] {
        match self {
            FaultKind::KubeletsRestart => &[Resource::Node1, Resource::Node2],
            kind => std::slice::from_ref(kind.resource()),
        }
    }

    /// Whether two faults act on one thing.
    pub fn shares_a_resource(self, other: FaultKind) -> bool {
        self.resources()
            .iter()
            .any(|r| other.resources().contains(r))
    }

    /// The one thing a fault of one resource acts on.
    fn resource(self) -> &'static Resource {
        match self {
            FaultKind::KillOperatorLeader | FaultKind::OperatorClockSkew => &Resource::Operator,
            FaultKind::RestartApiServer | FaultKind::RestartEtcd | FaultKind::SlowEtcdDisk => {
                &Resource::ControlPlane
            }
            FaultKind::RestartKubelet | FaultKind::KubeletsRestart => &Resource::Node1,
            FaultKind::RestartDevicePlugin
            | FaultKind::GpuUnhealthy
            | FaultKind::PluginMetricsFlood => &Resource::Gpus,
            FaultKind::LoseNode2 | FaultKind::PartitionNode2 | FaultKind::Node2CutFromApi => {
                &Resource::Node2
            }
            FaultKind::TerminationTaint => &Resource::Taint,
            FaultKind::ApiLatency => &Resource::ApiPath,
            FaultKind::DnsOutage => &Resource::Dns,
            FaultKind::ProgressFlood => &Resource::Progress,
            FaultKind::ForgedWorker => &Resource::Forger,
            FaultKind::DeleteWorkerPod
            | FaultKind::SuspendResume
            | FaultKind::TrainerFailure
            | FaultKind::ImagePullFailure => &Resource::Job,
        }
    }

    /// Whether an injection of this fault waits until `held`, a fault still held, is undone:
    /// two faults on one resource never overlap, and a fault aimed at a running worker waits
    /// for the resume of a suspended job (seed 9 at a960525: a `TerminationTaint` due while the
    /// job was suspended found no worker for 90 s and held back the resume).
    pub fn waits_for(self, held: FaultKind) -> bool {
        let aims_at_a_worker = matches!(
            self,
            FaultKind::DeleteWorkerPod
                | FaultKind::TerminationTaint
                | FaultKind::ImagePullFailure
                | FaultKind::ForgedWorker
        );
        self.shares_a_resource(held) || (aims_at_a_worker && held == FaultKind::SuspendResume)
    }

    /// Whether the fault is undone after its `hold` (otherwise it is a single action).
    pub fn is_undone(self) -> bool {
        matches!(
            self,
            FaultKind::GpuUnhealthy
                | FaultKind::LoseNode2
                | FaultKind::PartitionNode2
                | FaultKind::TerminationTaint
                | FaultKind::SuspendResume
                | FaultKind::ApiLatency
                | FaultKind::DnsOutage
                | FaultKind::ProgressFlood
                | FaultKind::Node2CutFromApi
                | FaultKind::PluginMetricsFlood
                | FaultKind::SlowEtcdDisk
                | FaultKind::ImagePullFailure
                | FaultKind::OperatorClockSkew
                | FaultKind::ForgedWorker
        )
    }

    /// Whether the job's attempt counter moves because of this fault alone: a suspend and
    /// resume of a started job is a `Resume`; the others may or may not restart the gang.
    pub fn counts_a_resume(self) -> bool {
        self == FaultKind::SuspendResume
    }

    /// Whether the fault is a failure of the job's own, to be counted as one failure.
    pub fn counts_a_failure(self) -> bool {
        self == FaultKind::TrainerFailure
    }

    /// Whether the fault restarts the gang as a preemption or resume (a node lost or noticed,
    /// a worker deleted, a suspend): a genuine failure close to one of these may be taken
    /// into that restart instead of counted on its own.
    pub fn restarts_the_gang(self) -> bool {
        matches!(
            self,
            FaultKind::LoseNode2
                | FaultKind::PartitionNode2
                | FaultKind::TerminationTaint
                | FaultKind::DeleteWorkerPod
                | FaultKind::ImagePullFailure
                | FaultKind::SuspendResume
        )
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// What a fault acts on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Resource {
    Operator,
    ControlPlane,
    Node1,
    Node2,
    Gpus,
    Taint,
    Job,
    ApiPath,
    Dns,
    Progress,
    Forger,
}

/// One fault of a schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    /// When it is injected, from the start of the schedule.
    pub at: Duration,
    pub kind: FaultKind,
    /// How long it lasts before it is undone (zero for single actions).
    pub hold: Duration,
}

impl Fault {
    /// When the fault's resource is free again.
    pub fn ends(&self) -> Duration {
        self.at + self.hold
    }
}

/// Whether a genuine failure at `failure` is near a fault that restarts the gang at `restart`,
/// so that the operator may rightly take it into that restart: after that fault, its longest
/// hold (30 s) and the loss's detection (60 s in all); before it, the failure's own verdict
/// (held until the other nodes' kubelets renew: 20 s).
pub fn near_a_restart(failure: Duration, restart: Duration) -> bool {
    restart + Duration::from_secs(60) >= failure && restart <= failure + Duration::from_secs(20)
}

/// The seed `make test` runs (`e2e/tests/chaos.rs`).
pub const MAKE_TEST_SEED: u64 = 20294459;

/// The knobs of a schedule.
#[derive(Clone, Debug)]
pub struct ScheduleConfig {
    /// How many faults.
    pub faults: usize,
    /// The shortest and longest pause between two injections.
    pub gap: (Duration, Duration),
    /// The shortest and longest hold of a fault that is undone.
    pub hold: (Duration, Duration),
    /// Kinds that must not be drawn (e.g. a run without node 2).
    pub excluded: Vec<FaultKind>,
}

impl Default for ScheduleConfig {
    fn default() -> Self {
        ScheduleConfig {
            faults: 10,
            gap: (Duration::from_secs(5), Duration::from_secs(25)),
            hold: (Duration::from_secs(5), Duration::from_secs(30)),
            excluded: Vec::new(),
        }
    }
}

impl ScheduleConfig {
    /// `make test`'s run: 6 faults (of 6 kinds), drawn as before `ForgedWorker` existed (the
    /// copied-worker scenario tries a forged worker in `make test`).
    pub fn make_test() -> Self {
        ScheduleConfig {
            faults: 6,
            excluded: vec![FaultKind::ForgedWorker],
            ..ScheduleConfig::default()
        }
    }
}

/// A seeded schedule of faults, ordered by injection time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    pub seed: u64,
    pub faults: Vec<Fault>,
}

impl Schedule {
    /// The schedule of `seed`. Kinds are drawn from shuffled rounds of every allowed kind, so
    /// any `n` consecutive faults with `n` at most the number of kinds are of `n` kinds.
    pub fn generate(seed: u64, config: &ScheduleConfig) -> Schedule {
        let mut rng = fastrand::Rng::with_seed(seed);
        let kinds: Vec<FaultKind> = FaultKind::ALL
            .into_iter()
            .filter(|k| !config.excluded.contains(k))
            .collect();
        let mut faults: Vec<Fault> = Vec::with_capacity(config.faults);
        let mut round: Vec<FaultKind> = Vec::new();
        let mut at = Duration::ZERO;
        while faults.len() < config.faults && !kinds.is_empty() {
            if round.is_empty() {
                round = kinds.clone();
                rng.shuffle(&mut round);
            }
            let Some(kind) = round.pop() else { break };
            at += draw(&mut rng, config.gap);
            // A fault waits for the last one on its resource to be undone.
            let free = faults
                .iter()
                .filter(|f| f.kind.shares_a_resource(kind))
                .map(Fault::ends)
                .max()
                .unwrap_or(Duration::ZERO);
            at = at.max(free + config.gap.0);
            let hold = if kind.is_undone() {
                draw(&mut rng, config.hold)
            } else {
                Duration::ZERO
            };
            faults.push(Fault { at, kind, hold });
        }
        Schedule { seed, faults }
    }

    /// When the last fault has been undone.
    pub fn ends(&self) -> Duration {
        self.faults
            .iter()
            .map(Fault::ends)
            .max()
            .unwrap_or(Duration::ZERO)
    }

    /// How many faults of each kind, in [`FaultKind::ALL`] order (kinds never drawn left out).
    pub fn counts(&self) -> Vec<(FaultKind, usize)> {
        FaultKind::ALL
            .into_iter()
            .map(|k| (k, self.faults.iter().filter(|f| f.kind == k).count()))
            .filter(|(_, n)| *n > 0)
            .collect()
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "chaos seed {} ({} faults)", self.seed, self.faults.len())?;
        for fault in &self.faults {
            write!(f, "  t+{:>4}s {}", fault.at.as_secs(), fault.kind)?;
            if !fault.hold.is_zero() {
                write!(f, " for {}s", fault.hold.as_secs())?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

/// A duration drawn uniformly from `[lo, hi]` at whole-second resolution.
fn draw(rng: &mut fastrand::Rng, (lo, hi): (Duration, Duration)) -> Duration {
    let (lo, hi) = (lo.as_secs(), hi.as_secs().max(lo.as_secs()));
    Duration::from_secs(rng.u64(lo..=hi))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// Seed 9 at a960525: a `TerminationTaint` due while the job was suspended waited 90 s for
    /// a worker, and the suspend's undo waited behind it.
    #[test]
    fn a_fault_aimed_at_a_worker_waits_for_a_suspended_job_to_resume() {
        use FaultKind::*;
        assert!(TerminationTaint.waits_for(SuspendResume));
        assert!(DeleteWorkerPod.waits_for(SuspendResume));
        assert!(LoseNode2.waits_for(PartitionNode2), "one resource");
        assert!(!GpuUnhealthy.waits_for(SuspendResume));
        assert!(!TerminationTaint.waits_for(LoseNode2));
        assert!(!SuspendResume.waits_for(TerminationTaint));
    }

    /// `make test`'s seed has a genuine failure among its faults, while the API is slow and
    /// away from other restarts, beside a lost or partitioned node and a control-plane fault.
    #[test]
    fn the_seed_of_make_test_has_a_genuine_failure_beside_node_and_control_plane_faults() {
        let s = Schedule::generate(MAKE_TEST_SEED, &ScheduleConfig::make_test());
        let kinds: HashSet<_> = s.faults.iter().map(|f| f.kind).collect();
        // The kinds docs/reliability.md names, drawn as before `ForgedWorker` existed.
        let named = HashSet::from([
            FaultKind::TrainerFailure,
            FaultKind::ApiLatency,
            FaultKind::RestartEtcd,
            FaultKind::GpuUnhealthy,
            FaultKind::OperatorClockSkew,
            FaultKind::LoseNode2,
        ]);
        assert_eq!(kinds, named, "{s}");
        // The failure comes while the API is slow, away from every fault that restarts the
        // gang (run.rs, `failures_alone`): it must be counted as exactly one failure.
        let failure = s
            .faults
            .iter()
            .find(|f| f.kind == FaultKind::TrainerFailure);
        let failure = failure.unwrap_or_else(|| panic!("no TrainerFailure: {s}"));
        assert!(
            s.faults.iter().any(|f| f.kind == FaultKind::ApiLatency
                && f.at <= failure.at
                && f.ends() >= failure.at),
            "{s}"
        );
        assert!(
            !s.faults
                .iter()
                .any(|f| f.kind.restarts_the_gang() && near_a_restart(failure.at, f.at)),
            "{s}"
        );
        assert!(
            kinds.contains(&FaultKind::LoseNode2) || kinds.contains(&FaultKind::PartitionNode2),
            "{s}"
        );
        assert!(
            [
                FaultKind::RestartApiServer,
                FaultKind::RestartEtcd,
                FaultKind::SlowEtcdDisk
            ]
            .iter()
            .any(|k| kinds.contains(k)),
            "{s}"
        );
    }

    #[test]
    fn a_seed_replays_its_schedule_and_another_seed_differs() {
        let config = ScheduleConfig::default();
        let a = Schedule::generate(42, &config);
        assert_eq!(a, Schedule::generate(42, &config));
        assert_ne!(a.faults, Schedule::generate(43, &config).faults);
        assert_eq!(a.faults.len(), 10);
    }

    #[test]
    fn faults_on_one_resource_never_overlap_and_injections_are_in_order() {
        let config = ScheduleConfig {
            faults: 30,
            ..ScheduleConfig::default()
        };
        for seed in 0..500 {
            let s = Schedule::generate(seed, &config);
            for pair in s.faults.windows(2) {
                assert!(pair[0].at < pair[1].at, "seed {seed}: {s}");
            }
            for (i, a) in s.faults.iter().enumerate() {
                for b in &s.faults[i + 1..] {
                    if a.kind.shares_a_resource(b.kind) {
                        assert!(a.ends() < b.at, "seed {seed}: {a:?} overlaps {b:?}\n{s}");
                    }
                }
            }
        }
    }

    #[test]
    fn six_faults_are_of_six_kinds_and_excluded_kinds_are_never_drawn() {
        let config = ScheduleConfig {
            faults: 6,
            excluded: vec![FaultKind::LoseNode2],
            ..ScheduleConfig::default()
        };
        for seed in 0..200 {
            let s = Schedule::generate(seed, &config);
            let kinds: HashSet<_> = s.faults.iter().map(|f| f.kind).collect();
            assert_eq!(kinds.len(), 6, "seed {seed}: {s}");
            assert!(!kinds.contains(&FaultKind::LoseNode2), "seed {seed}: {s}");
        }
    }

    #[test]
    fn only_faults_that_are_undone_hold_and_every_hold_is_in_range() {
        let config = ScheduleConfig::default();
        for seed in 0..200 {
            for f in Schedule::generate(seed, &config).faults {
                if f.kind.is_undone() {
                    assert!(f.hold >= config.hold.0 && f.hold <= config.hold.1, "{f:?}");
                } else {
                    assert_eq!(f.hold, Duration::ZERO, "{f:?}");
                }
            }
        }
    }

    #[test]
    fn the_printed_schedule_names_the_seed_and_every_fault() {
        let s = Schedule::generate(7, &ScheduleConfig::default());
        let text = s.to_string();
        assert!(text.starts_with("chaos seed 7 (10 faults)"), "{text}");
        assert_eq!(text.lines().count(), 11, "{text}");
        let counted: usize = s.counts().iter().map(|(_, n)| n).sum();
        assert_eq!(counted, 10);
    }
}
