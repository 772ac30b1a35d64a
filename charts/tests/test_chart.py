"""Tests of the trainyard Helm chart, rendered by the real Helm engine.

helm-python-sdk binds Helm's Go SDK, so lint, schema validation and rendering
here are exactly what `helm install` does; no cluster is needed. Run with

    pip install -r charts/tests/requirements.txt
    pytest charts/tests

(`make prereqs` installs them into ~/.cache/trainyard/venv). celpy (cel-python)
is required, not optional: without it the file fails to import, so the
ValidatingAdmissionPolicy's CEL is always evaluated, never skipped.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, NamedTuple

import celpy
import helm_python
import pytest
import yaml

CHART_DIR = Path(__file__).resolve().parent.parent / "trainyard"
REPO_ROOT = CHART_DIR.parent.parent
RELEASE = "trainyard"
NAMESPACE = "trainyard-system"
FAKE_GPUS_PATH = "/etc/trainyard/fake-gpus.yaml"
FAKE_UUID = "GPU-11111111-2222-3333-4444-{:012d}"
# The progress channel's Service and Endpoints (the release's full name).
PROGRESS = f"{RELEASE}-progress"
PROGRESS_URL = f"http://{PROGRESS}.{NAMESPACE}.svc.cluster.local:8082/v1/progress"
PROGRESS_OFF = {"operator": {"progress": {"enabled": False}}}

# Helm's lint severities (helm_python.lint messages).
SEVERITY_WARNING = 2

# No image is published: the chart requires both repositories. Every render and lint here
# sets them (under the test's own values), except the tests of that requirement.
OPERATOR_REPO = "registry.example.com/trainyard/operator"
DEVICE_PLUGIN_REPO = "registry.example.com/trainyard/device-plugin"
IMAGES = {
    "operator": {"image": {"repository": OPERATOR_REPO}},
    "devicePlugin": {"image": {"repository": DEVICE_PLUGIN_REPO}},
}


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Helm's coalescing of values: maps merge key by key, anything else replaces."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def with_images(values: dict[str, Any] | None) -> dict[str, Any]:
    return merged(IMAGES, values or {})


@pytest.fixture(scope="module")
def chart() -> Any:
    loaded = helm_python.Chart.load(CHART_DIR)
    yield loaded
    loaded.close()


def render(chart: Any, values: dict[str, Any] | None = None, **opts: Any) -> list[dict[str, Any]]:
    """Render the chart and return every Kubernetes object it produces."""
    manifests = chart.render(
        with_images(values),
        name=opts.get("name", RELEASE),
        namespace=opts.get("namespace", NAMESPACE),
        is_install=True,
    )
    objects = []
    for path, text in manifests.items():
        if path.endswith("NOTES.txt"):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


def render_for_cluster(
    chart: Any, values: dict[str, Any] | None = None, *, api_versions: list[str], kube_version: str
) -> list[dict[str, Any]]:
    """Render as `helm template --api-versions ... --kube-version ...` does.

    helm_python's Chart.render does not expose these options; the native call
    it wraps takes them as `api_versions` and `kube_version`.
    """
    from helm_python import _native
    from helm_python.chart import _dumps

    opts = {
        "name": RELEASE,
        "namespace": NAMESPACE,
        "is_install": True,
        "api_versions": api_versions,
        "kube_version": kube_version,
    }
    rendered = _native.call_string("helm_render", chart._raw(), _dumps(with_images(values)), json.dumps(opts))
    manifests = json.loads(rendered)
    objects = []
    for path, text in manifests.items():
        if path.endswith("NOTES.txt"):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


VAP_API = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"
NODE_POLICY = f"{RELEASE}-device-plugin-node-labels"


def render_notes(chart: Any, values: dict[str, Any] | None = None) -> str:
    manifests = chart.render(with_images(values), name=RELEASE, namespace=NAMESPACE, is_install=True)
    return next(text for path, text in manifests.items() if path.endswith("NOTES.txt"))


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [o for o in of_kind(objects, kind) if name is None or o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, got {[m['metadata']['name'] for m in matches]}"
    return matches[0]


def container(workload: dict[str, Any]) -> dict[str, Any]:
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e for e in c.get("env", [])}


def operator_deployment(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return one(objects, "Deployment", f"{RELEASE}-operator")


def device_plugin_daemonset(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return one(objects, "DaemonSet", f"{RELEASE}-device-plugin")


def rules_by_resource(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    """Map (apiGroup, resource) to the verbs a role grants on it."""
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    return granted


ALL_TOGGLES_ON = {
    "devicePlugin": {"fakeGpus": {"enabled": True}},
    "metrics": {"serviceMonitor": {"enabled": True}, "grafanaDashboard": {"enabled": True}},
}

# --- chart metadata and lint ------------------------------------------------


def test_chart_metadata_declares_v2_api_min_kube_version_and_app_version(chart: Any) -> None:
    meta = chart.metadata
    assert meta["apiVersion"] == "v2"
    assert meta["name"] == "trainyard"
    assert meta["kubeVersion"] == ">=1.20.0-0"
    assert meta["appVersion"] == "0.1.0"


# The one lint warning the chart accepts. The operator's progress channel is
# specified as a v1 Endpoints object the leader writes (EndpointSlice v1 needs
# Kubernetes 1.21; the chart supports 1.20). Kubernetes 1.33 deprecated the
# Endpoints API (a warning; GA core/v1 APIs are not removed), and Helm's lint
# says so for its default Kubernetes version. Anything else still fails.
ENDPOINTS_DEPRECATION = (
    "templates/operator-progress.yaml",
    "v1 Endpoints is deprecated in v1.33+; use discovery.k8s.io/v1 EndpointSlice",
)


@pytest.mark.parametrize(
    "values",
    [{}, ALL_TOGGLES_ON, {"operator": {"watchNamespace": "ml"}}, {"operator": {"progress": {"enabled": False}}}],
    ids=["defaults", "all-toggles-on", "single-namespace", "progress-off"],
)
@pytest.mark.parametrize("kube_version", [None, "v1.20.2"], ids=["default-kube", "kube-1.20"])
def test_lint_reports_no_warnings_or_errors(values: dict[str, Any], kube_version: str | None) -> None:
    report = helm_python.lint(CHART_DIR, with_images(values), strict=True, kube_version=kube_version)
    problems = [
        m
        for m in report["messages"]
        if m["severity"] >= SEVERITY_WARNING and (m["path"], m["error"]) != ENDPOINTS_DEPRECATION
    ]
    errors = [e for e in report["errors"] if e != ENDPOINTS_DEPRECATION[1]]
    assert errors == [] and problems == [], report


# --- operator Deployment ----------------------------------------------------


def test_default_operator_runs_two_replicas_with_leader_election(chart: Any) -> None:
    deployment = operator_deployment(render(chart))
    assert deployment["spec"]["replicas"] == 2
    args = container(deployment)["args"]
    assert args[0] == "run"
    assert "--leader-elect=true" in args
    assert f"--lease-name={RELEASE}" in args
    assert "--config=/etc/trainyard/config.yaml" in args
    assert "--metrics-addr=0.0.0.0:8080" in args
    assert "--log-format=json" in args
    assert not any(a.startswith("--namespace") for a in args), "default watches all namespaces"


def test_operator_runs_the_binary_from_the_image(chart: Any) -> None:
    c = container(operator_deployment(render(chart)))
    assert c["command"] == ["/usr/local/bin/trainyard-operator"]
    assert c["image"] == f"{OPERATOR_REPO}:0.1.0"


def test_operator_probes_hit_healthz_and_readyz_on_the_metrics_port(chart: Any) -> None:
    c = container(operator_deployment(render(chart)))
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"metrics": 8080, "progress": 8082}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}


def test_operator_is_non_root_read_only_without_capabilities(chart: Any) -> None:
    deployment = operator_deployment(render(chart))
    pod_sc = deployment["spec"]["template"]["spec"]["securityContext"]
    assert pod_sc["runAsNonRoot"] is True
    # The kubelet can verify runAsNonRoot only with a numeric user.
    assert pod_sc["runAsUser"] != 0
    assert pod_sc["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container(deployment)["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert "add" not in sc["capabilities"]


def test_operator_sets_resource_requests_and_limits(chart: Any) -> None:
    resources = container(operator_deployment(render(chart)))["resources"]
    assert set(resources["requests"]) >= {"cpu", "memory"}
    assert set(resources["limits"]) >= {"cpu", "memory"}


def test_operator_gets_pod_name_and_namespace_from_the_downward_api(chart: Any) -> None:
    env = env_of(container(operator_deployment(render(chart))))
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"


def test_operator_mounts_its_config_map_at_etc_trainyard(chart: Any) -> None:
    objects = render(chart)
    deployment = operator_deployment(objects)
    mounts = {m["name"]: m for m in container(deployment)["volumeMounts"]}
    assert mounts["config"]["mountPath"] == "/etc/trainyard"
    assert mounts["config"]["readOnly"] is True
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    config_map = one(objects, "ConfigMap", volumes["config"]["configMap"]["name"])
    assert "config.yaml" in config_map["data"]


def test_operator_config_renders_the_contract_defaults(chart: Any) -> None:
    config_map = one(render(chart), "ConfigMap", f"{RELEASE}-operator-config")
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    assert config["onDemandMultiplier"] == 3.0
    assert {p["match"]: p["spot"] for p in config["prices"]} == {
        "T4": 0.12,
        "L4": 0.25,
        "A10G": 0.50,
        "A100-40GB": 1.10,
        "A100-80GB": 1.25,
        "H100": 2.50,
    }
    assert {(l["provider"], l["key"], l["value"]) for l in config["spot"]["labels"]} == {
        ("GKE", "cloud.google.com/gke-spot", "true"),
        ("GKE", "cloud.google.com/gke-preemptible", "true"),
        ("EKS", "eks.amazonaws.com/capacityType", "SPOT"),
        ("Karpenter", "karpenter.sh/capacity-type", "spot"),
        ("AKS", "kubernetes.azure.com/scalesetpriority", "spot"),
    }
    assert config["spot"]["tolerations"] == [
        {"key": "kubernetes.azure.com/scalesetpriority", "operator": "Equal", "value": "spot", "effect": "NoSchedule"},
        {"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
    ]
    assert config["terminationTaints"] == [
        "karpenter.sh/disrupted",
        "cloud.google.com/impending-node-termination",
        "aws-node-termination-handler/spot-itn",
        "ToBeDeletedByClusterAutoscaler",
    ]
    assert config["nodeNotReadyTimeoutSeconds"] == 60
    assert config["containerWaitingTimeoutSeconds"] == 300
    assert config["lostPeerWindowSeconds"] == 60


def test_operator_config_defaults_match_the_operators_own_defaults(chart: Any) -> None:
    """The chart and the operator binary agree on defaults, so leaving
    operator.config alone and deleting it behave the same."""
    defaults_file = REPO_ROOT / "operator" / "config" / "default.yaml"
    assert defaults_file.is_file(), f"{defaults_file} (the operator's documented defaults) is missing"
    assert chart.values["operator"]["config"] == yaml.safe_load(defaults_file.read_text())


def test_operator_config_override_replaces_the_price_table(chart: Any) -> None:
    values = {"operator": {"config": {"prices": [{"match": "B200", "spot": 4.0}]}}}
    config_map = one(render(chart, values), "ConfigMap", f"{RELEASE}-operator-config")
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    assert config["prices"] == [{"match": "B200", "spot": 4.0}]
    assert config["nodeNotReadyTimeoutSeconds"] == 60, "untouched keys keep their defaults"


def test_changing_operator_config_rolls_the_operator_pods(chart: Any) -> None:
    def checksum(values: dict[str, Any]) -> str:
        template = operator_deployment(render(chart, values))["spec"]["template"]
        return template["metadata"]["annotations"]["checksum/config"]

    assert checksum({}) == checksum({})
    assert checksum({}) != checksum({"operator": {"config": {"nodeNotReadyTimeoutSeconds": 90}}})


def test_watch_namespace_is_passed_to_the_operator(chart: Any) -> None:
    args = container(operator_deployment(render(chart, {"operator": {"watchNamespace": "ml"}})))["args"]
    assert "--namespace=ml" in args


def test_image_tag_and_pull_policy_follow_values(chart: Any) -> None:
    values = {
        "operator": {"image": {"tag": "dev", "pullPolicy": "Never"}},
        "devicePlugin": {"image": {"tag": "dev", "pullPolicy": "Never"}},
    }
    objects = render(chart, values)
    for workload, image in [
        (operator_deployment(objects), f"{OPERATOR_REPO}:dev"),
        (device_plugin_daemonset(objects), f"{DEVICE_PLUGIN_REPO}:dev"),
    ]:
        assert container(workload)["image"] == image
        assert container(workload)["imagePullPolicy"] == "Never"


def test_more_than_one_replica_without_leader_election_is_refused(chart: Any) -> None:
    with pytest.raises(helm_python.HelmRenderError, match="leaderElection"):
        render(chart, {"operator": {"leaderElection": {"enabled": False}}})
    single = render(chart, {"operator": {"replicas": 1, "leaderElection": {"enabled": False}}})
    assert "--leader-elect=false" in container(operator_deployment(single))["args"]
    assert not [r for r in of_kind(single, "Role") if "leases" in json.dumps(r["rules"]) and "create" in json.dumps(r["rules"])]


def test_operator_pod_disruption_budget_keeps_one_replica(chart: Any) -> None:
    pdb = one(render(chart), "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    selector = pdb["spec"]["selector"]["matchLabels"]
    pod_labels = operator_deployment(render(chart))["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= pod_labels.items()


# --- RBAC -------------------------------------------------------------------


def all_roles(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return of_kind(objects, "ClusterRole") + of_kind(objects, "Role")


@pytest.mark.parametrize(
    "values", [{}, {"operator": {"watchNamespace": "ml"}}], ids=["cluster-wide", "single-namespace"]
)
def test_no_role_grants_wildcards(chart: Any, values: dict[str, Any]) -> None:
    for role in all_roles(render(chart, values)):
        for rule in role["rules"]:
            for field in ("verbs", "resources", "apiGroups"):
                assert "*" not in rule[field], f"{role['metadata']['name']}: wildcard in {field}"
            assert "nonResourceURLs" not in rule


def test_no_role_reads_config_maps_or_any_secret_but_the_seal_key(chart: Any) -> None:
    seal = f"{RELEASE}-worker-seal"
    for role in all_roles(render(chart)):
        assert ("", "configmaps") not in rules_by_resource(role)
        for rule in role["rules"]:
            if "secrets" not in rule["resources"]:
                continue
            # Read only the seal key, by name; create (which cannot be limited by name) it once.
            assert set(rule["verbs"]) <= {"get", "create"}, rule
            if "get" in rule["verbs"]:
                assert rule.get("resourceNames") == [seal], rule
            assert role["kind"] == "Role", role["metadata"]["name"]


@pytest.mark.parametrize(
    "values", [{}, {"operator": {"watchNamespace": "ml"}}], ids=["cluster-wide", "single-namespace"]
)
def test_operator_rbac_grants_exactly_the_contract(chart: Any, values: dict[str, Any]) -> None:
    objects = render(chart, values)
    assert operator_grants(objects) == OPERATOR_RBAC


def test_operator_rbac_without_the_progress_channel_grants_no_token_reviews_or_endpoints(chart: Any) -> None:
    objects = render(chart, {"operator": {"progress": {"enabled": False}}})
    assert operator_grants(objects) == OPERATOR_RBAC_WITHOUT_PROGRESS
    assert not [r for r in all_roles(objects) if r["metadata"]["name"].endswith("-progress")]
    assert not [b for b in of_kind(objects, "RoleBinding") if b["metadata"]["name"].endswith("-progress")]


# Exactly the calls operator/src makes; docs/operator.md ("RBAC") lists each one.
OPERATOR_RBAC: dict[tuple[str, str], set[str]] = {
    # Watched; never written: no finalizers, no spec or metadata writes.
    ("trainyard.dev", "trainingjobs"): {"list", "watch"},
    # Status by server-side apply (and a merge patch for malformed objects).
    ("trainyard.dev", "trainingjobs/status"): {"patch"},
    # Created, deleted, one read for a sibling's placement; patched only to move a pod kept for
    # an in-place restart to its next attempt (its attempt label, under its uid).
    ("", "pods"): {"get", "list", "watch", "create", "delete", "patch"},
    # Server-side applied (create the first time), watched; never deleted.
    ("", "services"): {"list", "watch", "create"},
    # Created; patched only for the owner reference retainOnDelete asks for.
    ("", "persistentvolumeclaims"): {"list", "watch", "create", "patch"},
    ("", "nodes"): {"list", "watch"},
    # The gang schedulers' PodGroups: created with an attempt's first pods, owned by the job.
    ("scheduling.volcano.sh", "podgroups"): {"create"},
    ("scheduling.x-k8s.io", "podgroups"): {"create"},
    # Kueue: the Workload of a job that names a LocalQueue (created, owned by the job), its
    # status (quota given back after an eviction, Finished), and the flavors it names.
    ("kueue.x-k8s.io", "workloads"): {"list", "watch", "create"},
    ("kueue.x-k8s.io", "workloads/status"): {"patch"},
    ("kueue.x-k8s.io", "resourceflavors"): {"list", "watch"},
    ("events.k8s.io", "events"): {"create", "patch"},
    # Node heartbeats (list, watch) and the leader Lease (create, get, patch).
    ("coordination.k8s.io", "leases"): {"get", "list", "watch", "create", "patch"},
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"get"},
    # Progress channel: each report's token is checked with a TokenReview.
    ("authentication.k8s.io", "tokenreviews"): {"create"},
    # Progress channel: the leader points the progress Endpoints (one object,
    # created by the chart) at its own pod IP, and hands them back when it
    # steps down; both are patches (test_progress_security.py).
    ("", "endpoints"): {"patch"},
    # Progress channel: the key that seals the worker pods allowed to report, in the operator's
    # namespace: read by name, made once by the first replica.
    ("", "secrets"): {"get", "create"},
}

# With operator.progress.enabled=false: no TokenReviews, no Endpoints, no seal key.
OPERATOR_RBAC_WITHOUT_PROGRESS = {
    key: verbs
    for key, verbs in OPERATOR_RBAC.items()
    if key not in {("authentication.k8s.io", "tokenreviews"), ("", "endpoints"), ("", "secrets")}
}


# Where the chart routes the progress Service with an EndpointSlice (discovery.k8s.io/v1 served
# and Kubernetes 1.25+): the same two patches on the one slice it creates, and no Endpoints.
SLICE_CLUSTER = {"api_versions": ["discovery.k8s.io/v1/EndpointSlice"], "kube_version": "v1.30.0"}
OPERATOR_RBAC_WITH_SLICES = {
    **{key: verbs for key, verbs in OPERATOR_RBAC.items() if key != ("", "endpoints")},
    ("discovery.k8s.io", "endpointslices"): {"patch"},
}


@pytest.mark.parametrize(
    "values", [{}, {"operator": {"watchNamespace": "ml"}}], ids=["cluster-wide", "single-namespace"]
)
def test_operator_rbac_with_endpoint_slices_grants_the_slice_instead_of_the_endpoints(
    chart: Any, values: dict[str, Any]
) -> None:
    assert operator_grants(render_for_cluster(chart, values, **SLICE_CLUSTER)) == OPERATOR_RBAC_WITH_SLICES
    off = render_for_cluster(chart, merged(values, PROGRESS_OFF), **SLICE_CLUSTER)
    assert operator_grants(off) == OPERATOR_RBAC_WITHOUT_PROGRESS


def operator_grants(objects: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    granted: dict[tuple[str, str], set[str]] = {}
    for role in all_roles(objects):
        if role["metadata"]["labels"]["app.kubernetes.io/component"] != "operator":
            continue
        for key, verbs in rules_by_resource(role).items():
            granted.setdefault(key, set()).update(verbs)
    return granted


@pytest.mark.parametrize(
    "values", [{}, {"operator": {"watchNamespace": "ml"}}], ids=["cluster-wide", "single-namespace"]
)
def test_operator_never_writes_job_specs_updates_pods_or_deletes_services_and_claims(
    chart: Any, values: dict[str, Any]
) -> None:
    granted = operator_grants(render(chart, values))
    assert granted[("trainyard.dev", "trainingjobs")] == {"list", "watch"}
    assert ("trainyard.dev", "trainingjobs/finalizers") not in granted
    assert "update" not in granted[("", "pods")]
    for resource in ("services", "persistentvolumeclaims"):
        assert "delete" not in granted[("", resource)], resource


def test_owner_reference_permission_enforcement_adds_only_the_verbs_it_checks(chart: Any) -> None:
    granted = operator_grants(render(chart, {"operator": {"rbac": {"ownerReferencesPermissionEnforcement": True}}}))
    expected = copy.deepcopy(OPERATOR_RBAC)
    expected[("", "services")].add("delete")
    expected[("", "persistentvolumeclaims")].add("delete")
    expected[("scheduling.volcano.sh", "podgroups")].add("delete")
    expected[("scheduling.x-k8s.io", "podgroups")].add("delete")
    expected[("kueue.x-k8s.io", "workloads")].add("delete")
    expected[("trainyard.dev", "trainingjobs/finalizers")] = {"update"}
    assert granted == expected


def test_operator_reads_only_its_own_crd_and_kueues_workload_crd(chart: Any) -> None:
    cluster_role = one(render(chart), "ClusterRole", f"{RELEASE}-operator-cluster")
    crd_rules = [r for r in cluster_role["rules"] if "customresourcedefinitions" in r["resources"]]
    assert [r["resourceNames"] for r in crd_rules] == [["trainingjobs.trainyard.dev", "workloads.kueue.x-k8s.io"]]


def test_leader_election_lease_access_is_a_namespaced_role_for_one_lease(chart: Any) -> None:
    objects = render(chart)
    assert not [r for r in of_kind(objects, "ClusterRole") if "leases" in json.dumps(r["rules"])]
    role = one(objects, "Role", f"{RELEASE}-operator-lease")
    assert role["metadata"]["namespace"] == NAMESPACE
    lease_name = next(
        a.split("=", 1)[1] for a in container(operator_deployment(objects))["args"] if a.startswith("--lease-name=")
    )
    for rule in role["rules"]:
        if set(rule["verbs"]) != {"create"}:
            # create cannot be restricted by name; everything else can.
            assert rule["resourceNames"] == [lease_name]
    binding = one(objects, "RoleBinding", f"{RELEASE}-operator-lease")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]


@pytest.mark.parametrize(
    "values", [{}, {"operator": {"watchNamespace": "ml"}}], ids=["cluster-wide", "single-namespace"]
)
def test_node_lease_access_is_read_only_and_only_in_kube_node_lease(chart: Any, values: dict[str, Any]) -> None:
    objects = render(chart, values)
    role = one(objects, "Role", f"{RELEASE}-operator-node-leases")
    assert role["metadata"]["namespace"] == "kube-node-lease"
    assert rules_by_resource(role) == {("coordination.k8s.io", "leases"): {"list", "watch"}}
    binding = one(objects, "RoleBinding", f"{RELEASE}-operator-node-leases")
    assert binding["metadata"]["namespace"] == "kube-node-lease"
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"][0]["namespace"] == NAMESPACE


def test_cluster_wide_operator_binds_job_rules_with_a_cluster_role(chart: Any) -> None:
    objects = render(chart)
    role = one(objects, "ClusterRole", f"{RELEASE}-operator-jobs")
    assert ("", "pods") in rules_by_resource(role)
    binding = one(objects, "ClusterRoleBinding", f"{RELEASE}-operator-jobs")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": f"{RELEASE}-operator", "namespace": NAMESPACE}]


def test_single_namespace_operator_gets_job_rules_only_in_that_namespace(chart: Any) -> None:
    objects = render(chart, {"operator": {"watchNamespace": "ml"}})
    for cluster_role in of_kind(objects, "ClusterRole"):
        assert ("", "pods") not in rules_by_resource(cluster_role), cluster_role["metadata"]["name"]
    role = one(objects, "Role", f"{RELEASE}-operator-jobs")
    assert role["metadata"]["namespace"] == "ml"
    assert ("", "pods") in rules_by_resource(role)
    binding = one(objects, "RoleBinding", f"{RELEASE}-operator-jobs")
    assert binding["metadata"]["namespace"] == "ml"
    assert binding["subjects"][0]["namespace"] == NAMESPACE


def test_device_plugin_may_only_get_and_patch_nodes(chart: Any) -> None:
    role = one(render(chart), "ClusterRole", f"{RELEASE}-device-plugin")
    assert rules_by_resource(role) == {("", "nodes"): {"get", "patch"}}


def test_node_label_policy_renders_only_where_the_cluster_serves_the_api(chart: Any) -> None:
    for objects in (
        render(chart),
        render_for_cluster(chart, api_versions=[], kube_version="v1.29.0"),
    ):
        assert not of_kind(objects, "ValidatingAdmissionPolicy")
        assert not of_kind(objects, "ValidatingAdmissionPolicyBinding")
    objects = render_for_cluster(chart, api_versions=[VAP_API], kube_version="v1.30.0")
    policy = one(objects, "ValidatingAdmissionPolicy", NODE_POLICY)
    assert policy["apiVersion"] == "admissionregistration.k8s.io/v1"
    binding = one(objects, "ValidatingAdmissionPolicyBinding", NODE_POLICY)
    assert binding["spec"] == {"policyName": NODE_POLICY, "validationActions": ["Deny"]}
    off = render_for_cluster(
        chart, {"devicePlugin": {"rbac": {"nodeLabelPolicy": False}}}, api_versions=[VAP_API], kube_version="v1.30.0"
    )
    assert not of_kind(off, "ValidatingAdmissionPolicy")


def test_node_label_policy_binds_the_plugin_to_nvidia_labels_of_its_own_node(chart: Any) -> None:
    objects = render_for_cluster(chart, api_versions=[VAP_API], kube_version="v1.30.0")
    spec = one(objects, "ValidatingAdmissionPolicy", NODE_POLICY)["spec"]
    assert spec["failurePolicy"] == "Fail"
    [rule] = spec["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == [""] and set(rule["resources"]) == {"nodes", "nodes/status"}
    assert set(rule["operations"]) == {"CREATE", "UPDATE", "DELETE"}
    # Only the plugin's own service account is judged.
    [condition] = spec["matchConditions"]
    assert condition["expression"] == (
        f"request.userInfo.username == 'system:serviceaccount:{NAMESPACE}:{RELEASE}-device-plugin'"
    )
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    assert "request.userInfo.extra['authentication.kubernetes.io/node-name'][0]" in variables["nodeName"]
    expressions = [v["expression"] for v in spec["validations"]]
    assert expressions[0] == "request.operation == 'UPDATE' && request.subResource == ''"
    assert "object.metadata.name == variables.nodeName" in expressions[1]
    assert "variables.nodeName != ''" in expressions[1]
    assert "k.startsWith('nvidia.com/')" in expressions[2]
    assert "object.metadata.labels.all(" in expressions[2] and "oldObject.metadata.labels.all(" in expressions[2]
    for compared in ("spec", "metadata.annotations", "metadata.ownerReferences", "metadata.finalizers"):
        assert f"object.{compared} == oldObject.{compared}" in expressions[3], compared
    assert all(v["reason"] == "Forbidden" for v in spec["validations"])


def test_node_label_policy_names_a_custom_service_account(chart: Any) -> None:
    objects = render_for_cluster(
        chart,
        {"devicePlugin": {"serviceAccount": {"name": "gpu-labeller"}}},
        api_versions=[VAP_API],
        kube_version="v1.30.0",
    )
    [condition] = one(objects, "ValidatingAdmissionPolicy", NODE_POLICY)["spec"]["matchConditions"]
    assert f"'system:serviceaccount:{NAMESPACE}:gpu-labeller'" in condition["expression"]


class Admission(NamedTuple):
    """What the API server answers a request the policy judges: `verdict` is 'not matched',
    'allowed' or 'denied by rule N'; `message` is the denying rule's message."""

    verdict: str
    message: str = ""


