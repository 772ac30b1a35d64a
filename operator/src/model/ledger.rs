//! The goodput ledger's arithmetic (`status.ledger`): where a job's GPU time went and what it
//! cost, folded in stretch by stretch.
//!
//! A job's life, as the ledger sees it, is a chain of stretches, one open at a time
//! ([`LedgerStretch`]): `Pending` from the first pods' creation to every worker running,
//! `Running` until the attempt ends, `Restarting` from a gang restart's decision to the next
//! attempt running. When a stretch ends, [`end`] or [`running`] adds its wall time × the
//! attempt's GPUs to the buckets of [`GpuMillis`], split by capacity type, and its price to
//! [`LedgerCost`](crate::model::crd::LedgerCost). The ledger is folded from the status (the open
//! stretch, its start, its GPUs) and what the round that ends it observes, never from pods
//! that are gone: the status is the record, so an operator restart or a leader change
//! mid-attempt loses nothing.
//!
//! Everything is integer: GPU-milliseconds, and micro-dollars from a price converted once per
//! stretch to micro-dollars per GPU-hour. A stretch's cost is rounded down to the micro-dollar,
//! so the sums never drift.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::config::OperatorConfig;
use crate::model::crd::{
    ElasticLedger, GoodputLedger, GpuMillis, LedgerStretch, MAX_LEDGER, MAX_LEDGER_SIZES,
    RestartReason, SizeMillis, StretchUse,
};

/// Milliseconds in an hour: prices are per GPU-hour.
const MILLIS_PER_HOUR: u128 = 3_600_000;

/// How a stretch of the job's life ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// A gang restart for this reason (never `Resume`: a suspend ends the stretch before).
    Restart(RestartReason),
    /// `spec.suspend` became true: the pods are deleted, the next attempt resumes from the
    /// checkpoint.
    Suspended,
    /// Every trainer exited 0: the whole running time was useful.
    Succeeded,
    /// The job failed for good (a budget, the deadline, the attempt limit).
    Failed,
}

/// The running time (per GPU) an attempt's end lost: work the checkpoint does not hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loss {
    /// This many milliseconds of the attempt's running time.
    Known(u64),
    /// No checkpoint and no step time known: the running time is `recomputeUnknown`.
    Unknown,
}

/// What the ledger knows of an attempt's progress when it ends: the trainers' reports, as
/// the status records them and the operator's progress store adds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// The step the attempt started from (its `resumedFrom`, else 0).
    pub start_step: u64,
    /// The highest step reported, and when it was first reached (absent without reports, or
    /// when only the status is left: the time is not recorded there).
    pub step: Option<(u64, Timestamp)>,
    /// The latest checkpoint the attempt reported: its step and when it was reported.
    pub checkpoint: Option<(u64, Timestamp)>,
}

/// The work an attempt that ran from `since` and was interrupted at `interrupted` lost.
///
/// With a measured step time (the attempt's steps since `start_step` over the time they took
/// from `since`): the steps past the last checkpoint × that step time, plus the time since the
/// last step. Without one, the time since the checkpoint the operator knows of. Without a
/// checkpoint either: unknown. Never more than the running time.
pub fn recompute_loss(since: Timestamp, interrupted: Timestamp, p: &Progress) -> Loss {
    let span = millis_between(since, interrupted);
    let saved = p
        .checkpoint
        .map_or(p.start_step, |(step, _)| step.max(p.start_step));
    if let Some((step, reached)) = p.step
        && step > p.start_step
        && reached > since
    {
        let took = millis_between(since, reached.min(interrupted));
        let step_millis = took / (step - p.start_step);
        let lost = (step.saturating_sub(saved))
            .saturating_mul(step_millis)
            .saturating_add(millis_between(reached, interrupted));
        return Loss::Known(lost.min(span));
    }
    match p.checkpoint {
        Some((_, at)) => Loss::Known(millis_between(at.max(since), interrupted).min(span)),
        None => Loss::Unknown,
    }
}

