#!/usr/bin/env python3
"""Kubernetes endpoints discovery for the e2e Prometheus, through files.

Debian's `prometheus` is built without Kubernetes service discovery (its NEWS.Debian: the
client library's dependencies), so this stands in for `kubernetes_sd_configs` with
`role: endpoints`: it lists the Services, Endpoints and Pods of each namespace the scrape
configuration names and writes, for every address and port of every Endpoints object, a
file_sd target group with the meta labels Prometheus's own discovery gives it
(`__meta_kubernetes_service_label_*`, `__meta_kubernetes_endpoint_port_name`, the pod's, ...).
It selects nothing itself: the relabel rules that prometheus_config.py generates from the
chart's ServiceMonitors do, as they would on the real discovery.

usage: prometheus_sd.py --config PROMETHEUS_YML --kubeconfig FILE [--interval SECONDS] [--once]

Every file_sd file the configuration names is `<dir>/<namespace>.json`; each is rewritten
(atomically, when it changes) every --interval seconds until the process is stopped.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import ssl
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml


def meta_name(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def object_labels(prefix: str, obj: dict[str, Any]) -> dict[str, str]:
    """`<prefix>_label_<k>`, `<prefix>_labelpresent_<k>` and the same for annotations."""
    out = {}
    meta = obj.get("metadata", {})
    for kind, values in (("label", meta.get("labels") or {}), ("annotation", meta.get("annotations") or {})):
        for k, v in values.items():
            out[f"{prefix}_{kind}_{meta_name(k)}"] = str(v)
            out[f"{prefix}_{kind}present_{meta_name(k)}"] = "true"
    return out


def pod_labels(pod: dict[str, Any], port: dict[str, Any]) -> dict[str, str]:
    """The pod's meta labels, with the container that exposes the endpoint's port."""
    status, spec = pod.get("status", {}), pod.get("spec", {})
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    out = {
        "__meta_kubernetes_pod_name": pod["metadata"]["name"],
        "__meta_kubernetes_pod_ip": status.get("podIP", ""),
        "__meta_kubernetes_pod_node_name": spec.get("nodeName", ""),
        "__meta_kubernetes_pod_host_ip": status.get("hostIP", ""),
        "__meta_kubernetes_pod_ready": str(ready).lower(),
        "__meta_kubernetes_pod_phase": status.get("phase", ""),
        "__meta_kubernetes_pod_uid": pod["metadata"].get("uid", ""),
        **object_labels("__meta_kubernetes_pod", pod),
    }
    for owner in pod["metadata"].get("ownerReferences") or []:
        if owner.get("controller"):
            out["__meta_kubernetes_pod_controller_kind"] = owner.get("kind", "")
            out["__meta_kubernetes_pod_controller_name"] = owner.get("name", "")
    for c in spec.get("containers") or []:
        for cp in c.get("ports") or []:
            if cp.get("containerPort") == port.get("port") and cp.get("protocol", "TCP") == port.get("protocol", "TCP"):
                out.update({
                    "__meta_kubernetes_pod_container_name": c["name"],
                    "__meta_kubernetes_pod_container_image": c.get("image", ""),
                    "__meta_kubernetes_pod_container_port_name": cp.get("name", ""),
                    "__meta_kubernetes_pod_container_port_number": str(cp["containerPort"]),
                    "__meta_kubernetes_pod_container_port_protocol": cp.get("protocol", "TCP"),
                })
    return out


def address_group(addr: dict[str, Any], port: dict[str, Any], ready: bool,
                  common: dict[str, str], pods: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One target group: one address and port of an Endpoints object."""
    labels = {
        **common,
        "__meta_kubernetes_endpoint_port_name": port.get("name", ""),
        "__meta_kubernetes_endpoint_port_protocol": port.get("protocol", "TCP"),
        "__meta_kubernetes_endpoint_ready": str(ready).lower(),
    }
    if addr.get("hostname"):
        labels["__meta_kubernetes_endpoint_hostname"] = addr["hostname"]
    if addr.get("nodeName"):
        labels["__meta_kubernetes_endpoint_node_name"] = addr["nodeName"]
    ref = addr.get("targetRef") or {}
    if ref:
        labels["__meta_kubernetes_endpoint_address_target_kind"] = ref.get("kind", "")
        labels["__meta_kubernetes_endpoint_address_target_name"] = ref.get("name", "")
    if ref.get("kind") == "Pod" and ref.get("name") in pods:
        labels.update(pod_labels(pods[ref["name"]], port))
    return {"targets": [f"{addr['ip']}:{port['port']}"], "labels": labels}