def cel_bool(expression: str, activation: dict[str, Any]) -> bool:
    """Evaluates a CEL expression that must yield a bool. An evaluation error or another
    type fails the test: the API server would deny the request (failurePolicy: Fail), but
    for a reason no rule states, so it is a bug in the policy, not a verdict."""
    result = cel_value(expression, activation)
    assert isinstance(result, celpy.celtypes.BoolType), f"{expression!r} gave {result!r}, not a bool"
    return bool(result)


def cel_value(expression: str, activation: dict[str, Any]) -> Any:
    env = celpy.Environment()
    try:
        return env.program(env.compile(expression)).evaluate(activation)
    except celpy.CELEvalError as err:
        pytest.fail(f"CEL evaluation error in {expression!r}: {err}")


def admission_verdict(spec: dict[str, Any], request: dict[str, Any], old: Any, new: Any) -> Admission:
    """Evaluates a ValidatingAdmissionPolicy spec as the API server does: matchConditions,
    then variables, then each validation in order, and the message (or messageExpression)
    of the first one that is false. cel-python evaluates dynamically typed CEL: it does not
    type-check against the Node schema or estimate cost, as the API server does when the
    policy is created (docs/install.md, "Protections by Kubernetes version")."""
    activation: dict[str, Any] = {
        "request": celpy.json_to_cel(request),
        "object": celpy.json_to_cel(new),
        "oldObject": celpy.json_to_cel(old),
    }
    if not all(cel_bool(c["expression"], activation) for c in spec.get("matchConditions", [])):
        return Admission("not matched")
    variables: dict[str, Any] = {}
    for variable in spec.get("variables", []):
        activation["variables"] = cel_map(variables)
        variables[variable["name"]] = cel_value(variable["expression"], activation)
    activation["variables"] = cel_map(variables)
    for i, validation in enumerate(spec["validations"]):
        if cel_bool(validation["expression"], activation):
            continue
        message = validation.get("message", "")
        if "messageExpression" in validation:
            message = cel_value(validation["messageExpression"], activation)
            assert isinstance(message, str), f"rule {i}: messageExpression gave {message!r}"
        return Admission(f"denied by rule {i}", str(message))
    return Admission("allowed")


