//! How many write requests may be in flight at once: a bound that follows the API server.
//!
//! A constant bound is wrong both ways: a small one keeps a burst of restarts waiting while
//! the API server could answer more, and none at all puts every write of a burst in front of
//! the server at once, each holding memory in the operator while it waits. [`AdaptiveLimit`]
//! learns the bound from the operator's own writes, additive increase and multiplicative
//! decrease (AIMD) over windows of answered writes:
//!
//! - a write throttled with 429 halves the bound at once;
//! - a window whose mean latency exceeds the target cuts it by a quarter: the server is
//!   queueing our writes, and more of them in flight would only wait longer;
//! - a window in which writes had to wait for a slot, answered within the target, raises it
//!   (by a quarter while the mean is under half the target, by one otherwise). A window in
//!   which no write waited leaves it alone, so that a quiet period does not inflate a bound
//!   that was never tried.
//!
//! Within a memory budget ([`LimitConfig::memory_budget`]): every request in flight holds
//! memory (about 35 kB: its connection's buffers, the body, the decoded answer), and a bound
//! wide enough for a burst among 100 jobs costs more than an operator of 1,000 jobs can spare
//! on top of its caches. So the resident set caps the limit: up to seven eighths of the budget
//! the ceiling ([`LimitConfig::max`]) is the cap, over the last eighth the cap falls in
//! proportion to the room left, down to the floor at the budget. A cap of the level, not of
//! its growth: the allocator keeps what it freed, so the resident set rarely shrinks, and a
//! limit cut at every window in which it grew a little (the caches grow as jobs come) would
//! sink to the floor and stay there.
//!
//! Pure: the clock and the memory reading are the caller's (the write gate, [`super::gate`],
//! feeds them).

use std::time::Duration;

/// Fewest samples that close a window (a window is as long as the bound, at least this).
const MIN_WINDOW: u32 = 8;

/// The bounds the limit moves within.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitConfig {
    /// Never fewer write rounds in flight than this.
    pub min: usize,
    /// Never more than this (the memory bound).
    pub max: usize,
    /// Where the limit starts.
    pub initial: usize,
    /// Mean write latency above which the server is taken to be queueing our writes.
    pub latency_target: Duration,
    /// Resident set size, bytes, that the bound keeps the operator within (None: no budget).
    pub memory_budget: Option<u64>,
}

impl LimitConfig {
    /// A config with `max` as the ceiling and the defaults for the rest.
    pub fn up_to(max: usize) -> Self {
        let max = max.max(1);
        Self {
            min: DEFAULT_MIN.min(max),
            max,
            initial: DEFAULT_INITIAL.min(max),
            latency_target: DEFAULT_LATENCY_TARGET,
            memory_budget: None,
        }
    }
}

/// Default floor of the limit.
pub const DEFAULT_MIN: usize = 8;
/// Where the limit starts by default: about what the constant bound it replaces (16
/// reconciles of up to six requests) allowed.
pub const DEFAULT_INITIAL: usize = 96;
/// Default latency target. A backstop: the API server's own word on overload is a 429 (API
/// Priority and Fairness), and on a busy control plane writes answered in a second or two
/// are saturation, not overload; shrinking then only slows restarts (measured in the fourth
/// benchmark round: docs/benchmarks.md's git history).
pub const DEFAULT_LATENCY_TARGET: Duration = Duration::from_secs(5);

/// The samples of the window being filled.
#[derive(Clone, Copy, Debug, Default)]
struct Window {
    samples: u32,
    total: Duration,
    /// A write round waited for a slot while this window filled.
    saturated: bool,
}

/// The current bound on write rounds in flight, and what it learns from.
#[derive(Clone, Debug)]
pub struct AdaptiveLimit {
    config: LimitConfig,
    limit: usize,
    window: Window,
}

/// What a closed window did to the limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Raised to this.
    Raised(usize),
    /// Lowered to this.
    Lowered(usize),
    /// Lowered to this, the cap the memory budget leaves (below what the window alone made it).
    Capped(usize),
    /// Left as it was.
    Kept,
}

impl AdaptiveLimit {
    /// A limit at `config.initial`, clamped into `[min, max]`.
    pub fn new(config: LimitConfig) -> Self {
        let max = config.max.max(1);
        let min = config.min.clamp(1, max);
        let config = LimitConfig {
            min,
            max,
            initial: config.initial.clamp(min, max),
            ..config
        };
        Self {
            limit: config.initial,
            config,
            window: Window::default(),
        }
    }

    /// Write rounds allowed in flight now.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The bounds it moves within.
    pub fn config(&self) -> &LimitConfig {
        &self.config
    }

    /// A write round had to wait for a slot.
    pub fn saturated(&mut self) {
        self.window.saturated = true;
    }

    /// One answered write: how long it took, and whether the server throttled it (429).
    /// For a limit without a memory budget.
    #[cfg(test)]
    pub fn sample(&mut self, latency: Duration, throttled: bool) -> Change {
        self.sample_within(latency, throttled, || None)
    }

