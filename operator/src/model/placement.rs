//! Where the workers may run: GPU product, memory, CUDA and compute capability, spot, and
//! never a node that carries a termination notice.
//!
//! Node affinity semantics shape this module: `nodeSelectorTerms` are ORed, the expressions
//! inside a term are ANDed, and `Gt` takes a single integer. So "CUDA >= 12.4" becomes
//! `(major Gt 12) OR (major In [12] AND minor Gt 3)`, and every OR group (spot labels, CUDA,
//! compute capability) is crossed with the others.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    Node, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    PreferredSchedulingTerm, Toleration,
};

use crate::config::OperatorConfig;
use crate::model::cached_pod::NODE_NAME_FIELD;
use crate::model::crd::{GpuSelection, SelectedGpu, SpotFallback, SpotPolicy};
use crate::model::nodes;
use crate::model::scheduling;
use crate::model::validate::ValidJob;
use trainyard_api::Version;

/// Where the job's pods go.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Placement {
    /// Node affinity to merge into the pod template's.
    pub node_affinity: Option<NodeAffinity>,
    /// Tolerations to add (spot taints).
    pub tolerations: Vec<Toleration>,
    /// What was chosen and why (status.selectedGpu); None for CPU jobs without GPU constraints.
    pub selected: Option<SelectedGpu>,
    /// Set when no Ready node satisfies the job; names what the cluster offers.
    pub unschedulable: Option<String>,
}

/// Whether the attempt may use spot nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpotMode {
    /// Prefer spot nodes.
    Prefer,
    /// Only spot nodes.
    Require,
    /// Never spot nodes (policy Never, or the on-demand fallback).
    Never,
}

/// What the job's past says about spot, as the fallback rules read it from the status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpotHistory {
    /// Gang restarts caused by preemption (`status.preemptions`).
    pub preemptions: u32,
    /// The cost rule found that spot no longer pays (the condition `SpotFallback` is True).
    pub no_longer_pays: bool,
}

impl From<u32> for SpotHistory {
    /// A history told by its preemptions alone: the cost rule has found nothing.
    fn from(preemptions: u32) -> Self {
        Self {
            preemptions,
            no_longer_pays: false,
        }
    }
}

/// The spot mode of the next attempt: the policy, unless the fallback of `spot.fallback` has
/// kicked in (`Count`: after `fallbackToOnDemandAfter` preemptions; `Cost`: once the cost rule
/// found that spot no longer pays).
pub fn spot_mode(job: &ValidJob, history: impl Into<SpotHistory>) -> (SpotMode, bool) {
    let history = history.into();
    let spot = &job.spec.spot;
    let after = spot.fallback_to_on_demand_after;
    let fell_back = spot.policy != SpotPolicy::Never
        && match spot.fallback {
            SpotFallback::Count => after > 0 && history.preemptions >= after,
            SpotFallback::Cost => history.no_longer_pays,
        };
    let mode = match job.spec.spot.policy {
        _ if fell_back => SpotMode::Never,
        SpotPolicy::Prefer => SpotMode::Prefer,
        SpotPolicy::Require => SpotMode::Require,
        SpotPolicy::Never => SpotMode::Never,
    };
    (mode, fell_back)
}

fn req(key: &str, operator: &str, values: Vec<String>) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: key.to_owned(),
        operator: operator.to_owned(),
        values: Some(values),
    }
}

/// OR-terms meaning "version(major, minor) >= min".
fn at_least(major_key: &str, minor_key: &str, min: Version) -> Vec<Vec<NodeSelectorRequirement>> {
    let mut terms = Vec::new();
    if min.minor == 0 {
        if min.major > 0 {
            terms.push(vec![req(
                major_key,
                "Gt",
                vec![(min.major - 1).to_string()],
            )]);
        }
        return terms;
    }
    terms.push(vec![req(major_key, "Gt", vec![min.major.to_string()])]);
    terms.push(vec![
        req(major_key, "In", vec![min.major.to_string()]),
        req(minor_key, "Gt", vec![(min.minor - 1).to_string()]),
    ]);
    terms
}

/// Crosses two ORed lists of ANDed expressions.
fn cross(
    a: Vec<Vec<NodeSelectorRequirement>>,
    b: &[Vec<NodeSelectorRequirement>],
) -> Vec<Vec<NodeSelectorRequirement>> {
    if b.is_empty() {
        return a;
    }
    a.into_iter()
        .flat_map(|left| {
            b.iter().map(move |right| {
                let mut term = left.clone();
                term.extend(right.iter().cloned());
                term
            })
        })
        .collect()
}

/// Whether a node meets everything but the product choice.
struct NodeFacts {
    product: Option<String>,
    spot: bool,
}

