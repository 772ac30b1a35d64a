"""Every example TrainingJob (examples/trainingjob*.yaml, and the TrainingJobs the README
shows) is valid against the CRD's openAPIV3Schema, as the API server checks it, and names no
field the schema lacks: the API server would prune such a field without a word."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
CRD = REPO_ROOT / "crds" / "trainingjob.yaml"
EXAMPLES = sorted((REPO_ROOT / "examples").glob("trainingjob*.yaml"))


def openapi_to_json_schema(node: Any) -> Any:
    """OpenAPI v3 (as a structural CRD schema uses it) to JSON Schema: `nullable` becomes a
    null type, and an object with properties allows no other keys unless it preserves them."""
    if isinstance(node, list):
        return [openapi_to_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: openapi_to_json_schema(v) for k, v in node.items() if not k.startswith("x-kubernetes-") and k != "nullable"}
    if node.get("x-kubernetes-int-or-string"):
        out["type"] = ["integer", "string"]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"] if isinstance(out["type"], str) else [*out["type"], "null"]
    if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields") and "additionalProperties" not in node:
        out["additionalProperties"] = False
    return out


def schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    [version] = [v for v in crd["spec"]["versions"] if v.get("storage")]
    s = openapi_to_json_schema(copy.deepcopy(version["schema"]["openAPIV3Schema"]))
    # metadata is the API server's to check; status is the operator's.
    s["properties"]["metadata"] = {"type": "object"}
    s["properties"]["apiVersion"] = {"const": "trainyard.dev/v1alpha1"}
    s["properties"]["kind"] = {"const": "TrainingJob"}
    s["properties"].pop("status", None)
    return s


def readme_jobs() -> list[dict[str, Any]]:
    text = (REPO_ROOT / "README.md").read_text()
    docs = [d for block in re.findall(r"```yaml\n(.*?)```", text, re.S) for d in yaml.safe_load_all(block)]
    return [d for d in docs if isinstance(d, dict) and d.get("kind") == "TrainingJob"]


def errors(job: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(schema())
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(job)]


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_trainingjobs_fit_the_crd(path: Path) -> None:
    [job] = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert (job["apiVersion"], job["kind"]) == ("trainyard.dev/v1alpha1", "TrainingJob")
    assert errors(job) == []


def test_the_gpu_example_is_among_them() -> None:
    assert "trainingjob-gpu.yaml" in [p.name for p in EXAMPLES]


def test_the_readme_shows_trainingjobs_that_fit_the_crd() -> None:
    jobs = readme_jobs()
    assert jobs, "README.md shows no TrainingJob in a yaml block"
    for job in jobs:
        assert errors(job) == [], job["metadata"]["name"]


def test_the_check_catches_a_misspelt_field_a_wrong_type_and_a_bad_enum() -> None:
    [job] = [d for d in yaml.safe_load_all((REPO_ROOT / "examples" / "trainingjob.yaml").read_text()) if d]
    for change, says in [
        (lambda j: j["spec"].update(worker=2), "Additional properties"),
        (lambda j: j["spec"].update(workers="two"), "is not of type"),
        (lambda j: j["spec"]["spot"].update(policy="Sometimes"), "is not one of"),
    ]:
        broken = copy.deepcopy(job)
        change(broken)
        assert any(says in e for e in errors(broken)), says
