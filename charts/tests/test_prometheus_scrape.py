"""The e2e Prometheus's scrape configuration, generated from the chart's ServiceMonitors.

e2e/cluster/prometheus_config.py translates each rendered ServiceMonitor into the scrape job
prometheus-operator would generate; e2e/cluster/prometheus_sd.py discovers endpoints as
`kubernetes_sd_configs` role endpoints would. Here both meet the chart's own Services,
without a cluster: their discovery labels go through the generated relabel rules (keep, drop
and replace, as Prometheus applies them), and exactly the two metrics Services must come out,
on their `metrics` port. promtool (Debian's `prometheus`, which `make prereqs` installs)
checks the configuration and every recording or alert rule the chart ships.
"""

from __future__ import annotations

import copy
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
CLUSTER_DIR = REPO_ROOT / "e2e" / "cluster"
RELEASE = "trainyard"
NAMESPACE = "trainyard-system"
SD_DIR = "/var/lib/trainyard-e2e/prometheus/sd"
PROMTOOL = shutil.which("promtool")
# The chart has no default image repositories.
IMAGES = {
    "operator": {"image": {"repository": "registry.example.com/trainyard/operator"}},
    "devicePlugin": {"image": {"repository": "registry.example.com/trainyard/device-plugin"}},
}


def load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, CLUSTER_DIR / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


config_gen = load("prometheus_config")
sd = load("prometheus_sd")


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    values = dict(IMAGES, metrics={"serviceMonitor": {"enabled": True}})
    return config_gen.render(RELEASE, NAMESPACE, values)


def monitors(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == "ServiceMonitor"]


def relabel(labels: dict[str, str], rules: list[dict[str, Any]]) -> dict[str, str] | None:
    """Prometheus's relabeling (replace, keep, drop), or None when the target is dropped."""
    labels = dict(labels)
    for r in rules:
        value = r.get("separator", ";").join(labels.get(s, "") for s in r.get("source_labels", []))
        match = re.fullmatch(r.get("regex", "(.*)"), value)
        action = r.get("action", "replace")
        if action == "keep" and not match:
            return None
        if action == "drop" and match:
            return None
        if action == "replace" and match:
            replacement = re.sub(r"\$\{(\d+)\}|\$(\d+)", lambda m: match.group(int(m.group(1) or m.group(2))),
                                 r.get("replacement", "$1"))
            if replacement:
                labels[r["target_label"]] = replacement
            else:
                labels.pop(r["target_label"], None)
        if action not in ("keep", "drop", "replace"):
            raise AssertionError(f"relabel action {action} is not simulated here")
    return {k: v for k, v in labels.items() if not k.startswith("__") or k == "__address__"}