def cel_map(values: dict[str, Any]) -> Any:
    return celpy.celtypes.MapType({celpy.celtypes.StringType(k): v for k, v in values.items()})


PLUGIN_USER = f"system:serviceaccount:{NAMESPACE}:{RELEASE}-device-plugin"
A_NODE = {
    "metadata": {
        "name": "gpu-1",
        "labels": {"kubernetes.io/hostname": "gpu-1", "nvidia.com/gpu.count": "8"},
        "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
    },
    "spec": {"podCIDR": "10.0.1.0/24"},
}


def edited(change: Any, node: dict[str, Any] = A_NODE) -> dict[str, Any]:
    node = copy.deepcopy(node)
    change(node)
    return node


NO_LABELS = edited(lambda n: n["metadata"].pop("labels"))
FIRST_LABELS = edited(lambda n: n["metadata"].update(labels={"nvidia.com/gpu.count": "8"}), NO_LABELS)


def relabeled(labels: dict[str, str]) -> dict[str, Any]:
    return edited(lambda n: n["metadata"]["labels"].update(labels))


def unlabeled(key: str) -> dict[str, Any]:
    return edited(lambda n: n["metadata"]["labels"].pop(key))


def respecced(spec: dict[str, Any]) -> dict[str, Any]:
    return edited(lambda n: n["spec"].update(spec))


U, P = "UPDATE", PLUGIN_USER


