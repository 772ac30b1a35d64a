"""Every metric family the operator and the device plugin register is in their page's metrics
table (docs/operator.md, docs/device-plugin.md), and every family a page lists is registered.
The registry is read from the code: the `trainyard_*` names in each crate's metrics module
(`metrics.rs` or `metrics/`, wherever it sits under src/) outside its tests."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CRATES = {
    "operator": (ROOT / "operator" / "src", ROOT / "docs" / "operator.md", "trainyard_operator_"),
    "device-plugin": (ROOT / "device-plugin" / "src", ROOT / "docs" / "device-plugin.md", "trainyard_"),
}
SUFFIX = re.compile(r"_(total|count|sum|bucket)$")


def metrics_sources(src: Path) -> list[Path]:
    """The crate's metrics module: every `metrics.rs` and every file under a `metrics/` folder."""
    files = [p for p in src.rglob("*.rs") if p.name == "metrics.rs" or "metrics" in p.relative_to(src).parts[:-1]]
    return sorted(p for p in files if p.name != "tests.rs")


def registered(src: Path) -> set[str]:
    names: set[str] = set()
    for source in metrics_sources(src):
        code = source.read_text().split("#[cfg(test)]")[0]
        # Names given to the registry or to a collector's descriptor, never an exposition line.
        names |= {SUFFIX.sub("", n) for n in re.findall(r'"(trainyard_[a-z0-9_]+)"', code)}
    return names


def documented(page: Path, prefix: str) -> set[str]:
    text = page.read_text()
    section = text.split("## Metrics", 1)[1]
    section = re.split(r"\n## ", section, maxsplit=1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return {SUFFIX.sub("", n) for row in rows for n in re.findall(rf"`({prefix}[a-z0-9_]+)", row)}


@pytest.mark.parametrize("crate", CRATES)
def test_every_registered_metric_family_is_documented_and_every_documented_one_registered(crate: str) -> None:
    source, page, prefix = CRATES[crate]
    code, docs = registered(source), documented(page, prefix)
    assert code, f"no metric names found in {source}"
    assert sorted(code - docs) == [], f"registered in {source}'s metrics module but not in {page.name}'s Metrics tables"
    assert sorted(docs - code) == [], f"in {page.name}'s Metrics tables but not registered"