    /// One answered write: how long it took, and whether the server throttled it (429);
    /// `resident` reads the resident set size in bytes, once per closed window and only when
    /// there is a memory budget.
    pub fn sample_within(
        &mut self,
        latency: Duration,
        throttled: bool,
        resident: impl FnOnce() -> Option<u64>,
    ) -> Change {
        if throttled {
            self.window = Window::default();
            return self.set((self.limit / 2).max(self.config.min));
        }
        let w = &mut self.window;
        w.samples += 1;
        w.total = w.total.saturating_add(latency);
        let size = u32::try_from(self.limit)
            .unwrap_or(u32::MAX)
            .max(MIN_WINDOW);
        if w.samples < size {
            return Change::Kept;
        }
        let window = std::mem::take(&mut self.window);
        let mean = window.total / window.samples;
        let target = self.config.latency_target;
        let ceiling = self.memory_cap(resident).unwrap_or(self.config.max);
        let next = if mean > target {
            self.limit - self.limit / 4
        } else if !window.saturated {
            self.limit
        } else if mean < target / 2 {
            self.limit + (self.limit / 4).max(1)
        } else {
            self.limit + 1
        };
        match self.set(next.clamp(self.config.min, ceiling)) {
            Change::Lowered(to) if next > ceiling => Change::Capped(to),
            change => change,
        }
    }

    /// The cap the memory budget puts on the limit now, within `[min, max]` (None: no budget,
    /// or no reading): the ceiling up to seven eighths of the budget, then falling in
    /// proportion to the room left, to the floor at the budget.
    fn memory_cap(&self, resident: impl FnOnce() -> Option<u64>) -> Option<usize> {
        let budget = self.config.memory_budget?;
        let now = resident()?;
        let taper = budget / 8;
        let start = budget - taper;
        let room = budget.saturating_sub(now).min(taper);
        let (min, max) = (self.config.min, self.config.max);
        if taper == 0 || now <= start {
            return Some(max);
        }
        let cap = (max as u128 * u128::from(room) / u128::from(taper)) as usize;
        Some(cap.clamp(min, max))
    }

