#!/usr/bin/env python3
"""The example trainer: PyTorch DDP under torchrun, following the trainyard env contract.

Run it as the trainer container's command with no flags:

    command: ["torchrun", "/app/train.py"]

The operator sets PET_NNODES, PET_NODE_RANK, PET_NPROC_PER_NODE, PET_MASTER_ADDR and
PET_MASTER_PORT, which torchrun reads as its flags. What this script relies on
(docs/env-contract.md has the whole contract):

- CHECKPOINT_PATH (<mountPath>/latest.pt): where rank 0 saves, atomically: a temporary file
  in the same directory, fsync, then rename over latest.pt, so a node lost in the middle of
  a save never leaves a torn checkpoint.
- RESUME_FROM: set by the operator on every attempt after the first; the checkpoint to load.
- SIGTERM (a spot notice, a gang restart, a deletion): save at the next step boundary and
  exit 143. terminationGracePeriodSeconds must cover one step plus one save.
- A peer that vanishes (its node was reclaimed) breaks the collective within seconds; rank 0
  then saves the last step that completed on every rank and exits non-zero. The operator
  counts that as a preemption when the peer's node is gone (docs/trainingjob.md).

The training itself is small and deterministic: fixed seeds, the batch of every rank derived
from the global step, one thread, gloo on the CPU. The final weights therefore depend only
on the number of steps and the world size: a run preempted and resumed any number of times
ends with exactly the weights of an uninterrupted run, which rank 0 proves by printing
`final weights sha256 <hex>` and writing it to <checkpoint dir>/final.sha256.

Tuning (env): TOTAL_STEPS (default 200), CHECKPOINT_EVERY (10), STEP_SECONDS (0: extra
sleep per step, to make a short job last long enough to be preempted),
COLLECTIVE_TIMEOUT_SECONDS (120: a collective that sees no peer for this long fails instead
of hanging for torch's default of 30 minutes).
"""

import datetime
import hashlib
import io
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

SEED = 20261122
FEATURES = 32
BATCH = 64


def env_int(name, default, minimum=0):
    raw = os.environ.get(name, str(default))
    try:
        value = int(raw)
    except ValueError:
        sys.exit(f"train.py: {name}={raw!r} is not an integer")
    if value < minimum:
        sys.exit(f"train.py: {name}={value} must be at least {minimum}")
    return value


def env_float(name, default):
    raw = os.environ.get(name, str(default))
    try:
        value = float(raw)
    except ValueError:
        sys.exit(f"train.py: {name}={raw!r} is not a number")
    if value < 0:
        sys.exit(f"train.py: {name}={value} must not be negative")
    return value


TOTAL_STEPS = env_int("TOTAL_STEPS", 200, minimum=1)
CHECKPOINT_EVERY = env_int("CHECKPOINT_EVERY", 10, minimum=1)
STEP_SECONDS = env_float("STEP_SECONDS", 0)
COLLECTIVE_TIMEOUT = env_int("COLLECTIVE_TIMEOUT_SECONDS", 120, minimum=1)
CHECKPOINT_PATH = os.environ.get("CHECKPOINT_PATH", "/mnt/checkpoints/latest.pt")
RESUME_FROM = os.environ.get("RESUME_FROM", "")

stop_requested = False


def on_sigterm(signum, frame):
    # Only set a flag: saving here could interrupt a collective or a save in progress.
    global stop_requested
    stop_requested = True


def log(rank, message):
    print(f"[rank {rank}] {message}", flush=True)


