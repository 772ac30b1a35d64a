//! The decisions of one round, in order. Each phase reads the [`View`] and adds to the
//! [`Round`]; the first that returns [`Flow::Stop`] ends the phases, then every row of
//! [`FINISH`] decides. These two tables are the only place that says in which order.

use std::collections::BTreeSet;
use std::sync::Arc;

use jiff::SignedDuration;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::finish::{self, FinishFn, FinishName};
use super::outcome::{Action, CLUSTER_WAIT_RECHECK, Flow, PhaseName};
use super::round::Round;
use super::view::{View, resumes_as_new_attempt};
use super::{attempt_start, cost_fallback, goodput, in_place};
use crate::build::{podgroup, pvc, service};
use crate::model::cached_pod::CachedPod;
use crate::model::condition::{self, condition_is_true};
use crate::model::crd::{LastRestart, MAX_LEDGER, Phase, RestartReason};
use crate::model::events::JobEvent;
use crate::model::kueue::{self, Queued};
use crate::model::nodes;
use crate::model::placement::{self, Placement};
use crate::model::preemption::WorkerState;
use crate::model::reason;
use crate::model::validate::InvalidSpec;

mod admission;
pub(super) mod elastic;
mod progress;
mod requeue;
mod restart;
mod standby;

/// One decision of a round.
pub(crate) type PhaseFn = fn(&View<'_>, &mut Round) -> Flow;

/// The decisions of a round, in the order they are taken.
pub(crate) const PHASES: &[(PhaseName, PhaseFn)] = &[
    (PhaseName::ClaimOwner, claim_owner),
    (PhaseName::Terminal, terminal),
    (PhaseName::Suspend, suspend),
    (PhaseName::Resume, resume),
    (PhaseName::Deadline, deadline),
    (PhaseName::Admission, admission::admission),
    (PhaseName::Classify, classify),
    (PhaseName::Progress, progress::record_progress),
    (PhaseName::GangRestart, restart::gang_restart),
    (PhaseName::Hang, progress::hang),
    (PhaseName::Grow, elastic::grow),
    (PhaseName::TerminationNotice, progress::termination_notice),
    (PhaseName::EarlyWarning, standby::early_warning),
    (PhaseName::Success, success),
    (PhaseName::DrainOldAttempt, drain_old_attempt),
    (PhaseName::ForeignObjects, foreign_objects),
    (PhaseName::ClusterPrerequisites, cluster_prerequisites),
    (PhaseName::Backoff, backoff_wait),
    (PhaseName::WithdrawnNotice, withdrawn_notice),
    (PhaseName::Create, create),
    (PhaseName::Unschedulable, unschedulable),
    (PhaseName::Shrink, elastic::shrink),
    (PhaseName::Requeue, requeue::requeue),
    (PhaseName::Running, running),
];

/// The decisions after the phase that ended the round, in order; every row runs.
pub(crate) const FINISH: &[(FinishName, FinishFn)] = &[
    (FinishName::HoldBackUnseen, finish::hold_back_unseen),
    (FinishName::Ledger, goodput::fold),
    (FinishName::InvalidSpec, finish::invalid_spec),
    (FinishName::Rejections, finish::rejections),
    (FinishName::Supervise, finish::supervise),
    (FinishName::Announce, finish::announce),
    (FinishName::TellAttempt, finish::tell_attempt),
    (FinishName::FinishWorkload, admission::finish_workload),
    (FinishName::WaitingFor, finish::waiting_for),
];

/// The phase the round started in.
fn started_in(view: &View<'_>) -> Phase {
    view.current.phase.unwrap_or(Phase::Pending)
}

/// `checkpoint.retainOnDelete` as the spec says now, also after an edit and in every phase
/// (a finished job's claim is what its delete keeps or removes): the claim the operator
/// manages carries the job's owner reference exactly when the job does not retain it, so the
/// garbage collector deletes it with the job or leaves it. An `existingClaim` is the user's
/// and never touched. Never stops the round.
fn claim_owner(view: &View<'_>, round: &mut Round) -> Flow {
    let job = view.job;
    let Some(claim) = view.observed.claim.as_ref().filter(|_| job.creates_claim) else {
        return Flow::Continue;
    };
    let owned = claim.owners.iter().any(|o| o.uid == job.uid);
    let wanted = !job.spec.checkpoint.retain_on_delete;
    if owned == wanted {
        return Flow::Continue;
    }
    let mut owners: Vec<_> = claim
        .owners
        .iter()
        .filter(|o| o.uid != job.uid)
        .cloned()
        .collect();
    if wanted {
        owners.push(job.owner.clone());
    }
    round.actions.push(Action::SetClaimOwners {
        name: job.claim_name.clone(),
        owners,
        resource_version: claim.resource_version.clone(),
    });
    Flow::Continue
}

/// Final phases: stop what still runs (after a failure, or a sidecar beside a trainer that
/// succeeded) so that it gives its GPUs back; leave completed pods for their logs.
fn terminal(view: &View<'_>, round: &mut Round) -> Flow {
    if !started_in(view).is_terminal() {
        return Flow::Continue;
    }
    round.remove_running_pods(view);
    Flow::Stop
}

/// Suspend: no pods, and no deadline running (see [`resume`]).
fn suspend(view: &View<'_>, round: &mut Round) -> Flow {
    if !view.job.spec.suspend {
        return Flow::Continue;
    }
    if started_in(view) != Phase::Suspended {
        round.events.push(JobEvent::normal(
            reason::SUSPENDED,
            "spec.suspend is true: deleting the workers",
        ));
    }
    round.st.phase = Some(Phase::Suspended);
    round.st.clear_workers();
    round.condition(
        view,
        condition::RUNNING,
        false,
        reason::SUSPENDED,
        "spec.suspend is true",
    );
    round.remove_pods(view, view.observed.pods.iter());
    Flow::Stop
}

/// `spec.suspend` went back to false. A job whose workers were created before (it has a
/// `startTime`) continues as a new attempt with restart reason `Resume`: its pods get
/// `RESUME_FROM` like every attempt after the first, so progress made before the suspend is
/// kept, and pods still terminating from the suspend are older pods that must be gone before
/// the new ones start. Like a Kubernetes Job, `startTime` (and with it
/// `activeDeadlineSeconds`) restarts at the resume. A job that never ran starts as it would
/// have. It fails when the attempt number is spent.
fn resume(view: &View<'_>, round: &mut Round) -> Flow {
    if started_in(view) != Phase::Suspended {
        return Flow::Continue;
    }
    let st = &mut round.st;
    st.phase = Some(Phase::Pending);
    if !resumes_as_new_attempt(view.job, view.current) {
        round.events.push(JobEvent::normal(
            reason::RESUMED,
            "spec.suspend is false: creating the workers",
        ));
        return Flow::Continue;
    }
    let Some(next) = st.attempt.checked_add(1) else {
        let message = restart::attempt_limit_message("spec.suspend set to false");
        round.fail(view, reason::ATTEMPT_LIMIT_REACHED, &message);
        return Flow::Stop;
    };
    st.attempt = next;
    st.clear_workers();
    st.start_time = Some(Time(view.now));
    st.last_restart = Some(LastRestart::new(
        Time(view.now),
        RestartReason::Resume,
        "spec.suspend set to false".to_owned(),
    ));
    round
        .events
        .push(attempt_start::resume_event(next, view.now));
    round.resumed = Some(RestartReason::Resume);
    Flow::Continue
}

/// `activeDeadlineSeconds`, counted from `startTime`.
fn deadline(view: &View<'_>, round: &mut Round) -> Flow {
    let (Some(limit), Some(start)) = (
        view.job.spec.active_deadline_seconds,
        round.st.start_time.as_ref(),
    ) else {
        return Flow::Continue;
    };
    let deadline = start
        .0
        .saturating_add(SignedDuration::from_secs(limit))
        .unwrap_or(start.0);
    if view.now < deadline {
        round.requeue(Some(deadline));
        return Flow::Continue;
    }
    let message = format!("activeDeadlineSeconds ({limit}s) passed");
    round.fail(view, reason::DEADLINE_EXCEEDED, &message);
    round.remove_running_pods(view);
    Flow::Stop
}

/// The workers are classified in the view; a state that may change on its own (a node's
/// grace period running out) is looked at again.
fn classify(view: &View<'_>, round: &mut Round) -> Flow {
    round.requeue(view.census.recheck_at);
    Flow::Continue
}

/// Every trainer exited 0.
fn success(view: &View<'_>, round: &mut Round) -> Flow {
    let states = &view.census.states;
    if view.workers == 0
        || !(0..view.workers).all(|r| states.get(&r) == Some(&WorkerState::Succeeded))
    {
        return Flow::Continue;
    }
    round.st.phase = Some(Phase::Succeeded);
    round.st.completion_time = Some(Time(view.now));
    round.record_workers(view);
    let exited = "every trainer exited 0";
    round.condition(
        view,
        condition::SUCCEEDED,
        true,
        reason::ALL_WORKERS_SUCCEEDED,
        exited,
    );
    round.condition(view, condition::RUNNING, false, reason::SUCCEEDED, exited);
    round.condition(view, condition::RESTARTING, false, reason::SUCCEEDED, "");
    round.events.push(JobEvent::normal(
        reason::SUCCEEDED,
        format!("{exited} (attempt {})", round.st.attempt),
    ));
    round.remove_running_pods(view);
    Flow::Stop
}

/// Older pods first: nothing new may meet an old rank at rendezvous.
fn drain_old_attempt(view: &View<'_>, round: &mut Round) -> Flow {
    // Kept pods stop their old attempt in place, or are replaced.
    let kept_stopped = in_place::settle(view, round);
    if standby::stalled(view, round) {
        return Flow::Stop;
    }
    if view.census.old_attempt_over(view, round.st.attempt) && kept_stopped {
        return Flow::Continue;
    }
    round.remove_pods(view, view.census.old.iter().copied());
    round.record_workers(view);
    // Watch events normally wake us; this is only the safety net.
    let now = view.now;
    round.requeue(Some(
        now.saturating_add(SignedDuration::from_secs(10))
            .unwrap_or(now),
    ));
    Flow::Stop
}

/// The condition `NameConflict`: True, with a Warning Event when its message changes, while
/// objects of the job's names are someone else's; False once they are gone. New pods would
/// use the objects of the job's names: none is created while one is someone else's.
fn foreign_objects(view: &View<'_>, round: &mut Round) -> Flow {
    report_name_conflicts(view, round);
    if view.census.missing(view.workers).is_empty() || view.observed.foreign.is_empty() {
        return Flow::Continue;
    }
    round.record_workers(view);
    round.requeue(view.now.saturating_add(CLUSTER_WAIT_RECHECK).ok());
    Flow::Stop
}

fn report_name_conflicts(view: &View<'_>, round: &mut Round) {
    let foreign = &view.observed.foreign;
    if foreign.is_empty() {
        if condition_is_true(&round.st.conditions, condition::NAME_CONFLICT) {
            round.condition(
                view,
                condition::NAME_CONFLICT,
                false,
                reason::NAMES_FREE,
                "",
            );
        }
        return;
    }
    let objects: Vec<String> = foreign.iter().map(ToString::to_string).collect();
    let message = format!(
        "names this TrainingJob needs are held by objects that are not its own: {}; trainyard \
         does not change, use or delete them, and creates no workers while they are there \
         (delete or rename them, or rename the job; spec.checkpoint.existingClaim mounts a PVC \
         of your own)",
        objects.join(", ")
    );
    let already =
        view.current.conditions.iter().any(|c| {
            c.type_ == condition::NAME_CONFLICT && c.status == "True" && c.message == message
        });
    round.condition(
        view,
        condition::NAME_CONFLICT,
        true,
        reason::NAME_TAKEN,
        &message,
    );
    if !already {
        round
            .events
            .push(JobEvent::warning(reason::NAME_CONFLICT, message));
    }
}

/// The one check that depends on the cluster, not the spec alone: a claim the user names
/// must exist. Nodes never make a spec invalid: a GPU pool scaled to zero (or to smaller
/// nodes) grows only once pods are Pending, so those get created and the unschedulable phase
/// says, in the Unschedulable condition, what no node offers yet.
fn cluster_prerequisites(view: &View<'_>, round: &mut Round) -> Flow {
    let job = view.job;
    if view.census.missing(view.workers).is_empty()
        || job.creates_claim
        || view.observed.claim.is_some()
    {
        return Flow::Continue;
    }
    round.invalid = Some(InvalidSpec {
        field: "spec.checkpoint.existingClaim".to_owned(),
        message: format!(
            "PersistentVolumeClaim {:?} does not exist in namespace {}",
            job.claim_name, job.namespace
        ),
    });
    round.record_workers(view);
    round.requeue(view.now.saturating_add(CLUSTER_WAIT_RECHECK).ok());
    Flow::Stop
}

/// The backoff after a failure or a requeue runs from the moment the restart was decided.
fn backoff_wait(view: &View<'_>, round: &mut Round) -> Flow {
    let st = &round.st;
    // Nothing of the attempt started yet: no pod created, none kept started in place.
    let starts = !view.census.missing(view.workers).is_empty() || !view.census.kept.is_empty();
    if !starts || !view.census.current.is_empty() {
        return Flow::Continue;
    }
    let Some(ready_at) = super::outcome::next_try(view.job, st) else {
        return Flow::Continue;
    };
    if view.now >= ready_at {
        return Flow::Continue;
    }
    round.record_workers(view);
    round.requeue(Some(ready_at));
    Flow::Stop
}

/// Pods created to stay off a node for its termination notice wait for ever when the notice is
/// withdrawn (Karpenter cancels a disruption) and that node is the one that fits: their
/// affinity names it. Such a pod that still waits for a node is deleted, with a Normal Event,
/// and the next round creates its rank anew where the placement allows now (beside ranks that
/// already run, as any rank of a half-created attempt). No restart is counted: a rank that
/// never ran means the gang never trained in this attempt.
fn withdrawn_notice(view: &View<'_>, round: &mut Round) -> Flow {
    let node_refs = view.observed.node_refs();
    let noticed = avoided_nodes(view, &node_refs);
    let withdrawn_of = |p: &CachedPod| -> Vec<String> {
        p.avoided_nodes()
            .into_iter()
            .filter(|n| node_refs.iter().any(|node| nodes::name(node) == *n))
            .filter(|n| !noticed.iter().any(|x| x == n))
            .map(str::to_owned)
            .collect()
    };
    let stuck: Vec<(u32, &Arc<CachedPod>)> = view
        .census
        .current
        .iter()
        .filter(|(_, p)| p.node_name().is_none() && p.metadata.deletion_timestamp.is_none())
        .filter(|(_, p)| !withdrawn_of(p).is_empty())
        .map(|(&rank, &p)| (rank, p))
        .collect();
    if stuck.is_empty() {
        return Flow::Continue;
    }
    let names: BTreeSet<String> = stuck.iter().flat_map(|(_, p)| withdrawn_of(p)).collect();
    let names: Vec<String> = names.into_iter().collect();
    round.events.push(JobEvent::normal(
        reason::NOTICE_WITHDRAWN,
        format!(
            "{} no longer avoided (its termination notice is withdrawn, or its kubelet renews \
             its Lease again): replacing the {} worker(s) of attempt {} that wait for a node \
             and were created to avoid it",
            names.join(", "),
            stuck.len(),
            round.st.attempt
        ),
    ));
    round.remove_pods(view, stuck.iter().map(|(_, p)| *p));
    // Deleted on purpose: not recorded, so their going is not taken for a lost pod.
    let stuck: Vec<u32> = stuck.iter().map(|(rank, _)| *rank).collect();
    round.record_workers_except(view, &stuck);
    Flow::Stop
}

/// Creates the missing workers: the first ones of an attempt where the placement picks,
/// later ranks of a half-created attempt beside the first ones, never a new choice.
fn create(view: &View<'_>, round: &mut Round) -> Flow {
    in_place::start(view, round);
    let missing = view.census.missing(view.workers);
    let node_refs = view.observed.node_refs();
    if missing.is_empty() {
        if view.census.any_unscheduled() {
            round.placement = Some(place(view, &node_refs, cost_fallback::history(&round.st)));
        }
        return Flow::Continue;
    }
    let half_created = !view.census.current.is_empty();
    if !half_created {
        cost_fallback::judge_next_attempt(view, round);
    }
    let history = cost_fallback::history(&round.st);
    let placement = match half_created {
        true => placement_of(view, &node_refs, history),
        false => place(view, &node_refs, history),
    };
    if !half_created {
        announce_attempt(view, round, &placement, missing.len());
    }
    if !view.observed.service_exists {
        let service = service::desired_service(view.job);
        round.actions.push(Action::CreateService(Box::new(service)));
    }
    let claim = view.observed.claim.as_ref();
    if claim.is_none()
        && let Some(claim) = pvc::desired_pvc(view.job)
    {
        round.actions.push(Action::CreatePvc(Box::new(claim)));
    }
    // The gang scheduler's PodGroup goes with an attempt's first pods (its pods wait for it,
    // if they come first); every pod joins it.
    let group = podgroup::desired_pod_group(view.job, view.config);
    if let Some(group) = group.as_ref().filter(|_| !half_created) {
        round
            .actions
            .push(Action::CreatePodGroup(Box::new(group.clone())));
    }
    for &rank in &missing {
        let mut pod = super::view::worker_pod(view, &round.st, rank, &placement);
        if let Some(group) = &group {
            podgroup::join(&mut pod, group);
        }
        if let Some(Queued::Workload(w)) = view.observed.queue.as_ref() {
            kueue::place(&mut pod, &w.placement);
        }
        round.actions.push(Action::CreatePod(Box::new(pod)));
    }
    if view.job.spec.elastic.is_some() && round.st.world_size.is_none() {
        round.st.world_size = Some(view.workers);
    }
    if round.st.start_time.is_none() {
        round.st.start_time = Some(Time(view.now));
        if let Some(limit) = view.job.spec.active_deadline_seconds {
            round.requeue(
                view.now
                    .saturating_add(SignedDuration::from_secs(limit))
                    .ok(),
            );
        }
    }
    round.placement = Some(placement);
    Flow::Continue
}

/// The first pods of an attempt: record the GPU chosen, and announce the job's first attempt
/// (a later one was announced by its restart's Event).
fn announce_attempt(view: &View<'_>, round: &mut Round, placement: &Placement, count: usize) {
    let st = &mut round.st;
    st.selected_gpu = placement.selected.clone();
    round.creates_attempt = Some(st.attempt);
    // One Event per restart: the restart's own Event (Preempted, WorkerFailed, Hang, Resumed)
    // already said which attempt follows. Retrying creates the API server rejected is not news
    // either: WriteRejected says so.
    let follows_restart = st.attempt > 0 && st.last_restart.is_some();
    let requeued = st
        .last_restart
        .as_ref()
        .is_some_and(|l| l.reason == RestartReason::Requeue);
    if follows_restart && requeued {
        round.announcement = Some(JobEvent::normal(
            reason::RETRYING,
            format!(
                "the requeue's backoff is over: creating {count} worker(s) for attempt {} \
                 (requeue {})",
                st.attempt, st.requeues
            ),
        ));
        return;
    }
    let retried = condition_is_true(&view.current.conditions, condition::WRITE_REJECTED)
        || view
            .observed
            .last_writes
            .as_ref()
            .is_some_and(|w| !w.rejected.is_empty());
    if follows_restart || retried {
        return;
    }
    let what = match &placement.selected {
        Some(s) if !s.product.is_empty() => {
            format!(" on {}{}", s.product, if s.spot { " (spot)" } else { "" })
        }
        _ => String::new(),
    };
    let resumes = match view.observed.claim.as_ref() {
        Some(c) if c.inherited && st.attempt == 0 => format!(
            "; claim {} was there before the job: resuming from its checkpoint (RESUME_FROM set)",
            view.job.claim_name
        ),
        _ => String::new(),
    };
    round.announcement = Some(JobEvent::normal(
        reason::CREATING_WORKERS,
        format!(
            "creating {count} worker(s) for attempt {}{what}{resumes}",
            st.attempt
        ),
    ));
}

/// The placement a half-created attempt already uses: its first pod's, which the controller
/// supplies ([`super::Observed::sibling_placement`]) whenever a missing rank was not just
/// created. Without it every missing rank is a create the watch does not show yet, which the
/// controller holds back (it only repeats a create that went out), so none is placed anew.
fn placement_of(
    view: &View<'_>,
    node_refs: &[&k8s_openapi::api::core::v1::Node],
    history: placement::SpotHistory,
) -> Placement {
    let mut p = place(view, node_refs, history);
    let sibling = view.observed.sibling_placement.clone().unwrap_or_default();
    let avoided = avoided_nodes(view, node_refs);
    p.node_affinity = sibling
        .node_affinity
        .map(|a| placement::without_withdrawn_notices(a, &avoided));
    p.tolerations = sibling.tolerations;
    p
}

/// Where the attempt's pods may go now: never a node whose kubelet went silent.
fn place(
    view: &View<'_>,
    node_refs: &[&k8s_openapi::api::core::v1::Node],
    history: placement::SpotHistory,
) -> Placement {
    let silent: Vec<String> = view.census.silent.keys().cloned().collect();
    placement::place_avoiding(view.job, view.config, node_refs, history, &silent)
}

/// The nodes a new pod stays off by name: those with a termination notice and those whose
/// kubelet went silent.
fn avoided_nodes(view: &View<'_>, node_refs: &[&k8s_openapi::api::core::v1::Node]) -> Vec<String> {
    let mut avoided = placement::noticed_nodes(view.config, node_refs);
    avoided.extend(view.census.silent.keys().cloned());
    avoided
}

/// Unschedulable: our own view of the cluster first (it names what the cluster has), then
/// the scheduler's verdict on the pods.
fn unschedulable(view: &View<'_>, round: &mut Round) -> Flow {
    let scheduler_says = view
        .census
        .states
        .values()
        .find(|s| s.unschedulable())
        .and_then(|s| s.reason().map(str::to_owned));
    let ours = round
        .placement
        .as_ref()
        .and_then(|p| p.unschedulable.clone());
    let (reason, message) = match (ours, scheduler_says) {
        (Some(m), _) => {
            round.requeue(view.now.saturating_add(CLUSTER_WAIT_RECHECK).ok());
            (reason::NO_MATCHING_NODE, m)
        }
        (None, Some(m)) => (reason::SCHEDULER_UNSCHEDULABLE, m),
        (None, None) => {
            if round
                .st
                .conditions
                .iter()
                .any(|c| c.type_ == condition::UNSCHEDULABLE)
            {
                round.condition(
                    view,
                    condition::UNSCHEDULABLE,
                    false,
                    reason::SCHEDULABLE,
                    "",
                );
            }
            return Flow::Continue;
        }
    };
    if !condition_is_true(&round.st.conditions, condition::UNSCHEDULABLE) {
        round
            .events
            .push(JobEvent::warning(reason::UNSCHEDULABLE, message.clone()));
    }
    round.condition(view, condition::UNSCHEDULABLE, true, reason, &message);
    Flow::Continue
}

/// Running once every worker runs (or has succeeded); Pending until then. A running job
/// whose failure's verdict is held stays Running: no restart is decided yet. Always the last
/// word of a round.
fn running(view: &View<'_>, round: &mut Round) -> Flow {
    round.record_workers(view);
    let workers = view.workers;
    let states = &view.census.states;
    let all_running = view.census.missing(workers).is_empty()
        && (0..workers).all(|r| {
            matches!(
                states.get(&r),
                Some(WorkerState::Running { .. } | WorkerState::Succeeded)
            )
        });
    if !all_running {
        let held = round.verdict_held && round.st.phase == Some(Phase::Running);
        if round.st.phase != Some(Phase::Restarting) && !held {
            round.st.phase = Some(Phase::Pending);
        }
        return Flow::Stop;
    }
    let attempt = round.st.attempt;
    let grew = round.st.restarted_for(RestartReason::Grow);
    if grew {
        // A grow whose every worker runs fitted: the next one waits as the first did.
        round.st.failed_grows = None;
    }
    if round.st.phase != Some(Phase::Running) {
        round.events.push(JobEvent::normal(
            reason::RUNNING,
            format!("all {workers} worker(s) of attempt {attempt} are running"),
        ));
        if let Some(last) = round.st.last_restart.as_mut()
            && last.running_after_millis.is_none()
        {
            let took = crate::model::ledger::millis_between(last.time.0, view.now);
            last.running_after_millis = Some(took.min(MAX_LEDGER));
        }
    }
    round.st.phase = Some(Phase::Running);
    let message = format!("attempt {attempt}: {workers}/{workers} workers running");
    round.condition(
        view,
        condition::RUNNING,
        true,
        reason::ALL_WORKERS_RUNNING,
        &message,
    );
    if condition_is_true(&round.st.conditions, condition::RESTARTING) {
        round.condition(
            view,
            condition::RESTARTING,
            false,
            reason::RESTARTED,
            &message,
        );
    }
    Flow::Stop
}