/// Opens a `Pending` stretch at `now` for the attempt's GPUs as planned (`stretch.since` is
/// ignored), unless a stretch is open (the `Restarting` one a gang restart opened counts the
/// wait for the next attempt).
pub fn pending(ledger: &mut GoodputLedger, now: Timestamp, stretch: LedgerStretch) {
    close_queued(ledger, now);
    if ledger.open.is_some() {
        return;
    }
    ledger.open = Some(LedgerStretch {
        use_: StretchUse::Pending,
        since: Time(now),
        ..stretch
    });
}

/// The job waits for Kueue's admission from `now`, no pod created: a `Queued` stretch opens,
/// unless one is open already (a restart's or a pending attempt's stays what it is).
pub fn queued(ledger: &mut GoodputLedger, now: Timestamp, attempt: u32) {
    if ledger.open.is_some() {
        return;
    }
    ledger.open = Some(LedgerStretch {
        use_: StretchUse::Queued,
        since: Time(now),
        attempt,
        spot_gpus: 0,
        on_demand_gpus: 0,
        product: String::new(),
        size: None,
    });
}

/// Closes an open `Queued` stretch at `now` into `queuedMillis`.
fn close_queued(ledger: &mut GoodputLedger, now: Timestamp) {
    if ledger
        .open
        .as_ref()
        .is_some_and(|o| o.use_ == StretchUse::Queued)
        && let Some(open) = ledger.open.take()
    {
        let wall = millis_between(open.since.0, now);
        ledger.queued_millis = ledger.queued_millis.saturating_add(wall).min(MAX_LEDGER);
    }
}

/// Every worker of the attempt runs from `now`: the open `Pending` or `Restarting` stretch is
/// counted, and a `Running` one opens with the GPUs as placed (`stretch.since` is ignored).
/// An open `Running` stretch is left as it is. A `Pending` stretch is counted on the nodes its
/// pods waited for, as placed now, not as planned (a spot `Prefer` job's worker may land on an
/// on-demand node); a `Restarting` one keeps the GPUs of the attempt that was lost.
pub fn running(
    ledger: &mut GoodputLedger,
    now: Timestamp,
    stretch: LedgerStretch,
    config: &OperatorConfig,
) {
    if ledger
        .open
        .as_ref()
        .is_some_and(|o| o.use_ == StretchUse::Running)
    {
        return;
    }
    close_queued(ledger, now);
    if let Some(open) = ledger
        .open
        .as_mut()
        .filter(|o| o.use_ == StretchUse::Pending)
    {
        open.spot_gpus = stretch.spot_gpus;
        open.on_demand_gpus = stretch.on_demand_gpus;
        open.product.clone_from(&stretch.product);
    }
    close_waiting(ledger, now, config);
    ledger.open = Some(LedgerStretch {
        use_: StretchUse::Running,
        since: Time(now),
        ..stretch
    });
    settle(ledger);
}

/// The open stretch ends with `ending`, decided at `decided`; a worker's interruption seen
/// at `interrupted` (clamped into the stretch) makes the time until the decision
/// `lostToDetection`. A `Running` stretch is split into useful time and `loss`; a waiting one
/// counts whole. A gang restart opens a `Restarting` stretch at `decided` with the same GPUs.
pub fn end(
    ledger: &mut GoodputLedger,
    ending: Ending,
    interrupted: Timestamp,
    decided: Timestamp,
    loss: Loss,
    config: &OperatorConfig,
) {
    let Some(open) = ledger.open.clone() else {
        return;
    };
    if open.use_ == StretchUse::Running {
        let since = open.since.0;
        let interrupted = interrupted.clamp(since, decided.max(since));
        let span = millis_between(since, interrupted);
        let mut per_gpu = GpuMillis::default();
        match (ending, loss) {
            (Ending::Succeeded, _) => per_gpu.useful = span,
            (_, Loss::Unknown) => per_gpu.recompute_unknown = span,
            (_, Loss::Known(lost)) => {
                let lost = lost.min(span);
                per_gpu.useful = span - lost;
                *loss_bucket(&mut per_gpu, ending) = lost;
            }
        }
        per_gpu.lost_to_detection = millis_between(interrupted, decided);
        charge(ledger, &open, &per_gpu, config);
        count_size(ledger, &open, span, config);
    } else {
        close_waiting(ledger, decided, config);
    }
    ledger.open = match ending {
        // Released for want of room: the wait for the next try is waiting for nodes, as
        // before the release.
        Ending::Restart(RestartReason::Requeue) => Some(LedgerStretch {
            use_: StretchUse::Pending,
            since: Time(decided),
            ..open
        }),
        Ending::Restart(_) => Some(LedgerStretch {
            use_: StretchUse::Restarting,
            since: Time(decided),
            ..open
        }),
        _ => None,
    };
    settle(ledger);
}

