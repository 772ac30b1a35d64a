#!/usr/bin/env python3
"""Prometheus's configuration for the local cluster, generated from the chart's ServiceMonitors.

The e2e Prometheus (e2e/cluster/prometheus.sh) runs without prometheus-operator, so this
does its part: it renders the chart as the e2e installs it, with the ServiceMonitors on, and
translates each ServiceMonitor endpoint into the scrape job prometheus-operator generates for
it: endpoints discovery in the monitor's namespaces, a keep rule for every label of the
monitor's selector and for the endpoint's port name, and the same target labels (namespace,
service, pod, container, job = the Service's name, endpoint). A selector or port name that
matches no Service in the chart therefore scrapes nothing, and the dashboard test finds no
data. Fields the translation does not know are errors, not silently dropped.

Debian's prometheus has no Kubernetes discovery, so each job reads `<sd-dir>/<namespace>.json`
(file_sd), which prometheus_sd.py keeps filled with what `kubernetes_sd_configs` role
endpoints would discover there; the relabel rules are the ones prometheus-operator writes.
The chart's recording and alert rules (PrometheusRule objects, and rule files shipped in the
chart) are written out for Prometheus and promtool.

usage:
  prometheus_config.py scrape-config --sd-dir DIR --out FILE [--rules-dir DIR] RENDER...
  prometheus_config.py rules --out-dir DIR RENDER...
RENDER: --release NAME --namespace NS [--values FILE]... [--set-json JSON]
Needs helm-python-sdk and PyYAML (the venv `make prereqs` creates).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

CHART_DIR = Path(__file__).resolve().parents[2] / "charts" / "trainyard"

# ServiceMonitor fields the translation follows; any other is an error.
SPEC_FIELDS = {"namespaceSelector", "selector", "endpoints"}
ENDPOINT_FIELDS = {"port", "path", "interval", "scrapeTimeout", "scheme", "honorLabels"}
SELECTOR_OPS = {"In", "NotIn", "Exists", "DoesNotExist"}


class Unsupported(ValueError):
    """A ServiceMonitor field or value this translation does not follow."""


def deep_merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def render(release: str, namespace: str, values: dict[str, Any]) -> list[dict[str, Any]]:
    """Every object the chart renders (the real Helm engine, as `helm template`)."""
    import helm_python

    chart = helm_python.Chart.load(CHART_DIR)
    try:
        manifests = chart.render(values, name=release, namespace=namespace, is_install=True)
    finally:
        chart.close()
    objects = []
    for path, text in manifests.items():
        if not path.endswith("NOTES.txt"):
            objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


def label_name(name: str) -> str:
    """A Kubernetes label key as a Prometheus meta label suffix (prometheus-operator's sanitizing)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def alternatives(values: list[str]) -> str:
    return "|".join(re.escape(v) for v in values)


def selector_rules(selector: dict[str, Any]) -> list[dict[str, Any]]:
    """Keep/drop rules that admit exactly the Services a label selector matches."""
    unknown = set(selector) - {"matchLabels", "matchExpressions"}
    if unknown:
        raise Unsupported(f"selector fields {sorted(unknown)}")
    if not selector.get("matchLabels") and not selector.get("matchExpressions"):
        raise Unsupported("an empty selector (every Service in the namespace)")
    rules = []
    for key, value in sorted((selector.get("matchLabels") or {}).items()):
        n = label_name(key)
        rules.append({
            "action": "keep",
            "source_labels": [f"__meta_kubernetes_service_label_{n}", f"__meta_kubernetes_service_labelpresent_{n}"],
            "regex": f"({alternatives([str(value)])});true",
        })
    for expr in selector.get("matchExpressions") or []:
        op, n = expr.get("operator"), label_name(expr.get("key", ""))
        if op not in SELECTOR_OPS:
            raise Unsupported(f"selector operator {op!r}")
        present = f"__meta_kubernetes_service_labelpresent_{n}"
        if op in ("In", "NotIn"):
            rules.append({
                "action": "keep" if op == "In" else "drop",
                "source_labels": [f"__meta_kubernetes_service_label_{n}", present],
                "regex": f"({alternatives([str(v) for v in expr.get('values') or []])});true",
            })
        else:
            rules.append({"action": "keep" if op == "Exists" else "drop", "source_labels": [present], "regex": "true"})
    return rules


def target_label_rules(port: str) -> list[dict[str, Any]]:
    """The labels prometheus-operator gives every ServiceMonitor target."""
    def copy(source: str, target: str) -> dict[str, Any]:
        return {"source_labels": [source], "target_label": target}

    return [
        {"source_labels": ["__meta_kubernetes_endpoint_address_target_kind", "__meta_kubernetes_endpoint_address_target_name"],
         "separator": ";", "regex": "Node;(.*)", "replacement": "${1}", "target_label": "node"},
        {"source_labels": ["__meta_kubernetes_endpoint_address_target_kind", "__meta_kubernetes_endpoint_address_target_name"],
         "separator": ";", "regex": "Pod;(.*)", "replacement": "${1}", "target_label": "pod"},
        {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"},
        copy("__meta_kubernetes_namespace", "namespace"),
        copy("__meta_kubernetes_service_name", "service"),
        copy("__meta_kubernetes_pod_name", "pod"),
        copy("__meta_kubernetes_pod_container_name", "container"),
        copy("__meta_kubernetes_service_name", "job"),
        {"target_label": "endpoint", "replacement": port},
    ]


def namespaces_of(monitor: dict[str, Any]) -> list[str]:
    """The namespaces a ServiceMonitor looks in."""
    sel = monitor["spec"].get("namespaceSelector") or {}
    unknown = set(sel) - {"matchNames"}
    if unknown:
        raise Unsupported(f"namespaceSelector fields {sorted(unknown)} (the discovery lists named namespaces)")
    return list(sel.get("matchNames") or [monitor["metadata"]["namespace"]])


def scrape_jobs(monitor: dict[str, Any], sd_dir: str) -> list[dict[str, Any]]:
    """The scrape jobs prometheus-operator generates for one ServiceMonitor, one per endpoint."""
    meta, spec = monitor["metadata"], monitor["spec"]
    where = f"ServiceMonitor {meta['namespace']}/{meta['name']}"
    unknown = set(spec) - SPEC_FIELDS
    if unknown:
        raise Unsupported(f"{where}: spec fields {sorted(unknown)}")
    sd = {"files": [f"{sd_dir}/{ns}.json" for ns in namespaces_of(monitor)]}
    jobs = []
    for i, ep in enumerate(spec.get("endpoints") or []):
        unknown = set(ep) - ENDPOINT_FIELDS
        if unknown:
            raise Unsupported(f"{where}: endpoint {i} fields {sorted(unknown)}")
        if "port" not in ep:
            raise Unsupported(f"{where}: endpoint {i} names no port")
        job = {
            "job_name": f"serviceMonitor/{meta['namespace']}/{meta['name']}/{i}",
            "honor_labels": bool(ep.get("honorLabels", False)),
            "file_sd_configs": [sd],
            "scheme": ep.get("scheme", "http"),
            "metrics_path": ep.get("path", "/metrics"),
            "relabel_configs": [
                *selector_rules(spec.get("selector") or {}),
                {"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"], "regex": re.escape(ep["port"])},
                *target_label_rules(ep["port"]),
            ],
        }
        for field, key in (("interval", "scrape_interval"), ("scrapeTimeout", "scrape_timeout")):
            if ep.get(field):
                job[key] = ep[field]
        jobs.append(job)
    if not jobs:
        raise Unsupported(f"{where}: no endpoints")
    return jobs


def prometheus_rule_groups(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The rule groups of the PrometheusRule objects among `objects`, by a file name."""
    return {
        f"prometheusrule-{o['metadata']['name']}.yaml": {"groups": o["spec"].get("groups") or []}
        for o in objects
        if o.get("kind") == "PrometheusRule"
    }


def chart_rule_groups(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every recording/alert rule group of the chart, by a file name: the PrometheusRule objects it
    renders and the rule files it ships (YAML with a top-level `groups` list)."""
    out = prometheus_rule_groups(objects)
    for path in sorted(CHART_DIR.rglob("*.y*ml")):
        if "templates" in path.relative_to(CHART_DIR).parts:
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and isinstance(doc.get("groups"), list):
                out["file-" + "-".join(path.relative_to(CHART_DIR).parts)] = {"groups": doc["groups"]}
    return out


def prometheus_config(objects: list[dict[str, Any]], sd_dir: str, rule_files: list[str]) -> dict[str, Any]:
    monitors = [o for o in objects if o.get("kind") == "ServiceMonitor"]
    if not monitors:
        raise Unsupported("the chart renders no ServiceMonitor (metrics.serviceMonitor.enabled?)")
    config: dict[str, Any] = {
        "global": {"scrape_interval": "30s", "evaluation_interval": "30s"},
        "scrape_configs": [job for m in monitors for job in scrape_jobs(m, sd_dir)],
    }
    if rule_files:
        config["rule_files"] = rule_files
    return config


def write_rules(groups: dict[str, dict[str, Any]], out_dir: Path) -> list[str]:
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("*.yaml"):
        old.unlink()
    paths = []
    for name, content in groups.items():
        path = out_dir / name
        path.write_text(yaml.safe_dump(content, sort_keys=False))
        paths.append(str(path))
    return paths


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("action", choices=["scrape-config", "rules"])
    p.add_argument("--release", required=True)
    p.add_argument("--namespace", required=True)
    p.add_argument("--values", action="append", default=[])
    p.add_argument("--set-json")
    p.add_argument("--sd-dir")
    p.add_argument("--out")
    p.add_argument("--rules-dir")
    p.add_argument("--out-dir")
    a = p.parse_args()
    values: dict[str, Any] = {}
    for f in a.values:
        values = deep_merge(values, yaml.safe_load(Path(f).read_text()) or {})
    if a.set_json:
        values = deep_merge(values, json.loads(a.set_json))
    try:
        objects = render(a.release, a.namespace, values)
        groups = chart_rule_groups(objects)
        if a.action == "rules":
            for path in write_rules(groups, Path(a.out_dir or p.error("rules needs --out-dir"))):
                print(path)
            return 0
        if not (a.sd_dir and a.out):
            p.error("scrape-config needs --sd-dir and --out")
        rule_files = write_rules(groups, Path(a.rules_dir)) if a.rules_dir and groups else []
        config = prometheus_config(objects, a.sd_dir, rule_files)
    except Unsupported as e:
        print(f"prometheus_config: cannot translate: {e}", file=sys.stderr)
        return 1
    Path(a.out).write_text(yaml.safe_dump(config, sort_keys=False))
    jobs = ", ".join(j["job_name"] for j in config["scrape_configs"])
    print(f"prometheus_config: wrote {a.out} ({jobs}; {len(rule_files)} rule file(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