fn node_fits(
    job: &ValidJob,
    config: &OperatorConfig,
    mode: SpotMode,
    node: &Node,
) -> Option<NodeFacts> {
    if !nodes::is_schedulable(node) || noticed(config, node) {
        return None;
    }
    let gpu = &job.spec.gpu;
    let wanted = u64::from(job.spec.gpus_per_worker);
    if wanted > 0 && nodes::allocatable(node, &gpu.resource_name) < wanted {
        return None;
    }
    let product = nodes::label(node, nodes::LABEL_GPU_PRODUCT).map(str::to_owned);
    if !gpu.products.is_empty() && !product.as_ref().is_some_and(|p| gpu.products.contains(p)) {
        return None;
    }
    if let Some(min_gib) = gpu.min_memory_gib {
        let mib =
            nodes::label(node, nodes::LABEL_GPU_MEMORY).and_then(|m| m.trim().parse::<u64>().ok());
        if mib.is_some_and(|mib| mib < u64::from(min_gib) * 1024) {
            return None;
        }
    }
    if let Some(min) = job.min_cuda {
        let v = nodes::version(node, nodes::LABEL_CUDA_MAJOR, nodes::LABEL_CUDA_MINOR)?;
        if v < (min.major, min.minor) {
            return None;
        }
    }
    if let Some(min) = job.min_compute {
        let v = nodes::version(node, nodes::LABEL_COMPUTE_MAJOR, nodes::LABEL_COMPUTE_MINOR)?;
        if v < (min.major, min.minor) {
            return None;
        }
    }
    let spot = node
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| config.is_spot(l));
    match mode {
        SpotMode::Require if !spot => return None,
        SpotMode::Never if spot => return None,
        _ => {}
    }
    Some(NodeFacts { product, spot })
}

/// The nodes an attempt placed in `mode` could use, with what the placement reads of them:
/// none whose kubelet went silent.
fn fitting<'n>(
    job: &ValidJob,
    config: &OperatorConfig,
    mode: SpotMode,
    nodes_: &[&'n Node],
    silent: &[String],
) -> Vec<(&'n Node, NodeFacts)> {
    nodes_
        .iter()
        .filter(|n| !silent.iter().any(|s| s == nodes::name(n)))
        .filter_map(|n| Some((*n, node_fits(job, config, mode, n)?)))
        .collect()
}

/// The names of the nodes an attempt placed now could use (sorted): Ready and schedulable,
/// meeting the GPU constraints and the spot mode `history` gives, with no termination notice,
/// and not `silent`. With `gpu.selection: Cheapest`, only nodes of the product it would pin.
pub fn fitting_nodes(
    job: &ValidJob,
    config: &OperatorConfig,
    nodes_: &[&Node],
    history: impl Into<SpotHistory>,
    silent: &[String],
) -> Vec<String> {
    let (mode, _) = spot_mode(job, history);
    // Room counts only where the scheduler would put a worker: the template's selector,
    // affinity and tolerations, with the operator's own (spot, the GPU resource's taint).
    let spec = job.spec.template.spec.clone().unwrap_or_default();
    let mut ours = if mode == SpotMode::Never {
        Vec::new()
    } else {
        config.spot.tolerations.clone()
    };
    ours.push(Toleration {
        key: Some(job.spec.gpu.resource_name.clone()),
        operator: Some("Exists".to_owned()),
        ..Toleration::default()
    });
    let admitted: Vec<&Node> = nodes_
        .iter()
        .copied()
        .filter(|n| scheduling::admits(&spec, &ours, n))
        .collect();
    let fitting = fitting(job, config, mode, &admitted, silent);
    let pinned = (job.spec.gpu.selection == GpuSelection::Cheapest)
        .then(|| cheapest_offer(config, mode, fitting.iter().map(|(_, f)| f)))
        .flatten();
    let mut names: Vec<String> = fitting
        .iter()
        .filter(|(_, f)| {
            pinned
                .as_ref()
                .is_none_or(|(p, _, _)| f.product.as_ref() == Some(p))
        })
        .map(|(n, _)| nodes::name(n).to_owned())
        .collect();
    names.sort();
    names
}

/// Whether the node carries a termination notice (a taint of the provider table) or an early
/// warning of one: it is going away, so no new pod may go there, even one whose template
/// tolerates every taint.
fn noticed(config: &OperatorConfig, node: &Node) -> bool {
    nodes::termination_taint(node, &config.termination_taints).is_some()
        || nodes::termination_taint(node, &config.early_warning_taints).is_some()
}