/// An elastic attempt's `Running` stretch of `span` wall milliseconds, counted by its size in
/// `ledger.elastic`; when it ran shrunk, with its cost and what every worker on on-demand
/// nodes would have cost for as long.
fn count_size(
    ledger: &mut GoodputLedger,
    stretch: &LedgerStretch,
    span: u64,
    config: &OperatorConfig,
) {
    let Some(size) = stretch.size.filter(|s| s.workers > 0) else {
        return;
    };
    let gpus = u64::from(stretch.spot_gpus) + u64::from(stretch.on_demand_gpus);
    let elastic = ledger.elastic.get_or_insert_with(ElasticLedger::default);
    let at = match elastic
        .by_workers
        .binary_search_by_key(&(size.workers, size.of), |s| (s.workers, s.of))
    {
        Ok(at) => at,
        // Full: the nearest listed size takes it, so the status stays within its schema.
        Err(at) if elastic.by_workers.len() >= MAX_LEDGER_SIZES => {
            nearest(&elastic.by_workers, at, size.workers)
        }
        Err(at) => {
            elastic.by_workers.insert(
                at,
                SizeMillis {
                    workers: size.workers,
                    of: size.of,
                    ..SizeMillis::default()
                },
            );
            at
        }
    };
    let entry = &mut elastic.by_workers[at];
    entry.wall_millis = entry.wall_millis.saturating_add(span).min(MAX_LEDGER);
    let gpu_millis = span.saturating_mul(gpus);
    entry.gpu_millis = entry.gpu_millis.saturating_add(gpu_millis).min(MAX_LEDGER);
    if size.workers >= size.of {
        return;
    }
    for (spot, gpus) in [(true, stretch.spot_gpus), (false, stretch.on_demand_gpus)] {
        if let Some(price) = micro_dollars_per_hour(config, &stretch.product, spot) {
            let cost = price_of(span.saturating_mul(u64::from(gpus)), price);
            elastic.shrunk_micro_dollars = elastic.shrunk_micro_dollars.saturating_add(cost);
        }
    }
    if let Some(price) = micro_dollars_per_hour(config, &stretch.product, false) {
        let full_gpus = gpus / u64::from(size.workers) * u64::from(size.of);
        let cost = price_of(span.saturating_mul(full_gpus), price);
        elastic.on_demand_instead_micro_dollars = elastic
            .on_demand_instead_micro_dollars
            .saturating_add(cost)
            .min(MAX_LEDGER);
    }
    elastic.shrunk_micro_dollars = elastic.shrunk_micro_dollars.min(MAX_LEDGER);
}

/// Of the listed sizes around insertion point `at`, the one whose worker count is nearest
/// `workers` (the smaller on a tie).
fn nearest(sizes: &[SizeMillis], at: usize, workers: u32) -> usize {
    let below = at.checked_sub(1);
    let above = (at < sizes.len()).then_some(at);
    match (below, above) {
        (Some(b), Some(a)) => {
            let gap = |i: usize| sizes[i].workers.abs_diff(workers);
            if gap(a) < gap(b) { a } else { b }
        }
        (Some(b), None) => b,
        (None, a) => a.unwrap_or(0),
    }
}

