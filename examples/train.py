#!/usr/bin/env python3
"""The example trainer: PyTorch DDP under torchrun, following the trainyard env contract.

Run it as the trainer container's command with no flags:

    command: ["python3", "/app/trainyard_launch.py", "torchrun", "/app/train.py"]

(trainyard_launch.py, beside this file, ends torchrun on SIGTERM even at its exit barrier.)

The operator sets PET_NNODES, PET_NODE_RANK, PET_NPROC_PER_NODE, PET_MASTER_ADDR and
PET_MASTER_PORT, which torchrun reads as its flags. What this script relies on
(docs/env-contract.md has the whole contract):

- CHECKPOINT_PATH (<mountPath>/latest.pt): where rank 0 saves, atomically: a temporary file
  in the same directory, fsync, then rename over latest.pt, so a node lost in the middle of
  a save never leaves a torn checkpoint.
- RESUME_FROM: set by the operator on every attempt after the first; the checkpoint to load.
  Rank 0 gives every checkpoint a second, step-addressed name that nothing ever replaces
  (ckpt-c<created>-a<attempt>-s<step>.pt, a hard link to the same bytes) and reports it as
  checkpointFile; the operator then names that file in RESUME_FROM, so a writer of an older
  attempt that replaces latest.pt cannot move the resume point back. Rank 0 resumes from the
  newest step-addressed file in the directory (one saved but not reported before its node was
  lost is newer than RESUME_FROM) and every rank loads the file it chose. It keeps the newest
  KEEP_CHECKPOINTS (3) and the one it resumed from. With no such file: RESUME_FROM, or
  latest.pt when RESUME_FROM was pruned.
- TRAINYARD_FENCE_TOKEN: set by the operator on every attempt. Every rank claims the
  checkpoint directory's fence before it loads RESUME_FROM, and rank 0 renames a new
  checkpoint only while the fence holds its token (trainyard_fence.py, beside this file), so
  an older attempt still running on a partitioned node never replaces what a newer one
  loads or writes. A stale or fenced attempt logs why and exits 75 without touching the
  checkpoint. Unset: no fence, a plain rename.
- SIGTERM (a spot notice, a gang restart, a deletion): save at the next step boundary and
  exit 143. terminationGracePeriodSeconds must cover one step plus one save. A rank blocked
  in a collective (a peer's node vanished) hears it on a thread of its own: with no step
  boundary reached within SIGTERM_STUCK_SECONDS (2) of the last one, it saves the last step
  completed on every rank and exits 143, at once when it was blocked that long before the
  signal (trainyard_sigterm.py).
- A peer that vanishes (its node was reclaimed) breaks the collective within seconds; rank 0
  then saves the last step that completed on every rank and exits non-zero. The operator
  counts that as a preemption when the peer's node is gone (docs/trainingjob.md).
- TRAINYARD_PROGRESS_URL and TRAINYARD_PROGRESS_TOKEN_FILE: set when the operator serves the
  progress channel. Each worker then POSTs its completed step (and loss, latest checkpoint,
  step resumed from) every PROGRESS_EVERY_SECONDS from a background thread, and a reply
  {"checkpoint": true} makes the ranks agree (an all_reduce at the next step boundary) to
  save right away. Unset: no reports, no extra collective. A report never waits on training
  and training never waits on a report (docs/env-contract.md#progress-reports).

- TRAINYARD_FULL_WORLD_SIZE: set by the operator on a TrainingJob with spec.elastic, the
  job's full world size; WORLD_SIZE may be smaller after a shrink. Then every step trains
  the full global batch at any size, in a fixed order (trainyard_elastic.py): each rank
  computes the gradients of its block of the full-size ranks' batches one by one, the ranks
  exchange them (all_gather) and every rank sums them in the same order. No DDP then. A
  checkpoint written at one size resumes at another, and the weights are the same bits.

The training itself is small and deterministic: fixed seeds, the batch of every rank derived
from the global step, one thread, gloo on the CPU. The final weights therefore depend only
on the number of steps and the world size: a run preempted and resumed any number of times
ends with exactly the weights of an uninterrupted run, which rank 0 proves by printing
`final weights sha256 <hex>` and writing it to <checkpoint dir>/final.sha256.

Tuning (env): TOTAL_STEPS (default 200), CHECKPOINT_EVERY (10), STEP_SECONDS (0: extra
sleep per step, to make a short job last long enough to be preempted),
COLLECTIVE_TIMEOUT_SECONDS (120: a collective that sees no peer for this long fails instead
of hanging for torch's default of 30 minutes), PROGRESS_EVERY_SECONDS (5, at least 1: the
progress report interval).

Hang test hook (env, for the operator's hang detection): HANG_AT_STEP (unset: never),
HANG_RANK (1: a global rank) and HANG_SECONDS (3600). In attempt 0 only, rank HANG_RANK
sleeps HANG_SECONDS at the start of step HANG_AT_STEP, before the step's collectives: its
peers block in the collective and no rank's reported step advances, while the reports keep
coming. On SIGTERM it and its blocked peers exit from their SIGTERM threads.
The peers' collective fails after COLLECTIVE_TIMEOUT_SECONDS (a Failure, not a Hang): set
restartPolicy.progressTimeoutSeconds well below it. The next attempt runs normally.
"""

