"""The Argo CD health script on TrainingJobs captured from the local cluster (the operator's
real status, not hand-written): `fixtures/captured/`, taken with `kubectl get tj -o json` from
jobs in each phase (the preempted job of `make demo` among them), managedFields and
annotations dropped."""

import json
from pathlib import Path
from typing import Any

import pytest

from test_argocd_health import health, lua  # noqa: F401  (lua is a fixture)

CAPTURED = Path(__file__).resolve().parent / "fixtures" / "captured"


def captured(name: str) -> dict[str, Any]:
    return json.loads((CAPTURED / f"{name}.json").read_text())


@pytest.mark.parametrize(
    "name, status, says",
    [
        ("running", "Healthy", "1/1 workers running"),
        ("succeeded-after-preemption", "Healthy", "every trainer exited 0"),
        ("suspended", "Suspended", "spec.suspend is true"),
        ("failed", "Degraded", "FailureBudgetExceeded"),
        ("missingclaim", "Degraded", "does not exist"),
        ("unschedulable", "Progressing", "NoMatchingNode: no Ready node offers 64"),
    ],
)
def test_captured_trainingjob_health(lua: str, tmp_path: Path, name: str, status: str, says: str) -> None:  # noqa: F811
    obj = captured(name)
    got, message = health(lua, obj, tmp_path)
    assert got == status, f"{name}: {got}: {message}"
    assert message, f"{name}: Argo CD shows the operator's words, not an empty message"
    assert says in message, f"{name}: {message!r}"


def test_every_captured_object_is_checked() -> None:
    files = {p.stem for p in CAPTURED.glob("*.json")}
    assert files == {"running", "succeeded-after-preemption", "suspended", "failed", "missingclaim", "unschedulable"}