/// The names of the nodes that carry a termination notice, sorted.
pub fn noticed_nodes(config: &OperatorConfig, nodes_: &[&Node]) -> Vec<String> {
    let mut names: Vec<String> = nodes_
        .iter()
        .filter(|n| noticed(config, n))
        .map(|n| nodes::name(n).to_owned())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// A sibling's affinity for a rank created beside it: the nodes it avoids by name are kept
/// only while they still carry a notice (`noticed`), so a rank created after a notice was
/// withdrawn may use that node. A term left with nothing to match is dropped with its
/// requirement (an empty term matches no node).
pub fn without_withdrawn_notices(mut affinity: NodeAffinity, noticed: &[String]) -> NodeAffinity {
    let Some(required) = affinity
        .required_during_scheduling_ignored_during_execution
        .as_mut()
    else {
        return affinity;
    };
    for term in &mut required.node_selector_terms {
        let Some(fields) = term.match_fields.as_mut() else {
            continue;
        };
        for r in fields
            .iter_mut()
            .filter(|r| r.key == NODE_NAME_FIELD && r.operator == "NotIn")
        {
            if let Some(values) = r.values.as_mut() {
                values.retain(|v| noticed.contains(v));
            }
        }
        fields
            .retain(|r| !(r.key == NODE_NAME_FIELD && r.values.as_ref().is_none_or(Vec::is_empty)));
        if fields.is_empty() {
            term.match_fields = None;
        }
    }
    let empty = |t: &NodeSelectorTerm| {
        t.match_expressions.as_ref().is_none_or(Vec::is_empty)
            && t.match_fields.as_ref().is_none_or(Vec::is_empty)
    };
    if required.node_selector_terms.iter().all(empty) {
        affinity.required_during_scheduling_ignored_during_execution = None;
    }
    affinity
}

/// What the cluster offers, for the Unschedulable message.
fn cluster_summary(job: &ValidJob, config: &OperatorConfig, nodes_: &[&Node]) -> String {
    let resource = &job.spec.gpu.resource_name;
    let mut products: BTreeMap<String, usize> = BTreeMap::new();
    let mut cuda = BTreeSet::new();
    let mut compute = BTreeSet::new();
    let mut max_gpus = 0;
    let mut ready = 0;
    let mut spot = 0;
    for n in nodes_.iter().filter(|n| nodes::is_schedulable(n)) {
        ready += 1;
        max_gpus = max_gpus.max(nodes::allocatable(n, resource));
        if n.metadata
            .labels
            .as_ref()
            .is_some_and(|l| config.is_spot(l))
        {
            spot += 1;
        }
        if let Some(p) = nodes::label(n, nodes::LABEL_GPU_PRODUCT) {
            *products.entry(p.to_owned()).or_default() += 1;
        }
        if let Some((a, b)) = nodes::version(n, nodes::LABEL_CUDA_MAJOR, nodes::LABEL_CUDA_MINOR) {
            cuda.insert(format!("{a}.{b}"));
        }
        if let Some((a, b)) =
            nodes::version(n, nodes::LABEL_COMPUTE_MAJOR, nodes::LABEL_COMPUTE_MINOR)
        {
            compute.insert(format!("{a}.{b}"));
        }
    }
    let list = |s: Vec<String>| {
        if s.is_empty() {
            "none".to_owned()
        } else {
            s.join(", ")
        }
    };
    format!(
        "the cluster has {ready} Ready node(s) ({spot} spot), at most {max_gpus} allocatable {resource} per node; products: {}; CUDA versions: {}; compute capabilities: {}",
        list(products.iter().map(|(p, n)| format!("{p} ({n})")).collect()),
        list(cuda.into_iter().collect()),
        list(compute.into_iter().collect()),
    )
}

fn wants(job: &ValidJob, mode: SpotMode) -> String {
    let gpu = &job.spec.gpu;
    let mut parts = vec![format!(
        "{} x {} per worker",
        job.spec.gpus_per_worker, gpu.resource_name
    )];
    if !gpu.products.is_empty() {
        parts.push(format!("product in [{}]", gpu.products.join(", ")));
    }
    if let Some(m) = gpu.min_memory_gib {
        parts.push(format!("at least {m} GiB GPU memory"));
    }
    if let Some(v) = job.min_cuda {
        parts.push(format!("CUDA >= {v}"));
    }
    if let Some(v) = job.min_compute {
        parts.push(format!("compute capability >= {v}"));
    }
    match mode {
        SpotMode::Require => parts.push("a spot node".to_owned()),
        SpotMode::Never => parts.push("an on-demand node".to_owned()),
        SpotMode::Prefer => {}
    }
    parts.join(", ")
}

/// Computes the placement of the next attempt from the nodes the cluster has now and the
/// job's spot history (its preemptions alone where the cost rule has found nothing).
pub fn place(
    job: &ValidJob,
    config: &OperatorConfig,
    nodes_: &[&Node],
    history: impl Into<SpotHistory>,
) -> Placement {
    place_avoiding(job, config, nodes_, history, &[])
}

/// [`place`], with the nodes `silent` (their kubelet stopped renewing its Lease: see
/// `heartbeat`) no candidate and excluded by name like a node with a termination notice.
pub fn place_avoiding(
    job: &ValidJob,
    config: &OperatorConfig,
    nodes_: &[&Node],
    history: impl Into<SpotHistory>,
    silent: &[String],
) -> Placement {
    let gpu = &job.spec.gpu;
    let history = history.into();
    let (mode, fell_back) = spot_mode(job, history);

    let fitting = fitting(job, config, mode, nodes_, silent);
    let noticed_names = noticed_nodes(config, nodes_);
    let unschedulable = fitting.is_empty().then(|| {
        let mut excepted = Vec::new();
        if !noticed_names.is_empty() {
            excepted.push(format!("nodes with a termination notice excepted: {}", noticed_names.join(", ")));
        }
        if !silent.is_empty() {
            excepted.push(format!("nodes whose kubelet went silent excepted: {}", silent.join(", ")));
        }
        let noticed = match excepted.is_empty() {
            true => String::new(),
            false => format!(" ({})", excepted.join("; ")),
        };
        format!(
            "no Ready node offers {}{noticed}; {}; the workers wait Pending for a node that does (a cluster autoscaler can add one)",
            wants(job, mode),
            cluster_summary(job, config, nodes_)
        )
    });

    let uses_gpus = job.spec.gpus_per_worker > 0 || !gpu.products.is_empty();
    let pinned = if uses_gpus && gpu.selection == GpuSelection::Cheapest {
        cheapest_offer(config, mode, fitting.iter().map(|(_, f)| f))
    } else {
        None
    };
    let mut avoided = noticed_names;
    avoided.extend(silent.iter().cloned());
    avoided.sort();
    avoided.dedup();
    let required = required_terms(job, config, mode, pinned.as_ref(), &avoided);
    let preferred = preferred_terms(config, mode);
    let node_affinity = (required.is_some() || !preferred.is_empty()).then(|| NodeAffinity {
        required_during_scheduling_ignored_during_execution: required,
        preferred_during_scheduling_ignored_during_execution: (!preferred.is_empty())
            .then_some(preferred),
    });

    let tolerations = if mode == SpotMode::Never {
        Vec::new()
    } else {
        config.spot.tolerations.clone()
    };

    let selected = selected_gpu(
        job,
        mode,
        fell_back,
        history.preemptions,
        pinned,
        uses_gpus,
        unschedulable.is_some(),
    );

    Placement {
        node_affinity,
        tolerations,
        selected,
        unschedulable,
    }
}

/// Cheapest: price every offered product on the capacity type the job would get there; the
/// product, its price and whether it is spot.
fn cheapest_offer<'f>(
    config: &OperatorConfig,
    mode: SpotMode,
    fitting: impl IntoIterator<Item = &'f NodeFacts>,
) -> Option<(String, f64, bool)> {
    let mut pinned: Option<(String, f64, bool)> = None;
    let mut offers: BTreeMap<&str, bool> = BTreeMap::new();
    for f in fitting {
        if let Some(p) = f.product.as_deref() {
            let spot = offers.entry(p).or_insert(false);
            *spot |= f.spot && mode != SpotMode::Never;
        }
    }
    for (product, spot) in offers {
        if let Some(price) = config.price(product, spot)
            && pinned.as_ref().is_none_or(|(_, best, _)| price < *best)
        {
            pinned = Some((product.to_owned(), price, spot));
        }
    }
    pinned
}