@pytest.mark.parametrize(
    "operation, sub_resource, user, claim, old, new, verdict",
    [
        (U, "", P, "gpu-1", A_NODE, relabeled({"nvidia.com/gpu.count": "7", "nvidia.com/x": "y"}), "allowed"),
        (U, "", P, "gpu-1", A_NODE, unlabeled("nvidia.com/gpu.count"), "allowed"),
        (U, "", P, "gpu-1", NO_LABELS, FIRST_LABELS, "allowed"),
        (U, "", P, "gpu-1", A_NODE, edited(lambda n: n["metadata"].pop("labels")), "denied by rule 2"),
        (U, "", P, "gpu-2", A_NODE, A_NODE, "denied by rule 1"),
        (U, "", P, None, A_NODE, A_NODE, "denied by rule 1"),
        (U, "", P, "gpu-1", A_NODE, relabeled({"team": "x"}), "denied by rule 2"),
        (U, "", P, "gpu-1", A_NODE, unlabeled("kubernetes.io/hostname"), "denied by rule 2"),
        (U, "", P, "gpu-1", A_NODE, respecced({"taints": [{"key": "k", "effect": "NoSchedule"}]}), "denied by rule 3"),
        (U, "", P, "gpu-1", A_NODE, respecced({"unschedulable": True}), "denied by rule 3"),
        (U, "", P, "gpu-1", A_NODE, edited(lambda n: n["metadata"]["annotations"].clear()), "denied by rule 3"),
        ("CREATE", "", P, "gpu-1", None, A_NODE, "denied by rule 0"),
        ("DELETE", "", P, "gpu-1", A_NODE, None, "denied by rule 0"),
        (U, "status", P, "gpu-1", A_NODE, A_NODE, "denied by rule 0"),
        (U, "", "system:node:gpu-1", None, A_NODE, respecced({"unschedulable": True}), "not matched"),
    ],
    ids=[
        "own-node-nvidia-labels-changed",
        "own-node-nvidia-label-removed",
        "first-labels-on-an-unlabelled-node",
        "every-label-removed",
        "other-node",
        "no-node-claim",
        "foreign-label-added",
        "foreign-label-removed",
        "taint",
        "cordon",
        "annotations",
        "create",
        "delete",
        "status",
        "other-user",
    ],
)
def test_node_label_policy_admits_only_nvidia_labels_of_the_plugins_own_node(
    chart: Any, operation: str, sub_resource: str, user: str, claim: str | None, old: Any, new: Any, verdict: str
) -> None:
    objects = render_for_cluster(chart, api_versions=[VAP_API], kube_version="v1.30.0")
    spec = one(objects, "ValidatingAdmissionPolicy", NODE_POLICY)["spec"]
    extra = {"authentication.kubernetes.io/node-name": [claim]} if claim else {}
    request = {"operation": operation, "subResource": sub_resource, "userInfo": {"username": user, "extra": extra}}
    assert admission_verdict(spec, request, old, new).verdict == verdict


@pytest.mark.parametrize(
    "claim, old, new, message",
    [
        ("gpu-2", A_NODE, A_NODE, "the device plugin on gpu-2 may change only that Node, not gpu-1"),
        (
            None,
            A_NODE,
            A_NODE,
            "the device plugin token carries no node-name claim (authentication.kubernetes.io/node-name); "
            "it may not change any Node",
        ),
        ("gpu-1", A_NODE, relabeled({"team": "x"}), "the device plugin may change only nvidia.com/* labels"),
    ],
    ids=["other-node", "no-node-claim", "foreign-label"],
)
def test_node_label_policy_denials_say_why(chart: Any, claim: str | None, old: Any, new: Any, message: str) -> None:
    objects = render_for_cluster(chart, api_versions=[VAP_API], kube_version="v1.30.0")
    spec = one(objects, "ValidatingAdmissionPolicy", NODE_POLICY)["spec"]
    extra = {"authentication.kubernetes.io/node-name": [claim]} if claim else {}
    request = {"operation": "UPDATE", "subResource": "", "userInfo": {"username": PLUGIN_USER, "extra": extra}}
    assert admission_verdict(spec, request, old, new).message == message


def test_network_policies_render_only_when_enabled(chart: Any) -> None:
    assert not of_kind(render(chart), "NetworkPolicy")
    assert not of_kind(render(chart, ALL_TOGGLES_ON), "NetworkPolicy")


def test_network_policies_admit_only_the_configured_peers_to_the_metrics_ports(chart: Any) -> None:
    peers = [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
        }
    ]
    objects = render(chart, {"networkPolicy": {"enabled": True, "metricsFrom": peers}})
    for component, name, port in (
        ("operator", f"{RELEASE}-operator-metrics", 8080),
        ("device-plugin", f"{RELEASE}-device-plugin-metrics", 9400),
    ):
        policy = one(objects, "NetworkPolicy", name)
        assert policy["metadata"]["namespace"] == NAMESPACE
        workload = operator_deployment(objects) if component == "operator" else device_plugin_daemonset(objects)
        assert policy["spec"]["podSelector"]["matchLabels"] == workload["spec"]["selector"]["matchLabels"]
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        assert policy["spec"]["ingress"] == [{"ports": [{"protocol": "TCP", "port": port}], "from": peers}]