import contextlib
import datetime
import hashlib
import io
import json
import math
import os
import re
import shutil
import sys
import threading
import time
import urllib.request

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import trainyard_elastic
import trainyard_fence
import trainyard_sigterm

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


def env_float(name, default, minimum=0):
    raw = os.environ.get(name, str(default))
    try:
        value = float(raw)
    except ValueError:
        sys.exit(f"train.py: {name}={raw!r} is not a number")
    if not math.isfinite(value) or value < minimum:
        sys.exit(f"train.py: {name}={value} must be a number of at least {minimum}")
    return value


TOTAL_STEPS = env_int("TOTAL_STEPS", 200, minimum=1)
CHECKPOINT_EVERY = env_int("CHECKPOINT_EVERY", 10, minimum=1)
KEEP_CHECKPOINTS = env_int("KEEP_CHECKPOINTS", 3, minimum=1)
STEP_SECONDS = env_float("STEP_SECONDS", 0)
COLLECTIVE_TIMEOUT = env_int("COLLECTIVE_TIMEOUT_SECONDS", 120, minimum=1)
CHECKPOINT_PATH = os.environ.get("CHECKPOINT_PATH", "/mnt/checkpoints/latest.pt")
CHECKPOINT_DIR = os.environ.get("CHECKPOINT_DIR") or os.path.dirname(CHECKPOINT_PATH) or "."
RESUME_FROM = os.environ.get("RESUME_FROM", "")
PROGRESS_URL = os.environ.get("TRAINYARD_PROGRESS_URL", "")
PROGRESS_TOKEN_FILE = os.environ.get("TRAINYARD_PROGRESS_TOKEN_FILE", "")
PROGRESS_EVERY = env_float("PROGRESS_EVERY_SECONDS", 5, minimum=1)
ATTEMPT = os.environ.get("TRAINYARD_ATTEMPT", "0")
HANG_AT_STEP = env_int("HANG_AT_STEP", -1, minimum=0) if os.environ.get("HANG_AT_STEP") else None
HANG_RANK = env_int("HANG_RANK", 1)
HANG_SECONDS = env_float("HANG_SECONDS", 3600)

STUCK_SECONDS = env_float("SIGTERM_STUCK_SECONDS", 2)


def log(rank, message):
    print(f"[rank {rank}] {message}", flush=True)


