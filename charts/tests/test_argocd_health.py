"""The chart's Argo CD health check (charts/trainyard/argocd/health.lua), run by Lua 5.1.

Argo CD runs health scripts with gopher-lua, a Lua 5.1 implementation, and gives a script
from argocd-cm only the base, table, package and a reduced os library (util/lua/lua.go:
`SkipOpenLibs` unless `useOpenLibs`). These tests run the script with Debian's `lua5.1`
after removing every other library, hand it each TrainingJob of charts/tests/fixtures/ as
Argo CD does (the global `obj`: JSON objects and arrays as tables, arrays 1-based, nulls
absent, numbers as Lua numbers) and check the status and message it returns. `lua5.1` is
required: `make prereqs` installs it (e2e/cluster/install-prereqs.sh).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

TESTS_DIR = Path(__file__).resolve().parent
CHART_DIR = TESTS_DIR.parent / "trainyard"
REPO_ROOT = CHART_DIR.parent.parent
HEALTH_LUA = CHART_DIR / "argocd" / "health.lua"
ARGOCD_CM = CHART_DIR / "argocd" / "argocd-cm.yaml"
CRD = CHART_DIR / "crds" / "trainingjob.yaml"
FIXTURES = TESTS_DIR / "fixtures"
CM_KEY = "resource.customizations.health.trainyard.dev_TrainingJob"
# The statuses Argo CD accepts from a health script; anything else shows as Unknown with
# "Lua returned an invalid health status".
ARGO_STATUSES = {"Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown"}

# Leaves the libraries Argo CD opens for a script from argocd-cm: base, table, package and
# a reduced os. Without the string library gopher-lua gives strings no methods either.
SANDBOX = """
string, math, io, debug, coroutine = nil, nil, nil, nil, nil
os = { time = os.time, date = os.date }
getmetatable("").__index = nil
"""


@pytest.fixture(scope="module")
def lua() -> str:
    path = shutil.which("lua5.1")
    if path is None:
        pytest.fail("lua5.1 is missing: `make prereqs` installs it (Debian package lua5.1)")
    return path


def lua_literal(value: Any) -> str:
    """A Lua expression building `value` (decoded JSON) as Argo CD hands it to a script."""
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return lua_string(value)
    if isinstance(value, list):
        assert None not in value, "a null inside an array has no Lua counterpart"
        return "{" + ", ".join(lua_literal(v) for v in value) + "}"
    if isinstance(value, dict):
        fields = (f"[{lua_string(k)}] = {lua_literal(v)}" for k, v in value.items() if v is not None)
        return "{" + ", ".join(fields) + "}"
    raise TypeError(f"not JSON: {value!r}")


def lua_string(text: str) -> str:
    """A Lua 5.1 string literal: printable ASCII as is, every other byte as a decimal escape."""
    out = []
    for byte in text.encode():
        char = chr(byte)
        if char in '"\\' or not 0x20 <= byte < 0x7F:
            out.append(f"\\{byte:03d}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def run_script(lua: str, script: Path, obj: dict[str, Any], tmp_path: Path) -> tuple[str, str]:
    """Runs a health script on `obj` in Argo CD's library set; returns (status, message)."""
    harness = tmp_path / "harness.lua"
    harness.write_text(
        f"local chunk = assert(loadfile({lua_string(str(script))}))\n"
        f"obj = {lua_literal(obj)}\n"
        f"{SANDBOX}\n"
        "local hs = chunk()\n"
        'assert(type(hs) == "table", "the script must return a table")\n'
        'assert(type(hs.status) == "string", "hs.status must be a string")\n'
        'assert(type(hs.message) == "string", "hs.message must be a string")\n'
        'print(hs.status .. "\\n" .. hs.message)\n'
    )
    done = subprocess.run([lua, str(harness)], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    status, message = done.stdout.removesuffix("\n").split("\n", 1)
    return status, message


def health(lua: str, obj: dict[str, Any], tmp_path: Path) -> tuple[str, str]:
    return run_script(lua, HEALTH_LUA, obj, tmp_path)


def fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"trainingjob-{name}.json").read_text())


RESTART = "attempt 1 after Preemption: worker 1: DisruptionTarget/TerminationByKubelet on node spot-7"


