"""The checkpoint fence of examples/trainyard_fence.py: an older attempt never replaces the
checkpoint once a newer one has claimed it (docs/env-contract.md#fencing-a-partitioned-writer)."""

import multiprocessing
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import trainyard_fence  # noqa: E402
from trainyard_fence import Fence, Fenced, Stale  # noqa: E402

UID = "6f1c2a9e-0000-4000-8000-000000000001"
CREATED = 1767225600


def token(attempt, created=CREATED, uid=UID):
    return f"{created}:{attempt}:{uid}"


def publish(fence, directory, content):
    """What a trainer's save does: a temporary file, then the fence's rename."""
    tmp = directory / f".latest.pt.tmp.{content}"
    tmp.write_text(content)
    fence.replace(str(tmp), str(directory / "latest.pt"))


def fence_file(directory):
    return (directory / trainyard_fence.FENCE_FILE).read_text().strip()


def temporaries(directory):
    return sorted(p.name for p in directory.iterdir() if ".tmp." in p.name)


def test_a_newer_claim_fences_the_older_writer(tmp_path):
    old, new = Fence(str(tmp_path), token(1)), Fence(str(tmp_path), token(2))
    old.claim()
    publish(old, tmp_path, "old-1")
    assert new.claim() == token(1)
    with pytest.raises(Fenced, match=r"attempt 2 of this job started"):
        publish(old, tmp_path, "old-2")
    assert (tmp_path / "latest.pt").read_text() == "old-1"
    assert temporaries(tmp_path) == []
    publish(new, tmp_path, "new-1")
    assert (tmp_path / "latest.pt").read_text() == "new-1"
    assert fence_file(tmp_path) == token(2)


def test_an_older_attempt_starting_after_a_newer_one_is_stale(tmp_path):
    Fence(str(tmp_path), token(3)).claim()
    with pytest.raises(Stale, match=r"attempt 3 of this job started"):
        Fence(str(tmp_path), token(2)).claim()
    assert fence_file(tmp_path) == token(3)


def test_a_job_applied_again_is_newer_than_every_attempt_of_the_old_one(tmp_path):
    old_job = Fence(str(tmp_path), token(5))
    new_job = Fence(str(tmp_path), token(0, created=CREATED + 1, uid="second-uid"))
    old_job.claim()
    new_job.claim()
    with pytest.raises(Fenced, match=r"attempt 0 of job second-uid"):
        publish(old_job, tmp_path, "old-job")
    with pytest.raises(Stale):
        old_job.claim()
    assert not (tmp_path / "latest.pt").exists()


def test_same_order_with_another_uid_the_last_claimer_wins(tmp_path):
    first = Fence(str(tmp_path), token(0, uid="first"))
    second = Fence(str(tmp_path), token(0, uid="second"))
    first.claim()
    second.claim()
    with pytest.raises(Fenced):
        publish(first, tmp_path, "first")
    first.claim()
    publish(first, tmp_path, "first")
    with pytest.raises(Fenced):
        publish(second, tmp_path, "second")
    assert (tmp_path / "latest.pt").read_text() == "first"


def test_every_rank_of_an_attempt_claims_and_publishes(tmp_path):
    ranks = [Fence(str(tmp_path), token(4)) for _ in range(3)]
    for rank in ranks:
        rank.claim()
    publish(ranks[0], tmp_path, "rank-0")
    assert (tmp_path / "latest.pt").read_text() == "rank-0"
    assert fence_file(tmp_path) == token(4)


def test_a_fence_file_without_a_token_is_claimed(tmp_path):
    (tmp_path / trainyard_fence.FENCE_FILE).write_text("not a token\n")
    fence = Fence(str(tmp_path), token(0))
    assert fence.claim() == "not a token"
    assert fence_file(tmp_path) == token(0)


def test_without_a_claim_the_fence_holds_no_token_and_nothing_is_published(tmp_path):
    with pytest.raises(Fenced, match=r"holds ''"):
        publish(Fence(str(tmp_path), token(0)), tmp_path, "unclaimed")
    assert not (tmp_path / "latest.pt").exists()
    assert temporaries(tmp_path) == []


def test_no_token_in_the_environment_renames_plainly(tmp_path):
    fence = trainyard_fence.from_env(str(tmp_path), environ={})
    assert fence.claim() is None
    publish(fence, tmp_path, "plain")
    assert (tmp_path / "latest.pt").read_text() == "plain"
    assert not (tmp_path / trainyard_fence.FENCE_FILE).exists()


def test_a_malformed_token_in_the_environment_is_an_error(tmp_path):
    env = {trainyard_fence.ENV_VAR: "12:x:uid"}
    with pytest.raises(ValueError, match="TRAINYARD_FENCE_TOKEN"):
        trainyard_fence.from_env(str(tmp_path), environ=env)
    env = {trainyard_fence.ENV_VAR: token(1)}
    assert trainyard_fence.from_env(str(tmp_path), environ=env).token == token(1)


def old_writer(directory, first_landed, outcome):
    """An old attempt's rank 0 saving in a loop until it is fenced."""
    fence = Fence(str(directory), token(1))
    landed = 0
    try:
        while True:
            publish(fence, directory, f"old-{landed}")
            landed += 1
            first_landed.set()
    except Fenced:
        outcome.put(("fenced", landed))
    except BaseException as err:  # anything else fails the test with its text
        outcome.put((repr(err), landed))
        first_landed.set()


def test_no_write_of_the_old_attempt_lands_after_the_new_claim(tmp_path):
    Fence(str(tmp_path), token(1)).claim()
    ctx = multiprocessing.get_context("fork")
    first_landed, outcome = ctx.Event(), ctx.Queue()
    writer = ctx.Process(target=old_writer, args=(tmp_path, first_landed, outcome))
    writer.start()
    try:
        assert first_landed.wait(60)
        Fence(str(tmp_path), token(2)).claim()
        resumed = (tmp_path / "latest.pt").read_text()  # what the new attempt loads
        result, landed = outcome.get(timeout=60)
    finally:
        writer.join(60)
        if writer.is_alive():
            writer.kill()
    assert result == "fenced"
    assert resumed == f"old-{landed - 1}"  # the old writer's last save is the one loaded
    assert (tmp_path / "latest.pt").read_text() == resumed
    assert temporaries(tmp_path) == []