def target_groups(namespace: str, services: list, endpoints: list, pods: list) -> list[dict[str, Any]]:
    """What `kubernetes_sd_configs` role endpoints discovers in one namespace."""
    by_name = {s["metadata"]["name"]: s for s in services}
    pods_by_name = {p["metadata"]["name"]: p for p in pods}
    groups = []
    for ep in sorted(endpoints, key=lambda e: e["metadata"]["name"]):
        name = ep["metadata"]["name"]
        common = {"__meta_kubernetes_namespace": namespace, "__meta_kubernetes_endpoints_name": name,
                  **object_labels("__meta_kubernetes_endpoints", ep)}
        if name in by_name:
            common["__meta_kubernetes_service_name"] = name
            common.update(object_labels("__meta_kubernetes_service", by_name[name]))
        for subset in ep.get("subsets") or []:
            for port in subset.get("ports") or []:
                for ready, key in ((True, "addresses"), (False, "notReadyAddresses")):
                    for addr in subset.get(key) or []:
                        groups.append(address_group(addr, port, ready, common, pods_by_name))
    return groups


class Api:
    """GETs against the API server with the kubeconfig's current context (client certificate)."""

    def __init__(self, kubeconfig: Path) -> None:
        cfg = yaml.safe_load(kubeconfig.read_text())
        ctx = next(c["context"] for c in cfg["contexts"] if c["name"] == cfg["current-context"])
        cluster = next(c["cluster"] for c in cfg["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in cfg["users"] if u["name"] == ctx["user"])
        self.server = cluster["server"].rstrip("/")
        self.tls = ssl.create_default_context(cafile=cluster["certificate-authority"])
        self.tls.load_cert_chain(user["client-certificate"], user["client-key"])

    def items(self, path: str) -> list[dict[str, Any]]:
        with urllib.request.urlopen(self.server + path, context=self.tls, timeout=10) as r:
            return json.load(r)["items"]


def sd_files(config: Path) -> dict[str, Path]:
    """The file_sd files of the Prometheus configuration, by namespace (their names)."""
    cfg = yaml.safe_load(config.read_text())
    out = {}
    for job in cfg.get("scrape_configs") or []:
        for sd in job.get("file_sd_configs") or []:
            for f in sd.get("files") or []:
                out[Path(f).stem] = Path(f)
    return out


def refresh(api: Api, files: dict[str, Path]) -> None:
    for ns, path in files.items():
        base = f"/api/v1/namespaces/{ns}"
        groups = target_groups(ns, api.items(base + "/services"), api.items(base + "/endpoints"),
                               api.items(base + "/pods"))
        text = json.dumps(groups, indent=1, sort_keys=True)
        if path.exists() and path.read_text() == text:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
        print(f"prometheus_sd: {path}: {len(groups)} target group(s)", flush=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--config", type=Path, required=True)
    p.add_argument("--kubeconfig", type=Path, required=True)
    p.add_argument("--interval", type=float, default=5.0)
    p.add_argument("--once", action="store_true")
    a = p.parse_args()
    files = sd_files(a.config)
    if not files:
        print(f"prometheus_sd: {a.config} names no file_sd files", file=sys.stderr)
        return 1
    api = Api(a.kubeconfig)
    while True:
        try:
            refresh(api, files)
        except (OSError, ValueError, KeyError) as e:
            if a.once:
                raise
            print(f"prometheus_sd: {e} (keeping the last targets)", file=sys.stderr, flush=True)
        if a.once:
            return 0
        time.sleep(a.interval)


if __name__ == "__main__":
    sys.exit(main())
