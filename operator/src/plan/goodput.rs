//! The goodput ledger's part of a round: at each transition the round decides (the first
//! pods created, every worker running, a gang restart, success, failure, a suspend), the
//! stretch it ends is folded into `status.ledger` ([`crate::model::ledger`]) from the status and
//! this round's observation. Rounds without a transition leave the ledger as it is, so it
//! costs no status write of its own.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::round::Round;
use super::view::View;
use crate::model::cached_pod::CachedPod;
use crate::model::crd::{GangSize, GoodputLedger, LedgerStretch, Phase, RestartReason, StretchUse};
use crate::model::ledger::{self, Ending, Loss, Progress};
use crate::model::preemption::{NodeView, WorkerState, trainer_status};
use k8s_openapi::api::core::v1::ContainerState;
use trainyard_api::gpu_labels::LABEL_GPU_PRODUCT;

/// Folds this round's transitions into `round.st.ledger`. Jobs without GPUs keep none.
pub(super) fn fold(view: &View<'_>, round: &mut Round) {
    if view.job.spec.gpus_per_worker == 0 {
        return;
    }
    let mut l = round.st.ledger.clone().unwrap_or_default();
    if let Some(ending) = ending(view, round) {
        let (interrupted, loss) = what_the_end_lost(view, round, &l, ending);
        let decided = match ending {
            // The work is over, and the GPUs free, once the last trainer has exited.
            Ending::Succeeded => interrupted,
            _ => now(view),
        };
        ledger::end(&mut l, ending, interrupted, decided, loss, view.config);
    }
    // Kueue has not admitted the job and no pod exists: the wait is queued time.
    let awaits_admission = round
        .st
        .conditions
        .iter()
        .any(|c| c.type_ == crate::model::condition::ADMITTED && c.status == "False");
    if awaits_admission && view.observed.pods.is_empty() && round.creates_attempt.is_none() {
        ledger::queued(&mut l, now(view), round.st.attempt);
    }
    if let Some(attempt) = round.creates_attempt {
        ledger::pending(&mut l, now(view), planned(view, round, attempt));
    }
    let runs = l
        .open
        .as_ref()
        .is_some_and(|o| o.use_ == StretchUse::Running);
    if round.st.phase == Some(Phase::Running) && !runs {
        let since = l.open.as_ref().map(|o| o.since.0);
        let started = last_trainer(view, since, |s| {
            Some(s.running.as_ref()?.started_at.as_ref()?.0)
        });
        ledger::running(&mut l, started, placed(view, round), view.config);
    }
    // Standbys let go of in this round: what they held for the notice.
    for pod in &round.released_standbys {
        if let Some(held) = held_for_notice(view, round, pod) {
            ledger::held_for_notice(&mut l, &held, now(view), view.config);
        }
    }
    if round.st.ledger.is_some() || l != GoodputLedger::default() {
        round.st.ledger = Some(l);
    }
}

/// The round's time, to the whole second ([`whole_second`]).
fn now(view: &View<'_>) -> Timestamp {
    whole_second(view.now)
}

/// A time to the whole second: the status keeps times to the second, so a boundary the
/// ledger draws reads back exactly as it was counted, and the next stretch starts where the
/// last one ended.
fn whole_second(t: Timestamp) -> Timestamp {
    Timestamp::from_second(t.as_second()).unwrap_or(t)
}

/// How the round ends the stretch under way, if it does.
fn ending(view: &View<'_>, round: &Round) -> Option<Ending> {
    if let Some(reason) = round.restart.filter(|r| *r != RestartReason::Resume) {
        return Some(Ending::Restart(reason));
    }
    let before = view.current.phase.unwrap_or(Phase::Pending);
    let after = round.st.phase.unwrap_or(Phase::Pending);
    if before == after {
        return None;
    }
    match after {
        Phase::Succeeded => Some(Ending::Succeeded),
        Phase::Failed => Some(Ending::Failed),
        Phase::Suspended => Some(Ending::Suspended),
        _ => None,
    }
}

