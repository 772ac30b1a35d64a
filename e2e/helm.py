#!/usr/bin/env python3
"""Helm v4 (through the PyPI package helm-python-sdk) for the e2e harness.

usage:
  helm.py install   RELEASE CHART NAMESPACE [--values FILE.yaml]...  [--set-json JSON]
  helm.py upgrade   RELEASE CHART NAMESPACE [--values FILE.yaml]...  [--set-json JSON]
  helm.py uninstall RELEASE NAMESPACE
  helm.py lint      CHART [--values FILE.yaml]...
Uses $KUBECONFIG. Exits non-zero with Helm's message on failure.
"""
import argparse
import json
import os
import sys

import helm_python as helm
import yaml


def deep_merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_values(files, set_json) -> dict:
    values: dict = {}
    for f in files or []:
        with open(f) as fh:
            values = deep_merge(values, yaml.safe_load(fh) or {})
    if set_json:
        values = deep_merge(values, json.loads(set_json))
    return values


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("action", choices=["install", "upgrade", "uninstall", "lint"])
    p.add_argument("args", nargs="+")
    p.add_argument("--values", action="append")
    p.add_argument("--set-json")
    p.add_argument("--timeout", type=int, default=180)
    a = p.parse_args()
    values = load_values(a.values, a.set_json)
    try:
        if a.action == "lint":
            result = helm.lint(a.args[0], values)
            print(json.dumps(result, indent=2, default=str))
            return 0
        cfg = helm.Config(kubeconfig_path=os.environ.get("KUBECONFIG"),
                          namespace=a.args[-1])
        if a.action == "install":
            rel, chart, ns = a.args
            r = cfg.install(helm.Chart.load(chart), rel, values, namespace=ns,
                            create_namespace=True, timeout=a.timeout)
        elif a.action == "upgrade":
            rel, chart, ns = a.args
            r = cfg.upgrade(helm.Chart.load(chart), rel, values, namespace=ns, timeout=a.timeout)
        else:
            rel, ns = a.args
            r = cfg.uninstall(rel, ignore_not_found=True, timeout=a.timeout)
        info = r.get("info") if isinstance(r, dict) else None
        print(f"helm {a.action} {a.args[0]}: ok" + (f" ({info})" if isinstance(info, str) else ""))
        return 0
    except helm.HelmError as e:
        print(f"helm {a.action} {a.args[0]} failed: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