def test_network_policies_without_peers_admit_no_one_to_the_metrics_port(chart: Any) -> None:
    objects = render(chart, {"networkPolicy": {"enabled": True}, "devicePlugin": {"enabled": False}})
    policies = {p["metadata"]["name"]: p for p in of_kind(objects, "NetworkPolicy")}
    assert set(policies) == {f"{RELEASE}-operator-metrics", f"{RELEASE}-operator-progress"}
    # An empty `from` would admit every source; no rule admits none.
    assert policies[f"{RELEASE}-operator-metrics"]["spec"]["ingress"] == []
    # The progress policy opens the progress port only, never the metrics port.
    [rule] = policies[f"{RELEASE}-operator-progress"]["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 8082}]


def test_every_binding_names_a_rendered_role_and_service_account(chart: Any) -> None:
    objects = render(chart)
    roles = {(r["kind"], r["metadata"]["name"]) for r in all_roles(objects)}
    accounts = {(a["metadata"]["namespace"], a["metadata"]["name"]) for a in of_kind(objects, "ServiceAccount")}
    for binding in of_kind(objects, "ClusterRoleBinding") + of_kind(objects, "RoleBinding"):
        assert (binding["roleRef"]["kind"], binding["roleRef"]["name"]) in roles
        for subject in binding["subjects"]:
            assert (subject["namespace"], subject["name"]) in accounts


# --- device-plugin DaemonSet ------------------------------------------------


def test_device_plugin_mounts_the_kubelet_socket_dir_from_the_host(chart: Any) -> None:
    daemonset = device_plugin_daemonset(render(chart))
    volumes = {v["name"]: v for v in daemonset["spec"]["template"]["spec"]["volumes"]}
    assert volumes["device-plugins"]["hostPath"] == {"path": "/var/lib/kubelet/device-plugins", "type": "Directory"}
    mounts = {m["name"]: m for m in container(daemonset)["volumeMounts"]}
    assert mounts["device-plugins"]["mountPath"] == "/var/lib/kubelet/device-plugins"
    assert "--device-plugin-dir=/var/lib/kubelet/device-plugins" in container(daemonset)["args"]


def test_custom_device_plugin_dir_reaches_host_path_mount_and_flag(chart: Any) -> None:
    kubelet_dir = "/var/lib/k0s/kubelet/device-plugins"
    daemonset = device_plugin_daemonset(render(chart, {"devicePlugin": {"devicePluginDir": kubelet_dir}}))
    volumes = {v["name"]: v for v in daemonset["spec"]["template"]["spec"]["volumes"]}
    assert volumes["device-plugins"]["hostPath"]["path"] == kubelet_dir
    assert f"--device-plugin-dir={kubelet_dir}" in container(daemonset)["args"]


def test_device_plugin_is_node_critical_and_tolerates_gpu_and_spot_taints(chart: Any) -> None:
    spec = device_plugin_daemonset(render(chart))["spec"]["template"]["spec"]
    assert spec["priorityClassName"] == "system-node-critical"
    tolerations = spec["tolerations"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations
    spot_keys = {t["key"] for t in tolerations}
    assert {"kubernetes.azure.com/scalesetpriority", "cloud.google.com/gke-spot"} <= spot_keys


def test_device_plugin_node_selector_comes_from_values(chart: Any) -> None:
    selector = {"nvidia.com/gpu.present": "true"}
    daemonset = device_plugin_daemonset(render(chart, {"devicePlugin": {"nodeSelector": selector}}))
    assert daemonset["spec"]["template"]["spec"]["nodeSelector"] == selector


def test_device_plugin_args_follow_the_cli_contract(chart: Any) -> None:
    c = container(device_plugin_daemonset(render(chart)))
    assert c["command"] == ["/usr/local/bin/trainyard-device-plugin"]
    assert c["args"] == [
        "run",
        "--device-plugin-dir=/var/lib/kubelet/device-plugins",
        "--resource-name=nvidia.com/gpu",
        "--node-name=$(NODE_NAME)",
        "--metrics-addr=0.0.0.0:9400",
        "--device-list-strategy=envvar",
        "--log-format=json",
        "--state-dir=/var/lib/trainyard/device-plugin",
    ]
    assert env_of(c)["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_device_plugin_keeps_owed_resets_in_a_node_directory_unless_turned_off(chart: Any) -> None:
    daemonset = device_plugin_daemonset(render(chart))
    volumes = {v["name"]: v for v in daemonset["spec"]["template"]["spec"]["volumes"]}
    assert volumes["state"]["hostPath"] == {
        "path": "/var/lib/trainyard/device-plugin",
        "type": "DirectoryOrCreate",
    }
    mounts = {m["name"]: m["mountPath"] for m in container(daemonset)["volumeMounts"]}
    assert mounts["state"] == "/var/lib/trainyard/device-plugin"
    off = device_plugin_daemonset(render(chart, {"devicePlugin": {"stateDir": ""}}))
    assert "state" not in {v["name"] for v in off["spec"]["template"]["spec"]["volumes"]}
    assert not any(a.startswith("--state-dir") for a in container(off)["args"])


def test_device_plugin_passes_device_specs_only_when_asked(chart: Any) -> None:
    values = {"devicePlugin": {"passDeviceSpecs": True, "deviceListStrategy": "envvar,cdi"}}
    args = container(device_plugin_daemonset(render(chart, values)))["args"]
    assert "--pass-device-specs" in args
    assert "--device-list-strategy=envvar,cdi" in args


def test_device_plugin_probes_and_metrics_use_port_9400(chart: Any) -> None:
    c = container(device_plugin_daemonset(render(chart)))
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"metrics": 9400}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}


def test_device_plugin_runs_as_root_without_capabilities_or_escalation(chart: Any) -> None:
    daemonset = device_plugin_daemonset(render(chart))
    sc = container(daemonset)["securityContext"]
    assert sc["privileged"] is False
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert "add" not in sc["capabilities"]
    pod_sc = daemonset["spec"]["template"]["spec"]["securityContext"]
    assert pod_sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "hostNetwork" not in daemonset["spec"]["template"]["spec"]


def test_device_plugin_uses_nvml_by_default(chart: Any) -> None:
    objects = render(chart)
    c = container(device_plugin_daemonset(objects))
    assert not any(a.startswith("--fake-gpus") for a in c["args"])
    assert env_of(c)["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert "TRAINYARD_FAKE_GPUS" not in env_of(c)
    assert not [cm for cm in of_kind(objects, "ConfigMap") if cm["metadata"]["name"].endswith("fake-gpus")]


def test_fake_gpus_render_a_config_map_mount_and_flag(chart: Any) -> None:
    objects = render(chart, {"devicePlugin": {"fakeGpus": {"enabled": True}}})
    daemonset = device_plugin_daemonset(objects)
    c = container(daemonset)
    assert f"--fake-gpus={FAKE_GPUS_PATH}" in c["args"]
    assert "NVIDIA_VISIBLE_DEVICES" not in env_of(c)
    # `discover` run in the pod reads the same file without flags.
    assert env_of(c)["TRAINYARD_FAKE_GPUS"]["value"] == FAKE_GPUS_PATH
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["fake-gpus"]["mountPath"] == str(Path(FAKE_GPUS_PATH).parent)
    # No subPath: a subPath mount never sees ConfigMap updates.
    assert "subPath" not in mounts["fake-gpus"]
    volumes = {v["name"]: v for v in daemonset["spec"]["template"]["spec"]["volumes"]}
    config_map = one(objects, "ConfigMap", volumes["fake-gpus"]["configMap"]["name"])
    assert set(config_map["data"]) == {Path(FAKE_GPUS_PATH).name}


def test_default_fake_gpu_file_is_an_8_gpu_nvswitch_node(chart: Any) -> None:
    objects = render(chart, {"devicePlugin": {"fakeGpus": {"enabled": True}}})
    config_map = one(objects, "ConfigMap", f"{RELEASE}-device-plugin-fake-gpus")
    fake = yaml.safe_load(config_map["data"]["fake-gpus.yaml"])
    assert fake["driverVersion"] == "550.54.15"
    assert fake["cudaVersion"] == "12.4"
    gpus = fake["gpus"]
    uuids = [FAKE_UUID.format(i) for i in range(8)]
    assert [g["uuid"] for g in gpus] == uuids
    for i, gpu in enumerate(gpus):
        assert gpu["index"] == i
        assert gpu["name"] == "NVIDIA A100-SXM4-80GB"
        assert gpu["memoryMiB"] == 81920
        assert gpu["numaNode"] == (0 if i < 4 else 1)
        assert gpu["computeCapability"] == "8.0"
        assert gpu["healthy"] is True
        assert gpu["nvlinks"] == {peer: 12 for peer in uuids if peer != gpu["uuid"]}


def test_fake_gpu_file_content_implies_fake_gpus_and_is_used_verbatim(chart: Any) -> None:
    content = (
        "gpus:\n"
        "  - uuid: GPU-aaaaaaaa-0000-0000-0000-000000000000\n"
        "    index: 0\n"
        "    name: NVIDIA L4\n"
        "    memoryMiB: 23034\n"
        "    healthy: false\n"
    )
    objects = render(chart, {"devicePlugin": {"fakeGpus": {"file": content}}})
    assert f"--fake-gpus={FAKE_GPUS_PATH}" in container(device_plugin_daemonset(objects))["args"]
    config_map = one(objects, "ConfigMap", f"{RELEASE}-device-plugin-fake-gpus")
    assert config_map["data"]["fake-gpus.yaml"].strip() == content.strip()


def test_fake_gpus_from_a_host_directory_mount_it_instead_of_a_config_map(chart: Any) -> None:
    objects = render(chart, {"devicePlugin": {"fakeGpus": {"hostDirectory": "/srv/trainyard"}}})
    daemonset = device_plugin_daemonset(objects)
    volumes = {v["name"]: v for v in daemonset["spec"]["template"]["spec"]["volumes"]}
    assert volumes["fake-gpus"]["hostPath"] == {"path": "/srv/trainyard", "type": "Directory"}
    assert f"--fake-gpus={FAKE_GPUS_PATH}" in container(daemonset)["args"]
    assert not [cm for cm in of_kind(objects, "ConfigMap") if cm["metadata"]["name"].endswith("fake-gpus")]


def test_fake_gpu_file_and_host_directory_together_are_refused(chart: Any) -> None:
    with pytest.raises(helm_python.HelmRenderError, match="exclusive"):
        render(chart, {"devicePlugin": {"fakeGpus": {"file": "gpus: []\n", "hostDirectory": "/srv/trainyard"}}})


# --- Services, labels, selectors -------------------------------------------


def test_services_select_their_pods_on_a_named_metrics_port(chart: Any) -> None:
    objects = render(chart)
    workloads = {
        f"{RELEASE}-operator-metrics": operator_deployment(objects),
        f"{RELEASE}-device-plugin-metrics": device_plugin_daemonset(objects),
    }
    # The progress Service has no selector (the leader writes its Endpoints).
    services = [s for s in of_kind(objects, "Service") if s["metadata"]["name"] != PROGRESS]
    assert {s["metadata"]["name"] for s in services} == set(workloads)
    for service in services:
        workload = workloads[service["metadata"]["name"]]
        pod_labels = workload["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= pod_labels.items()
        port_names = {p["name"] for p in container(workload)["ports"]}
        assert [p["targetPort"] for p in service["spec"]["ports"]] == ["metrics"]
        assert "metrics" in port_names


def test_workload_selectors_match_their_pod_templates(chart: Any) -> None:
    objects = render(chart)
    for workload in (operator_deployment(objects), device_plugin_daemonset(objects)):
        selector = workload["spec"]["selector"]["matchLabels"]
        assert selector.items() <= workload["spec"]["template"]["metadata"]["labels"].items()
        # Selectors are immutable: nothing version-dependent may be in them.
        assert "app.kubernetes.io/version" not in selector
        assert "helm.sh/chart" not in selector


def test_every_object_carries_the_standard_labels(chart: Any) -> None:
    for obj in render(chart, ALL_TOGGLES_ON):
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "trainyard", obj["metadata"]["name"]
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["app.kubernetes.io/part-of"] == "trainyard"
        assert labels["helm.sh/chart"] == "trainyard-0.1.0"


def test_namespaced_objects_land_in_the_release_namespace(chart: Any) -> None:
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding"}
    # The one exception: read access to the kubelets' Leases lives where they are.
    node_leases = f"{RELEASE}-operator-node-leases"
    for obj in render(chart, ALL_TOGGLES_ON):
        if obj["kind"] not in cluster_scoped and obj["metadata"]["name"] != node_leases:
            assert obj["metadata"]["namespace"] == NAMESPACE, obj["metadata"]["name"]


def test_names_fit_kubernetes_limits_for_long_release_names(chart: Any) -> None:
    objects = render(chart, ALL_TOGGLES_ON, name="a-very-long-release-name-for-a-gpu-training-cluster")
    for obj in objects:
        assert len(obj["metadata"]["name"]) <= 63, obj["metadata"]["name"]
        for value in obj["metadata"]["labels"].values():
            assert len(str(value)) <= 63


@pytest.mark.parametrize("disabled, kept", [("operator", "device-plugin"), ("devicePlugin", "operator")])
def test_each_component_can_be_disabled_alone(chart: Any, disabled: str, kept: str) -> None:
    values = {disabled: {"enabled": False}, "metrics": {"serviceMonitor": {"enabled": True}}}
    objects = render(chart, values)
    components = {o["metadata"]["labels"].get("app.kubernetes.io/component") for o in objects}
    assert components == {kept}
    assert len(of_kind(objects, "ServiceMonitor")) == 1


# --- progress channel -------------------------------------------------------


def flags_of(c: dict[str, Any]) -> dict[str, str]:
    """`--name=value` arguments by name."""
    return dict(a[2:].split("=", 1) for a in c["args"] if a.startswith("--") and "=" in a)


def test_operator_serves_the_progress_channel_by_default(chart: Any) -> None:
    c = container(operator_deployment(render(chart)))
    flags = flags_of(c)
    assert flags["progress-addr"] == "0.0.0.0:8082"
    assert flags["progress-url"] == PROGRESS_URL
    assert flags["progress-audience"] == "trainyard-progress"
    assert flags["progress-endpoints"] == PROGRESS
    assert {"name": "progress", "containerPort": 8082, "protocol": "TCP"} in c["ports"]


def test_operator_gets_its_pod_ip_for_the_progress_endpoints(chart: Any) -> None:
    env = env_of(container(operator_deployment(render(chart))))
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    # The Endpoints object lives in the operator's namespace.
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"


def test_progress_port_audience_and_cluster_domain_follow_values(chart: Any) -> None:
    values = {
        "clusterDomain": "corp.example",
        "operator": {"progress": {"port": 9443, "audience": "https://trainyard.example/progress"}},
    }
    objects = render(chart, values, namespace="ops")
    c = container(operator_deployment(objects))
    flags = flags_of(c)
    assert flags["progress-addr"] == "0.0.0.0:9443"
    assert flags["progress-url"] == f"http://{PROGRESS}.ops.svc.corp.example:9443/v1/progress"
    assert flags["progress-audience"] == "https://trainyard.example/progress"
    assert {p["name"]: p["containerPort"] for p in c["ports"]}["progress"] == 9443
    service = one(objects, "Service", PROGRESS)
    assert service["spec"]["ports"] == [{"name": "progress", "port": 9443, "targetPort": 9443, "protocol": "TCP"}]


def test_progress_url_names_the_progress_service_by_its_cluster_dns_name(chart: Any) -> None:
    objects = render(chart)
    url = flags_of(container(operator_deployment(objects)))["progress-url"]
    service = one(objects, "Service", PROGRESS)
    host, port = re.fullmatch(r"http://([^/:]+):(\d+)/v1/progress", url).groups()
    assert host == f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc.cluster.local"
    assert int(port) == service["spec"]["ports"][0]["port"]


def test_progress_service_has_no_selector_and_the_chart_creates_its_endpoints(chart: Any) -> None:
    objects = render(chart)
    service = one(objects, "Service", PROGRESS)
    assert service["metadata"]["namespace"] == NAMESPACE
    # A selector would spread reports over standby replicas, which do not serve the port.
    assert "selector" not in service["spec"]
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"] == [{"name": "progress", "port": 8082, "targetPort": 8082, "protocol": "TCP"}]
    endpoints = one(objects, "Endpoints", PROGRESS)
    assert endpoints["metadata"]["namespace"] == NAMESPACE
    assert endpoints["metadata"]["labels"]["app.kubernetes.io/component"] == "operator"
    # The object the operator is told to write is this one.
    assert flags_of(container(operator_deployment(objects)))["progress-endpoints"] == endpoints["metadata"]["name"]


def test_progress_endpoints_leave_subsets_to_the_leader(chart: Any) -> None:
    """No `subsets` key, not even `subsets: []`: Helm 3's three-way merge resets
    every field a chart renders to its rendered value on `helm upgrade` (and
    Helm 4's server-side apply would own it), which would wipe the leader's
    address. A field the chart never renders is left as the leader wrote it."""
    endpoints = one(render(chart), "Endpoints", PROGRESS)
    assert set(endpoints) == {"apiVersion", "kind", "metadata"}


def test_token_reviews_are_create_only_in_the_operators_cluster_role(chart: Any) -> None:
    objects = render(chart)
    holders = [r["metadata"]["name"] for r in all_roles(objects) if "tokenreviews" in json.dumps(r["rules"])]
    assert holders == [f"{RELEASE}-operator-cluster"]
    cluster_role = one(objects, "ClusterRole", f"{RELEASE}-operator-cluster")
    assert rules_by_resource(cluster_role)[("authentication.k8s.io", "tokenreviews")] == {"create"}


def test_progress_channel_off_renders_no_flags_env_port_service_or_endpoints(chart: Any) -> None:
    objects = render(chart, {**PROGRESS_OFF, "networkPolicy": {"enabled": True}})
    c = container(operator_deployment(objects))
    assert not [a for a in c["args"] if a.startswith("--progress")]
    assert "POD_IP" not in env_of(c)
    assert [p["name"] for p in c["ports"]] == ["metrics"]
    assert not [o for o in objects if o["metadata"]["name"] == PROGRESS]
    assert not [o for o in objects if o["metadata"]["name"].endswith("-progress")]
    assert "tokenreviews" not in json.dumps(all_roles(objects))
    assert "progress" not in render_notes(chart, PROGRESS_OFF)


def test_progress_channel_needs_the_operator(chart: Any) -> None:
    objects = render(chart, {"operator": {"enabled": False}, "networkPolicy": {"enabled": True}})
    assert not [o for o in objects if "progress" in o["metadata"]["name"]]


def test_progress_and_metrics_on_one_port_are_refused(chart: Any) -> None:
    with pytest.raises(helm_python.HelmRenderError, match="must differ"):
        render(chart, {"operator": {"progress": {"port": 8080}}})
    render(chart, {"operator": {"progress": {"enabled": False, "port": 8080}}})


def test_notes_give_the_progress_url(chart: Any) -> None:
    assert PROGRESS_URL in render_notes(chart)


# --- metrics: ServiceMonitor and Grafana dashboard -------------------------


def test_service_monitors_are_off_by_default(chart: Any) -> None:
    assert of_kind(render(chart), "ServiceMonitor") == []


def test_service_monitors_scrape_the_operator_and_device_plugin_services(chart: Any) -> None:
    values = {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}}}}
    objects = render(chart, values)
    monitors = of_kind(objects, "ServiceMonitor")
    assert len(monitors) == 2
    services = of_kind(objects, "Service")
    for monitor in monitors:
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        assert monitor["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]
        selected = [
            s for s in services if monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
        ]
        assert len(selected) == 1, monitor["metadata"]["name"]
        assert selected[0]["metadata"]["name"] != PROGRESS, "the progress port has no /metrics"
        service_ports = {p["name"] for p in selected[0]["spec"]["ports"]}
        for endpoint in monitor["spec"]["endpoints"]:
            assert endpoint["port"] in service_ports
            assert endpoint["path"] == "/metrics"


def test_dashboard_config_map_is_off_by_default(chart: Any) -> None:
    assert not [cm for cm in of_kind(render(chart), "ConfigMap") if cm["metadata"]["name"].endswith("dashboard")]


def dashboard_from(chart: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    objects = render(chart, {"metrics": {"grafanaDashboard": {"enabled": True}}})
    config_map = one(objects, "ConfigMap", f"{RELEASE}-dashboard")
    return config_map, json.loads(config_map["data"]["trainyard.json"])


def test_dashboard_config_map_is_labelled_for_the_grafana_sidecar(chart: Any) -> None:
    config_map, dashboard = dashboard_from(chart)
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["uid"] == "trainyard-gpus"
    assert dashboard["panels"], "dashboard has panels"


# The per-GPU and operator families the dashboard must show (issue 6).
EXPECTED_METRICS = {
    "trainyard_gpu_utilization_percent",
    "trainyard_gpu_memory_used_bytes",
    "trainyard_gpu_memory_total_bytes",
    "trainyard_gpu_temperature_celsius",
    "trainyard_gpu_power_draw_watts",
    "trainyard_gpu_throttle_reason",
    "trainyard_gpu_xid_events_total",
    "trainyard_gpu_health",
    "trainyard_operator_restarts_total",
    "trainyard_operator_reconcile_errors_total",
    "trainyard_operator_preemption_recovery_seconds",
    "trainyard_operator_steps_lost_per_preemption",
    "trainyard_operator_job_steps_per_second",
    "trainyard_operator_progress_reports_total",
    "trainyard_operator_gpu_seconds_total",
    "trainyard_operator_cost_dollars_total",
    "trainyard_operator_on_demand_equivalent_dollars_total",
}


def test_dashboard_names_each_metric_once_in_its_constant_variables(chart: Any) -> None:
    _, dashboard = dashboard_from(chart)
    constants = {v["name"]: v["query"] for v in dashboard["templating"]["list"] if v["type"] == "constant"}
    assert EXPECTED_METRICS <= set(constants.values())
    assert len(set(constants.values())) == len(constants), "each metric has one variable"
    # Outside the constants, metric names appear only through variables, so a
    # renamed metric is fixed in one place.
    without_constants = copy.deepcopy(dashboard)
    without_constants["templating"]["list"] = [
        v for v in without_constants["templating"]["list"] if v["type"] != "constant"
    ]
    assert "trainyard_" not in json.dumps(without_constants)
    expressions = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    used = {name for e in expressions for name in re.findall(r"\$\{(m_\w+)\}", e)}
    assert used == set(constants), "every metric is shown and every variable exists"


def registered_metric_names(crate: str) -> set[str]:
    """Metric names a crate registers: its `"trainyard_..."` string literals."""
    names: set[str] = set()
    for source in (REPO_ROOT / crate / "src").rglob("*.rs"):
        names.update(re.findall(r'"(trainyard_[a-z0-9_]+)"', source.read_text()))
    return names


@pytest.mark.parametrize(
    "crate, prefixes",
    [("device-plugin", ("trainyard_gpu_", "trainyard_device_plugin_")), ("operator", ("trainyard_operator_",))],
)
def test_dashboard_queries_metrics_the_components_register(
    chart: Any, crate: str, prefixes: tuple[str, ...]
) -> None:
    registered = registered_metric_names(crate)
    if not any(name.startswith(prefixes) for name in registered):
        pytest.skip(f"{crate} registers no {'/'.join(prefixes)}* metrics yet")
    _, dashboard = dashboard_from(chart)
    shown = {v["query"] for v in dashboard["templating"]["list"] if v["type"] == "constant"}
    for metric in sorted(m for m in shown if m.startswith(prefixes)):
        # prometheus-client appends _total to counters when it exposes them.
        assert metric.removesuffix("_total") in registered, f"{metric}: {crate} registers no such metric"


def test_dashboard_panels_have_unique_ids_and_fit_the_grid(chart: Any) -> None:
    _, dashboard = dashboard_from(chart)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24, panel["title"]


def dashboard_panel(dashboard: dict[str, Any], title: str) -> dict[str, Any]:
    [panel] = [p for p in dashboard["panels"] if p["title"] == title]
    return panel


def resolved_exprs(dashboard: dict[str, Any], panel: dict[str, Any]) -> list[str]:
    """The panel's queries with the metric-name constants substituted."""
    constants = {v["name"]: v["query"] for v in dashboard["templating"]["list"] if v["type"] == "constant"}
    return [re.sub(r"\$\{(m_\w+)\}", lambda m: constants[m.group(1)], t["expr"]) for t in panel["targets"]]


def test_dashboard_shows_steps_lost_per_preemption_as_median_p99_and_mean(chart: Any) -> None:
    _, dashboard = dashboard_from(chart)
    panel = dashboard_panel(dashboard, "Steps lost per preemption")
    m = "trainyard_operator_steps_lost_per_preemption"
    assert resolved_exprs(dashboard, panel) == [
        f"histogram_quantile(0.5, sum by (le) (rate({m}_bucket[$__rate_interval])))",
        f"histogram_quantile(0.99, sum by (le) (rate({m}_bucket[$__rate_interval])))",
        f"sum(rate({m}_sum[$__rate_interval])) / sum(rate({m}_count[$__rate_interval]))",
    ]
    assert [t["legendFormat"] for t in panel["targets"]] == ["p50", "p99", "mean"]


def test_dashboard_shows_training_steps_per_second_by_job_from_the_leader(chart: Any) -> None:
    _, dashboard = dashboard_from(chart)
    panel = dashboard_panel(dashboard, "Training steps per second by job")
    [expr] = resolved_exprs(dashboard, panel)
    # The metric's own namespace/job labels arrive as exported_* next to the
    # scrape target's; a former leader's stale gauge is dropped.
    assert expr == (
        "max by (exported_namespace, exported_job) "
        "(trainyard_operator_job_steps_per_second and on (instance) (trainyard_operator_leader == 1))"
    )
    assert panel["targets"][0]["legendFormat"] == "{{exported_namespace}}/{{exported_job}}"


def test_dashboard_shows_progress_reports_by_outcome(chart: Any) -> None:
    _, dashboard = dashboard_from(chart)
    panel = dashboard_panel(dashboard, "Progress reports by outcome")
    assert resolved_exprs(dashboard, panel) == [
        "sum by (outcome) (rate(trainyard_operator_progress_reports_total[5m]))"
    ]
    assert panel["targets"][0]["legendFormat"] == "{{outcome}}"


# A replica's copy of a ledger series collapses into one before any sum (two replicas may
# both expose a job's ledger for a scrape during a leader change).
PER_JOB_USE = "max by (exported_namespace, exported_job, capacity, use)"
GPU_SECONDS = "trainyard_operator_gpu_seconds_total"
COST = "trainyard_operator_cost_dollars_total"
ON_DEMAND = "trainyard_operator_on_demand_equivalent_dollars_total"
BY_JOB = "exported_namespace, exported_job"


def test_dashboard_shows_goodput_by_job_as_useful_over_all_gpu_time(chart: Any) -> None:
    _, dashboard = dashboard_from(chart)
    panel = dashboard_panel(dashboard, "Goodput by job")
    assert resolved_exprs(dashboard, panel) == [
        f'sum by ({BY_JOB}) ({PER_JOB_USE} ({GPU_SECONDS}{{use="useful"}})) '
        f"/ sum by ({BY_JOB}) ({PER_JOB_USE} ({GPU_SECONDS}))"
    ]
    assert panel["fieldConfig"]["defaults"]["unit"] == "percentunit"
    assert panel["targets"][0]["legendFormat"] == "{{exported_namespace}}/{{exported_job}}"


def test_dashboard_shows_gpu_seconds_lost_by_cause(chart: Any) -> None:
    _, dashboard = dashboard_from(chart)
    panel = dashboard_panel(dashboard, "GPU-seconds lost by cause")
    assert resolved_exprs(dashboard, panel) == [
        f'sum by (use) ({PER_JOB_USE} (increase({GPU_SECONDS}{{use!="useful"}}[$__rate_interval])))'
    ]
    assert panel["targets"][0]["legendFormat"] == "{{use}}"


def test_dashboard_shows_dollars_spent_and_saved_by_job(chart: Any) -> None:
    _, dashboard = dashboard_from(chart)
    spent = dashboard_panel(dashboard, "Dollars spent by job")
    saved = dashboard_panel(dashboard, "Saved by spot, by job")
    assert resolved_exprs(dashboard, spent) == [f"max by ({BY_JOB}) ({COST})"]
    assert resolved_exprs(dashboard, saved) == [f"max by ({BY_JOB}) ({ON_DEMAND}) - max by ({BY_JOB}) ({COST})"]
    for panel in (spent, saved):
        assert panel["fieldConfig"]["defaults"]["unit"] == "currencyUSD"


def ledger_series(instance: str) -> list[dict[str, str]]:
    """One job's ledger as one replica exposes it, a sample a minute: nothing counted, then
    the first attempt's preemption (90 useful, 5 to detection, 5 to restart, on spot)."""
    job = f'instance="{instance}",exported_namespace="ml",exported_job="preempted"'
    spot = f'{job},capacity="spot"'
    return [
        {"series": f'{GPU_SECONDS}{{{spot},use="useful"}}', "values": "0 0 90 90 90"},
        {"series": f'{GPU_SECONDS}{{{spot},use="lost_to_detection"}}', "values": "0 0 5 5 5"},
        {"series": f'{GPU_SECONDS}{{{spot},use="lost_to_restart"}}', "values": "0 0 5 5 5"},
        {"series": f'{GPU_SECONDS}{{{job},capacity="on_demand",use="useful"}}', "values": "0 0 0 0 0"},
        {"series": f"{COST}{{{job}}}", "values": "0 0 2.5 2.5 2.5"},
        {"series": f"{ON_DEMAND}{{{job}}}", "values": "0 0 7.5 7.5 7.5"},
    ]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian's prometheus) is not installed")
def test_dashboard_ledger_panels_compute_goodput_cost_and_losses_once_per_job(chart: Any, tmp_path: Path) -> None:
    """The ledger panels' queries, evaluated by promtool over series that two replicas both
    expose (a leader change): each job counts once."""
    _, dashboard = dashboard_from(chart)

    def expr(title: str) -> str:
        [e] = resolved_exprs(dashboard, dashboard_panel(dashboard, title))
        return e.replace("$__rate_interval", "3m")

    job = '{exported_namespace="ml",exported_job="preempted"}'
    expected = [
        (expr("Goodput by job"), job, 0.9),
        (expr("Dollars spent by job"), job, 2.5),
        (expr("Saved by spot, by job"), job, 5),
        (expr("GPU-seconds lost by cause"), '{use="lost_to_detection"}', 5),
        (expr("GPU-seconds lost by cause"), '{use="lost_to_restart"}', 5),
    ]
    by_expr: dict[str, list[dict[str, Any]]] = {}
    for e, labels, value in expected:
        by_expr.setdefault(e, []).append({"labels": labels, "value": value})
    tests = [{"expr": e, "eval_time": "4m", "exp_samples": samples} for e, samples in by_expr.items()]
    spec = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": ledger_series("leader") + ledger_series("former-leader"),
                "promql_expr_test": tests,
            }
        ],
    }
    path = tmp_path / "ledger_panels.yml"
    path.write_text(yaml.safe_dump(spec))
    run = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_dashboard_panels_do_not_overlap(chart: Any) -> None:
    _, dashboard = dashboard_from(chart)
    cells: dict[tuple[int, int], str] = {}
    for panel in dashboard["panels"]:
        g = panel["gridPos"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]


