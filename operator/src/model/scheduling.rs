//! What the kube-scheduler checks of a pod template against a node before GPUs count: the
//! template's `nodeSelector`, its required node affinity, and the node's taints against the
//! tolerations. Pure; used where the operator counts room it has not asked the scheduler for
//! (an elastic job's grow), so that GPUs its pods could never use are no room.

use k8s_openapi::api::core::v1::{
    Node, NodeSelectorRequirement, NodeSelectorTerm, PodSpec, Taint, Toleration,
};

/// Whether a pod of `spec`, with `extra` tolerations added (the operator's own), may land on
/// `node` as far as selectors, required affinity and taints go.
pub fn admits(spec: &PodSpec, extra: &[Toleration], node: &Node) -> bool {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let selected = spec
        .node_selector
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    // The terms are ORed; none (or an empty list) selects every node.
    let affine = required.is_none_or(|r| {
        r.node_selector_terms.is_empty()
            || r.node_selector_terms
                .iter()
                .any(|t| term_matches(t, &labels, name))
    });
    let tolerations: Vec<&Toleration> = spec.tolerations.iter().flatten().chain(extra).collect();
    let tolerated = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .all(|t| tolerations.iter().any(|tol| tolerates(tol, t)));
    selected && affine && tolerated
}

/// A term: every expression and field requirement holds (an empty term selects nothing).
fn term_matches(
    term: &NodeSelectorTerm,
    labels: &std::collections::BTreeMap<String, String>,
    name: &str,
) -> bool {
    let exprs = term.match_expressions.iter().flatten();
    let fields = term.match_fields.iter().flatten();
    if exprs.clone().count() + fields.clone().count() == 0 {
        return false;
    }
    exprs
        .into_iter()
        .all(|r| requirement(r, labels.get(&r.key).map(String::as_str)))
        && fields
            .into_iter()
            .all(|r| r.key == "metadata.name" && requirement(r, Some(name)))
}

fn requirement(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), Some(bound)) = (
                value.and_then(number),
                values.first().and_then(|b| number(b)),
            ) else {
                return false;
            };
            if r.operator == "Gt" {
                v > bound
            } else {
                v < bound
            }
        }
        _ => false,
    }
}

/// The scheduler's toleration rule: the key matches (an empty key with Exists matches every
/// taint), the value matches for Equal, and the effect matches or is empty.
fn tolerates(tol: &Toleration, taint: &Taint) -> bool {
    let effect = tol
        .effect
        .as_deref()
        .is_none_or(|e| e.is_empty() || e == taint.effect);
    let key = tol.key.as_deref().unwrap_or_default();
    let exists = tol.operator.as_deref() == Some("Exists");
    let matches = if key.is_empty() {
        exists
    } else if key != taint.key {
        false
    } else {
        exists
            || tol.value.as_deref().unwrap_or_default()
                == taint.value.as_deref().unwrap_or_default()
    };
    effect && matches
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(labels: serde_json::Value, taints: serde_json::Value) -> Node {
        serde_json::from_value(json!({"metadata": {"name": "n-1", "labels": labels},
                                      "spec": {"taints": taints}}))
        .expect("node")
    }

    fn spec(value: serde_json::Value) -> PodSpec {
        serde_json::from_value(
            json!({"containers": [], "nodeSelector": value["nodeSelector"],
                                      "affinity": value["affinity"],
                                      "tolerations": value["tolerations"]}),
        )
        .expect("spec")
    }

    #[expect(clippy::too_many_lines, reason = "a table of cases, a few lines each")]
    #[test]
    fn a_template_is_admitted_only_where_its_selector_affinity_and_tolerations_allow() {
        let pool = node(json!({"pool": "a", "gen": "5"}), json!([]));
        let tainted = node(
            json!({"pool": "a"}),
            json!([{"key": "team", "value": "x", "effect": "NoSchedule"}]),
        );
        let soft = node(
            json!({"pool": "a"}),
            json!([{"key": "soft", "effect": "PreferNoSchedule"}]),
        );
        let affinity = |op: &str, values: serde_json::Value| {
            json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "gen", "operator": op, "values": values}]}]}}})
        };
        let cases = [
            ("no constraint", json!({}), &pool, true),
            (
                "selector matches",
                json!({"nodeSelector": {"pool": "a"}}),
                &pool,
                true,
            ),
            (
                "selector misses",
                json!({"nodeSelector": {"pool": "b"}}),
                &pool,
                false,
            ),
            (
                "affinity In",
                json!({"affinity": affinity("In", json!(["5"]))}),
                &pool,
                true,
            ),
            (
                "affinity NotIn",
                json!({"affinity": affinity("NotIn", json!(["5"]))}),
                &pool,
                false,
            ),
            (
                "affinity Gt",
                json!({"affinity": affinity("Gt", json!(["4"]))}),
                &pool,
                true,
            ),
            (
                "affinity Lt",
                json!({"affinity": affinity("Lt", json!(["4"]))}),
                &pool,
                false,
            ),
            ("untolerated taint", json!({}), &tainted, false),
            (
                "tolerated by key and value",
                json!({"tolerations": [{"key": "team", "value": "x", "effect": "NoSchedule"}]}),
                &tainted,
                true,
            ),
            (
                "another value",
                json!({"tolerations": [{"key": "team", "value": "y"}]}),
                &tainted,
                false,
            ),
            (
                "tolerate everything",
                json!({"tolerations": [{"operator": "Exists"}]}),
                &tainted,
                true,
            ),
            ("a soft taint keeps no pod out", json!({}), &soft, true),
        ];
        for (case, template, node, admitted) in cases {
            assert_eq!(admits(&spec(template), &[], node), admitted, "{case}");
        }
        let extra: Toleration =
            serde_json::from_value(json!({"key": "team", "operator": "Exists"})).expect("tol");
        assert!(
            admits(&spec(json!({})), &[extra], &tainted),
            "the operator's own toleration"
        );
    }
}
