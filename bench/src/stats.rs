//! Percentiles over measured samples.

/// The p-th percentile (nearest rank) of sorted samples; 0 for none.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The median run of `runs` by `key`: the middle one, of an even number the slower of the two
/// middle ones; None for none. Repeated runs of one phase are judged by it, so that a verdict
/// does not follow one run's luck.
pub fn median_by<T>(runs: &[T], key: impl Fn(&T) -> f64) -> Option<&T> {
    let mut sorted: Vec<&T> = runs.iter().collect();
    sorted.sort_by(|a, b| key(a).total_cmp(&key(b)));
    sorted.get(sorted.len() / 2).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_run_is_the_middle_one_and_of_two_the_slower() {
        let runs = [(1, 9.0), (2, 3.0), (3, 5.0)];
        assert_eq!(median_by(&runs, |r| r.1), Some(&(3, 5.0)));
        assert_eq!(median_by(&runs[..2], |r| r.1), Some(&(1, 9.0)));
        assert_eq!(median_by(&runs[..1], |r| r.1), Some(&(1, 9.0)));
        assert_eq!(median_by(&[] as &[(i32, f64)], |r| r.1), None);
    }

    #[test]
    fn nearest_rank_percentiles() {
        let s: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&s, 50.0), 50.0);
        assert_eq!(percentile(&s, 99.0), 99.0);
        assert_eq!(percentile(&[3.0], 99.0), 3.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
        let ten: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile(&ten, 99.0), 10.0);
    }
}
