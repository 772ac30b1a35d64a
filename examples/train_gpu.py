#!/usr/bin/env python3
"""The example GPU trainer: PyTorch DDP over NCCL, one process per GPU under torchrun.

Run it as the trainer container's command, as examples/trainingjob-gpu.yaml does:

    command: ["python3", "/app/trainyard_launch.py", "torchrun", "/app/train_gpu.py"]

The operator sets PET_NPROC_PER_NODE to gpusPerWorker, so torchrun starts one process per
GPU the pod was given; each process drives the GPU of its LOCAL_RANK (cuda:LOCAL_RANK: the
container sees only its own GPUs, numbered from 0). The checkpoint and progress contract is
examples/train.py's, by import: atomic, fenced, step-addressed saves to CHECKPOINT_PATH,
RESUME_FROM on every later attempt, a save on SIGTERM, progress reports when
TRAINYARD_PROGRESS_URL is set (docs/env-contract.md). Only the device, the backend and the
model differ.

Settings (env), besides train.py's (TOTAL_STEPS, CHECKPOINT_EVERY, KEEP_CHECKPOINTS,
STEP_SECONDS, PROGRESS_EVERY_SECONDS):
- NCCL_TIMEOUT_SECONDS (600): how long a collective waits for a peer before it fails. 600 is
  PyTorch's own default for NCCL since 2.2; with the async error handling PyTorch 2.x turns
  on by default, a rank whose peer's node vanished fails after it instead of hanging. Keep
  restartPolicy.progressTimeoutSeconds below it, so that a hang is told as a Hang.
- TORCH_BACKEND: nccl where CUDA is available, else gloo on the CPU (for a dry run).
- MODEL_WIDTH (1024), BATCH_SIZE (256 per process): the synthetic MLP's size.

torch is imported in main() only, so that the settings parse (and are tested) without it.
"""

import datetime
import os
import sys
import time
from dataclasses import dataclass

# PyTorch's default for NCCL collectives since 2.2 (it was 30 minutes before).
NCCL_DEFAULT_TIMEOUT_SECONDS = 600


class Invalid(ValueError):
    """A setting the trainer cannot run with; the message says which and why."""


def _int(environ, name, default, minimum):
    raw = environ.get(name, "")
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise Invalid(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise Invalid(f"{name}={value} must be at least {minimum}")
    return value


@dataclass(frozen=True)
class Settings:
    backend: str
    device: str
    local_rank: int
    timeout_seconds: int
    width: int
    batch: int

    @classmethod
    def from_env(cls, environ, cuda_available, device_count):
        """What this process runs with, from the environment torchrun and the operator set."""
        local_rank = _int(environ, "LOCAL_RANK", 0, 0)
        backend = environ.get("TORCH_BACKEND") or ("nccl" if cuda_available else "gloo")
        if backend not in ("nccl", "gloo"):
            raise Invalid(f"TORCH_BACKEND={backend!r}: nccl or gloo")
        if backend == "nccl":
            if not cuda_available:
                raise Invalid("TORCH_BACKEND=nccl, but CUDA is not available: no GPU was given to this container")
            if local_rank >= device_count:
                raise Invalid(
                    f"LOCAL_RANK={local_rank}, but the container sees {device_count} GPU(s): "
                    "torchrun's --nproc-per-node (PET_NPROC_PER_NODE) must not exceed gpusPerWorker"
                )
            device = f"cuda:{local_rank}"
        else:
            device = "cpu"
        return cls(
            backend=backend,
            device=device,
            local_rank=local_rank,
            timeout_seconds=_int(environ, "NCCL_TIMEOUT_SECONDS", NCCL_DEFAULT_TIMEOUT_SECONDS, 1),
            width=_int(environ, "MODEL_WIDTH", 1024, 1),
            batch=_int(environ, "BATCH_SIZE", 256, 1),
        )

    def describe(self):
        return f"backend {self.backend} on {self.device}, collective timeout {self.timeout_seconds} s"


def main():
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    import train  # examples/train.py: the checkpoint, fence, SIGTERM and progress contract
    import trainyard_fence
    import trainyard_sigterm

    try:
        s = Settings.from_env(os.environ, torch.cuda.is_available(), torch.cuda.device_count())
    except Invalid as err:
        sys.exit(f"train_gpu.py: {err}")
    if s.device.startswith("cuda"):
        torch.cuda.set_device(s.local_rank)
    distributed = "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group(s.backend, timeout=datetime.timedelta(seconds=s.timeout_seconds))
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1

    torch.manual_seed(train.SEED)
    model = nn.Sequential(nn.Linear(s.width, s.width), nn.GELU(), nn.Linear(s.width, 1)).to(s.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fence = train.fence_from_env()
    try:
        train.claim(rank, fence)
    except trainyard_fence.Stale as err:
        train.log(rank, f"stale: {err}: exiting without touching the checkpoint")
        return trainyard_fence.EXIT_CODE
    step, resumed_from, resumed_file = train.resume(rank, world, model, optimizer, distributed)
    train.log(rank, f"world size {world}, {s.describe()}, attempt {train.ATTEMPT}")
    ddp = DistributedDataParallel(model, device_ids=[s.local_rank] if s.backend == "nccl" else None) if distributed else model
    progress = train.progress_reporter(rank)
    sigterm = trainyard_sigterm.Sigterm(train.STUCK_SECONDS)
    saved = step

    def checkpoint(reason):
        nonlocal saved
        with sigterm.state:
            if rank == 0 and step > saved:
                name = train.save(model, optimizer, step, train.CHECKPOINT_PATH, fence)
                saved = step
                train.log(rank, f"{reason} at step {step}")
                progress.checkpointed(step, name)

    def stuck():
        checkpoint("SIGTERM while blocked: checkpoint saved")
        return 143

    progress.start(step, resumed_from, resumed_file)
    sigterm.watch(stuck)
    try:
        while step < train.TOTAL_STEPS:
            if sigterm.boundary():
                checkpoint("SIGTERM: checkpoint saved")
                return 143
            if train.PROGRESS_URL and train.checkpoint_requested_by_any_rank(progress, distributed):
                checkpoint("checkpoint requested: saved")
            # A synthetic batch, a function of the step and the rank only.
            g = torch.Generator().manual_seed(train.SEED + step * 4099 + rank)
            x = torch.randn(s.batch, s.width, generator=g).to(s.device, non_blocking=True)
            target = x.mean(dim=1, keepdim=True).sin()
            optimizer.zero_grad(set_to_none=True)
            try:
                loss = nn.functional.mse_loss(ddp(x), target)
                loss.backward()
            except RuntimeError as err:  # a peer lost: NCCL's timeout or abort
                checkpoint("peer lost: checkpoint saved")
                train.log(rank, f"collective failed at step {step}: {err}")
                return 1
            with sigterm.state:
                optimizer.step()
                step += 1
            progress.completed(step, loss.item())
            if step % train.CHECKPOINT_EVERY == 0:
                checkpoint("checkpoint saved")
            if step % 10 == 0 or step == train.TOTAL_STEPS:
                train.log(rank, f"step {step}/{train.TOTAL_STEPS} loss {loss.item():.6f}")
            if train.STEP_SECONDS:
                time.sleep(train.STEP_SECONDS)
        checkpoint("checkpoint saved")
    except trainyard_fence.Fenced as err:
        train.log(rank, f"fenced: {err}: not saving step {step}")
        return trainyard_fence.EXIT_CODE
    finally:
        progress.close()
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
