#!/usr/bin/env python3
"""Prints TrainingJobs' goodput ledgers (status.ledger) side by side.

    kubectl get tj JOB [JOB...] -o json | python3 e2e/ledger_table.py

Reads a List (or one TrainingJob) on stdin; one column pair (spot, on-demand) per job, in
the order given. GPU time is in GPU-seconds, money in dollars, both from the ledger's exact
integers (GPU-milliseconds, micro-dollars), rounded here for display only. `make demo` ends
with it, for the preempted job and its uninterrupted twin.
"""

from __future__ import annotations

import json
import sys
from typing import Any

# The ledger's uses of GPU time (status.ledger.spot / .onDemand), in the order shown.
USES = [
    ("useful", "useful"),
    ("lostToRecompute", "lost to recompute"),
    ("lostToDetection", "lost to detection"),
    ("lostToRestart", "lost to restart"),
    ("failedAttempts", "failed attempts"),
    ("hangs", "hangs"),
    ("recomputeUnknown", "recompute unknown"),
    ("pending", "pending (not charged)"),
]
LABEL = 26
COLUMN = 14


def dollars(micro: int) -> str:
    sign = "-" if micro < 0 else ""
    return f"{sign}${abs(micro) / 1_000_000:.4f}"


def seconds(millis: int) -> str:
    return f"{millis / 1000:.1f}"


def row(label: str, cells: list[str]) -> str:
    return f"{label:<{LABEL}}" + "".join(f"{c:>{COLUMN}}" for c in cells)


def table(jobs: list[dict[str, Any]]) -> list[str]:
    ledgers = [(j["metadata"]["name"], (j.get("status") or {}).get("ledger") or {}) for j in jobs]
    width = 2 * COLUMN
    lines = [f"{'':<{LABEL}}" + "".join(f"{name[: width - 1]:>{width}}" for name, _ in ledgers)]
    money = [l.get("microDollars") or {} for _, l in ledgers]

    def whole(label: str, values: list[str]) -> None:
        lines.append(f"{label:<{LABEL}}" + "".join(f"{v:>{width}}" for v in values))

    whole("spent", [dollars(m.get("spent", 0)) for m in money])
    whole("on-demand equivalent", [dollars(m.get("onDemandEquivalent", 0)) for m in money])
    whole("saved by spot", [dollars(m.get("saved", 0)) for m in money])
    whole("goodput", [l.get("goodput") or "-" for _, l in ledgers])
    lines.append(row("GPU-seconds", ["spot", "on-demand"] * len(ledgers)))
    for key, label in USES:
        cells = [seconds((l.get(c) or {}).get(key, 0)) for _, l in ledgers for c in ("spot", "onDemand")]
        lines.append(row(f"  {label}", cells))
    totals = [seconds(sum((l.get(c) or {}).values())) for _, l in ledgers for c in ("spot", "onDemand")]
    lines.append(row("  total", totals))
    unpriced = [l.get("unpricedGpuMillis", 0) for _, l in ledgers]
    if any(unpriced):
        whole("unpriced GPU-seconds", [seconds(u) for u in unpriced])
    return lines


def main() -> int:
    doc = json.load(sys.stdin)
    jobs = doc.get("items", [doc]) if doc.get("kind", "").endswith("List") else [doc]
    print("\n".join(table(jobs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
