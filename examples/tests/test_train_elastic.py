"""Elastic training (examples/trainyard_elastic.py, examples/train.py with
TRAINYARD_FULL_WORLD_SIZE): the same computation at any world size.

The shard arithmetic is tested everywhere; the runs of train.py itself need torch (Debian's
python3-torch: CPU, gloo) and are skipped where it is missing."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(EXAMPLES))

import trainyard_elastic  # noqa: E402


@pytest.mark.parametrize("full", range(1, 9))
def test_the_blocks_of_every_world_cover_every_shard_once_in_rank_order(full):
    for world in range(1, full + 1):
        shards = [s for r in range(world) for s in trainyard_elastic.shards_of(r, world, full)]
        assert shards == list(range(full)), (world, full)
        most = max(len(trainyard_elastic.shards_of(r, world, full)) for r in range(world))
        assert most == trainyard_elastic.most_shards(world, full)


def test_the_full_world_size_is_read_and_checked():
    read = trainyard_elastic.full_world_size
    assert read(2, {}) is None
    assert read(2, {"TRAINYARD_FULL_WORLD_SIZE": "4"}) == 4
    for bad, says in [("four", "not an integer"), ("0", "at least 1"), ("1", "smaller than WORLD_SIZE=2")]:
        with pytest.raises(trainyard_elastic.Invalid, match=says):
            read(2, {"TRAINYARD_FULL_WORLD_SIZE": bad})
    assert trainyard_elastic.describe(1, 3, 4) == "elastic: world size 3 of 4, shards 2 per step"
    assert trainyard_elastic.describe(0, 2, 4) == "elastic: world size 2 of 4, shards 0-1 per step"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(world, steps, directory, full=4, resume=False):
    """Runs train.py as `world` processes over gloo on loopback, to `steps`; returns the
    final weights' digest rank 0 wrote."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("TRAINYARD_", "RESUME_"))
        }
        env.update(
            RANK=str(rank),
            LOCAL_RANK="0",
            WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            TRAINYARD_FULL_WORLD_SIZE=str(full),
            CHECKPOINT_DIR=str(directory),
            CHECKPOINT_PATH=str(directory / "latest.pt"),
            TOTAL_STEPS=str(steps),
            CHECKPOINT_EVERY="5",
            PYTHONPATH=str(EXAMPLES),
        )
        if resume:
            env["RESUME_FROM"] = str(directory / "latest.pt")
        procs.append(
            subprocess.Popen(
                [sys.executable, str(EXAMPLES / "train.py")],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outs = [p.communicate(timeout=120)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out
    assert f"elastic: world size {world} of {full}" in outs[0], outs[0]
    return (directory / "final.sha256").read_text().strip()


def test_training_that_shrinks_and_grows_ends_with_the_weights_of_a_run_at_full_size(tmp_path):
    pytest.importorskip("torch")
    whole = tmp_path / "whole"
    whole.mkdir()
    expected = run(4, 30, whole)
    resized = tmp_path / "resized"
    resized.mkdir()
    run(4, 10, resized)
    run(2, 20, resized, resume=True)
    run(3, 25, resized, resume=True)
    assert run(4, 30, resized, resume=True) == expected