/// The bucket the lost work of an attempt ending so goes to.
fn loss_bucket(per_gpu: &mut GpuMillis, ending: Ending) -> &mut u64 {
    match ending {
        Ending::Restart(RestartReason::Failure) | Ending::Failed => &mut per_gpu.failed_attempts,
        Ending::Restart(RestartReason::Hang) => &mut per_gpu.hangs,
        Ending::Restart(
            RestartReason::Preemption
            | RestartReason::Resume
            | RestartReason::Shrink
            | RestartReason::Grow
            | RestartReason::Requeue,
        )
        | Ending::Suspended
        | Ending::Succeeded => &mut per_gpu.lost_to_recompute,
    }
}

/// Counts an open `Pending` or `Restarting` stretch whole, up to `now`, and closes it.
fn close_waiting(ledger: &mut GoodputLedger, now: Timestamp, config: &OperatorConfig) {
    if ledger
        .open
        .as_ref()
        .is_some_and(|o| o.use_ == StretchUse::Queued)
    {
        close_queued(ledger, now);
        return;
    }
    let Some(open) = ledger.open.take() else {
        return;
    };
    let wall = millis_between(open.since.0, now);
    let per_gpu = match open.use_ {
        StretchUse::Queued => GpuMillis::default(),
        StretchUse::Pending => GpuMillis {
            pending: wall,
            ..GpuMillis::default()
        },
        StretchUse::Restarting => GpuMillis {
            lost_to_restart: wall,
            ..GpuMillis::default()
        },
        // A running stretch is only ever ended by `end`; kept open otherwise.
        StretchUse::Running => {
            ledger.open = Some(open);
            return;
        }
    };
    charge(ledger, &open, &per_gpu, config);
}

/// Charges the GPUs a replacement created ahead of a termination notice held, from `since` to
/// `until`, as `heldForNotice` (`held`: its GPUs by capacity type and product, as a stretch).
pub fn held_for_notice(
    ledger: &mut GoodputLedger,
    held: &LedgerStretch,
    until: Timestamp,
    config: &OperatorConfig,
) {
    let per_gpu = GpuMillis {
        held_for_notice: millis_between(held.since.0, until),
        ..GpuMillis::default()
    };
    charge(ledger, held, &per_gpu, config);
    settle(ledger);
}

/// Adds `per_gpu` × the stretch's GPUs of each capacity type to the buckets, and its price to
/// the cost (every bucket but `pending`).
fn charge(
    ledger: &mut GoodputLedger,
    stretch: &LedgerStretch,
    per_gpu: &GpuMillis,
    config: &OperatorConfig,
) {
    let on_demand_price = micro_dollars_per_hour(config, &stretch.product, false);
    for (spot, gpus) in [(true, stretch.spot_gpus), (false, stretch.on_demand_gpus)] {
        if gpus == 0 {
            continue;
        }
        let added = times(per_gpu, u64::from(gpus));
        let charged = added.total().saturating_sub(added.pending);
        let bucket = if spot {
            &mut ledger.spot
        } else {
            &mut ledger.on_demand
        };
        add(bucket, &added);
        let cost = &mut ledger.micro_dollars;
        match micro_dollars_per_hour(config, &stretch.product, spot) {
            Some(price) => cost.spent = cost.spent.saturating_add(price_of(charged, price)),
            None => {
                ledger.unpriced_gpu_millis = ledger.unpriced_gpu_millis.saturating_add(charged);
            }
        }
        if let Some(price) = on_demand_price {
            cost.on_demand_equivalent = cost
                .on_demand_equivalent
                .saturating_add(price_of(added.useful, price));
        }
    }
}

/// The price of `product` on the capacity type, in micro-dollars per GPU-hour; None when the
/// table has none (or the product is not known).
pub fn micro_dollars_per_hour(config: &OperatorConfig, product: &str, spot: bool) -> Option<u64> {
    if product.is_empty() {
        return None;
    }
    let dollars = config.price(product, spot)?;
    let micro = (dollars * 1_000_000.0).round();
    // The config check keeps prices finite and non-negative; a price past u64 is no price.
    (micro.is_finite() && (0.0..=u64::MAX as f64).contains(&micro)).then_some(micro as u64)
}

