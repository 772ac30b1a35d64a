"""A container's first process for torchrun: SIGTERM ends it even at torchrun's exit barrier.

    command: ["python3", "/app/trainyard_launch.py", "torchrun", "/app/train.py"]

When a worker fails, torchrun's agent stops its workers and then waits at an exit barrier
for the other nodes' agents, for up to 300 s (not configurable in torch 1.13), blocked in a
store call where it cannot act on SIGTERM. When a peer node is lost and the rendezvous store
survives (rank 0's node), that agent holds the pod, and so the gang's next attempt, whose
pods reuse the names, until the grace period's SIGKILL, although its workers have long
exited (rank 0 saved its checkpoint when the collective broke).

This launcher runs the command as its child and passes SIGTERM and SIGINT on. After SIGTERM,
once the child has had no process of its own (no worker left to save a checkpoint) for
SIGTERM_STUCK_SECONDS (2), it is blocked at its barrier: the launcher kills it and exits
143. Otherwise it exits with the child's code. Standard library only.
"""

import os
import signal
import subprocess
import sys
import time

POLL_SECONDS = 0.2


def stuck_seconds():
    raw = os.environ.get("SIGTERM_STUCK_SECONDS", "2")
    try:
        value = float(raw)
    except ValueError:
        sys.exit(f"trainyard_launch.py: SIGTERM_STUCK_SECONDS={raw!r} is not a number")
    if value < 0:
        sys.exit(f"trainyard_launch.py: SIGTERM_STUCK_SECONDS={raw!r} is negative")
    return value


def has_children(pid):
    """Whether any process has `pid` as its parent (from /proc/<pid>/stat's ppid)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue  # ended while we looked
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and fields[1] == str(pid):
            return True
    return False


def run(command, stuck):
    child = subprocess.Popen(command)
    terminated = []

    def forward(signum, frame):
        if signum == signal.SIGTERM:
            terminated.append(time.monotonic())
        child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    childless_since = None
    while child.poll() is None:
        time.sleep(POLL_SECONDS)
        if not terminated or child.poll() is not None:
            continue
        if has_children(child.pid):
            childless_since = None
            continue
        now = time.monotonic()
        childless_since = childless_since or now
        if now - childless_since >= stuck:
            print(
                f"trainyard_launch.py: {command[0]} outlived its workers by {stuck:g} s "
                "after SIGTERM (torchrun's exit barrier): stopping it",
                file=sys.stderr,
                flush=True,
            )
            child.kill()
            child.wait()
            return 143
    code = child.returncode
    return 128 - code if code < 0 else code


def main(argv):
    if len(argv) < 2:
        sys.exit("usage: trainyard_launch.py COMMAND [ARG]...")
    try:
        return run(argv[1:], stuck_seconds())
    except FileNotFoundError as err:
        sys.exit(f"trainyard_launch.py: {err}")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