/// The required node selector: the product (pinned, or the allowed ones), GPU memory, spot
/// labels by mode, CUDA and compute minimums, and, in every term, none of the `avoided`
/// nodes (a `metadata.name NotIn` field, which no toleration of the template overrides).
fn required_terms(
    job: &ValidJob,
    config: &OperatorConfig,
    mode: SpotMode,
    pinned: Option<&(String, f64, bool)>,
    avoided: &[String],
) -> Option<NodeSelector> {
    let gpu = &job.spec.gpu;
    let mut common = Vec::new();
    match pinned {
        Some((product, _, _)) => {
            common.push(req(nodes::LABEL_GPU_PRODUCT, "In", vec![product.clone()]))
        }
        None if !gpu.products.is_empty() => {
            common.push(req(nodes::LABEL_GPU_PRODUCT, "In", gpu.products.clone()));
        }
        None => {}
    }
    if gpu.products.is_empty()
        && pinned.is_none()
        && let Some(min_gib) = gpu.min_memory_gib
    {
        // Without a product list, memory can only be expressed on the memory label itself.
        common.push(req(
            nodes::LABEL_GPU_MEMORY,
            "Gt",
            vec![(u64::from(min_gib) * 1024 - 1).to_string()],
        ));
    }
    if mode == SpotMode::Never {
        for l in &config.spot.labels {
            common.push(req(&l.key, "NotIn", vec![l.value.clone()]));
        }
    }

    let mut terms = vec![common];
    if mode == SpotMode::Require {
        let spot_terms: Vec<_> = config
            .spot
            .labels
            .iter()
            .map(|l| vec![req(&l.key, "In", vec![l.value.clone()])])
            .collect();
        terms = cross(terms, &spot_terms);
    }
    if let Some(min) = job.min_cuda {
        terms = cross(
            terms,
            &at_least(nodes::LABEL_CUDA_MAJOR, nodes::LABEL_CUDA_MINOR, min),
        );
    }
    if let Some(min) = job.min_compute {
        terms = cross(
            terms,
            &at_least(nodes::LABEL_COMPUTE_MAJOR, nodes::LABEL_COMPUTE_MINOR, min),
        );
    }
    // One requirement per node: the API server takes exactly one value for `In` or `NotIn` on
    // a node field, and the requirements of a term are ANDed.
    let fields = (!avoided.is_empty()).then(|| {
        avoided
            .iter()
            .map(|name| req(NODE_NAME_FIELD, "NotIn", vec![name.clone()]))
            .collect::<Vec<_>>()
    });
    (fields.is_some() || terms.iter().any(|t| !t.is_empty())).then(|| NodeSelector {
        node_selector_terms: terms
            .into_iter()
            .map(|t| NodeSelectorTerm {
                match_expressions: (!t.is_empty()).then_some(t),
                match_fields: fields.clone(),
            })
            .collect(),
    })
}