# --- values.schema.json -----------------------------------------------------

A_FAKE_GPU = {"uuid": "GPU-1", "name": "NVIDIA T4", "memoryMiB": 15360}


@pytest.mark.parametrize(
    "values, offending",
    [
        ({"operator": {"replicas": "two"}}, "/operator/replicas"),
        ({"operator": {"replicas": 0}}, "/operator/replicas"),
        ({"operator": {"logFormat": "xml"}}, "/operator/logFormat"),
        ({"operator": {"image": {"pullPolicy": "Sometimes"}}}, "/operator/image/pullPolicy"),
        ({"operator": {"config": {"nodeNotReadyTimeoutSeconds": 0}}}, "/operator/config/nodeNotReadyTimeoutSeconds"),
        ({"operator": {"config": {"prices": [{"match": "T4", "spot": -1}]}}}, "/operator/config/prices/0/spot"),
        ({"devicePlugin": {"deviceListStrategy": "volume-mounts"}}, "/devicePlugin/deviceListStrategy"),
        ({"devicePlugin": {"metrics": {"port": 70000}}}, "/devicePlugin/metrics/port"),
        ({"devicePlugin": {"devicePluginDir": "relative/dir"}}, "/devicePlugin/devicePluginDir"),
        ({"devicePlugin": {"fakeGpus": {"enabled": "yes"}}}, "/devicePlugin/fakeGpus/enabled"),
        ({"metrics": {"serviceMonitor": {"interval": "often"}}}, "/metrics/serviceMonitor/interval"),
        ({"networkPolicy": {"enabled": "yes"}}, "/networkPolicy/enabled"),
        ({"networkPolicy": {"metricsFrom": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}}, "ipBlock"),
        ({"operator": {"rbac": {"ownerReferencesPermissionEnforcement": "on"}}}, "ownerReferencesPermissionEnforcement"),
        ({"devicePlugin": {"rbac": {"nodeLabelPolicy": 1}}}, "/devicePlugin/rbac/nodeLabelPolicy"),
        (
            {"devicePlugin": {"fakeGpus": {"config": {"gpus": [{**A_FAKE_GPU, "probeDelaySeconds": -1}]}}}},
            "/devicePlugin/fakeGpus/config/gpus/0/probeDelaySeconds",
        ),
        ({"operatr": {"replicas": 1}}, "operatr"),
        ({"operator": {"progress": {"enabled": "yes"}}}, "/operator/progress/enabled"),
        ({"operator": {"progress": {"port": 0}}}, "/operator/progress/port"),
        ({"operator": {"progress": {"audience": ""}}}, "/operator/progress/audience"),
        ({"operator": {"progress": {"url": "http://x"}}}, "url"),
        ({"clusterDomain": "cluster.local."}, "/clusterDomain"),
        ({"clusterDomain": ""}, "/clusterDomain"),
        # The operator and the plugin reject unknown keys in their files; so does the chart.
        ({"operator": {"config": {"price": []}}}, "price"),
        ({"devicePlugin": {"fakeGpus": {"config": {"gpus": [{**A_FAKE_GPU, "vram": 1}]}}}}, "vram"),
        (
            {"devicePlugin": {"fakeGpus": {"config": {"gpus": [{**A_FAKE_GPU, "throttleReasons": ["hot"]}]}}}},
            "/devicePlugin/fakeGpus/config/gpus/0/throttleReasons/0",
        ),
        (
            {"devicePlugin": {"tolerations": [{"key": "a", "operator": "Maybe"}]}},
            "/devicePlugin/tolerations/0/operator",
        ),
    ],
)
def test_schema_rejects_bad_values_naming_the_field(chart: Any, values: dict[str, Any], offending: str) -> None:
    with pytest.raises(helm_python.HelmValuesError) as rejected:
        chart.validate_schema(values)
    assert offending in str(rejected.value)
    with pytest.raises(helm_python.HelmValuesError):
        render(chart, values)


