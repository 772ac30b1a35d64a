"""What the chart lets reach the progress channel, and what it lets the operator do with its Endpoints.

The progress port admits, where NetworkPolicies are enforced, only pods that carry the labels
the operator gives every worker pod, and the operator may only patch the one Endpoints object
behind the progress Service: the code's only calls on it are patches (pointing it at the
leader, and handing it back when the leader steps down). Both are held to the operator's
source, so that a renamed label or a new call fails here.

Rendered by the real Helm engine, with test_chart.py's helpers.
"""

from __future__ import annotations

import re
from typing import Any

from test_chart import (  # noqa: F401 (chart: the module fixture)
    NAMESPACE,
    PROGRESS,
    PROGRESS_OFF,
    RELEASE,
    REPO_ROOT,
    all_roles,
    chart,
    of_kind,
    one,
    operator_deployment,
    render,
    rules_by_resource,
)

# The labels the progress port admits: every worker pod carries them (operator/src/build/pods.rs).
WORKER_LABEL_CONSTANTS = ("LABEL_JOB", "LABEL_RANK")
API_CRD = REPO_ROOT / "api" / "src" / "crd.rs"
PODS_RS = REPO_ROOT / "operator" / "src" / "build" / "pods.rs"
CONTROLLER_PROGRESS_RS = REPO_ROOT / "operator" / "src" / "runtime" / "progress_endpoint.rs"
METRICS_PEERS = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]


def label_value(constant: str) -> str:
    """The value of a label constant in the contract crate (api/src/crd.rs)."""
    match = re.search(rf'pub const {constant}: &str = "([^"]+)";', API_CRD.read_text())
    assert match, f"{constant} is not defined in {API_CRD}"
    return match.group(1)


def worker_pod_labels_use(constant: str) -> bool:
    """Whether operator/src/build/pods.rs's pod_labels sets the label `constant`."""
    source = PODS_RS.read_text()
    body = source[source.index("pub fn pod_labels(") :]
    body = body[: body.index("\n}\n")]
    return f"({constant}.to_owned()," in body


def render_with_policies(chart: Any, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return render(chart, {**(values or {}), "networkPolicy": {"enabled": True, "metricsFrom": METRICS_PEERS}})


def test_every_worker_pod_carries_the_labels_the_progress_policy_selects() -> None:
    for constant in WORKER_LABEL_CONSTANTS:
        assert worker_pod_labels_use(constant), f"pod_labels does not set {constant}"


def test_progress_network_policy_admits_only_worker_pods_of_any_namespace_to_the_progress_port(chart: Any) -> None:
    objects = render_with_policies(chart)
    policy = one(objects, "NetworkPolicy", f"{RELEASE}-operator-progress")
    assert policy["metadata"]["namespace"] == NAMESPACE
    assert policy["spec"]["podSelector"]["matchLabels"] == operator_deployment(objects)["spec"]["selector"]["matchLabels"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    # One peer with both selectors: worker pods, in every namespace (trainers run in any);
    # no ipBlock, so nothing from outside the cluster.
    workers = {
        "namespaceSelector": {},
        "podSelector": {
            "matchExpressions": [
                {"key": label_value(constant), "operator": "Exists"} for constant in WORKER_LABEL_CONSTANTS
            ]
        },
    }
    assert policy["spec"]["ingress"] == [{"ports": [{"protocol": "TCP", "port": 8082}], "from": [workers]}]


def test_progress_network_policy_widens_nothing_on_the_metrics_port(chart: Any) -> None:
    objects = render_with_policies(chart)
    metrics = one(objects, "NetworkPolicy", f"{RELEASE}-operator-metrics")
    assert metrics["spec"]["ingress"] == [{"ports": [{"protocol": "TCP", "port": 8080}], "from": METRICS_PEERS}]
    off = render_with_policies(chart, PROGRESS_OFF)
    assert {p["metadata"]["name"] for p in of_kind(off, "NetworkPolicy")} == {
        f"{RELEASE}-operator-metrics",
        f"{RELEASE}-device-plugin-metrics",
    }


def endpoints_calls() -> set[str]:
    """The API calls operator/src/runtime/progress_endpoint.rs makes on the progress Endpoints."""
    source = CONTROLLER_PROGRESS_RS.read_text()
    source = source[: source.index("#[cfg(test)]")]
    return set(re.findall(r"self\s*\.api\s*\.(\w+)\(", source))


def test_the_operator_only_patches_the_progress_endpoints() -> None:
    assert endpoints_calls() == {"patch"}


def test_progress_endpoints_rbac_is_patch_alone_on_that_one_object(chart: Any) -> None:
    objects = render(chart, {"operator": {"watchNamespace": "ml"}})
    endpoint_roles = [r for r in all_roles(objects) if ("", "endpoints") in rules_by_resource(r)]
    assert [(r["kind"], r["metadata"]["name"]) for r in endpoint_roles] == [("Role", f"{RELEASE}-operator-progress")]
    role = endpoint_roles[0]
    # The operator's own namespace, not the watched one.
    assert role["metadata"]["namespace"] == NAMESPACE
    # No get or update: the code never reads or replaces it; its hand-back is a JSON patch
    # whose test op checks the address.
    endpoint_rules = [r for r in role["rules"] if "endpoints" in r["resources"]]
    assert endpoint_rules == [
        {"apiGroups": [""], "resources": ["endpoints"], "resourceNames": [PROGRESS], "verbs": sorted(endpoints_calls())}
    ]
    # Beside it, only the seal key: read by name, made once (create cannot be limited by name).
    assert [r for r in role["rules"] if r not in endpoint_rules] == [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [f"{RELEASE}-worker-seal"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
    ]
    binding = one(objects, "RoleBinding", f"{RELEASE}-operator-progress")
    assert binding["metadata"]["namespace"] == NAMESPACE
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": f"{RELEASE}-operator", "namespace": NAMESPACE}]

