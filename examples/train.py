#!/usr/bin/env python3
"""A minimal PyTorch trainer that follows the trainyard environment contract.

- Run it with torchrun: the operator sets PET_NNODES, PET_NODE_RANK, PET_NPROC_PER_NODE,
  PET_MASTER_ADDR and PET_MASTER_PORT, so `torchrun train.py` needs no flags.
- Checkpoints go to CHECKPOINT_PATH (<mountPath>/latest.pt) atomically: rank 0 writes a
  temporary file in the same directory and renames it over latest.pt, so a preemption in the
  middle of a save never leaves a torn checkpoint.
- On SIGTERM (preemption, gang restart, deletion) it saves at the next step boundary and exits
  143; the operator gives it terminationGracePeriodSeconds for that.
- After a restart RESUME_FROM points at the checkpoint to load.
- Without a GPU it trains on the CPU (gloo instead of NCCL), so it runs anywhere.

Example template (trainer container):
    command: ["torchrun", "/app/train.py"]
"""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

STEPS = int(os.environ.get("TOTAL_STEPS", "1000"))
CHECKPOINT_EVERY = int(os.environ.get("CHECKPOINT_EVERY", "100"))
CHECKPOINT_PATH = os.environ.get("CHECKPOINT_PATH", "/mnt/checkpoints/latest.pt")
RESUME_FROM = os.environ.get("RESUME_FROM", "")

stop_requested = False


def on_sigterm(signum, frame):
    # Only set a flag: saving inside the handler could interrupt a collective or a save.
    global stop_requested
    stop_requested = True


def setup():
    """Initialise torch.distributed when launched by torchrun, and pick the device."""
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    if distributed:
        dist.init_process_group(backend=backend)
    rank = dist.get_rank() if distributed else 0
    return device, rank, distributed


def save_checkpoint(model, optimizer, step, rank):
    """Write the checkpoint atomically: temp file in the same directory, fsync, rename."""
    if rank != 0:
        return
    directory = os.path.dirname(CHECKPOINT_PATH) or "."
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".latest.pt.tmp-{os.getpid()}")
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "step": step,
        "attempt": int(os.environ.get("TRAINYARD_ATTEMPT", "0")),
    }
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, CHECKPOINT_PATH)  # atomic on POSIX: readers see the old or the new file
    print(f"checkpoint saved at step {step} -> {CHECKPOINT_PATH}", flush=True)


def load_checkpoint(model, optimizer, device):
    if not RESUME_FROM or not os.path.exists(RESUME_FROM):
        return 0
    state = torch.load(RESUME_FROM, map_location=device)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    print(
        f"resumed from {RESUME_FROM} at step {state['step']} "
        f"(restart reason: {os.environ.get('TRAINYARD_RESTART_REASON', 'none')})",
        flush=True,
    )
    return int(state["step"])


def main():
    signal.signal(signal.SIGTERM, on_sigterm)
    device, rank, distributed = setup()
    torch.manual_seed(0)

    # A toy regression problem: learn y = 3x + 1.
    model = nn.Linear(1, 1).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    start = load_checkpoint(model, optimizer, device)
    if distributed:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    raw_model = model.module if distributed else model

    step = start
    while step < STEPS:
        x = torch.randn(64, 1, device=device)
        y = 3 * x + 1
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1

        # Every rank must agree to stop, or the others would hang in the next all-reduce.
        stop = torch.tensor([1.0 if stop_requested else 0.0], device=device)
        if distributed:
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item() > 0:
            save_checkpoint(raw_model, optimizer, step, rank)
            print(f"SIGTERM: stopping at step {step}", flush=True)
            if distributed:
                dist.destroy_process_group()
            sys.exit(143)

        if step % CHECKPOINT_EVERY == 0:
            save_checkpoint(raw_model, optimizer, step, rank)
            if rank == 0:
                print(f"step {step} loss {loss.item():.4f}", flush=True)
        time.sleep(float(os.environ.get("STEP_SLEEP_SECONDS", "0")))

    save_checkpoint(raw_model, optimizer, step, rank)
    if distributed:
        dist.destroy_process_group()
    print(f"done after {step} steps", flush=True)


if __name__ == "__main__":
    main()
