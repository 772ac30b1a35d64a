//! `spot.fallback: Cost`: whether spot still pays, judged from the goodput ledger each time
//! the first pods of an attempt are placed, the same point where the count rule acts.
//!
//! Spot pays while the job's spot GPU time has cost no more per useful GPU-hour than the
//! same product on on-demand nodes:
//!
//! ```text
//! spot price × charged spot GPU time / useful spot GPU time  ≤  on-demand price
//! ```
//!
//! over the whole job so far (`status.ledger.spot`). Charged is every spot bucket but
//! `pending` (no GPU is held yet), as the ledger's money counts them. Useful is `useful`
//! plus `recomputeUnknown`: the running time of attempts whose loss the operator cannot tell
//! (trainers that report no progress) counts as kept, so the job leaves spot only on
//! evidence that spot lost money. No useful spot time after charged spot time is an
//! unbounded cost. Both prices are those of the product of the attempt that just ended (the
//! open stretch's, else `selectedGpu`'s), from the operator's price table; a product
//! without both prices is never judged by cost, and the job stays on spot.
//!
//! The rule judges only once a preemption has been counted and some spot time charged:
//! before that the ledger holds nothing that spot risks and on-demand would not. Once spot
//! no longer pays, the condition `SpotFallback` (True, `SpotNoLongerPays`) records it and
//! every later attempt runs on on-demand nodes, whatever the ledger or the prices say later.

use super::round::Round;
use super::view::View;
use crate::config::OperatorConfig;
use crate::model::condition::{self, condition_is_true};
use crate::model::crd::{GoodputLedger, SpotFallback, SpotPolicy, TrainingJobStatus};
use crate::model::events::JobEvent;
use crate::model::ledger::micro_dollars_per_hour;
use crate::model::placement::SpotHistory;
use crate::model::reason;

/// What the cost rule finds when an attempt is placed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SpotVerdict {
    /// Not judged: no preemption counted yet, or no spot time charged.
    TooEarly,
    /// The product (empty when not known) lacks a spot or an on-demand price: cost decides
    /// nothing.
    Unpriced(String),
    /// Spot costs no more per useful GPU-hour than on-demand.
    Pays(SpotCost),
    /// Spot costs more per useful GPU-hour than on-demand: later attempts leave it.
    NoLongerPays(SpotCost),
}

/// The figures of a judgement, in micro-dollars and GPU-milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpotCost {
    /// Spot's cost per useful GPU-hour; None when no spot time was useful (unbounded).
    pub per_useful_hour: Option<u64>,
    /// The on-demand price per GPU-hour.
    pub on_demand: u64,
    /// Spot GPU time charged.
    pub charged: u64,
    /// Spot GPU time that counts as useful here (`useful` + `recomputeUnknown`).
    pub useful: u64,
}

/// Judges spot from the ledger, the preemptions counted and the prices of `product`.
pub fn judge(
    ledger: &GoodputLedger,
    preemptions: u32,
    product: &str,
    config: &OperatorConfig,
) -> SpotVerdict {
    let spot = &ledger.spot;
    let charged = spot.total().saturating_sub(spot.pending);
    if preemptions == 0 || charged == 0 {
        return SpotVerdict::TooEarly;
    }
    let prices = (
        micro_dollars_per_hour(config, product, true),
        micro_dollars_per_hour(config, product, false),
    );
    let (Some(spot_price), Some(on_demand)) = prices else {
        return SpotVerdict::Unpriced(product.to_owned());
    };
    let useful = spot.useful.saturating_add(spot.recompute_unknown);
    let spent = u128::from(spot_price) * u128::from(charged);
    let per_useful_hour = match (spot_price, useful) {
        (0, _) => Some(0),
        (_, 0) => None,
        (_, useful) => Some(u64::try_from(spent / u128::from(useful)).unwrap_or(u64::MAX)),
    };
    let cost = SpotCost {
        per_useful_hour,
        on_demand,
        charged,
        useful,
    };
    // Cross-multiplied, exact: spot × charged / useful > on-demand.
    if spent > u128::from(on_demand) * u128::from(useful) {
        SpotVerdict::NoLongerPays(cost)
    } else {
        SpotVerdict::Pays(cost)
    }
}

/// The spot history the placement reads from a status.
pub(super) fn history(st: &TrainingJobStatus) -> SpotHistory {
    SpotHistory {
        preemptions: st.preemptions,
        no_longer_pays: condition_is_true(&st.conditions, condition::SPOT_FALLBACK),
    }
}