    fn set(&mut self, next: usize) -> Change {
        let before = self.limit;
        self.limit = next;
        match next.cmp(&before) {
            std::cmp::Ordering::Greater => Change::Raised(next),
            std::cmp::Ordering::Less => Change::Lowered(next),
            std::cmp::Ordering::Equal => Change::Kept,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn config() -> LimitConfig {
        LimitConfig {
            min: 4,
            max: 64,
            initial: 16,
            latency_target: 1000 * MS,
            memory_budget: None,
        }
    }

    const MIB: u64 = 1 << 20;

    /// [`config`] kept within a budget of 64 MiB.
    fn budgeted_config() -> LimitConfig {
        LimitConfig {
            memory_budget: Some(64 * MIB),
            ..config()
        }
    }

    fn budgeted() -> AdaptiveLimit {
        AdaptiveLimit::new(budgeted_config())
    }

    /// Feeds one whole saturated window of `latency` samples, the resident set reading
    /// `resident`; the last change.
    fn window_reading(
        limit: &mut AdaptiveLimit,
        latency: Duration,
        resident: Option<u64>,
    ) -> Change {
        window_of(limit, latency, true, resident)
    }

    /// Feeds one whole window of `latency` samples, saturated or not, the resident set reading
    /// `resident`; the last change.
    fn window_of(
        limit: &mut AdaptiveLimit,
        latency: Duration,
        saturated: bool,
        resident: Option<u64>,
    ) -> Change {
        let size = limit.limit().max(MIN_WINDOW as usize);
        let mut last = Change::Kept;
        for _ in 0..size {
            if saturated {
                limit.saturated();
            }
            last = limit.sample_within(latency, false, || resident);
        }
        last
    }

    /// One saturated window of fast answers, the resident set reading `resident`.
    fn fast_window_at(limit: &mut AdaptiveLimit, resident: u64) -> Change {
        window_reading(limit, MS, Some(resident))
    }

    /// Feeds one whole window of `latency` samples, saturated or not; the last change.
    fn window(limit: &mut AdaptiveLimit, latency: Duration, saturated: bool) -> Change {
        window_of(limit, latency, saturated, None)
    }

    #[test]
    fn fast_answers_while_rounds_wait_raise_the_limit_by_a_quarter_then_by_one() {
        let mut l = AdaptiveLimit::new(config());
        assert_eq!(window(&mut l, 100 * MS, true), Change::Raised(20));
        assert_eq!(window(&mut l, 100 * MS, true), Change::Raised(25));
        // Within the target but over half of it: one more.
        assert_eq!(window(&mut l, 700 * MS, true), Change::Raised(26));
    }

    #[test]
    fn nothing_waiting_means_nothing_learned() {
        let mut l = AdaptiveLimit::new(config());
        assert_eq!(window(&mut l, MS, false), Change::Kept);
        assert_eq!(l.limit(), 16);
    }

    #[test]
    fn slow_answers_cut_the_limit_by_a_quarter_down_to_the_floor() {
        let mut l = AdaptiveLimit::new(config());
        assert_eq!(window(&mut l, 1500 * MS, true), Change::Lowered(12));
        assert_eq!(window(&mut l, 1500 * MS, false), Change::Lowered(9));
        for _ in 0..10 {
            window(&mut l, 5000 * MS, true);
        }
        assert_eq!(l.limit(), 4);
    }

    #[test]
    fn a_throttled_write_halves_the_limit_at_once_and_starts_a_new_window() {
        let mut l = AdaptiveLimit::new(config());
        for _ in 0..15 {
            l.saturated();
            assert_eq!(l.sample(10 * MS, false), Change::Kept);
        }
        assert_eq!(l.sample(10 * MS, true), Change::Lowered(8));
        // The fifteen fast samples before the 429 are forgotten: a window of 8 starts anew.
        for _ in 0..7 {
            assert_eq!(l.sample(10 * MS, false), Change::Kept);
        }
        l.saturated();
        assert_eq!(l.sample(10 * MS, false), Change::Raised(10));
    }

    #[test]
    fn the_limit_stays_within_its_bounds_and_bad_configs_are_clamped() {
        let mut l = AdaptiveLimit::new(config());
        for _ in 0..40 {
            window(&mut l, MS, true);
        }
        assert_eq!(l.limit(), 64);
        let l = AdaptiveLimit::new(LimitConfig {
            min: 0,
            max: 0,
            initial: 99,
            latency_target: MS,
            memory_budget: None,
        });
        assert_eq!((l.limit(), l.config().min, l.config().max), (1, 1, 1));
        assert_eq!(LimitConfig::up_to(2).initial, 2);
    }

    #[test]
    fn over_the_budgets_last_eighth_the_limit_is_capped_in_proportion_to_the_room_left() {
        let mut l = AdaptiveLimit::new(LimitConfig {
            initial: 64,
            ..budgeted_config()
        });
        // 64 MiB less an eighth is 56 MiB: there the cap is still the ceiling (64).
        assert_eq!(fast_window_at(&mut l, 56 * MIB), Change::Kept);
        // 4 of the last 8 MiB left: half the ceiling.
        assert_eq!(fast_window_at(&mut l, 60 * MIB), Change::Capped(32));
        // The level caps, not its growth: the same reading holds the limit where it is.
        assert_eq!(fast_window_at(&mut l, 60 * MIB), Change::Kept);
        assert_eq!(fast_window_at(&mut l, 63 * MIB), Change::Capped(8));
        assert_eq!(
            fast_window_at(&mut l, 70 * MIB),
            Change::Capped(4),
            "the floor"
        );
    }

    #[test]
    fn with_room_again_the_limit_rises_as_it_would_without_a_budget() {
        let mut l = budgeted();
        assert_eq!(fast_window_at(&mut l, 63 * MIB), Change::Capped(8));
        assert_eq!(fast_window_at(&mut l, 62 * MIB), Change::Raised(10));
        assert_eq!(fast_window_at(&mut l, 62 * MIB), Change::Raised(12));
        assert_eq!(fast_window_at(&mut l, 62 * MIB), Change::Raised(15));
        assert_eq!(
            fast_window_at(&mut l, 62 * MIB),
            Change::Raised(16),
            "capped at 16"
        );
        assert_eq!(fast_window_at(&mut l, 62 * MIB), Change::Kept);
        assert_eq!(fast_window_at(&mut l, 40 * MIB), Change::Raised(20));
    }

    #[test]
    fn slow_answers_cut_within_the_budget_as_they_do_without_one() {
        let mut l = budgeted();
        assert_eq!(
            window_reading(&mut l, 1500 * MS, Some(MIB)),
            Change::Lowered(12)
        );
        // In the last eighth, a cut the latency made (below the cap of 56) is still its own.
        assert_eq!(
            window_reading(&mut l, 1500 * MS, Some(57 * MIB)),
            Change::Lowered(9)
        );
    }

    #[test]
    fn the_resident_set_is_read_once_per_closed_window_and_only_under_a_budget() {
        let reads = std::cell::Cell::new(0);
        let read = || {
            reads.set(reads.get() + 1);
            Some(MIB)
        };
        let mut l = budgeted();
        for _ in 0..15 {
            l.saturated();
            assert_eq!(l.sample_within(MS, false, read), Change::Kept);
        }
        assert_eq!(reads.get(), 0, "no window closed yet");
        assert_eq!(l.sample_within(MS, false, read), Change::Raised(20));
        assert_eq!(reads.get(), 1);

        let mut unbudgeted = AdaptiveLimit::new(config());
        for _ in 0..16 {
            unbudgeted.saturated();
            unbudgeted.sample_within(MS, false, read);
        }
        assert_eq!(unbudgeted.limit(), 20);
        assert_eq!(reads.get(), 1, "without a budget memory is never read");
    }

    #[test]
    fn an_unreadable_resident_set_leaves_the_limit_to_the_latency() {
        let mut l = budgeted();
        assert_eq!(window_reading(&mut l, MS, None), Change::Raised(20));
    }
}
