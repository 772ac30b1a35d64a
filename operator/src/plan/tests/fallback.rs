//! Leaving spot: the count rule and the cost rule (`fallback: Cost`).

use super::*;

#[test]
fn spot_fallback_kicks_in_after_enough_preemptions() {
    let mut w =
        World::running_world("workers: 1\ngpusPerWorker: 1\nspot: {fallbackToOnDemandAfter: 1}\n");
    w.preempt("train-worker-0");
    let plan = w.step();
    assert!(plan.events.iter().any(|e| e.reason == "SpotFallback"));
    assert_eq!(plan.decided_by, PhaseName::GangRestart);
    w.kubelet_removes_deleted();
    let plan = w.step();
    assert_eq!(plan.decided_by, PhaseName::Running);
    let pod = World::creates(&plan)[0];
    assert!(
        pod.spec
            .as_ref()
            .and_then(|s| s.tolerations.clone())
            .is_none(),
        "no spot tolerations"
    );
    let terms = pod
        .spec
        .as_ref()
        .and_then(|s| s.affinity.clone())
        .and_then(|a| a.node_affinity)
        .and_then(|n| n.required_during_scheduling_ignored_during_execution)
        .expect("required")
        .node_selector_terms;
    assert!(
        terms[0]
            .match_expressions
            .iter()
            .flatten()
            .any(|e| e.operator == "NotIn" && e.key == trainyard_api::spot::KARPENTER_CAPACITY_TYPE)
    );
    let gpu = plan.status.selected_gpu.expect("gpu");
    assert!(!gpu.spot);
    assert!(gpu.reason.contains("fell back"), "{}", gpu.reason);
}

/// The spot terms a pod carries: its tolerations' keys, and whether its required affinity
/// keeps it off Karpenter spot nodes.
fn spot_terms(pod: &Pod) -> (Vec<String>, bool) {
    let spec = pod.spec.as_ref().expect("spec");
    let tolerations = spec
        .tolerations
        .iter()
        .flatten()
        .filter_map(|t| t.key.clone())
        .collect();
    let avoids_spot = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .is_some_and(|s| {
            s.node_selector_terms.iter().all(|t| {
                t.match_expressions.iter().flatten().any(|e| {
                    e.operator == "NotIn" && e.key == trainyard_api::spot::KARPENTER_CAPACITY_TYPE
                })
            })
        });
    (tolerations, avoids_spot)
}

/// The job's worker is preempted now; the old pod goes and the next attempt's is created.
fn preempt_and_recreate(w: &mut World) -> Plan {
    w.preempt("train-worker-0");
    let restart = w.step();
    assert_eq!(restart.restart, Some(RestartReason::Preemption));
    w.kubelet_removes_deleted();
    let created = w.step();
    assert_eq!(World::creates(&created).len(), 1);
    created
}