def pods_of(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """One pod per workload of the chart, named after its component, on a fake node."""
    pods = {}
    for w in objects:
        if w["kind"] in ("Deployment", "DaemonSet"):
            template = w["spec"]["template"]
            name = f"{w['metadata']['name']}-0"
            pods[name] = {
                "metadata": {"name": name, "namespace": NAMESPACE, "labels": template["metadata"]["labels"]},
                "spec": {**template["spec"], "nodeName": "node-a"},
                "status": {"phase": "Running", "podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]},
            }
    return pods


def container_port(pod: dict[str, Any], target: Any) -> int | None:
    for c in pod["spec"]["containers"]:
        for p in c.get("ports") or []:
            if target in (p.get("name"), p["containerPort"]):
                return p["containerPort"]
    return None


def endpoints_of(services: list[dict[str, Any]], pods: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The Endpoints the endpoints controller makes for the chart's selector Services (and
    the pods serving its ports for a Service without a selector, as the operator's leader
    points its progress Endpoints at itself)."""
    out = []
    for svc in services:
        selector = svc["spec"].get("selector")
        targets = [port.get("targetPort", port["port"]) for port in svc["spec"]["ports"]]
        backing = [
            p for p in pods.values()
            if (selector.items() <= p["metadata"]["labels"].items() if selector
                else all(container_port(p, t) for t in targets))
        ]
        assert backing, f"no pod backs Service {svc['metadata']['name']}"
        subsets = [{
            "addresses": [{"ip": "10.0.0.1", "nodeName": "node-a", "targetRef": {"kind": "Pod", "name": p["metadata"]["name"]}}],
            "ports": [{"name": port.get("name", ""), "protocol": "TCP",
                       "port": container_port(p, port.get("targetPort", port["port"]))} for port in svc["spec"]["ports"]],
        } for p in backing]
        out.append({"metadata": {"name": svc["metadata"]["name"], "namespace": NAMESPACE}, "subsets": subsets})
    return out


def scraped(objects: list[dict[str, Any]], monitor_list: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """(job, endpoint, container) of every target the monitors' scrape jobs keep among the
    chart's own Services."""
    services = [o for o in objects if o["kind"] == "Service"]
    pods = pods_of(objects)
    groups = sd.target_groups(NAMESPACE, services, endpoints_of(services, pods), list(pods.values()))
    assert groups, "the chart's Services give discovery targets"
    out = set()
    for m in monitor_list:
        for job in config_gen.scrape_jobs(m, SD_DIR):
            for g in groups:
                kept = relabel(g["labels"], job["relabel_configs"])
                if kept is not None:
                    out.add((kept["job"], kept["endpoint"], kept["container"]))
    return out


def test_service_monitors_scrape_exactly_the_metrics_services_on_their_metrics_port(objects: list) -> None:
    assert scraped(objects, monitors(objects)) == {
        (f"{RELEASE}-operator-metrics", "metrics", "operator"),
        (f"{RELEASE}-device-plugin-metrics", "metrics", "device-plugin"),
    }


def test_scrape_jobs_follow_prometheus_operators_names_paths_and_target_labels(objects: list) -> None:
    jobs = [job for m in monitors(objects) for job in config_gen.scrape_jobs(m, SD_DIR)]
    assert [j["job_name"] for j in jobs] == [
        f"serviceMonitor/{NAMESPACE}/{RELEASE}-operator/0",
        f"serviceMonitor/{NAMESPACE}/{RELEASE}-device-plugin/0",
    ]
    for job in jobs:
        assert job["metrics_path"] == "/metrics"
        assert job["honor_labels"] is False, "the per-job gauge's namespace/job become exported_*"
        assert job["file_sd_configs"] == [{"files": [f"{SD_DIR}/{NAMESPACE}.json"]}]
        assert job["scrape_interval"] == "30s"


@pytest.mark.parametrize(
    "break_it",
    [
        lambda m: m["spec"]["selector"]["matchLabels"].update({"trainyard.dev/service": "metric"}),
        lambda m: m["spec"]["selector"]["matchLabels"].update({"app.kubernetes.io/instance": "other"}),
        lambda m: m["spec"]["endpoints"][0].update({"port": "http-metrics"}),
    ],
    ids=["selector-label", "selector-instance", "port-name"],
)
def test_a_broken_service_monitor_scrapes_nothing(objects: list, break_it: Any) -> None:
    broken = copy.deepcopy(monitors(objects))
    for m in broken:
        break_it(m)
    assert scraped(objects, broken) == set()


def test_a_service_monitor_looks_for_endpoints_in_its_namespaces_only(objects: list) -> None:
    m = copy.deepcopy(monitors(objects)[0])
    m["spec"]["namespaceSelector"]["matchNames"] = ["monitoring"]
    [job] = config_gen.scrape_jobs(m, SD_DIR)
    assert job["file_sd_configs"] == [{"files": [f"{SD_DIR}/monitoring.json"]}]


@pytest.mark.parametrize(
    "change",
    [
        {"endpoints": [{"port": "metrics", "relabelings": [{"action": "drop"}]}]},
        {"endpoints": [{"targetPort": 8080}]},
        {"namespaceSelector": {"any": True}},
        {"selector": {}},
        {"podTargetLabels": ["app"]},
    ],
    ids=["relabelings", "target-port", "any-namespace", "empty-selector", "pod-target-labels"],
)
def test_service_monitor_fields_the_translation_does_not_follow_are_errors(objects: list, change: dict) -> None:
    m = copy.deepcopy(monitors(objects)[0])
    m["spec"].update(change)
    with pytest.raises(config_gen.Unsupported):
        config_gen.scrape_jobs(m, SD_DIR)


def test_generated_configuration_passes_promtool(objects: list, tmp_path: Path) -> None:
    assert PROMTOOL, "promtool missing: `make prereqs` installs Debian's prometheus"
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config_gen.prometheus_config(objects, str(tmp_path / "sd"), [])))
    subprocess.run([PROMTOOL, "check", "config", str(path)], check=True, capture_output=True)


def promtool_check_rules(groups: dict[str, dict[str, Any]], tmp_path: Path) -> list[str]:
    """promtool's complaint about each rule file that fails `promtool check rules`."""
    failures = []
    for path in config_gen.write_rules(groups, tmp_path / "rules"):
        r = subprocess.run([PROMTOOL, "check", "rules", path], capture_output=True, text=True)
        if r.returncode != 0:
            failures.append(f"{Path(path).name}: {r.stdout}{r.stderr}")
    return failures


def test_every_rule_the_chart_ships_passes_promtool_check_rules(tmp_path: Path) -> None:
    assert PROMTOOL, "promtool missing: `make prereqs` installs Debian's prometheus"
    every_feature = dict(
        IMAGES,
        metrics={"serviceMonitor": {"enabled": True}, "grafanaDashboard": {"enabled": True}},
        prometheusRule={"enabled": True},
    )
    groups = config_gen.chart_rule_groups(config_gen.render(RELEASE, NAMESPACE, every_feature))
    assert promtool_check_rules(groups, tmp_path) == []


def test_rule_check_finds_prometheus_rules_and_reports_a_broken_one(tmp_path: Path) -> None:
    def rule(expr: str) -> dict[str, Any]:
        return {"kind": "PrometheusRule", "metadata": {"name": "r"},
                "spec": {"groups": [{"name": "g", "rules": [{"record": "job:up:sum", "expr": expr}]}]}}

    good = config_gen.prometheus_rule_groups([rule("sum by (job) (up)")])
    assert list(good) == ["prometheusrule-r.yaml"]
    assert promtool_check_rules(good, tmp_path) == []
    [failure] = promtool_check_rules(config_gen.prometheus_rule_groups([rule("sum by (job) (up")]), tmp_path)
    assert "prometheusrule-r.yaml" in failure