@pytest.mark.parametrize(
    "name, status, message",
    [
        ("new", "Progressing", "Waiting for the operator"),
        ("pending", "Progressing", "attempt 0: waiting for the workers to run; worker 1: ContainerCreating"),
        (
            "pending-unschedulable",
            "Progressing",
            "NoMatchingNode: no Ready node offers 2 x nvidia.com/gpu per worker; the cluster has 1 Ready node(s) "
            "(0 spot), at most 1 allocatable nvidia.com/gpu per node; products: NVIDIA-A100-SXM4-80GB (1); CUDA "
            "versions: 12.4; compute capabilities: 8.0; the workers wait Pending for a node that does (a cluster "
            "autoscaler can add one)",
        ),
        (
            "pending-invalid-spec",
            "Degraded",
            'InvalidSpec: spec.checkpoint.existingClaim: PersistentVolumeClaim "shared-ckpt" does not exist in '
            "namespace ml",
        ),
        (
            "malformed",
            "Degraded",
            "MalformedObject: the object does not parse as a TrainingJob: spec.template.spec.containers: invalid "
            "type: map, expected a sequence",
        ),
        ("running", "Healthy", "attempt 1: 2/2 workers running; step 1200, checkpoint at step 1000"),
        ("running-edit-not-observed", "Progressing", "Waiting for the operator to observe generation 2"),
        (
            "running-edited-invalid",
            "Degraded",
            'InvalidSpec: spec.template.spec.containers: the template has no containers; add one (named "trainer", '
            "or the first is the trainer)",
        ),
        ("restarting", "Progressing", RESTART),
        (
            "write-rejected",
            "Degraded",
            'Invalid: the API server rejected creating Pod ml/demo-worker-0 (422 Invalid): Pod "demo-worker-0" is '
            'invalid: spec.containers[0].env[0].name: Invalid value: "1BAD": a valid environment variable name must '
            "consist of alphabetic characters, digits, '_', '-', or '.', and must not start with a digit",
        ),
        (
            "name-conflict",
            "Degraded",
            "NameTaken: names this TrainingJob needs are held by objects that are not its own: Service ml/demo "
            "(owned by Deployment web); trainyard does not change, use or delete them, and creates no workers while "
            "they are there (delete or rename them, or rename the job; spec.checkpoint.existingClaim mounts a PVC "
            "of your own)",
        ),
        ("succeeded", "Healthy", "every trainer exited 0"),
        (
            "failed",
            "Degraded",
            "FailureBudgetExceeded: 3 failures exceed maxFailures=2; last: worker 0: trainer exited with code 1 "
            "(Error)",
        ),
        ("suspended", "Suspended", "spec.suspend is true"),
    ],
)
def test_health_of_a_trainingjob_follows_its_phase_and_conditions(
    lua: str, tmp_path: Path, name: str, status: str, message: str
) -> None:
    assert health(lua, fixture(name), tmp_path) == (status, message)


def test_every_fixture_is_checked_and_every_phase_has_one() -> None:
    names = {p.name.removeprefix("trainingjob-").removesuffix(".json") for p in FIXTURES.glob("trainingjob-*.json")}
    params = test_health_of_a_trainingjob_follows_its_phase_and_conditions.pytestmark[0].args[1]
    assert names == {p[0] for p in params}
    phases = {fixture(n).get("status", {}).get("phase") for n in names}
    assert set(status_schema()["properties"]["phase"]["enum"]) <= phases


def test_a_running_job_whose_progress_is_from_an_older_attempt_shows_no_step(lua: str, tmp_path: Path) -> None:
    job = fixture("running")
    job["status"]["progress"]["attempt"] = 0
    assert health(lua, job, tmp_path) == ("Healthy", "attempt 1: 2/2 workers running")