def test_lint_fails_on_a_schema_violation() -> None:
    report = helm_python.lint(CHART_DIR, with_images({"operator": {"replicas": "two"}}))
    assert any("/operator/replicas" in e for e in report["errors"]), report


def test_schema_accepts_the_defaults_and_the_local_cluster_values(chart: Any) -> None:
    chart.validate_schema({})
    chart.validate_schema(
        {
            "operator": {"image": {"tag": "dev", "pullPolicy": "Never"}},
            "devicePlugin": {"image": {"tag": "dev", "pullPolicy": "Never"}, "fakeGpus": {"enabled": True}},
        }
    )
    chart.validate_schema({"devicePlugin": {"fakeGpus": {"enabled": True, "config": {"gpus": [A_FAKE_GPU]}}}})


def test_local_cluster_values_lint_clean_and_use_the_fake_gpu_host_directory(chart: Any) -> None:
    values_file = REPO_ROOT / "e2e" / "values-local.yaml"
    if not values_file.is_file():
        pytest.skip(f"{values_file} is not there")
    values = yaml.safe_load(values_file.read_text())
    for key in ("operator", "devicePlugin"):
        assert values.get(key, {}).get("image", {}).get("repository"), (
            f"e2e/values-local.yaml must set {key}.image.repository (the chart has no default): "
            "the images e2e/cluster/images.sh imports are trainyard/operator:dev and trainyard/device-plugin:dev"
        )
    report = helm_python.lint(CHART_DIR, values, strict=True, kube_version="v1.20.2")
    assert report["errors"] == [], report
    daemonset = device_plugin_daemonset(render(chart, values))
    assert f"--fake-gpus={FAKE_GPUS_PATH}" in container(daemonset)["args"]


def harness_node_labels() -> dict[str, dict[str, str]]:
    """The labels each local cluster node's kubelet registers with (--node-labels)."""
    env = (REPO_ROOT / "e2e" / "cluster" / "env.sh").read_text()
    variables = dict(re.findall(r"^([A-Z0-9_]+)=([^\s$]+)$", env, re.M))
    nodes = {}
    for script in ("up.sh", "node2.sh"):
        text = (REPO_ROOT / "e2e" / "cluster" / script).read_text()
        [labels] = re.findall(r'--node-labels "([^"]+)"', text)
        labels = re.sub(r"\$\{?([A-Z0-9_]+)\}?", lambda m: variables[m.group(1)], labels)
        nodes[script] = dict(pair.split("=", 1) for pair in labels.split(","))
    return nodes


