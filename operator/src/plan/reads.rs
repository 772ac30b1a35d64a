//! What a round needs read that the caches cannot serve: a rule of the plan, since only the
//! plan knows what it will create. The controller reads what this asks for before it decides
//! ([`super::Observed::sibling_placement`]).

use std::sync::Arc;

use crate::model::cached_pod::CachedPod;
use crate::model::crd::{LABEL_ATTEMPT, LABEL_RANK, TrainingJobStatus};

/// The pod whose placement a missing rank of the current attempt copies (the lowest rank
/// present), when some missing rank is one this round would create: not one the operator has
/// just created (`held`: its create is on its way into the cache), nor one recorded in
/// `current` as seen (seen and gone: a preemption or a success, never created again in this
/// attempt, since a preempted rank restarts the gang). Only then do the cached pods, stripped
/// of their placement, not suffice, and a round trip before the round is worth it.
pub fn sibling_to_read<'p>(
    pods: &'p [Arc<CachedPod>],
    current: &TrainingJobStatus,
    workers: u32,
    held: impl Fn(u32) -> bool,
) -> Option<&'p CachedPod> {
    let attempt = current.attempt;
    let recorded = current.recorded_ranks();
    let recorded = |rank| recorded.contains(rank);
    let mut present: Vec<(u32, &Arc<CachedPod>)> = pods
        .iter()
        .filter(|p| crate::build::pods::label_u32(p.as_ref(), LABEL_ATTEMPT) == Some(attempt))
        .filter_map(|p| Some((crate::build::pods::label_u32(p.as_ref(), LABEL_RANK)?, p)))
        .filter(|(rank, _)| *rank < workers)
        .collect();
    present.sort_by_key(|(rank, _)| *rank);
    let &(_, sibling) = present.first()?;
    let unheld_gap = (0..workers)
        .filter(|r| present.iter().all(|(rank, _)| rank != r))
        .any(|r| !held(r) && !recorded(r));
    unheld_gap.then_some(sibling.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::crd::WorkerStatus;
    use crate::model::validate::pod_name;
    use kube::ResourceExt;
    use serde_json::json;

    fn worker(rank: u32, attempt: u32) -> Arc<CachedPod> {
        Arc::new(
            serde_json::from_value(json!({"metadata": {
                "name": format!("j-worker-{rank}"),
                "labels": {LABEL_RANK: rank.to_string(), LABEL_ATTEMPT: attempt.to_string()},
            }}))
            .expect("pod"),
        )
    }

    fn at(attempt: u32) -> TrainingJobStatus {
        TrainingJobStatus {
            attempt,
            ..TrainingJobStatus::default()
        }
    }

    #[test]
    fn a_rank_seen_and_gone_is_a_preemption_not_a_create_and_needs_no_sibling() {
        let pods = [worker(0, 2), worker(2, 2), worker(3, 2)];
        let mut current = at(2);
        current.workers = (0..4)
            .map(|rank| WorkerStatus {
                rank,
                pod: pod_name("j", rank),
                node: Some("n".to_owned()),
                phase: "Running".to_owned(),
                reason: None,
            })
            .collect();
        assert!(sibling_to_read(&pods, &current, 4, |_| false).is_none());
        // Never seen: it would be created, placed like its siblings.
        current.workers.remove(1);
        assert_eq!(
            sibling_to_read(&pods, &current, 4, |_| false).map(|p| p.name_any()),
            Some("j-worker-0".to_owned())
        );
    }

    #[test]
    fn a_sibling_is_read_whole_only_for_a_missing_rank_not_just_created() {
        let pods = [worker(1, 2), worker(3, 2), worker(0, 1)];
        let nothing_held = |_| false;
        // Ranks 0 and 2 of attempt 2 are missing: copy the lowest present rank of attempt 2.
        assert_eq!(
            sibling_to_read(&pods, &at(2), 4, nothing_held)
                .map(|p| p.name_any())
                .as_deref(),
            Some("j-worker-1")
        );
        // Both missing ranks were just created by this operator: the cache will show them.
        assert_eq!(
            sibling_to_read(&pods, &at(2), 4, |r| r == 0 || r == 2).map(|p| p.name_any()),
            None
        );
        assert_eq!(
            sibling_to_read(&pods, &at(2), 4, |r| r == 0)
                .map(|p| p.name_any())
                .as_deref(),
            Some("j-worker-1")
        );
        // Nothing of the attempt exists (a fresh attempt is placed from the job), or nothing is missing.
        assert_eq!(
            sibling_to_read(&pods, &at(3), 4, nothing_held).map(|p| p.name_any()),
            None
        );
        let all = [worker(0, 0), worker(1, 0)];
        assert_eq!(
            sibling_to_read(&all, &at(0), 2, nothing_held).map(|p| p.name_any()),
            None
        );
    }
}