/// When the ending attempt was interrupted, and the running time it lost.
fn what_the_end_lost(
    view: &View<'_>,
    round: &Round,
    l: &GoodputLedger,
    ending: Ending,
) -> (Timestamp, Loss) {
    let Some(open) = l.open.as_ref().filter(|o| o.use_ == StretchUse::Running) else {
        return (now(view), Loss::Known(0));
    };
    let interrupted = match ending {
        Ending::Restart(RestartReason::Preemption) => interrupted_at(view, true),
        Ending::Restart(RestartReason::Failure) | Ending::Failed => interrupted_at(view, false),
        Ending::Succeeded => last_trainer(view, Some(open.since.0), |s| {
            Some(s.terminated.as_ref()?.finished_at.as_ref()?.0)
        }),
        _ => now(view),
    };
    let loss = ledger::recompute_loss(open.since.0, interrupted, &progress(view, round, open));
    (interrupted, loss)
}

/// The earliest interruption among the workers of the ending attempt that were preempted or
/// failed (a trainer's end, a pod's DisruptionTarget condition, the last sign of life of a
/// node that is down, its kubelet silent or the Node NotReady:
/// [`super::view::Census::last_alive`]); now when nothing tells (a pod that vanished). For a
/// `preemption`, also the last sign of life of a down node under any worker: the lost-peer
/// rule takes a survivor's trainer, whose collective broke when that node went, for preempted
/// before the node's own ranks are judged, and the work stopped when the node did, not when
/// the collective noticed.
fn interrupted_at(view: &View<'_>, preemption: bool) -> Timestamp {
    let census = &view.census;
    let last_alive = |pod: &CachedPod| census.last_alive(view, pod.node_name()?);
    let down_nodes = census
        .current
        .values()
        .filter(|_| preemption)
        .filter_map(|pod| last_alive(pod));
    census
        .states
        .iter()
        .filter(|(_, s)| matches!(s, WorkerState::Preempted(_) | WorkerState::Failed(_)))
        .map(|(rank, _)| {
            census
                .current
                .get(rank)
                .and_then(|pod| pod_interrupted_at(pod).or_else(|| last_alive(pod)))
                .unwrap_or(now(view))
        })
        .chain(down_nodes)
        .min()
        .map_or(now(view), whole_second)
        .min(now(view))
}

/// When a pod was interrupted: marked for disruption or its trainer ended, whichever came
/// first.
fn pod_interrupted_at(pod: &CachedPod) -> Option<Timestamp> {
    let ended = trainer_state(pod)
        .and_then(|s| s.terminated.as_ref()?.finished_at.as_ref())
        .map(|t| t.0);
    let disrupted = pod.true_since("DisruptionTarget").map(|t| t.0);
    ended.into_iter().chain(disrupted).min()
}

/// The state of a pod's trainer container, as its status reports it.
fn trainer_state(pod: &CachedPod) -> Option<&ContainerState> {
    trainer_status(pod)?.state.as_ref()
}

/// When the last of the attempt's trainers started (every worker runs from then), or ended
/// (the attempt's work is over then): the latest such time among its pods, never after now
/// nor before `since`; now when no pod tells.
fn last_trainer(
    view: &View<'_>,
    since: Option<Timestamp>,
    time: impl Fn(&ContainerState) -> Option<Timestamp>,
) -> Timestamp {
    let latest = view
        .census
        .current
        .values()
        .filter_map(|pod| trainer_state(pod).and_then(&time))
        .max()
        .map_or(now(view), whole_second)
        .min(now(view));
    since.map_or(latest, |s| latest.max(s))
}