/// Judges spot for the attempt whose first pods this round places, when the job has
/// `fallback: Cost`, may use spot and has not left it, and records the verdict in the
/// condition `SpotFallback`: True with the Event `SpotNoLongerPays` when spot no longer pays,
/// False (`SpotPays`, `SpotUnpriced`) otherwise; nothing before the rule judges.
pub(super) fn judge_next_attempt(view: &View<'_>, round: &mut Round) {
    let spot = &view.job.spec.spot;
    if spot.fallback != SpotFallback::Cost
        || spot.policy == SpotPolicy::Never
        || history(&round.st).no_longer_pays
    {
        return;
    }
    let Some(ledger) = round.st.ledger.as_ref() else {
        return;
    };
    let product = ledger
        .open
        .as_ref()
        .map(|o| o.product.clone())
        .filter(|p| !p.is_empty())
        .or_else(|| round.st.selected_gpu.as_ref().map(|s| s.product.clone()))
        .unwrap_or_default();
    let preemptions = round.st.preemptions;
    let verdict = judge(ledger, preemptions, &product, view.config);
    let message = verdict.message(preemptions);
    let (left, reason) = match verdict {
        SpotVerdict::TooEarly => return,
        SpotVerdict::Unpriced(_) => (false, reason::SPOT_UNPRICED),
        SpotVerdict::Pays(_) => (false, reason::SPOT_PAYS),
        SpotVerdict::NoLongerPays(_) => (true, reason::SPOT_NO_LONGER_PAYS),
    };
    if left {
        round.events.push(JobEvent::normal(
            reason::SPOT_NO_LONGER_PAYS,
            message.clone(),
        ));
    }
    round.condition(view, condition::SPOT_FALLBACK, left, reason, &message);
}

/// Why an unpriced product is not judged.
fn unpriced(product: &str) -> String {
    let which = match product {
        "" => "the attempt's GPU product is not known".to_owned(),
        p => format!("the operator's price table does not price {p}"),
    };
    format!("{which}: the Cost fallback cannot judge spot, which the job keeps using")
}

impl SpotVerdict {
    /// What the condition `SpotFallback` and the Event `SpotNoLongerPays` say of it: `spot
    /// cost $X per useful GPU-hour > on-demand $Y` (or `<=`), with the figures behind it.
    pub fn message(&self, preemptions: u32) -> String {
        let (cost, sign, then) = match self {
            SpotVerdict::TooEarly => {
                return "not judged before a preemption and charged spot time".to_owned();
            }
            SpotVerdict::Unpriced(product) => return unpriced(product),
            SpotVerdict::Pays(cost) => (cost, "<=", "spot still pays"),
            SpotVerdict::NoLongerPays(cost) => (cost, ">", "later attempts run on on-demand nodes"),
        };
        let (x, y) = match cost.per_useful_hour {
            None => ("∞".to_owned(), dollars(cost.on_demand, 2)),
            Some(x) => {
                // Cents that read the same would hide the comparison: show more digits.
                let places = if cents(x) == cents(cost.on_demand) {
                    4
                } else {
                    2
                };
                (dollars(x, places), dollars(cost.on_demand, places))
            }
        };
        format!(
            "spot cost ${x} per useful GPU-hour {sign} on-demand ${y}: {} of {} charged spot \
             GPU-seconds were useful, over {preemptions} preemption(s); {then}",
            seconds(cost.useful),
            seconds(cost.charged),
        )
    }
}

/// Micro-dollars rounded to cents.
fn cents(micro: u64) -> u64 {
    micro / 10_000 + u64::from(micro % 10_000 >= 5_000)
}

/// Micro-dollars as dollars with `places` decimals (at most 6), rounded half up.
fn dollars(micro: u64, places: u32) -> String {
    let places = places.min(6);
    let unit = 10u64.pow(6 - places);
    let scaled = micro / unit + u64::from(unit > 1 && micro % unit >= unit / 2);
    let per_dollar = 10u64.pow(places);
    format!(
        "{}.{:0width$}",
        scaled / per_dollar,
        scaled % per_dollar,
        width = places as usize
    )
}