/// Preferred terms: spot nodes, when spot is preferred.
fn preferred_terms(config: &OperatorConfig, mode: SpotMode) -> Vec<PreferredSchedulingTerm> {
    if mode == SpotMode::Prefer {
        config
            .spot
            .labels
            .iter()
            .map(|l| PreferredSchedulingTerm {
                weight: 100,
                preference: NodeSelectorTerm {
                    match_expressions: Some(vec![req(&l.key, "In", vec![l.value.clone()])]),
                    match_fields: None,
                },
            })
            .collect()
    } else {
        Vec::new()
    }
}

/// What `status.selectedGpu` says about the choice.
fn selected_gpu(
    job: &ValidJob,
    mode: SpotMode,
    fell_back: bool,
    preemptions: u32,
    pinned: Option<(String, f64, bool)>,
    uses_gpus: bool,
    unschedulable: bool,
) -> Option<SelectedGpu> {
    let gpu = &job.spec.gpu;
    let fallback_note = match (fell_back, job.spec.spot.fallback) {
        (false, _) => String::new(),
        (true, SpotFallback::Count) => format!(
            "; fell back to on-demand after {preemptions} preemption(s) (fallbackToOnDemandAfter={})",
            job.spec.spot.fallback_to_on_demand_after
        ),
        (true, SpotFallback::Cost) => {
            "; fell back to on-demand: spot no longer pays (fallback Cost)".to_owned()
        }
    };
    match pinned {
        Some((product, price, spot)) => Some(SelectedGpu {
            reason: format!(
                "cheapest offered product at ${price:.2}/GPU-hour {}{fallback_note}",
                if spot { "on spot" } else { "on demand" }
            ),
            product,
            price_per_hour: Some(price),
            spot,
        }),
        None if uses_gpus || mode != SpotMode::Prefer => Some(SelectedGpu {
            product: String::new(),
            price_per_hour: None,
            spot: mode != SpotMode::Never,
            reason: format!(
                "{}{fallback_note}",
                match (gpu.selection, unschedulable) {
                    (_, true) =>
                        "no node offers an allowed product yet: any allowed product".to_owned(),
                    (GpuSelection::Any, false) =>
                        "selection Any: the scheduler picks among the allowed products".to_owned(),
                    (GpuSelection::Cheapest, false) =>
                        "no offered product has a price: any allowed product".to_owned(),
                }
            ),
        }),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{job_yaml, node};
    use crate::model::nodes::{
        LABEL_COMPUTE_MAJOR, LABEL_CUDA_MAJOR, LABEL_CUDA_MINOR, LABEL_GPU_MEMORY,
        LABEL_GPU_PRODUCT,
    };
    use crate::model::validate::validate;
    use trainyard_api::spot::{
        AKS_SCALESET_PRIORITY, EKS_CAPACITY_TYPE, GKE_SPOT, KARPENTER_CAPACITY_TYPE,
    };

    fn job(yaml: &str) -> ValidJob {
        validate(&job_yaml(yaml)).expect("valid")
    }

    fn terms(p: &Placement) -> Vec<Vec<(String, String, Vec<String>)>> {
        p.node_affinity
            .as_ref()
            .and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })
            .map(|s| {
                s.node_selector_terms
                    .iter()
                    .map(|t| {
                        t.match_expressions
                            .iter()
                            .flatten()
                            .map(|e| {
                                (
                                    e.key.clone(),
                                    e.operator.clone(),
                                    e.values.clone().unwrap_or_default(),
                                )
                            })
                            .collect()
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    fn expr(k: &str, op: &str, v: &[&str]) -> (String, String, Vec<String>) {
        (
            k.to_owned(),
            op.to_owned(),
            v.iter().map(|s| s.to_string()).collect(),
        )
    }

    #[test]
    fn cheapest_pins_the_lowest_priced_offered_product() {
        let a100 = node("a").gpus(8).product("NVIDIA-A100-SXM4-80GB").build();
        let t4 = node("t").gpus(4).product("Tesla-T4").build();
        let p = place(
            &job("gpusPerWorker: 4\n"),
            &OperatorConfig::default(),
            &[&a100, &t4],
            0,
        );
        let selected = p.selected.clone().expect("selected");
        assert_eq!(selected.product, "Tesla-T4");
        assert_eq!(selected.price_per_hour, Some(0.12 * 3.0));
        assert!(!selected.spot);
        assert_eq!(
            terms(&p),
            vec![vec![expr(LABEL_GPU_PRODUCT, "In", &["Tesla-T4"])]]
        );
        assert!(p.unschedulable.is_none());
    }

    #[test]
    fn a_sibling_affinity_keeps_avoiding_only_the_nodes_still_noticed() {
        use trainyard_api::spot::KARPENTER_DISRUPTED;
        let going = |name: &str| {
            node(name)
                .gpus(4)
                .product("Tesla-T4")
                .cuda(12, 4)
                .taint(KARPENTER_DISRUPTED)
                .build()
        };
        let (a, b) = (going("a"), going("b"));
        let spec = "gpusPerWorker: 4\ngpu: {minCudaVersion: \"12.4\"}\n";
        let sibling = place(&job(spec), &OperatorConfig::default(), &[&a, &b], 0)
            .node_affinity
            .expect("affinity");
        let fields = |affinity: &NodeAffinity| -> Vec<Option<Vec<NodeSelectorRequirement>>> {
            affinity
                .required_during_scheduling_ignored_during_execution
                .iter()
                .flat_map(|r| r.node_selector_terms.iter().map(|t| t.match_fields.clone()))
                .collect()
        };
        // Both noticed: every term avoids each, one node per requirement (the API server
        // refuses a pod whose node field requirement has more than one value).
        let both = Some(vec![
            req("metadata.name", "NotIn", vec!["a".to_owned()]),
            req("metadata.name", "NotIn", vec!["b".to_owned()]),
        ]);
        assert_eq!(fields(&sibling), vec![both.clone(), both]);
        // b's notice is withdrawn: every term keeps avoiding a, and its CUDA expressions.
        let kept = without_withdrawn_notices(sibling.clone(), &["a".to_owned()]);
        let only_a = Some(vec![req("metadata.name", "NotIn", vec!["a".to_owned()])]);
        assert_eq!(fields(&kept), vec![only_a.clone(), only_a]);
        // Both withdrawn: no name requirement is left, the CUDA terms stay.
        let kept = without_withdrawn_notices(sibling, &[]);
        assert_eq!(fields(&kept), vec![None, None]);
        // A job with no other requirement keeps none at all (an empty term matches no node).
        let bare = place(
            &job("gpusPerWorker: 4\n"),
            &OperatorConfig::default(),
            &[&a],
            0,
        );
        let bare = without_withdrawn_notices(bare.node_affinity.expect("affinity"), &[]);
        assert_eq!(
            bare.required_during_scheduling_ignored_during_execution,
            None
        );
    }

    #[test]
    fn a_node_with_a_termination_notice_is_no_candidate_and_every_term_excludes_it() {
        use trainyard_api::spot::KARPENTER_DISRUPTED;
        let going = node("going")
            .gpus(4)
            .product("Tesla-T4")
            .cuda(12, 4)
            .taint(KARPENTER_DISRUPTED)
            .build();
        let a100 = node("a")
            .gpus(8)
            .product("NVIDIA-A100-SXM4-80GB")
            .cuda(12, 4)
            .build();
        let p = place(
            &job("gpusPerWorker: 4\ngpu: {minCudaVersion: \"12.4\"}\n"),
            &OperatorConfig::default(),
            &[&going, &a100],
            0,
        );
        // The T4 is cheaper, but its only node is going away.
        assert_eq!(
            p.selected.as_ref().map(|s| s.product.as_str()),
            Some("NVIDIA-A100-SXM4-80GB")
        );
        let required = p
            .node_affinity
            .as_ref()
            .and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .clone()
            })
            .expect("required");
        assert_eq!(required.node_selector_terms.len(), 2, "the CUDA OR-terms");
        for term in &required.node_selector_terms {
            assert_eq!(
                term.match_fields,
                Some(vec![req(
                    "metadata.name",
                    "NotIn",
                    vec!["going".to_owned()]
                )])
            );
        }
        // Alone, it leaves the job unschedulable, and says why.
        let p = place(
            &job("gpusPerWorker: 4\n"),
            &OperatorConfig::default(),
            &[&going],
            0,
        );
        let why = p.unschedulable.expect("unschedulable");
        assert!(why.contains("termination notice excepted: going"), "{why}");
        // With no notice, no field term.
        let p = place(
            &job("gpusPerWorker: 4\n"),
            &OperatorConfig::default(),
            &[&a100],
            0,
        );
        let required = p
            .node_affinity
            .and_then(|a| a.required_during_scheduling_ignored_during_execution)
            .expect("required");
        assert!(
            required
                .node_selector_terms
                .iter()
                .all(|t| t.match_fields.is_none())
        );
    }

    #[test]
    fn cheapest_uses_the_spot_price_where_the_product_runs_on_spot() {
        // On demand the T4 costs 0.36, the A100-80GB on spot 1.25; an H100 on demand 7.5.
        let a100_spot = node("a")
            .gpus(8)
            .product("NVIDIA-A100-SXM4-80GB")
            .spot()
            .build();
        let h100 = node("h").gpus(8).product("NVIDIA-H100-80GB-HBM3").build();
        let p = place(
            &job("gpusPerWorker: 8\n"),
            &OperatorConfig::default(),
            &[&a100_spot, &h100],
            0,
        );
        let selected = p.selected.expect("selected");
        assert_eq!(
            (selected.product.as_str(), selected.spot),
            ("NVIDIA-A100-SXM4-80GB", true)
        );
        assert_eq!(selected.price_per_hour, Some(1.25));
    }

    #[test]
    fn candidates_need_enough_allocatable_gpus_on_a_ready_node() {
        let small_t4 = node("t").gpus(2).product("Tesla-T4").build();
        let down_l4 = node("l")
            .gpus(8)
            .product("NVIDIA-L4")
            .not_ready_since("2026-01-01T00:00:00Z")
            .build();
        let a10 = node("g").gpus(4).product("NVIDIA-A10G").build();
        let p = place(
            &job("gpusPerWorker: 4\n"),
            &OperatorConfig::default(),
            &[&small_t4, &down_l4, &a10],
            0,
        );
        assert_eq!(p.selected.expect("selected").product, "NVIDIA-A10G");
    }

    #[test]
    fn no_offered_product_keeps_the_whole_allowed_list_and_names_what_the_cluster_has() {
        let t4 = node("t").gpus(4).product("Tesla-T4").build();
        let p = place(
            &job(
                "gpusPerWorker: 1\ngpu: {products: [NVIDIA-H100-80GB-HBM3, NVIDIA-A100-SXM4-80GB]}\n",
            ),
            &OperatorConfig::default(),
            &[&t4],
            0,
        );
        assert_eq!(
            terms(&p),
            vec![vec![expr(
                LABEL_GPU_PRODUCT,
                "In",
                &["NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"]
            )]]
        );
        let msg = p.unschedulable.expect("unschedulable");
        assert!(msg.contains("Tesla-T4 (1)"), "{msg}");
        assert_eq!(p.selected.expect("selected").product, "");
    }

    #[test]
    fn min_memory_excludes_products_with_too_little_memory() {
        let a100_40 = node("a")
            .gpus(8)
            .product("NVIDIA-A100-PCIE-40GB")
            .label(LABEL_GPU_MEMORY, "40960")
            .build();
        let a100_80 = node("b")
            .gpus(8)
            .product("NVIDIA-A100-SXM4-80GB")
            .label(LABEL_GPU_MEMORY, "81920")
            .build();
        let p = place(
            &job("gpusPerWorker: 8\ngpu: {minMemoryGiB: 80}\n"),
            &OperatorConfig::default(),
            &[&a100_40, &a100_80],
            0,
        );
        assert_eq!(
            p.selected.expect("selected").product,
            "NVIDIA-A100-SXM4-80GB"
        );
    }

    #[test]
    fn min_cuda_becomes_gt_and_in_terms_ored() {
        let n = node("n")
            .gpus(8)
            .product("NVIDIA-A100-SXM4-80GB")
            .cuda(12, 4)
            .build();
        let p = place(
            &job("gpusPerWorker: 1\ngpu: {minCudaVersion: \"12.4\", selection: Any}\n"),
            &OperatorConfig::default(),
            &[&n],
            0,
        );
        assert_eq!(
            terms(&p),
            vec![
                vec![expr(LABEL_CUDA_MAJOR, "Gt", &["12"])],
                vec![
                    expr(LABEL_CUDA_MAJOR, "In", &["12"]),
                    expr(LABEL_CUDA_MINOR, "Gt", &["3"]),
                ],
            ]
        );
        assert!(p.unschedulable.is_none());
    }

    #[test]
    fn min_cuda_above_every_node_is_unschedulable_naming_the_versions() {
        let a = node("a").gpus(8).cuda(12, 2).build();
        let b = node("b").gpus(8).cuda(11, 8).build();
        let p = place(
            &job("gpusPerWorker: 1\ngpu: {minCudaVersion: \"12.4\"}\n"),
            &OperatorConfig::default(),
            &[&a, &b],
            0,
        );
        let msg = p.unschedulable.expect("unschedulable");
        assert!(msg.contains("CUDA >= 12.4"), "{msg}");
        assert!(msg.contains("CUDA versions: 11.8, 12.2"), "{msg}");
    }

    #[test]
    fn compute_capability_with_minor_zero_is_one_gt_term_crossed_with_cuda() {
        let n = node("n").gpus(8).cuda(12, 4).compute(9, 0).build();
        let p = place(
            &job(
                "gpusPerWorker: 1\ngpu: {minCudaVersion: \"12.4\", minComputeCapability: \"8.0\"}\n",
            ),
            &OperatorConfig::default(),
            &[&n],
            0,
        );
        let t = terms(&p);
        assert_eq!(t.len(), 2);
        for term in &t {
            assert!(
                term.contains(&expr(LABEL_COMPUTE_MAJOR, "Gt", &["7"])),
                "{term:?}"
            );
        }
    }

    #[test]
    fn require_spot_ors_the_provider_labels_and_crosses_them_with_other_terms() {
        let n = node("n").gpus(8).cuda(12, 4).spot().build();
        let p = place(
            &job(
                "gpusPerWorker: 1\nspot: {policy: Require}\ngpu: {minCudaVersion: \"12.4\", selection: Any}\n",
            ),
            &OperatorConfig::default(),
            &[&n],
            0,
        );
        let t = terms(&p);
        assert_eq!(t.len(), 5 * 2);
        assert!(t.iter().any(|term| term.contains(&expr(
            KARPENTER_CAPACITY_TYPE,
            "In",
            &["spot"]
        ))));
        assert!(!p.tolerations.is_empty());
        assert!(p.selected.expect("selected").spot);
    }

    #[test]
    fn prefer_spot_is_preferred_affinity_with_tolerations() {
        let n = node("n").gpus(8).build();
        let p = place(
            &job("gpusPerWorker: 1\n"),
            &OperatorConfig::default(),
            &[&n],
            0,
        );
        let preferred = p
            .node_affinity
            .and_then(|a| a.preferred_during_scheduling_ignored_during_execution)
            .expect("preferred");
        assert_eq!(preferred.len(), 5);
        let keys: Vec<_> = p.tolerations.iter().filter_map(|t| t.key.clone()).collect();
        assert_eq!(keys, [AKS_SCALESET_PRIORITY, GKE_SPOT]);
    }

    #[test]
    fn never_spot_excludes_every_spot_label_and_tolerates_nothing() {
        let n = node("n").gpus(8).build();
        let p = place(
            &job("gpusPerWorker: 1\nspot: {policy: Never}\ngpu: {selection: Any}\n"),
            &OperatorConfig::default(),
            &[&n],
            0,
        );
        let t = terms(&p);
        assert_eq!(t.len(), 1);
        assert!(t[0].contains(&expr(EKS_CAPACITY_TYPE, "NotIn", &["SPOT"])));
        assert!(p.tolerations.is_empty());
    }

    #[test]
    fn fallback_after_enough_preemptions_avoids_spot_and_says_so() {
        let spot = node("s").gpus(8).product("Tesla-T4").spot().build();
        let od = node("o").gpus(8).product("Tesla-T4").build();
        let j = job("gpusPerWorker: 1\nspot: {fallbackToOnDemandAfter: 2}\n");
        let before = place(&j, &OperatorConfig::default(), &[&spot, &od], 1);
        assert!(before.selected.expect("selected").spot);
        let after = place(&j, &OperatorConfig::default(), &[&spot, &od], 2);
        let selected = after.selected.clone().expect("selected");
        assert!(!selected.spot);
        assert!(
            selected.reason.contains("fell back to on-demand after 2"),
            "{}",
            selected.reason
        );
        assert!(after.tolerations.is_empty());
        assert!(terms(&after)[0].contains(&expr(KARPENTER_CAPACITY_TYPE, "NotIn", &["spot"])));
    }

    #[test]
    fn zero_fallback_never_falls_back() {
        let j = job("spot: {fallbackToOnDemandAfter: 0}\n");
        assert_eq!(spot_mode(&j, 1000), (SpotMode::Prefer, false));
    }

    #[test]
    fn the_cost_fallback_ignores_the_count_and_follows_the_cost_verdict() {
        let spot = node("s").gpus(8).product("Tesla-T4").spot().build();
        let od = node("o").gpus(8).product("Tesla-T4").build();
        let j = job(
            "gpusPerWorker: 1\nspot: {policy: Require, fallback: Cost, fallbackToOnDemandAfter: 1}\n",
        );
        assert_eq!(spot_mode(&j, 5), (SpotMode::Require, false));
        let lost = SpotHistory {
            preemptions: 2,
            no_longer_pays: true,
        };
        assert_eq!(spot_mode(&j, lost), (SpotMode::Never, true));
        let after = place(&j, &OperatorConfig::default(), &[&spot, &od], lost);
        let selected = after.selected.clone().expect("selected");
        assert!(!selected.spot);
        assert!(
            selected.reason.contains("spot no longer pays"),
            "{}",
            selected.reason
        );
        assert!(after.tolerations.is_empty());
        let never = job("spot: {policy: Never, fallback: Cost}\n");
        assert_eq!(spot_mode(&never, lost), (SpotMode::Never, false));
        let count = job("spot: {fallbackToOnDemandAfter: 0}\n");
        assert_eq!(
            spot_mode(&count, lost),
            (SpotMode::Prefer, false),
            "Count ignores it"
        );
    }

    #[test]
    fn cpu_job_gets_no_gpu_constraints() {
        let n = node("n").build();
        let p = place(
            &job("gpusPerWorker: 0\n"),
            &OperatorConfig::default(),
            &[&n],
            0,
        );
        assert!(terms(&p).is_empty());
        assert!(p.selected.is_none());
        assert!(p.unschedulable.is_none());
    }
}