/// `gpu_millis` at `price` micro-dollars per GPU-hour, rounded down.
fn price_of(gpu_millis: u64, price: u64) -> u64 {
    let micro = u128::from(gpu_millis) * u128::from(price) / MILLIS_PER_HOUR;
    u64::try_from(micro).unwrap_or(u64::MAX)
}

/// Holds every count within [`MAX_LEDGER`] (the schema's bound) and recomputes what derives
/// from the integers: saved, goodput and the display strings.
pub fn settle(ledger: &mut GoodputLedger) {
    ledger.spot = times(&ledger.spot, 1);
    ledger.on_demand = times(&ledger.on_demand, 1);
    let cost = &mut ledger.micro_dollars;
    cost.spent = cost.spent.min(MAX_LEDGER);
    cost.on_demand_equivalent = cost.on_demand_equivalent.min(MAX_LEDGER);
    ledger.unpriced_gpu_millis = ledger.unpriced_gpu_millis.min(MAX_LEDGER);
    let saved = i128::from(cost.on_demand_equivalent) - i128::from(cost.spent);
    cost.saved = i64::try_from(saved).unwrap_or(if saved < 0 { i64::MIN } else { i64::MAX });
    let total = u128::from(ledger.spot.total()) + u128::from(ledger.on_demand.total());
    let useful = u128::from(ledger.spot.useful) + u128::from(ledger.on_demand.useful);
    ledger.goodput_permille = (total > 0)
        .then(|| u32::try_from(useful * 1000 / total).unwrap_or(1000))
        .map(|p| p.min(1000));
    ledger.goodput = ledger
        .goodput_permille
        .map(|p| format!("{}.{}%", p / 10, p % 10))
        .unwrap_or_default();
    let cents = (u128::from(ledger.micro_dollars.spent) + 5_000) / 10_000;
    ledger.cost = format!("${}.{:02}", cents / 100, cents % 100);
}

/// Wall milliseconds from `from` to `to`, 0 when `to` is not later.
pub fn millis_between(from: Timestamp, to: Timestamp) -> u64 {
    let ms = to.duration_since(from).as_millis();
    u64::try_from(ms.max(0)).unwrap_or(u64::MAX)
}

/// `per_gpu` × `gpus`, each bucket held within [`MAX_LEDGER`].
fn times(per_gpu: &GpuMillis, gpus: u64) -> GpuMillis {
    let m = |v: u64| v.saturating_mul(gpus).min(MAX_LEDGER);
    GpuMillis {
        useful: m(per_gpu.useful),
        lost_to_recompute: m(per_gpu.lost_to_recompute),
        lost_to_detection: m(per_gpu.lost_to_detection),
        lost_to_restart: m(per_gpu.lost_to_restart),
        pending: m(per_gpu.pending),
        failed_attempts: m(per_gpu.failed_attempts),
        hangs: m(per_gpu.hangs),
        recompute_unknown: m(per_gpu.recompute_unknown),
        held_for_notice: m(per_gpu.held_for_notice),
    }
}

fn add(into: &mut GpuMillis, more: &GpuMillis) {
    let pairs = [
        (&mut into.useful, more.useful),
        (&mut into.lost_to_recompute, more.lost_to_recompute),
        (&mut into.lost_to_detection, more.lost_to_detection),
        (&mut into.lost_to_restart, more.lost_to_restart),
        (&mut into.pending, more.pending),
        (&mut into.failed_attempts, more.failed_attempts),
        (&mut into.hangs, more.hangs),
        (&mut into.recompute_unknown, more.recompute_unknown),
        (&mut into.held_for_notice, more.held_for_notice),
    ];
    for (bucket, added) in pairs {
        *bucket = bucket.saturating_add(added).min(MAX_LEDGER);
    }
}

#[cfg(test)]
mod tests;