/// GPU-milliseconds as GPU-seconds with one decimal, rounded down.
fn seconds(millis: u64) -> String {
    format!("{}.{}", millis / 1000, millis % 1000 / 100)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PriceEntry;
    use crate::model::crd::GpuMillis;

    /// A ledger whose spot side holds `useful`, `lost` (to recompute) and `unknown` seconds
    /// of one GPU, with 30 s pending.
    fn spot_ledger(useful: u64, lost: u64, unknown: u64) -> GoodputLedger {
        GoodputLedger {
            spot: GpuMillis {
                useful: useful * 1000,
                lost_to_recompute: lost * 1000,
                recompute_unknown: unknown * 1000,
                pending: 30_000,
                ..GpuMillis::default()
            },
            ..GoodputLedger::default()
        }
    }

    /// T4 at $0.12 spot and $0.36 on-demand (the default table: spot pays up to 3×).
    fn config() -> OperatorConfig {
        OperatorConfig::default()
    }

    fn cost(v: &SpotVerdict) -> SpotCost {
        match v {
            SpotVerdict::Pays(c) | SpotVerdict::NoLongerPays(c) => *c,
            other => panic!("not judged: {other:?}"),
        }
    }

    #[test]
    fn spot_that_lost_more_than_on_demand_costs_no_longer_pays() {
        // 100 s useful, 250 s lost: $0.12 × 350 / 100 = $0.42 > $0.36.
        let v = judge(&spot_ledger(100, 250, 0), 2, "Tesla-T4", &config());
        assert!(matches!(v, SpotVerdict::NoLongerPays(_)), "{v:?}");
        let c = cost(&v);
        assert_eq!((c.per_useful_hour, c.on_demand), (Some(420_000), 360_000));
        assert_eq!(
            (c.charged, c.useful),
            (350_000, 100_000),
            "pending is not charged"
        );
        assert_eq!(
            v.message(2),
            "spot cost $0.42 per useful GPU-hour > on-demand $0.36: 100.0 of 350.0 charged \
             spot GPU-seconds were useful, over 2 preemption(s); later attempts run on \
             on-demand nodes"
        );
    }

    #[test]
    fn spot_that_lost_less_than_the_price_gap_keeps_paying() {
        // 100 s useful, 150 s lost: $0.12 × 250 / 100 = $0.30 <= $0.36.
        let v = judge(&spot_ledger(100, 150, 0), 5, "Tesla-T4", &config());
        assert!(matches!(v, SpotVerdict::Pays(_)), "{v:?}");
        assert!(
            v.message(5)
                .starts_with("spot cost $0.30 per useful GPU-hour <= on-demand $0.36")
        );
        // Exactly the on-demand price still pays: 100 useful, 200 lost = 3×.
        let even = judge(&spot_ledger(100, 200, 0), 1, "Tesla-T4", &config());
        assert!(matches!(even, SpotVerdict::Pays(_)), "{even:?}");
        assert!(
            even.message(1)
                .contains("$0.3600 per useful GPU-hour <= on-demand $0.3600")
        );
    }

    #[test]
    fn a_product_without_prices_is_never_judged_by_cost() {
        let lost = spot_ledger(0, 500, 0);
        assert_eq!(
            judge(&lost, 3, "Radeon-MI300X", &config()),
            SpotVerdict::Unpriced("Radeon-MI300X".to_owned())
        );
        assert_eq!(
            judge(&lost, 3, "", &config()),
            SpotVerdict::Unpriced(String::new())
        );
        assert!(unpriced("").contains("not known"));
    }

    #[test]
    fn nothing_is_judged_before_a_preemption_or_charged_spot_time() {
        let lost = spot_ledger(0, 500, 0);
        assert_eq!(
            judge(&lost, 0, "Tesla-T4", &config()),
            SpotVerdict::TooEarly
        );
        let only_pending = spot_ledger(0, 0, 0);
        assert_eq!(only_pending.spot.pending, 30_000);
        assert_eq!(
            judge(&only_pending, 1, "Tesla-T4", &config()),
            SpotVerdict::TooEarly
        );
    }

    #[test]
    fn no_useful_spot_time_is_an_unbounded_cost() {
        let v = judge(&spot_ledger(0, 5, 0), 1, "Tesla-T4", &config());
        assert!(matches!(v, SpotVerdict::NoLongerPays(_)), "{v:?}");
        assert_eq!(cost(&v).per_useful_hour, None);
        assert!(
            v.message(1)
                .starts_with("spot cost $∞ per useful GPU-hour > on-demand $0.36: 0.0 of 5.0"),
            "{}",
            v.message(1)
        );
    }

    #[test]
    fn running_time_of_unknown_loss_counts_as_useful() {
        // 50 s known useful + 100 s unknown, 250 s lost: $0.12 × 400 / 150 = $0.32.
        let v = judge(&spot_ledger(50, 250, 100), 2, "Tesla-T4", &config());
        assert!(matches!(v, SpotVerdict::Pays(_)), "{v:?}");
        assert_eq!(cost(&v).useful, 150_000);
    }

    #[test]
    fn free_spot_always_pays_and_near_prices_show_four_decimals() {
        let free = OperatorConfig {
            prices: vec![PriceEntry {
                match_: "T4".to_owned(),
                spot: 0.0,
                on_demand: Some(0.36),
            }],
            ..OperatorConfig::default()
        };
        let v = judge(&spot_ledger(0, 100, 0), 4, "Tesla-T4", &free);
        assert_eq!(cost(&v).per_useful_hour, Some(0));
        assert!(matches!(v, SpotVerdict::Pays(_)), "{v:?}");
        let near = OperatorConfig {
            prices: vec![PriceEntry {
                match_: "T4".to_owned(),
                spot: 0.3,
                on_demand: Some(0.36),
            }],
            ..OperatorConfig::default()
        };
        // $0.30 × 1201 / 1000 = $0.3603 > $0.36.
        let v = judge(&spot_ledger(1000, 201, 0), 2, "Tesla-T4", &near);
        assert!(matches!(v, SpotVerdict::NoLongerPays(_)), "{v:?}");
        assert!(
            v.message(2)
                .starts_with("spot cost $0.3603 per useful GPU-hour > on-demand $0.3600"),
            "{}",
            v.message(2)
        );
    }

    #[test]
    fn dollars_round_half_up() {
        assert_eq!(dollars(125_000, 2), "0.13");
        assert_eq!(dollars(124_999, 2), "0.12");
        assert_eq!(dollars(3_600_050, 4), "3.6001");
        assert_eq!(dollars(1, 6), "0.000001");
        assert_eq!(
            dollars(1, 9),
            "0.000001",
            "no more places than micro-dollars hold"
        );
        assert_eq!(seconds(1_999), "1.9");
    }
}
