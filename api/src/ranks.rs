//! Sets of worker ranks written as ranges, the way `status.workerSummary` stores which ranks
//! the operator has seen: `"0-9999"` for a whole gang of 10,000, `"0-3,5,7-9"` in general.
//!
//! Status is input too (a user or a tool may write it), so parsing never fails: whatever is
//! not a well-formed rank or range below [`MAX_WORKERS`] is skipped, and the work is bounded
//! by the string's length, never by the numbers in it.

use std::collections::BTreeSet;
use std::fmt;

/// Most workers (`spec.workers`): one pod each, and a gang this large is already far beyond
/// what one rendezvous holds. Every rank is below it.
pub const MAX_WORKERS: u32 = 10_000;

/// A set of ranks below [`MAX_WORKERS`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RankSet(BTreeSet<u32>);

impl RankSet {
    /// The ranks of `text` (`"0-3,5"`); what is not a rank or a range of ranks below
    /// [`MAX_WORKERS`] is skipped.
    pub fn parse(text: &str) -> Self {
        let mut set = BTreeSet::new();
        for part in text.split(',').map(str::trim) {
            let (low, high) = part.split_once('-').unwrap_or((part, part));
            let (Ok(low), Ok(high)) = (low.trim().parse::<u32>(), high.trim().parse::<u32>())
            else {
                continue;
            };
            // A range is cut at MAX_WORKERS, so the loop is bounded whatever the text says.
            set.extend(low..=high.min(MAX_WORKERS - 1));
        }
        Self(set)
    }

    /// Adds `rank` (one at or above [`MAX_WORKERS`] is ignored).
    pub fn insert(&mut self, rank: u32) {
        if rank < MAX_WORKERS {
            self.0.insert(rank);
        }
    }

    /// Whether `rank` is in the set.
    pub fn contains(&self, rank: u32) -> bool {
        self.0.contains(&rank)
    }

    /// The ranks, lowest first.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().copied()
    }

    /// How many ranks.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl FromIterator<u32> for RankSet {
    fn from_iter<I: IntoIterator<Item = u32>>(ranks: I) -> Self {
        let mut set = Self::default();
        for rank in ranks {
            set.insert(rank);
        }
        set
    }
}

impl Extend<u32> for RankSet {
    fn extend<I: IntoIterator<Item = u32>>(&mut self, ranks: I) {
        for rank in ranks {
            self.insert(rank);
        }
    }
}

/// Runs of consecutive ranks as `a-b`, single ranks as `a`, comma-separated.
impl fmt::Display for RankSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ranks = self.iter().peekable();
        let mut first = true;
        while let Some(low) = ranks.next() {
            let mut high = low;
            while ranks.peek() == Some(&(high + 1)) {
                high += 1;
                ranks.next();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if high == low {
                write!(f, "{low}")?;
            } else {
                write!(f, "{low}-{high}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_written_as_ranges_and_read_back() {
        let set: RankSet = [0, 1, 2, 3, 5, 7, 8, 9].into_iter().collect();
        assert_eq!(set.to_string(), "0-3,5,7-9");
        assert_eq!(RankSet::parse("0-3,5,7-9"), set);
        let gang: RankSet = (0..MAX_WORKERS).collect();
        assert_eq!(gang.to_string(), "0-9999");
        assert_eq!(RankSet::parse("0-9999").len(), 10_000);
        assert_eq!(RankSet::default().to_string(), "");
        assert!(RankSet::parse("").is_empty());
    }

    #[test]
    fn text_a_user_wrote_is_read_as_far_as_it_names_ranks_and_never_loops_past_the_cap() {
        // A range up to u32::MAX costs MAX_WORKERS steps at most.
        assert_eq!(RankSet::parse("9998-4294967295").to_string(), "9998-9999");
        assert!(RankSet::parse("10000,4294967295,99999999999").is_empty());
        // Garbage, reversed ranges and spaces.
        assert_eq!(
            RankSet::parse(" 1 , x, 5-3, -2, 4-, 7 - 8").to_string(),
            "1,7-8"
        );
        let mut set = RankSet::default();
        set.insert(MAX_WORKERS);
        assert!(set.is_empty());
    }

    #[test]
    fn the_longest_sets_fit_the_schemas_bound() {
        let every_other: RankSet = (0..MAX_WORKERS).step_by(2).collect();
        let pairs: RankSet = (0..MAX_WORKERS).filter(|r| r % 3 != 2).collect();
        let triples: RankSet = (0..MAX_WORKERS).filter(|r| r % 4 != 3).collect();
        for set in [every_other, pairs, triples] {
            assert!(
                set.to_string().len() <= crate::crd::MAX_RANK_SET_CHARS,
                "{} characters",
                set.to_string().len()
            );
        }
    }
}