class ProgressReporter:
    """The trainer's side of the progress channel (docs/env-contract.md#progress-reports).

    The training loop hands over what it has completed; a daemon thread POSTs it every
    PROGRESS_EVERY seconds, and at once when woken (the first report, a checkpoint). The
    thread only ever sends what the loop handed over, so a rank stuck in a collective keeps
    reporting the same step: the operator sees reports without progress, a hang. Any error is
    logged at most once a minute and otherwise ignored.
    """

    TIMEOUT = 2  # seconds; the protocol's bound on one report
    QUIET = 60  # seconds between two logged errors

    def __init__(self, url, token_file, rank, log_rank):
        self.url = url
        self.token_file = token_file
        self.log_rank = log_rank
        self.identity = {
            "job": os.environ.get("TRAINYARD_JOB", ""),
            "rank": rank,
            "attempt": int(ATTEMPT),
        }
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.stopping = False
        self.progress = {"step": 0}
        self.checkpoint_requested = False
        self.errors = 0
        self.last_error_log = None
        self.accepted_once = False
        # In-cluster traffic: an HTTP(S)_PROXY meant for the outside world must not take it.
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self.thread = threading.Thread(target=self.run, name="progress", daemon=True)

    def start(self, step, resumed_from, name=None):
        """The first report, right away: `step` and, on a resume, the step loaded (from the
        step-addressed checkpoint `name`, when it was one)."""
        with self.lock:
            self.progress = {"step": step}
            if resumed_from is not None:
                # Every rank loaded it: a checkpoint every rank knows is durable.
                self.progress["resumedFrom"] = resumed_from
                self.progress["checkpointStep"] = resumed_from
                if name:
                    self.progress["checkpointFile"] = name
        self.thread.start()
        self.wake.set()

    def completed(self, step, loss):
        """Called by the training loop once `step` steps are done on this rank."""
        with self.lock:
            self.progress["step"] = step
            if math.isfinite(loss):
                self.progress["loss"] = loss
            else:
                self.progress.pop("loss", None)

    def checkpointed(self, step, name=None):
        """A checkpoint of `step` is durably saved (as `name` too, step-addressed, in the
        checkpoint directory): report it at once."""
        with self.lock:
            if name:
                self.progress["checkpointFile"] = name
            elif self.progress.get("checkpointStep") != step:
                self.progress.pop("checkpointFile", None)
            self.progress["checkpointStep"] = step
        self.wake.set()

    def take_checkpoint_request(self):
        with self.lock:
            requested, self.checkpoint_requested = self.checkpoint_requested, False
        return requested

    def close(self):
        """One last report of the final figures, bounded by the report timeout."""
        self.stopping = True
        self.wake.set()
        if self.thread.is_alive():
            self.thread.join(self.TIMEOUT + 1)

    def run(self):
        while True:
            self.wake.wait(PROGRESS_EVERY)
            self.wake.clear()
            last = self.stopping  # read before the report, so that it sends the final figures
            self.report()
            if last:
                return

    def report(self):
        with self.lock:
            body = dict(self.identity, **self.progress)
        try:
            with open(self.token_file) as f:  # re-read each time: the kubelet rotates it
                token = f.read().strip()
            request = urllib.request.Request(
                self.url,
                data=json.dumps(body, allow_nan=False).encode(),
                headers={
                    "Authorization": f"Bearer {token}",
                    "Content-Type": "application/json",
                },
                method="POST",
            )
            with self.opener.open(request, timeout=self.TIMEOUT) as response:
                reply = json.loads(response.read(4096) or b"{}")
        except Exception as err:  # refused, timed out, 4xx, 5xx, a bad reply: never fatal
            self.failed(err)
            return
        if not self.accepted_once:
            self.accepted_once = True
            log(self.log_rank, f"progress reports accepted by {self.url}")
        if isinstance(reply, dict) and reply.get("checkpoint") is True:
            with self.lock:
                self.checkpoint_requested = True

    def failed(self, err):
        self.errors += 1
        now = time.monotonic()
        if self.last_error_log is None or now - self.last_error_log >= self.QUIET:
            more = f" ({self.errors} failures since the last such line)" if self.errors > 1 else ""
            log(self.log_rank, f"progress report failed: {err}{more}")
            self.last_error_log = now
            self.errors = 0


class NoProgressReporter:
    """Reports nothing and never asks for a checkpoint: TRAINYARD_PROGRESS_URL is unset, or
    another process of this worker pod reports for it."""

    def start(self, step, resumed_from, name=None):
        pass

    def completed(self, step, loss):
        pass

    def checkpointed(self, step, name=None):
        pass

    def take_checkpoint_request(self):
        return False

    def close(self):
        pass


