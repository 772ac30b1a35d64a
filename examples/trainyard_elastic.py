"""Elastic training for examples/train.py: the same computation at any world size.

The operator sets TRAINYARD_FULL_WORLD_SIZE on the pods of a TrainingJob with spec.elastic:
the job's full number of processes (workers x processes per worker). WORLD_SIZE is this
attempt's, smaller after a shrink (docs/env-contract.md#elastic-trainers).

A step's global batch is FULL shards, shard j being the batch the full-size rank j would
train. Rank r of a world of W trains the contiguous block of shards `shards_of(r, W, FULL)`,
each shard's gradient on its own, and the ranks exchange those per-shard gradients: every rank
then adds them up in shard order 0, 1, ..., FULL-1 and divides by FULL. The same additions in
the same order at every size: the weights after a step are the same bits whether 4 ranks or 2
(or 3) computed it, which DDP's bucketed all-reduce (sums in an order that depends on the world)
cannot give. Nothing here imports torch, so that it can be tested without it.
"""

import os

ENV = "TRAINYARD_FULL_WORLD_SIZE"


class Invalid(ValueError):
    """TRAINYARD_FULL_WORLD_SIZE that this world cannot train."""


def full_world_size(world, environ=None):
    """The job's full world size from the environment, or None (not elastic). Raises Invalid
    when it is not a positive integer or is smaller than this attempt's `world`."""
    raw = (os.environ if environ is None else environ).get(ENV, "")
    if not raw:
        return None
    try:
        full = int(raw)
    except ValueError:
        raise Invalid(f"{ENV}={raw!r} is not an integer") from None
    if full < 1:
        raise Invalid(f"{ENV}={full} must be at least 1")
    if full < world:
        raise Invalid(f"{ENV}={full} is smaller than WORLD_SIZE={world}: a rank would get no shard")
    return full


def shards_of(rank, world, full):
    """The shards rank `rank` of `world` trains: a contiguous block, the first `full % world`
    ranks one shard more. The blocks of ranks 0..world-1, in rank order, are 0..full-1."""
    if not 0 <= rank < world <= full:
        raise ValueError(f"rank {rank} of a world of {world} with {full} shards")
    base, extra = divmod(full, world)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (1 if rank < extra else 0))


def most_shards(world, full):
    """The most shards any rank trains: the rows of the tensor every rank sends."""
    return -(-full // world)


def describe(rank, world, full):
    """The line train.py logs at start on the elastic path."""
    block = shards_of(rank, world, full)
    shards = f"{block.start}" if len(block) == 1 else f"{block.start}-{block.stop - 1}"
    return f"elastic: world size {world} of {full}, shards {shards} per step"
