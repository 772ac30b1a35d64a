"""The chart's alerting rules (charts/trainyard/rules/alerts.yaml): shipped verbatim as a
PrometheusRule, valid for promtool, tested by `promtool test rules`, and reading only metrics
the operator and the device plugin register."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

CHART_DIR = Path(__file__).resolve().parent.parent / "trainyard"
REPO_ROOT = CHART_DIR.parent.parent
RULES = CHART_DIR / "rules" / "alerts.yaml"
RULE_TESTS = sorted((Path(__file__).resolve().parent / "prometheus-rules").glob("*.test.yaml"))
PROMTOOL = shutil.which("promtool")
IMAGES = {
    "operator": {"image": {"repository": "registry.example.com/trainyard/operator"}},
    "devicePlugin": {"image": {"repository": "registry.example.com/trainyard/device-plugin"}},
}
# Every metrics module of both crates, wherever it sits under src/.
METRIC_SOURCES = sorted(
    p
    for crate in ("operator", "device-plugin")
    for p in (REPO_ROOT / crate / "src").rglob("*.rs")
    if p.name == "metrics.rs" or "metrics" in p.relative_to(REPO_ROOT / crate / "src").parts[:-1]
)


def rendered_rules(values: dict[str, Any]) -> list[dict[str, Any]]:
    with helm_python.Chart.load(CHART_DIR) as chart:
        manifests = chart.render(dict(IMAGES, **values), name="trainyard", namespace="trainyard-system", is_install=True)
    return [
        doc
        for path, text in manifests.items()
        if not path.endswith("NOTES.txt")
        for doc in yaml.safe_load_all(text)
        if doc and doc["kind"] == "PrometheusRule"
    ]


def test_no_prometheus_rule_by_default() -> None:
    assert rendered_rules({}) == []


def test_the_prometheus_rule_carries_the_rule_file_verbatim_with_its_labels() -> None:
    [rule] = rendered_rules({"prometheusRule": {"enabled": True, "labels": {"release": "kps"}}})
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["namespace"] == "trainyard-system"
    assert rule["metadata"]["labels"]["release"] == "kps"
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]


@pytest.mark.parametrize("disabled, left", [("devicePlugin", "trainyard-operator"), ("operator", "trainyard-device-plugin")])
def test_a_disabled_component_brings_no_alerts(disabled: str, left: str) -> None:
    [rule] = rendered_rules({"prometheusRule": {"enabled": True, "namespace": "monitoring"}, disabled: {"enabled": False}})
    assert [g["name"] for g in rule["spec"]["groups"]] == [left]
    assert rule["metadata"]["namespace"] == "monitoring"


def test_the_rule_file_passes_promtool_check_rules() -> None:
    assert PROMTOOL, "promtool missing: `make prereqs` installs Debian's prometheus"
    r = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("tests", RULE_TESTS, ids=[p.name for p in RULE_TESTS])
def test_promtool_test_rules_passes(tests: Path) -> None:
    assert PROMTOOL, "promtool missing: `make prereqs` installs Debian's prometheus"
    r = subprocess.run([PROMTOOL, "test", "rules", tests.name], cwd=tests.parent, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_alert_has_a_test() -> None:
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    tested = {
        case["alertname"]
        for path in RULE_TESTS
        for test in yaml.safe_load(path.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert alerts - tested == set()


def registered_metrics() -> set[str]:
    names = set()
    for source in METRIC_SOURCES:
        code = source.read_text().split("#[cfg(test)]")[0]
        names |= set(re.findall(r'"(trainyard_[a-z0-9_]+)"', code))
    return names


def test_alerts_read_only_metrics_the_code_registers() -> None:
    registered = registered_metrics()
    assert "trainyard_operator_leader" in registered and "trainyard_gpu_health" in registered
    used = set(re.findall(r"\btrainyard_[a-z0-9_]+", RULES.read_text().split("groups:", 1)[1]))
    # Counters gain _total and histograms _count in the exposition.
    unknown = {m for m in used if re.sub(r"_(total|count|sum|bucket)$", "", m) not in registered}
    assert unknown == set()


def test_the_flux_example_installs_values_the_chart_accepts() -> None:
    """examples/gitops/flux/helmrelease.yaml's values pass the chart's schema and render."""
    release = yaml.safe_load((REPO_ROOT / "examples" / "gitops" / "flux" / "helmrelease.yaml").read_text())
    assert release["spec"]["chart"]["spec"]["chart"] == "./charts/trainyard"
    with helm_python.Chart.load(CHART_DIR) as chart:
        chart.validate_schema(release["spec"]["values"])
    assert len(rendered_rules(release["spec"]["values"])) == 1