def schedulable_on(pod_spec: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a node with these labels satisfies the pod's nodeSelector and required node affinity."""
    if any(labels.get(k) != v for k, v in (pod_spec.get("nodeSelector") or {}).items()):
        return False
    required = (pod_spec.get("affinity") or {}).get("nodeAffinity", {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if not required:
        return True

    def holds(e: dict[str, Any]) -> bool:
        op, key = e["operator"], e["key"]
        return {
            "In": lambda: labels.get(key) in e.get("values", []),
            "NotIn": lambda: labels.get(key) not in e.get("values", []),
            "Exists": lambda: key in labels,
            "DoesNotExist": lambda: key not in labels,
        }[op]()

    return any(all(holds(e) for e in term.get("matchExpressions", [])) for term in required["nodeSelectorTerms"])


def test_the_device_plugin_runs_on_both_local_cluster_nodes(chart: Any) -> None:
    values = yaml.safe_load((REPO_ROOT / "e2e" / "values-local.yaml").read_text())
    spec = device_plugin_daemonset(render(chart, values))["spec"]["template"]["spec"]
    for script, labels in harness_node_labels().items():
        assert schedulable_on(spec, labels), (
            f"the node e2e/cluster/{script} starts ({labels}) matches none of the device plugin's "
            "GPU node terms: label it nvidia.com/gpu.present=true (--node-labels), or set "
            "devicePlugin.gpuNodeSelectorTerms: [] in e2e/values-local.yaml"
        )


# --- images and operator-only mode ------------------------------------------


@pytest.mark.parametrize("key, target", [("operator", "operator"), ("devicePlugin", "device-plugin")])
def test_an_unset_image_repository_fails_saying_what_to_set(chart: Any, key: str, target: str) -> None:
    values = copy.deepcopy(IMAGES)
    del values[key]["image"]["repository"]
    with pytest.raises(helm_python.HelmError) as failed:
        chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    says = str(failed.value)
    assert f"{key}.image.repository is not set" in says
    assert f"--set {key}.image.repository=registry.example.com/trainyard/{target}" in says
    assert "docs/install.md" in says


def test_a_digest_pins_each_image_and_replaces_the_tag(chart: Any) -> None:
    digest = "sha256:" + "0123456789abcdef" * 4
    values = {
        "operator": {"image": {"tag": "ignored", "digest": digest}},
        "devicePlugin": {"image": {"digest": digest}},
    }
    objects = render(chart, values)
    assert container(operator_deployment(objects))["image"] == f"{OPERATOR_REPO}@{digest}"
    assert container(device_plugin_daemonset(objects))["image"] == f"{DEVICE_PLUGIN_REPO}@{digest}"


def test_the_schema_refuses_a_digest_that_is_not_sha256(chart: Any) -> None:
    report = helm_python.lint(CHART_DIR, with_images({"operator": {"image": {"digest": "latest"}}}))
    assert any("/operator/image/digest" in e for e in report["errors"]), report


def test_operator_only_mode_renders_no_device_plugin_and_needs_no_plugin_image(chart: Any) -> None:
    values = {
        "operator": {"image": {"repository": OPERATOR_REPO}},
        "devicePlugin": {"enabled": False},
        "metrics": {"serviceMonitor": {"enabled": True}},
        "networkPolicy": {"enabled": True},
        "prometheusRule": {"enabled": True},
    }
    manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    objects = [d for p, t in manifests.items() if not p.endswith("NOTES.txt") for d in yaml.safe_load_all(t) if d]
    assert of_kind(objects, "DaemonSet") == []
    assert [o for o in objects if "device-plugin" in o["metadata"]["name"]] == []
    assert len(of_kind(objects, "Deployment")) == 1
    notes = next(t for p, t in manifests.items() if p.endswith("NOTES.txt"))
    assert "no device plugin (devicePlugin.enabled=false)" in notes


# --- where the device plugin runs -------------------------------------------


def plugin_pod_spec(chart: Any, values: dict[str, Any] | None = None) -> dict[str, Any]:
    return device_plugin_daemonset(render(chart, values))["spec"]["template"]["spec"]


def test_the_device_plugin_runs_only_on_gpu_nodes_by_default(chart: Any) -> None:
    spec = plugin_pod_spec(chart)
    assert "nodeSelector" not in spec
    for gpu_node in [
        {"nvidia.com/gpu.present": "true"},
        {"feature.node.kubernetes.io/pci-10de.present": "true"},
        {"cloud.google.com/gke-accelerator": "nvidia-tesla-a100"},
        {"k8s.amazonaws.com/accelerator": "nvidia-tesla-a100"},
        {"karpenter.k8s.aws/instance-gpu-manufacturer": "nvidia"},
    ]:
        assert schedulable_on(spec, gpu_node), gpu_node
    for cpu_node in [{}, {"kubernetes.io/os": "linux"}, {"nvidia.com/gpu.present": "false"}]:
        assert not schedulable_on(spec, cpu_node), cpu_node


def test_a_node_selector_or_node_affinity_replaces_the_gpu_node_terms(chart: Any) -> None:
    pool = {"accelerator": "nvidia"}
    spec = plugin_pod_spec(chart, {"devicePlugin": {"nodeSelector": pool}})
    assert spec["nodeSelector"] == pool and "affinity" not in spec
    assert schedulable_on(spec, pool)
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]}]}]
            }
        }
    }
    assert plugin_pod_spec(chart, {"devicePlugin": {"affinity": affinity}})["affinity"] == affinity


def test_other_affinity_keeps_the_gpu_node_terms_and_an_empty_list_drops_them(chart: Any) -> None:
    anti = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
    spec = plugin_pod_spec(chart, {"devicePlugin": {"affinity": anti}})
    assert spec["affinity"]["podAntiAffinity"] == anti["podAntiAffinity"]
    assert not schedulable_on(spec, {})
    spec = plugin_pod_spec(chart, {"devicePlugin": {"gpuNodeSelectorTerms": []}})
    assert "affinity" not in spec and schedulable_on(spec, {})


def test_schema_gives_every_property_a_description(chart: Any) -> None:
    """`helm show values` readers and schema-aware editors see what each key does."""
    missing = []

    def walk(node: dict[str, Any], path: str) -> None:
        for key, sub in (node.get("properties") or {}).items():
            where = f"{path}.{key}".lstrip(".")
            if not sub.get("description"):
                missing.append(where)
            walk(sub, where)
        if isinstance(node.get("items"), dict):
            walk(node["items"], path + "[]")
        if isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"], path + "{}")

    schema = chart.schema
    walk(schema, "")
    for name, definition in schema.get("definitions", {}).items():
        walk(definition, f"#/definitions/{name}")
    assert missing == []


def test_schema_describes_every_default_value(chart: Any) -> None:
    """Every key in values.yaml has a schema entry, so none is typed by accident."""
    schema = chart.schema
    assert schema is not None

    def resolve(node: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in node:
            node = schema["definitions"][node["$ref"].rsplit("/", 1)[-1]]
        return node

    def walk(value: Any, node: dict[str, Any], path: str) -> None:
        node = resolve(node)
        assert "type" in node, f"{path}: no type in the schema"
        if isinstance(value, dict) and "properties" in node:
            for key, child in value.items():
                assert key in node["properties"], f"{path}.{key}: not in the schema"
                walk(child, node["properties"][key], f"{path}.{key}")
        if isinstance(value, list) and "items" in node:
            for index, item in enumerate(value):
                walk(item, node["items"], f"{path}[{index}]")

    walk(chart.values, schema, "values")


# --- CRD and Dockerfile consistency -----------------------------------------


def test_chart_installs_the_generated_trainingjob_crd(chart: Any) -> None:
    crds = chart.crds
    assert [c["filename"] for c in crds] == ["trainyard/crds/trainingjob.yaml"]
    crd = yaml.safe_load(crds[0]["data"])
    assert crd["kind"] == "CustomResourceDefinition"
    assert crd["metadata"]["name"] == "trainingjobs.trainyard.dev"
    assert crd["spec"]["names"]["shortNames"] == ["tj"]
    assert [v["name"] for v in crd["spec"]["versions"]] == ["v1alpha1"]
    generated = REPO_ROOT / "crds" / "trainingjob.yaml"
    assert crds[0]["data"] == generated.read_text(), "the chart's CRD is a stale copy of crds/trainingjob.yaml"


def test_chart_ships_no_templated_crd(chart: Any) -> None:
    # The CRD lives in crds/ (installed before templates, never templated);
    # a templated copy would fight Helm over ownership on upgrade.
    for obj in render(chart, ALL_TOGGLES_ON):
        assert obj["kind"] != "CustomResourceDefinition"


def test_dockerfile_targets_install_the_binaries_the_chart_runs(chart: Any) -> None:
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()
    stages = {alias: image for image, alias in re.findall(r"^FROM\s+(\S+)\s+AS\s+(\S+)", dockerfile, re.M | re.I)}
    assert stages["builder"] == "${RUST_IMAGE}"
    assert "ARG RUST_IMAGE=rust:1.89-bookworm" in dockerfile
    assert stages["operator"] == "gcr.io/distroless/cc-debian12:nonroot"
    assert stages["device-plugin"].startswith("gcr.io/distroless/cc-debian12")
    assert "--locked --release" in dockerfile
    objects = render(chart)
    for workload in (operator_deployment(objects), device_plugin_daemonset(objects)):
        binary = container(workload)["command"][0]
        assert f"COPY --from=builder /out/{Path(binary).name} {binary}" in dockerfile


def test_operator_image_user_matches_the_chart_run_as_user(chart: Any) -> None:
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()
    operator_stage = dockerfile.split("AS operator", 1)[1].split("FROM ", 1)[0]
    user = re.search(r"^USER\s+(\d+)", operator_stage, re.M)
    assert user is not None
    pod_sc = operator_deployment(render(chart))["spec"]["template"]["spec"]["securityContext"]
    assert int(user.group(1)) == pod_sc["runAsUser"]


# --- NOTES.txt --------------------------------------------------------------


def test_notes_explain_how_to_check_gpus_and_submit_the_example_job(chart: Any) -> None:
    notes = render_notes(chart)
    assert f"rollout status deployment/{RELEASE}-operator" in notes
    assert r".status.allocatable.nvidia\.com/gpu" in notes
    assert "kubectl apply -f examples/trainingjob.yaml" in notes
    assert "FAKE" not in notes
    assert "FAKE GPU file" in render_notes(chart, {"devicePlugin": {"fakeGpus": {"enabled": True}}})



def test_packaged_chart_renders_like_the_directory(chart: Any, tmp_path: Path) -> None:
    """`helm package` keeps the dashboard, schema and CRD dir (nothing needed is .helmignored)."""
    archive = helm_python.package(CHART_DIR, destination=tmp_path)
    with helm_python.Chart.load(archive) as packaged:
        assert packaged.schema == chart.schema
        assert any(f["name"] == "dashboards/trainyard.json" for f in packaged.files)
        values = {"metrics": {"grafanaDashboard": {"enabled": True}}}
        assert render(packaged, values) == render(chart, values)
