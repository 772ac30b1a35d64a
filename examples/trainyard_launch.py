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

Before it starts the command, it waits (up to MASTER_WAIT_SECONDS, 120) for MASTER_ADDR to
name a host it can reach at MASTER_PORT: one that accepts the connection, or refuses it
(rank 0's store is not listening yet, and torchrun retries a refusal). Each attempt's pods
are new, with new addresses, and the cluster's DNS follows the API server: after an API
server restart the Endpoints controller and CoreDNS catch up only after a while, and until
then the master's name resolves to the previous attempt's address, or to nothing. torchrun
gives up at once on an address with no route to it (exit 1), which the operator must count
as the job's failure.
"""

import errno
import os
import signal
import socket
import subprocess
import sys
import time

POLL_SECONDS = 0.2
# Errors that say the name points nowhere yet (a stale or missing address), not that the
# master's store is not up yet.
UNREACHABLE = {errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN, errno.ETIMEDOUT}


def seconds_setting(name, default):
    raw = os.environ.get(name, default)
    try:
        value = float(raw)
    except ValueError:
        sys.exit(f"trainyard_launch.py: {name}={raw!r} is not a number")
    if value < 0:
        sys.exit(f"trainyard_launch.py: {name}={raw!r} is negative")
    return value


def master_reachable(host, port, resolve=socket.getaddrinfo, connect=socket.create_connection):
    """None when `host` resolves to an address that accepts or refuses a connection on `port`;
    else why not."""
    try:
        addresses = {info[4][0] for info in resolve(host, port, type=socket.SOCK_STREAM)}
    except socket.gaierror as err:
        return f"{host} does not resolve ({err.strerror})"
    why = f"{host} resolves to nothing"
    for address in sorted(addresses):
        try:
            connect((address, port), timeout=2).close()
            return None
        except ConnectionRefusedError:
            return None
        except socket.timeout:
            why = f"{host} ({address}) does not answer"
        except OSError as err:
            if err.errno not in UNREACHABLE:
                return None  # not a stale address: torchrun decides
            why = f"{host} ({address}): {err.strerror}"
    return why


def wait_for_master(env, limit, check=master_reachable, sleep=time.sleep, clock=time.monotonic):
    """Waits while MASTER_ADDR points nowhere, up to `limit` seconds; whether it was reached."""
    host, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    if not host or not port or not port.isdigit():
        return True
    started, told = clock(), None
    while True:
        why = check(host, int(port))
        if why is None:
            return True
        waited = clock() - started
        if waited >= limit:
            print(f"trainyard_launch.py: {why} after {waited:.0f} s: starting anyway",
                  file=sys.stderr, flush=True)
            return False
        if told is None or clock() - told >= 10:
            print(f"trainyard_launch.py: waiting for the master: {why}", file=sys.stderr,
                  flush=True)
            told = clock()
        sleep(1)


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
    stuck = seconds_setting("SIGTERM_STUCK_SECONDS", "2")
    wait_for_master(os.environ, seconds_setting("MASTER_WAIT_SECONDS", "120"))
    try:
        return run(argv[1:], stuck)
    except FileNotFoundError as err:
        sys.exit(f"trainyard_launch.py: {err}")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