def checkpoint_requested_by_any_rank(progress, distributed):
    """Whether any rank's reply asked for a checkpoint. Every rank calls it at every step
    boundary, so they all run the same collective: none can wait on a peer that skipped it."""
    requested = progress.take_checkpoint_request()
    if not distributed:
        return requested
    flag = torch.tensor([1 if requested else 0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def hang_if_asked(rank, step):
    """The hang test hook (module docstring): a sleep where a collective would hang."""
    if HANG_AT_STEP == step and HANG_RANK == rank and ATTEMPT == "0":
        log(rank, f"HANG_AT_STEP: hanging for {HANG_SECONDS:g} s at step {step}")
        time.sleep(HANG_SECONDS)


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


STEP_FILE = re.compile(r"ckpt-c([0-9]{10})-a([0-9]{6})-s([0-9]{9,})\.pt")


def step_file(fence, step):
    """The step-addressed name of this attempt's checkpoint of `step`: ordered by the fence
    token's (created, attempt), then the step, so that names sort oldest first."""
    created, attempt = getattr(fence, "order", (0, int(ATTEMPT)))
    return f"ckpt-c{created:010d}-a{attempt:06d}-s{step:09d}.pt"


def prune(directory, keep):
    """Removes step-addressed checkpoints but the newest KEEP_CHECKPOINTS and those in
    `keep` (the one this attempt resumed from: the operator may still name it)."""
    names = sorted(n for n in os.listdir(directory) if STEP_FILE.fullmatch(n))
    for name in names[:-KEEP_CHECKPOINTS]:
        if name not in keep:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, name))