def model_and_optimizer():
    torch.manual_seed(SEED)
    model = nn.Sequential(nn.Linear(FEATURES, 64), nn.Tanh(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return model, optimizer


def batch(step, rank):
    """The batch of `rank` at `step`: a function of the two only, never of the history."""
    g = torch.Generator().manual_seed(SEED + step * 4099 + rank)
    x = torch.randn(BATCH, FEATURES, generator=g)
    target = torch.sin(x.sum(dim=1, keepdim=True)) + 0.1 * torch.randn(BATCH, 1, generator=g)
    return x, target


def save(model, optimizer, step, path):
    """Atomic: a reader sees the previous checkpoint or this one, never half of one."""
    state = {
        "step": step,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "rng": torch.get_rng_state(),
        "world_size": dist.get_world_size() if dist.is_initialized() else 1,
    }
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp.{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load(model, optimizer, path, world_size):
    state = torch.load(path, map_location="cpu")
    if state.get("world_size", world_size) != world_size:
        sys.exit(
            f"train.py: {path} was written by a world of {state['world_size']} ranks, "
            f"this one has {world_size}; the data split would change"
        )
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"])
    return int(state["step"])


def weights_digest(model):
    buf = io.BytesIO()
    for name, tensor in sorted(model.state_dict().items()):
        buf.write(name.encode())
        buf.write(tensor.detach().contiguous().numpy().tobytes())
    return hashlib.sha256(buf.getvalue()).hexdigest()


def main():
    signal.signal(signal.SIGTERM, on_sigterm)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    distributed = "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group(
            "gloo", timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT)
        )
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1

    model, optimizer = model_and_optimizer()
    step = 0
    if RESUME_FROM and os.path.exists(RESUME_FROM):
        step = load(model, optimizer, RESUME_FROM, world)
        log(rank, f"resuming from step {step} ({RESUME_FROM})")
    else:
        if RESUME_FROM:
            log(rank, f"RESUME_FROM={RESUME_FROM} does not exist yet")
        log(rank, "starting from step 0")
    log(
        rank,
        f"world size {world}, node rank {os.environ.get('GROUP_RANK', '0')}, "
        f"master {os.environ.get('MASTER_ADDR', '-')}:{os.environ.get('MASTER_PORT', '-')}, "
        f"attempt {os.environ.get('TRAINYARD_ATTEMPT', '0')}",
    )
    ddp = DistributedDataParallel(model) if distributed else model
    if distributed:
        # DDP regroups its gradient buckets after the first backward pass, and the ring
        # allreduce sums each element in an order that depends on its place in a bucket. One
        # pass that changes nothing (no optimizer step) makes every counted step, in a fresh
        # run or in a resumed one, use the same buckets: bit-exact resumes.
        ddp(batch(0, rank)[0]).sum().backward()
        optimizer.zero_grad(set_to_none=True)
    loss_fn = nn.MSELoss()
    saved = step

    def checkpoint(reason):
        nonlocal saved
        if rank == 0 and step > saved:
            save(model, optimizer, step, CHECKPOINT_PATH)
            saved = step
            log(rank, f"{reason} at step {step}")

    while step < TOTAL_STEPS:
        if stop_requested:
            checkpoint("SIGTERM: checkpoint saved")
            log(rank, f"SIGTERM at step {step}: exiting")
            return 143
        x, target = batch(step, rank)
        try:
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(ddp(x), target)
            loss.backward()  # DDP averages the gradients of all ranks here
        except RuntimeError as err:
            # A peer vanished mid-collective. The parameters still hold the last step that
            # completed on every rank: keep it, then fail so the operator restarts the gang.
            checkpoint("peer lost: checkpoint saved")
            log(rank, f"collective failed at step {step}: {err}")
            return 143 if stop_requested else 1
        optimizer.step()
        step += 1
        if step % CHECKPOINT_EVERY == 0:
            checkpoint("checkpoint saved")
        if step % 10 == 0 or step == TOTAL_STEPS:
            log(rank, f"step {step}/{TOTAL_STEPS} loss {loss.item():.6f}")
        if STEP_SECONDS:
            time.sleep(STEP_SECONDS)

    checkpoint("checkpoint saved")
    if rank == 0:
        digest = weights_digest(model)
        with open(os.path.join(os.path.dirname(CHECKPOINT_PATH) or ".", "final.sha256"), "w") as f:
            f.write(digest + "\n")
        log(rank, f"final weights sha256 {digest}")
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