/// `fallback: Cost`, one worker × 1 GPU on a spot Tesla-T4 ($0.12, on-demand $0.36: spot
/// pays up to 3× the useful time). Attempt 0 runs 10 → 120 s at 1 s a step: step 100 at
/// 110 s, checkpoint 80 at 90 s, preempted at 120 s: 80 s useful of 110 s, $0.17 per useful
/// GPU-hour, spot pays. Attempt 1 runs 220 → 280 s (100 s of restart) from step 80 to 130
/// at 270 s with no checkpoint, and is preempted: all 60 s lost. Then 80 s useful of 270 s
/// charged is $0.41 per useful GPU-hour: attempt 2 leaves spot, with 2 preemptions where the
/// count rule (3) would not have.
#[expect(clippy::too_many_lines, reason = "one worked example, round by round")]
#[test]
fn two_preemptions_that_lose_the_work_make_spot_stop_paying_for_good() {
    let mut w = World::new("workers: 1\ngpusPerWorker: 1\nspot: {fallback: Cost}\n");
    w.replace_node(node("n-1").gpus(8).product("Tesla-T4").spot().build());
    w.nodes
        .push(Arc::new(node("n-2").gpus(8).product("Tesla-T4").build()));
    w.step();
    w.advance(10);
    start_all_now(&mut w);
    w.step();
    w.advance(100);
    let mut p = reports(0, &[(0, 100)], w.now);
    p.checkpoint = Some((80, t(90)));
    w.progress = Some(p);
    w.step();
    w.advance(10);

    let attempt_1 = preempt_and_recreate(&mut w);
    let pays = condition_of(&attempt_1.status, condition::SPOT_FALLBACK).expect("judged");
    assert_eq!(
        (pays.status.as_str(), pays.reason.as_str()),
        ("False", "SpotPays")
    );
    assert!(
        pays.message
            .starts_with("spot cost $0.17 per useful GPU-hour <= on-demand $0.36: 80.0 of 110.0"),
        "{}",
        pays.message
    );
    let (tolerations, avoids_spot) = spot_terms(World::creates(&attempt_1)[0]);
    assert!(
        !tolerations.is_empty() && !avoids_spot,
        "attempt 1 stays on spot"
    );
    assert!(attempt_1.status.selected_gpu.as_ref().expect("gpu").spot);

    w.advance(100);
    start_all_now(&mut w);
    w.step();
    w.advance(50);
    let mut p = reports(1, &[(0, 130)], w.now);
    p.resumed_from = Some(80);
    p.previous_attempt_step = Some(100);
    w.progress = Some(p);
    w.step();
    w.advance(10);

    let attempt_2 = preempt_and_recreate(&mut w);
    let message = "spot cost $0.41 per useful GPU-hour > on-demand $0.36: 80.0 of 270.0 charged \
                   spot GPU-seconds were useful, over 2 preemption(s); later attempts run on \
                   on-demand nodes";
    let left: Vec<&JobEvent> = attempt_2
        .events
        .iter()
        .filter(|e| e.reason == "SpotNoLongerPays")
        .collect();
    assert_eq!(left.len(), 1, "{:?}", attempt_2.events);
    assert_eq!(left[0].note, message);
    assert!(!attempt_2.events.iter().any(|e| e.reason == "SpotFallback"));
    let fell_back = condition_of(&attempt_2.status, condition::SPOT_FALLBACK).expect("judged");
    assert_eq!(
        (
            fell_back.status.as_str(),
            fell_back.reason.as_str(),
            fell_back.message.as_str()
        ),
        ("True", "SpotNoLongerPays", message)
    );
    let (tolerations, avoids_spot) = spot_terms(World::creates(&attempt_2)[0]);
    assert!(
        tolerations.is_empty() && avoids_spot,
        "attempt 2 avoids spot"
    );
    let gpu = attempt_2.status.selected_gpu.clone().expect("gpu");
    assert!(!gpu.spot);
    assert!(gpu.reason.contains("spot no longer pays"), "{}", gpu.reason);

    // Sticky: spot turned almost free, and attempt 2 ran at no loss, yet attempt 3 stays on
    // on-demand nodes, with no second Event.
    w.config.prices[0].spot = 0.001;
    w.config.prices[0].on_demand = Some(0.36);
    w.advance(30);
    start_all_now(&mut w);
    w.step();
    w.advance(600);
    let attempt_3 = preempt_and_recreate(&mut w);
    assert!(
        !attempt_3
            .events
            .iter()
            .any(|e| e.reason == "SpotNoLongerPays")
    );
    let (tolerations, avoids_spot) = spot_terms(World::creates(&attempt_3)[0]);
    assert!(
        tolerations.is_empty() && avoids_spot,
        "attempt 3 avoids spot"
    );
    assert_eq!(
        condition_of(&attempt_3.status, condition::SPOT_FALLBACK),
        Some(fell_back)
    );
}

/// `fallback: Cost` on a product the price table does not know: the rule cannot judge, says
/// so, and the next attempt keeps spot even though the attempt before lost everything.
#[test]
fn the_cost_fallback_leaves_an_unpriced_product_on_spot_and_says_why() {
    let mut w = World::new("workers: 1\ngpusPerWorker: 1\nspot: {fallback: Cost}\n");
    w.replace_node(node("n-1").gpus(8).product("Radeon-MI300X").spot().build());
    w.step();
    start_all_now(&mut w);
    w.step();
    w.advance(100);
    w.progress = Some(reports(0, &[(0, 100)], w.now));
    w.step();
    let created = preempt_and_recreate(&mut w);
    assert!(
        !created
            .events
            .iter()
            .any(|e| e.reason == "SpotNoLongerPays")
    );
    let unpriced = condition_of(&created.status, condition::SPOT_FALLBACK).expect("judged");
    assert_eq!(
        (unpriced.status.as_str(), unpriced.reason.as_str()),
        ("False", "SpotUnpriced")
    );
    assert!(
        unpriced.message.contains("Radeon-MI300X"),
        "{}",
        unpriced.message
    );
    let (tolerations, avoids_spot) = spot_terms(World::creates(&created)[0]);
    assert!(!tolerations.is_empty() && !avoids_spot);
}
