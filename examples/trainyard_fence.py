"""Fencing for a shared checkpoint: a trainer of an older attempt never replaces the
checkpoint a newer attempt resumes from or writes (docs/env-contract.md#fencing-a-partitioned-writer).

A node cut off from the cluster keeps its trainers running, and the operator starts the next
attempt without waiting for them. The operator gives every trainer container
TRAINYARD_FENCE_TOKEN = "<created>:<attempt>:<uid>": the TrainingJob's creationTimestamp in
unix seconds, the 0-based attempt and the job's uid. Tokens are ordered by (created,
attempt): a job deleted and applied again over its retained claim starts at attempt 0 again,
but later. Two tokens are equal when their strings are.

The fence file <checkpoint dir>/.trainyard-fence holds one token. It is read and written only
under an exclusive flock on the file itself, and rewritten in place (never renamed over, so
every process locks the same inode):

- claim(): every rank, before it reads RESUME_FROM. A token in the file newer than ours
  raises Stale; otherwise ours is written. Once a newer attempt has claimed, no older one
  renames, so every rank of the newer attempt loads the same checkpoint.
- replace(tmp, path): the rename that publishes a checkpoint, done under the lock and only
  while the file holds our token; otherwise tmp is removed and Fenced is raised.

Without TRAINYARD_FENCE_TOKEN (an operator that does not set it) from_env() returns a fence
that claims nothing and renames plainly. Standard library only: copy this file beside your
trainer.
"""

import contextlib
import fcntl
import os
import re

ENV_VAR = "TRAINYARD_FENCE_TOKEN"
FENCE_FILE = ".trainyard-fence"
# EX_TEMPFAIL: this process is superseded by a newer attempt; nothing is wrong with the job.
EXIT_CODE = 75

_TOKEN = re.compile(r"([0-9]+):([0-9]+):(.+)")
_MAX_READ = 4096


class Stale(Exception):
    """A newer attempt claimed the checkpoint before this one started: do not load or save."""


class Fenced(Exception):
    """The fence file no longer holds this attempt's token: do not publish a checkpoint."""


def parse(token):
    """(created, attempt, uid) of a token, or None when it is not one."""
    match = _TOKEN.fullmatch(token)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2)), match.group(3)


def claimant(found, uid):
    """Who holds the fence file, in words, for a log line."""
    parsed = parse(found)
    if parsed is None:
        return f"the fence file holds {found!r}, not this attempt's token"
    _, attempt, other = parsed
    job = "this job" if other == uid else f"job {other}"
    return f"attempt {attempt} of {job} started (fence token {found})"


class Fence:
    """The fence of one attempt over the checkpoints in `directory`."""

    def __init__(self, directory, token):
        parsed = parse(token)
        if parsed is None:
            raise ValueError(f"{ENV_VAR}={token!r} is not <created>:<attempt>:<uid>")
        self.directory = directory
        self.path = os.path.join(directory, FENCE_FILE)
        self.token = token
        self.order = parsed[:2]
        self.uid = parsed[2]

    def claim(self):
        """Makes this attempt the fence's holder; returns the token found before (or None).

        Raises Stale when the file holds a newer token: the caller must exit without
        touching the checkpoint. Among tokens of the same order the last claimer wins."""
        with self._locked() as fd:
            found = _read(fd)
            parsed = parse(found)
            if parsed is not None and parsed[:2] > self.order:
                raise Stale(claimant(found, self.uid))
            if found != self.token:
                _write(fd, self.token)
                _fsync_dir(self.directory)
        return found or None

    def replace(self, tmp, path):
        """os.replace(tmp, path) while the fence file holds this attempt's token.

        Otherwise removes tmp and raises Fenced. The caller fsyncs the directory after."""
        with self._locked() as fd:
            found = _read(fd)
            if found != self.token:
                _remove(tmp)
                raise Fenced(claimant(found, self.uid))
            os.replace(tmp, path)

    @contextlib.contextmanager
    def _locked(self):
        os.makedirs(self.directory, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield fd
        finally:
            os.close(fd)  # releases the lock


class NoFence:
    """No token in the environment: claims nothing, renames plainly."""

    token = None

    def claim(self):
        return None

    def replace(self, tmp, path):
        os.replace(tmp, path)


def from_env(directory, environ=os.environ):
    """The fence of this attempt over `directory`: a Fence when TRAINYARD_FENCE_TOKEN is set
    (ValueError when it is malformed), else a NoFence."""
    token = environ.get(ENV_VAR, "")
    return Fence(directory, token) if token else NoFence()


def _read(fd):
    os.lseek(fd, 0, os.SEEK_SET)
    return os.read(fd, _MAX_READ).decode("utf-8", errors="replace").strip()


def _write(fd, token):
    data = (token + "\n").encode()
    os.lseek(fd, 0, os.SEEK_SET)
    os.ftruncate(fd, 0)
    while data:
        data = data[os.write(fd, data):]
    os.fsync(fd)


def _fsync_dir(directory):
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(path):
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
