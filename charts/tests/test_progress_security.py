"""What the chart lets reach the progress channel, and what it lets the operator do with its endpoints.

The progress port admits, where NetworkPolicies are enforced, only pods that carry the labels
the operator gives every worker pod, and the operator may only patch the one object behind the
progress Service, an EndpointSlice where the cluster has them and an Endpoints object before:
the code's only calls on either are patches (pointing it at the leader, and handing it back
when the leader steps down). Both are held to the operator's source, so that a renamed label
or a new call fails here.

Rendered by the real Helm engine, with test_chart.py's helpers.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from test_chart import (  # noqa: F401 (chart: the module fixture)
    NAMESPACE,
    PROGRESS,
    PROGRESS_OFF,
    RELEASE,
    REPO_ROOT,
    SLICE_CLUSTER,
    all_roles,
    chart,
    of_kind,
    one,
    operator_deployment,
    render,
    render_for_cluster,
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
    """The API calls operator/src/runtime/progress_endpoint.rs makes on the progress Service's
    EndpointSlice (its `slices` Api) or Endpoints (its `endpoints` Api)."""
    source = CONTROLLER_PROGRESS_RS.read_text()
    source = source[: source.index("#[cfg(test)]")]
    return set(re.findall(r"self\s*\.(?:slices|endpoints)\s*\.(\w+)\(", source))


def api_handles() -> set[str]:
    """The kinds of the Api handles the operator's progress endpoint holds."""
    source = CONTROLLER_PROGRESS_RS.read_text()
    return set(re.findall(r"\b\w+: Api<(\w+)>", source[: source.index("#[cfg(test)]")]))


def test_the_operator_only_patches_the_progress_endpoints() -> None:
    assert api_handles() == {"EndpointSlice", "Endpoints"}
    assert endpoints_calls() == {"patch"}


# The object behind the progress Service: ("", "endpoints") on Kubernetes 1.20 and wherever
# `helm template` is not told of discovery.k8s.io/v1, the EndpointSlice where it is served.
ROUTES = {
    "endpoints": ({}, ("", "endpoints"), "Endpoints"),
    "endpoint-slice": (SLICE_CLUSTER, ("discovery.k8s.io", "endpointslices"), "EndpointSlice"),
}


def render_route(chart: Any, route: str, values: dict[str, Any]) -> list[dict[str, Any]]:
    cluster = ROUTES[route][0]
    return render_for_cluster(chart, values, **cluster) if cluster else render(chart, values)


@pytest.mark.parametrize("route", ROUTES)
def test_progress_endpoints_rbac_is_patch_alone_on_that_one_object(chart: Any, route: str) -> None:
    _, resource, kind = ROUTES[route]
    objects = render_route(chart, route, {"operator": {"watchNamespace": "ml"}})
    # The chart creates the one object the operator patches, and no other of either kind.
    assert [(o["kind"], o["metadata"]["name"]) for o in objects if o["kind"] in {"Endpoints", "EndpointSlice"}] == [
        (kind, PROGRESS)
    ]
    routing_resources = {("", "endpoints"), ("discovery.k8s.io", "endpointslices")}
    endpoint_roles = [r for r in all_roles(objects) if routing_resources & set(rules_by_resource(r))]
    assert [(r["kind"], r["metadata"]["name"]) for r in endpoint_roles] == [("Role", f"{RELEASE}-operator-progress")]
    role = endpoint_roles[0]
    # The operator's own namespace, not the watched one.
    assert role["metadata"]["namespace"] == NAMESPACE
    # No get or update: the code never reads or replaces it; its hand-back is a JSON patch
    # whose test op checks the address. No create: the chart made it.
    endpoint_rules = [r for r in role["rules"] if {"endpoints", "endpointslices"} & set(r["resources"])]
    assert endpoint_rules == [
        {
            "apiGroups": [resource[0]],
            "resources": [resource[1]],
            "resourceNames": [PROGRESS],
            "verbs": sorted(endpoints_calls()),
        }
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



@pytest.mark.parametrize(
    ("api_versions", "kube_version"),
    [([], "v1.20.2"), (["discovery.k8s.io/v1/EndpointSlice"], "v1.24.0"), ([], "v1.33.0")],
    ids=["1.20", "1.24-client-side-validation", "1.33-not-told-of-the-api"],
)
def test_the_progress_service_is_routed_by_endpoints_without_endpoint_slice_v1_or_before_1_25(
    chart: Any, api_versions: list[str], kube_version: str
) -> None:
    objects = render_for_cluster(chart, api_versions=api_versions, kube_version=kube_version)
    assert not of_kind(objects, "EndpointSlice")
    endpoints = one(objects, "Endpoints", PROGRESS)
    # As before EndpointSlices, byte for byte: no subsets (the leader's).
    assert set(endpoints) == {"apiVersion", "kind", "metadata"}


def test_the_progress_endpoint_slice_is_labelled_for_its_service_and_leaves_its_endpoints_to_the_leader(
    chart: Any,
) -> None:
    objects = render_for_cluster(chart, **SLICE_CLUSTER)
    assert not of_kind(objects, "Endpoints")
    service = one(objects, "Service", PROGRESS)
    assert "selector" not in service["spec"]
    slice_ = one(objects, "EndpointSlice", PROGRESS)
    assert slice_["apiVersion"] == "discovery.k8s.io/v1"
    assert slice_["metadata"]["namespace"] == service["metadata"]["namespace"] == NAMESPACE
    labels = slice_["metadata"]["labels"]
    # kube-proxy joins the slices of a Service by this label.
    assert labels["kubernetes.io/service-name"] == service["metadata"]["name"]
    # Not a controller-managed slice: the EndpointSlice (mirroring) controllers leave it alone.
    assert labels["endpointslice.kubernetes.io/managed-by"] == "trainyard-operator.trainyard.dev"
    # No endpoints or ports key, not even empty: Helm would reset the leader's on each upgrade.
    assert set(slice_) == {"apiVersion", "kind", "metadata", "addressType"}
    assert slice_["addressType"] == "IPv4"
    # The ports the leader writes carry the Service port's name, as kube-proxy matches them.
    assert '"name": "progress"' in CONTROLLER_PROGRESS_RS.read_text()
    assert [p["name"] for p in service["spec"]["ports"]] == ["progress"]
