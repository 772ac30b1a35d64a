"""A fake torchrun agent as torch >= 2.1 runs one: every worker in a session of its own
(start_new_session=True). On SIGTERM it passes the signal to its workers and waits for them
(torch waits 30 s before its SIGKILL: longer than the tests' stop grace).

    fake_torchrun.py DIR KIND...    one worker per KIND:
      save      saves (writes DIR/saved<i>) and exits 143 on SIGTERM
      deaf      ignores SIGTERM (blocked in a collective)
      detached  as save, after starting a deaf process that forks twice into a session of
                its own, its parent gone (DIR/detached<i>)
    --crash     the agent exits 1 once its workers are up, leaving them (a crashed agent)

Attempt 4 (TRAINYARD_ATTEMPT) only writes DIR/attempt4 ("4 <X>") and exits 0. Each process
writes DIR/<name> = "<pid> <start time>" once it is ready; DIR/agent is written last.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def mark(d, name, text=""):
    (d / (name + ".tmp")).write_text(text)
    os.replace(d / (name + ".tmp"), d / name)


def identity(pid="self"):
    """'<pid> <start time>': a pid reused later reads otherwise."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rfind(")") + 2 :].split()
    return f"{os.getpid() if pid == 'self' else pid} {fields[19]}"


def deaf_forever():
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(1)


def worker(d, kind, i):
    if kind == "deaf":
        mark(d, f"worker{i}", identity())
        deaf_forever()
    if kind == "detached":
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                mark(d, f"detached{i}", identity())
                deaf_forever()
            os._exit(0)
        os.wait()
        while not (d / f"detached{i}").exists():
            time.sleep(0.01)

    def save(signum, frame):
        mark(d, f"saved{i}")
        sys.exit(143)

    signal.signal(signal.SIGTERM, save)
    mark(d, f"worker{i}", identity())
    while True:
        time.sleep(1)


def agent(d, kinds, crash):
    if os.environ.get("TRAINYARD_ATTEMPT") == "4":
        mark(d, "attempt4", "4 " + os.environ.get("X", "-"))
        sys.exit(0)
    workers = []

    def forward(signum, frame):
        for each in workers:
            each.send_signal(signum)
        for each in workers:
            each.wait()
        sys.exit(143)

    signal.signal(signal.SIGTERM, forward)
    for i, kind in enumerate(kinds):
        workers.append(subprocess.Popen(
            [sys.executable, __file__, "--worker", str(d), kind, str(i)],
            start_new_session=True))
    for i in range(len(kinds)):
        while not (d / f"worker{i}").exists():
            time.sleep(0.01)
    mark(d, "agent", identity())
    if crash:
        os._exit(1)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    if sys.argv[1] == "--worker":
        worker(Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
    else:
        args = sys.argv[1:]
        crash = "--crash" in args
        args = [a for a in args if a != "--crash"]
        agent(Path(args[0]), args[1:], crash)