/// What the ledger knows of the ending attempt's progress: the status's record of it, and
/// the step reports of this operator's progress store when it holds the attempt's.
fn progress(view: &View<'_>, round: &Round, open: &LedgerStretch) -> Progress {
    let recorded = round
        .st
        .progress
        .as_ref()
        .filter(|p| p.attempt == open.attempt);
    let checkpoint =
        recorded.and_then(|p| Some((p.checkpoint_step?, p.checkpoint_time.as_ref()?.0)));
    let step = view
        .observed
        .progress
        .as_ref()
        .filter(|p| p.attempt == open.attempt)
        .and_then(|p| p.ranks.iter().max_by_key(|r| (r.step, r.advanced_at)))
        .map(|r| (r.step, r.advanced_at));
    Progress {
        start_step: recorded.and_then(|p| p.resumed_from).unwrap_or(0),
        step,
        checkpoint,
    }
}

/// The attempt's GPUs as placed for its first pods (the capacity type chosen, not known per
/// node yet).
fn planned(view: &View<'_>, round: &Round, attempt: u32) -> LedgerStretch {
    let gpus = view.workers.saturating_mul(view.job.spec.gpus_per_worker);
    let selected = round.st.selected_gpu.as_ref();
    let spot = selected.is_some_and(|s| s.spot);
    LedgerStretch {
        use_: StretchUse::Pending,
        since: Time(now(view)),
        attempt,
        spot_gpus: if spot { gpus } else { 0 },
        on_demand_gpus: if spot { 0 } else { gpus },
        product: selected.map(|s| s.product.clone()).unwrap_or_default(),
        size: view.job.spec.elastic.as_ref().map(|_| GangSize {
            workers: view.workers,
            of: view.job.spec.workers,
        }),
    }
}

/// The running attempt's GPUs by the capacity type of the node each worker runs on (a worker
/// whose node is not known counts as planned), and the product its first worker's node
/// carries (else the one selected).
fn placed(view: &View<'_>, round: &Round) -> LedgerStretch {
    let mut stretch = planned(view, round, round.st.attempt);
    let per_worker = view.job.spec.gpus_per_worker;
    let planned_spot = stretch.spot_gpus > 0;
    let (mut spot, mut on_demand, mut product) = (0u32, 0u32, None);
    for rank in 0..view.workers {
        let labels = view
            .census
            .current
            .get(&rank)
            .and_then(|p| node_labels(view, p));
        let on_spot = labels.map_or(planned_spot, |l| view.config.is_spot(l));
        let count = if on_spot { &mut spot } else { &mut on_demand };
        *count = count.saturating_add(per_worker);
        product = product.or_else(|| labels.and_then(|l| l.get(LABEL_GPU_PRODUCT)).cloned());
    }
    (stretch.spot_gpus, stretch.on_demand_gpus) = (spot, on_demand);
    if let Some(product) = product {
        stretch.product = product;
    }
    stretch
}

/// The labels of the node `pod` runs on, when the operator sees it.
fn node_labels<'v>(view: &'v View<'_>, pod: &'v CachedPod) -> Option<&'v BTreeMap<String, String>> {
    match view.observed.node_view(pod) {
        NodeView::Present(node) => node.metadata.labels.as_ref(),
        _ => None,
    }
}

/// What the standby `pod`, let go of in this round, held for its notice: one worker's GPUs by
/// its node's capacity type and product, from its scheduling (its `PodScheduled` condition,
/// else its creation) to the second. None while it had no node, which holds nothing.
fn held_for_notice(view: &View<'_>, round: &Round, pod: &CachedPod) -> Option<LedgerStretch> {
    pod.node_name()?;
    let scheduled = pod
        .true_since("PodScheduled")
        .or(pod.metadata.creation_timestamp.as_ref())?;
    let labels = node_labels(view, pod);
    let gpus = view.job.spec.gpus_per_worker;
    let spot = labels.is_some_and(|l| view.config.is_spot(l));
    let planned = planned(view, round, round.st.attempt);
    Some(LedgerStretch {
        since: Time(whole_second(scheduled.0)),
        spot_gpus: if spot { gpus } else { 0 },
        on_demand_gpus: if spot { 0 } else { gpus },
        product: labels
            .and_then(|l| l.get(LABEL_GPU_PRODUCT))
            .cloned()
            .unwrap_or(planned.product),
        size: None,
        ..planned
    })
}