def test_a_running_job_whose_progress_reports_stopped_stays_healthy_and_says_so(lua: str, tmp_path: Path) -> None:
    # The operator judges no hang while the channel is down: the job trains on, but the user
    # must learn that hang detection is blind (docs/trainingjob.md, "ProgressChannel").
    job = fixture("running")
    job["status"]["conditions"].append(
        {
            "type": "ProgressChannel",
            "status": "False",
            "reason": "ReportsStopped",
            "message": "no report from any trainer for 120 s",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
    )
    status, message = health(lua, job, tmp_path)
    assert status == "Healthy"
    assert message.endswith("; ReportsStopped: no report from any trainer for 120 s"), message


def test_a_phase_the_script_does_not_know_is_unknown(lua: str, tmp_path: Path) -> None:
    job = fixture("running")
    job["status"]["phase"] = "Draining"
    assert health(lua, job, tmp_path) == ("Unknown", "unknown phase Draining")


def test_a_running_job_edited_into_an_object_that_does_not_parse_is_degraded(lua: str, tmp_path: Path) -> None:
    # The operator patches only the InvalidSpec condition onto such an object: the status's
    # observedGeneration stays behind the edit, which must not read as "waiting".
    job = fixture("running")
    job["metadata"]["generation"] = 2
    malformed = fixture("malformed")["status"]["conditions"][0]
    job["status"]["conditions"].append(dict(malformed, observedGeneration=2))
    assert health(lua, job, tmp_path) == ("Degraded", f"MalformedObject: {malformed['message']}")


def test_a_failed_job_is_degraded_even_while_an_edit_waits(lua: str, tmp_path: Path) -> None:
    job = fixture("failed")
    job["metadata"]["generation"] = 5
    assert health(lua, job, tmp_path)[0] == "Degraded"


@pytest.mark.parametrize("name", sorted(p.stem for p in FIXTURES.glob("trainingjob-*.json")))
def test_the_script_returns_a_status_argo_cd_accepts(lua: str, tmp_path: Path, name: str) -> None:
    status, _ = health(lua, json.loads((FIXTURES / f"{name}.json").read_text()), tmp_path)
    assert status in ARGO_STATUSES


def test_the_harness_withholds_the_string_library_as_argo_cd_does(lua: str, tmp_path: Path) -> None:
    """The sandbox is what makes a passing run mean "runs in Argo CD": a script calling a
    string function or method must fail here as it fails there."""
    for body in ('return {status = string.upper("x"), message = ""}', 'return {status = ("x"):upper(), message = ""}'):
        script = tmp_path / "uses-string.lua"
        script.write_text(body + "\n")
        with pytest.raises(AssertionError, match="attempt to"):
            run_script(lua, script, {}, tmp_path)


def status_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    return version["schema"]["openAPIV3Schema"]["properties"]["status"]


def schema_errors(value: Any, schema: dict[str, Any], path: str) -> list[str]:
    """Where `value` breaks the CRD's structural schema (types, known fields, required
    fields, enums): the subset of OpenAPI v3 the TrainingJob status uses."""
    if value is None:
        return [] if schema.get("nullable") else [f"{path}: null"]
    kinds = {"object": dict, "array": list, "string": str, "boolean": bool, "integer": int, "number": (int, float)}
    kind = schema.get("type")
    if kind and (not isinstance(value, kinds[kind]) or (kind in ("integer", "number") and isinstance(value, bool))):
        return [f"{path}: {value!r} is not {kind}"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{path}: {value!r} not in {schema['enum']}"]
    errors = []
    if kind == "object":
        properties = schema.get("properties", {})
        errors += [f"{path}.{k}: required" for k in schema.get("required", []) if k not in value]
        for key, item in value.items():
            if key not in properties:
                errors.append(f"{path}.{key}: not in the schema")
            else:
                errors += schema_errors(item, properties[key], f"{path}.{key}")
    if kind == "array":
        for i, item in enumerate(value):
            errors += schema_errors(item, schema["items"], f"{path}[{i}]")
    return errors


@pytest.mark.parametrize("name", sorted(p.stem for p in FIXTURES.glob("trainingjob-*.json")))
def test_fixtures_are_trainingjobs_whose_status_fits_the_crd(name: str) -> None:
    job = json.loads((FIXTURES / f"{name}.json").read_text())
    assert (job["apiVersion"], job["kind"]) == ("trainyard.dev/v1alpha1", "TrainingJob")
    assert schema_errors(job.get("status"), dict(status_schema(), nullable=True), "status") == []


def snippet_script(text: str) -> str:
    return yaml.safe_load(text)["data"][CM_KEY]


def test_the_argocd_cm_snippet_in_the_chart_carries_the_script_verbatim() -> None:
    assert snippet_script(ARGOCD_CM.read_text()) == HEALTH_LUA.read_text()


def test_docs_show_the_argocd_cm_snippet_with_the_script_verbatim() -> None:
    docs = (REPO_ROOT / "docs" / "install.md").read_text()
    blocks = [b.split("\n", 1)[1] for b in docs.split("```yaml")[1:] if CM_KEY in b.split("```")[0]]
    assert len(blocks) == 1, f"docs/install.md needs one yaml block with {CM_KEY}"
    assert snippet_script(blocks[0].split("```")[0]) == HEALTH_LUA.read_text()


def test_a_condition_without_a_message_shows_its_reason(lua: str, tmp_path: Path) -> None:
    job = fixture("write-rejected")
    del job["status"]["conditions"][0]["message"]
    assert health(lua, job, tmp_path) == ("Degraded", "Invalid")
