"""The images built from the repository's Dockerfile agree with the chart that runs them.

e2e/cluster/images.sh builds the operator and device-plugin targets with buildah and
saves `buildah inspect` of each as $TRAINYARD_IMAGE_CONFIG_DIR/<target>.inspect.json,
then runs this file for the targets it built ($TRAINYARD_CHECK_IMAGES). The name does
not match `test_*.py` on purpose: `pytest charts/tests` (make chart-test) runs before any
image exists, so this file runs only when images.sh names it. A missing or unreadable
image config is a failure, never a skip.

Checked per image, against the chart rendered with its default values: the user (the
container's effective runAsUser), the entrypoint (the chart's `command`) and default
command (the first of the chart's `args`), the exposed ports (the container's ports), and
the OCI labels (title, source and licence as Chart.yaml states them).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

CHART_DIR = Path(__file__).resolve().parent.parent / "trainyard"
RELEASE = "trainyard"
NAMESPACE = "trainyard-system"
# Dockerfile target -> (kind of the chart's workload, its container's name).
WORKLOADS = {
    "operator": ("Deployment", "operator"),
    "device-plugin": ("DaemonSet", "device-plugin"),
}


def targets() -> list[str]:
    """The images images.sh built; both when run by hand."""
    named = os.environ.get("TRAINYARD_CHECK_IMAGES", "operator device-plugin").split()
    return named


def config_dir() -> Path:
    state = os.environ.get("TRAINYARD_E2E_STATE", "/var/lib/trainyard-e2e")
    return Path(os.environ.get("TRAINYARD_IMAGE_CONFIG_DIR", f"{state}/images"))


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    chart = helm_python.Chart.load(CHART_DIR)
    try:
        # The chart has no default repositories; any will do, only the pods' specs are compared.
        images = {key: {"image": {"repository": f"trainyard/{target}"}} for key, target in
                  (("operator", "operator"), ("devicePlugin", "device-plugin"))}
        manifests = chart.render(images, name=RELEASE, namespace=NAMESPACE, is_install=True)
    finally:
        chart.close()
    return [
        doc
        for path, text in manifests.items()
        if not path.endswith("NOTES.txt")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


@pytest.fixture(scope="module")
def chart_meta() -> dict[str, Any]:
    return yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())


def image_config(target: str) -> dict[str, Any]:
    """The OCI config of the built image; fails (not skips) when images.sh saved none."""
    path = config_dir() / f"{target}.inspect.json"
    assert path.is_file(), f"no image config at {path}: images.sh has not built {target} from the Dockerfile"
    inspect = json.loads(path.read_text())
    config = inspect.get("OCIv1", {}).get("config")
    assert config, f"{path} holds no OCIv1.config"
    return config


def chart_pod(rendered: list[dict[str, Any]], target: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(pod spec, container) of the chart's workload for a Dockerfile target."""
    kind, container = WORKLOADS[target]
    [workload] = [o for o in rendered if o["kind"] == kind and o["metadata"]["name"].endswith(target)]
    pod = workload["spec"]["template"]["spec"]
    [c] = [c for c in pod["containers"] if c["name"] == container]
    return pod, c


def test_the_list_of_images_to_check_is_not_empty() -> None:
    assert targets(), "TRAINYARD_CHECK_IMAGES names no image"
    assert set(targets()) <= set(WORKLOADS), f"unknown Dockerfile target in {targets()}"


@pytest.mark.parametrize("target", targets())
def test_the_image_runs_as_the_user_the_chart_runs_it_as(rendered: list[dict[str, Any]], target: str) -> None:
    pod, container = chart_pod(rendered, target)
    chart_uid = container.get("securityContext", {}).get("runAsUser", pod.get("securityContext", {}).get("runAsUser"))
    assert chart_uid is not None, f"the chart sets no runAsUser for {target}"
    user = image_config(target).get("User", "")
    assert user.split(":")[0] == str(chart_uid), f"{target}: image user {user!r}, chart runAsUser {chart_uid}"


@pytest.mark.parametrize("target", targets())
def test_the_image_entrypoint_is_the_command_the_chart_runs(rendered: list[dict[str, Any]], target: str) -> None:
    _, container = chart_pod(rendered, target)
    config = image_config(target)
    assert config.get("Entrypoint") == container["command"]
    assert config.get("Cmd", [None])[0] == container["args"][0], f"{target}: default command {config.get('Cmd')}"


@pytest.mark.parametrize("target", targets())
def test_the_image_exposes_exactly_the_ports_the_chart_declares(rendered: list[dict[str, Any]], target: str) -> None:
    _, container = chart_pod(rendered, target)
    declared = {f"{p['containerPort']}/{p.get('protocol', 'TCP').lower()}" for p in container.get("ports", [])}
    exposed = set(image_config(target).get("ExposedPorts") or {})
    assert exposed == declared, f"{target}: image exposes {sorted(exposed)}, chart declares {sorted(declared)}"


@pytest.mark.parametrize("target", targets())
def test_the_image_carries_the_oci_labels_of_the_chart(chart_meta: dict[str, Any], target: str) -> None:
    labels = image_config(target).get("Labels") or {}
    assert labels.get("org.opencontainers.image.title") == f"trainyard-{target}"
    assert labels.get("org.opencontainers.image.source") in chart_meta["sources"]
    assert labels.get("org.opencontainers.image.licenses") == chart_meta["annotations"]["artifacthub.io/license"]
    assert labels.get("org.opencontainers.image.description"), f"{target}: no description label"