def save(model, optimizer, step, path, fence, full=None):
    """Atomic: a reader sees the previous checkpoint or this one, never half of one. Fenced:
    raises trainyard_fence.Fenced, and publishes nothing, once a newer attempt has claimed.
    Returns the checkpoint's step-addressed name (a second name of the same file, created
    here and never replaced)."""
    state = {
        "step": step,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "rng": torch.get_rng_state(),
        "world_size": dist.get_world_size() if dist.is_initialized() else 1,
    }
    if full is not None:
        state["full_world_size"] = full
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    # A name no other writer has ("x": created here): processes of two pods (two attempts)
    # can share a pid.
    unique = f"{os.getpid()}.{os.urandom(4).hex()}"
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp.{unique}")
    with open(tmp, "xb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    name = step_file(fence, step)
    addressed = os.path.join(directory, name)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(addressed)  # one this attempt saved before a crash, at the same step
    try:
        os.link(tmp, addressed)
    except OSError:
        # A file system without hard links: a copy, published by its own rename.
        copy = f"{tmp}.copy"
        shutil.copyfile(tmp, copy)
        os.replace(copy, addressed)
    try:
        fence.replace(tmp, path)
    except trainyard_fence.Fenced:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(addressed)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    prune(directory, keep={os.path.basename(RESUME_FROM)})
    return name


def load(model, optimizer, path, world_size, full=None):
    """The step of the checkpoint at `path`, loaded. The data split must be the same: the
    world size, or with TRAINYARD_FULL_WORLD_SIZE (`full`) the full world size, whatever
    the world that wrote it."""
    state = torch.load(path, map_location="cpu")
    if full is None:
        written, this, what = state.get("world_size", world_size), world_size, "a world of"
    else:
        written = state.get("full_world_size", state.get("world_size", full))
        this, what = full, "a full world of"
    if written != this:
        sys.exit(
            f"train.py: {path} was written by {what} {written} ranks, "
            f"this one has {this}; the data split would change"
        )
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"])
    return int(state["step"])


def fence_from_env():
    try:
        return trainyard_fence.from_env(CHECKPOINT_DIR)
    except ValueError as err:
        sys.exit(f"train.py: {err}")


def claim(rank, fence):
    """Claims the checkpoint directory for this attempt, before anything reads it (every
    rank). Raises trainyard_fence.Stale when a newer attempt claimed it first."""
    previous = fence.claim()
    if fence.token:
        was = f" (was {previous})" if previous and previous != fence.token else ""
        log(rank, f"fence token {fence.token} claimed{was}")


def newest_step_file(directory):
    """The step-addressed checkpoint of the highest step in `directory` (ties: the newest
    attempt's), or None."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return None
    found = [(int(m.group(3)), n) for n in names if (m := STEP_FILE.fullmatch(n))]
    return os.path.join(directory, max(found)[1]) if found else None


def resume_path():
    """What to load, or None in a fresh start: the newest step-addressed checkpoint in the
    directory (one saved and not reported before its node was lost is newer than RESUME_FROM,
    and a writer of an older attempt can only add older ones), else RESUME_FROM itself, else
    latest.pt when RESUME_FROM was pruned."""
    if not RESUME_FROM:
        return None
    newest = newest_step_file(CHECKPOINT_DIR)
    if newest:
        return newest
    if not os.path.exists(RESUME_FROM) and os.path.exists(CHECKPOINT_PATH):
        return CHECKPOINT_PATH
    return RESUME_FROM


def resume(rank, world, model, optimizer, distributed, full=None):
    """The step to start from, the step loaded (None in a fresh start) and its step-addressed
    name (None when it has none). Rank 0 chooses the file and every rank loads that one: a
    rank that looked at the directory itself could see a checkpoint another rank's attempt
    saved meanwhile."""
    choice = [resume_path() if rank == 0 else None]
    if distributed:
        dist.broadcast_object_list(choice, src=0)
    path = choice[0]
    if path and os.path.exists(path):
        step = load(model, optimizer, path, world, full)
        via = "" if path == RESUME_FROM else f", RESUME_FROM={RESUME_FROM}"
        log(rank, f"resuming from step {step} ({path}{via})")
        name = os.path.basename(path)
        return step, step, name if STEP_FILE.fullmatch(name) else None
    if path:
        log(rank, f"RESUME_FROM={path} does not exist yet")
    log(rank, "starting from step 0")
    return 0, None, None


def progress_reporter(rank):
    if PROGRESS_URL and os.environ.get("LOCAL_RANK", "0") == "0":
        # One report stream per worker pod: the rank in a report is the pod's node rank.
        node_rank = int(os.environ.get("NODE_RANK", os.environ.get("GROUP_RANK", "0")))
        return ProgressReporter(PROGRESS_URL, PROGRESS_TOKEN_FILE, node_rank, rank)
    return NoProgressReporter()


def ddp_with_warm_up(model, optimizer, rank):
    ddp = DistributedDataParallel(model)
    # DDP regroups its gradient buckets after the first backward pass, and the ring
    # allreduce sums each element in an order that depends on its place in a bucket. One
    # pass that changes nothing (no optimizer step) makes every counted step, in a fresh
    # run or in a resumed one, use the same buckets: bit-exact resumes.
    ddp(batch(0, rank)[0]).sum().backward()
    optimizer.zero_grad(set_to_none=True)
    return ddp


class FixedOrderStep:
    """The elastic path's gradients (trainyard_elastic.py): rank `rank` of `world` computes
    the gradient of each of its shards of the `full` shards one by one; `backward` gathers
    every shard's gradient on every rank and leaves in each parameter's .grad their sum in
    shard order, divided by `full`."""

    def __init__(self, model, rank, world, full, distributed):
        self.model = model
        self.params = list(model.parameters())
        self.world, self.full, self.distributed = world, full, distributed
        self.shards = trainyard_elastic.shards_of(rank, world, full)
        self.rows = trainyard_elastic.most_shards(world, full)
        self.size = sum(p.numel() for p in self.params)

    def backward(self, step, loss_fn):
        """Sets the step's gradients; returns the mean loss of this rank's shards."""
        mine = torch.zeros(self.rows, self.size)
        losses = []
        for row, shard in enumerate(self.shards):
            for p in self.params:
                p.grad = None
            x, target = batch(step, shard)
            loss = loss_fn(self.model(x), target)
            loss.backward()
            mine[row] = torch.cat([p.grad.reshape(-1) for p in self.params])
            losses.append(loss.item())
        if self.distributed:
            every = [torch.zeros_like(mine) for _ in range(self.world)]
            dist.all_gather(every, mine)
        else:
            every = [mine]
        total = torch.zeros(self.size)
        for rank, rows in enumerate(every):
            for row in range(len(trainyard_elastic.shards_of(rank, self.world, self.full))):
                total += rows[row]
        total /= self.full
        offset = 0
        for p in self.params:
            n = p.numel()
            p.grad = total[offset : offset + n].reshape(p.shape).clone()
            offset += n
        return sum(losses) / len(losses)


def weights_digest(model):
    buf = io.BytesIO()
    for name, tensor in sorted(model.state_dict().items()):
        buf.write(name.encode())
        buf.write(tensor.detach().contiguous().numpy().tobytes())
    return hashlib.sha256(buf.getvalue()).hexdigest()


def main():
    sigterm = trainyard_sigterm.Sigterm(STUCK_SECONDS)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    distributed = "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group(
            "gloo", timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT)
        )
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    try:
        full = trainyard_elastic.full_world_size(world)
    except trainyard_elastic.Invalid as err:
        sys.exit(f"train.py: {err}")

    model, optimizer = model_and_optimizer()
    fence = fence_from_env()
    try:
        claim(rank, fence)
    except trainyard_fence.Stale as err:
        log(rank, f"stale: {err}: exiting without touching the checkpoint")
        return trainyard_fence.EXIT_CODE
    step, resumed_from, resumed_file = resume(rank, world, model, optimizer, distributed, full)
    log(
        rank,
        f"world size {world}, node rank {os.environ.get('GROUP_RANK', '0')}, "
        f"master {os.environ.get('MASTER_ADDR', '-')}:{os.environ.get('MASTER_PORT', '-')}, "
        f"attempt {ATTEMPT}",
    )
    progress = progress_reporter(rank)
    if full is not None:
        log(rank, trainyard_elastic.describe(rank, world, full))
        elastic = FixedOrderStep(model, rank, world, full, distributed)
        ddp = model
    else:
        elastic = None
        ddp = ddp_with_warm_up(model, optimizer, rank) if distributed else model
    loss_fn = nn.MSELoss()
    saved = step
    first_step = step + 1

    def checkpoint(reason):
        nonlocal saved
        with sigterm.state:
            if rank == 0 and step > saved:
                name = save(model, optimizer, step, CHECKPOINT_PATH, fence, full)
                saved = step
                log(rank, f"{reason} at step {step}")
                progress.checkpointed(step, name)

    def stuck():
        # On the SIGTERM thread, the main thread blocked: the parameters hold `step`.
        try:
            checkpoint("SIGTERM while blocked: checkpoint saved")
        except trainyard_fence.Fenced as err:
            log(rank, f"fenced: {err}: not saving step {step}")
            return trainyard_fence.EXIT_CODE
        log(rank, f"SIGTERM at step {step}, blocked for over {STUCK_SECONDS:g} s: exiting")
        return 143

    def peer_lost(err):
        # A peer vanished mid-collective. The parameters still hold the last step that
        # completed on every rank: keep it, then fail so the operator restarts the gang.
        try:
            checkpoint("peer lost: checkpoint saved")
        finally:  # fenced too: the cause is logged before the fence's line
            log(rank, f"collective failed at step {step}: {err}")
        return 143 if sigterm.requested.is_set() else 1

    progress.start(step, resumed_from, resumed_file)
    sigterm.watch(stuck)
    try:
        while step < TOTAL_STEPS:
            if sigterm.boundary():
                checkpoint("SIGTERM: checkpoint saved")
                log(rank, f"SIGTERM at step {step}: exiting")
                return 143
            hang_if_asked(rank, step)
            if PROGRESS_URL:  # set on every worker or on none, so every rank agrees or none
                try:
                    requested = checkpoint_requested_by_any_rank(progress, distributed)
                except RuntimeError as err:
                    return peer_lost(err)
                if requested:
                    # Like a periodic save: the weights do not depend on when they are saved.
                    log(rank, f"checkpoint requested at step {step}")
                    checkpoint("checkpoint saved")
                    if rank == 0 and saved > 0:
                        progress.checkpointed(saved)  # reported even if it already existed
            try:
                optimizer.zero_grad(set_to_none=True)
                if elastic is not None:
                    loss = elastic.backward(step, loss_fn)
                else:
                    x, target = batch(step, rank)
                    loss = loss_fn(ddp(x), target)
                    loss.backward()  # DDP averages the gradients of all ranks here
                    loss = loss.item()
            except RuntimeError as err:
                return peer_lost(err)
            with sigterm.state:
                optimizer.step()
                step += 1
            progress.completed(step, loss)
            if step == first_step:  # when training runs again after a restart
                log(rank, f"first step of attempt {ATTEMPT}: step {step}")
            if step % CHECKPOINT_EVERY == 0:
                checkpoint("checkpoint saved")
            if step % 10 == 0 or step == TOTAL_STEPS:
                log(rank, f"step {step}/{TOTAL_STEPS} loss {loss:.6f}")
            if STEP_SECONDS:
                time.sleep(STEP_SECONDS)

        checkpoint("checkpoint saved")
    except trainyard_fence.Fenced as err:
        # A newer attempt resumes from the checkpoint, or writes it: leave it to that one.
        log(rank, f"fenced: {err}: not saving step {step}")
        return trainyard_fence.EXIT_CODE
    finally:
        progress.close()
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
