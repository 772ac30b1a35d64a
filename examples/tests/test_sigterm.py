"""SIGTERM heard while the main thread is blocked (examples/trainyard_sigterm.py): a rank
stuck in a collective with a lost peer saves its last completed step and exits, instead of
holding its GPUs until the grace period's SIGKILL (docs/env-contract.md)."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1]

PRELUDE = """
import os, sys, time
import trainyard_sigterm
log = open(sys.argv[1], "a", buffering=1)
sigterm = trainyard_sigterm.Sigterm(float(os.environ.get("STUCK", "0.2")))
def stuck():
    log.write("stuck\\n")
    return 143
sigterm.watch(stuck)
def block_forever():
    # A call the main thread never comes back from (torch's collective, here a pipe that
    # nobody writes): the handler may run on EINTR, the main loop never reaches a boundary.
    r, _ = os.pipe()
    while True:
        os.read(r, 1)
def ready():
    print("ready", flush=True)
"""


def run(body, tmp_path, stuck=0.2):
    """Runs PRELUDE + body with `stuck` seconds for a step, sends SIGTERM once it says
    ready(); returns (exit code, its log)."""
    log = tmp_path / "log"
    child = subprocess.Popen(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(body), str(log)],
        cwd=EXAMPLES,
        env={**os.environ, "PYTHONPATH": str(EXAMPLES), "STUCK": str(stuck)},
        stdout=subprocess.PIPE,
        text=True,
    )
    watchdog = threading.Timer(60, child.kill)  # a child that never gets ready fails
    watchdog.start()
    try:
        assert child.stdout.readline() == "ready\n"
        child.send_signal(signal.SIGTERM)
        code = child.wait()
    finally:
        watchdog.cancel()
        child.kill()
    return code, log.read_text().splitlines() if log.exists() else []


def test_a_main_thread_blocked_past_the_stuck_time_exits_from_the_sigterm_thread(tmp_path):
    code, log = run("ready()\nblock_forever()", tmp_path)
    assert (code, log) == (143, ["stuck"])


def test_a_main_loop_that_reaches_a_boundary_saves_and_exits_itself(tmp_path):
    body = """
    ready()
    while not sigterm.boundary():
        time.sleep(0.01)
    log.write("boundary\\n")
    sys.exit(143)
    """
    code, log = run(body, tmp_path)
    assert (code, log) == (143, ["boundary"])


def test_the_sigterm_thread_never_saves_while_the_main_thread_changes_the_state(tmp_path):
    # The main thread holds the state (a save, an optimizer step) for longer than the stuck
    # time: the thread's save waits for it, then runs.
    body = """
    with sigterm.state:
        ready()
        sigterm.requested.wait()
        log.write("main: state changing\\n")
        time.sleep(1)
        log.write("main: state changed\\n")
    block_forever()
    """
    code, log = run(body, tmp_path)
    assert (code, log) == (143, ["main: state changing", "main: state changed", "stuck"])


def test_other_signals_do_not_wake_the_sigterm_thread(tmp_path):
    body = """
    import signal
    signal.signal(signal.SIGUSR1, lambda *_: log.write("usr1\\n"))
    os.kill(os.getpid(), signal.SIGUSR1)
    time.sleep(0.5)
    log.write("still running\\n")
    ready()
    block_forever()
    """
    code, log = run(body, tmp_path)
    assert (code, log) == (143, ["usr1", "still running", "stuck"])


def test_a_rank_blocked_for_longer_than_the_stuck_time_before_sigterm_exits_at_once(tmp_path):
    # A hang restart comes long after the rank blocked: no wait for a boundary then. With the
    # clock started at the signal, the main thread's line 2 s after it would come first.
    body = """
    sigterm.boundary()
    time.sleep(3.5)  # blocked since the boundary for longer than the 3 s allowed a step
    ready()
    sigterm.requested.wait()
    time.sleep(2)
    log.write("main: still blocked 2 s after SIGTERM\\n")
    block_forever()
    """
    code, log = run(body, tmp_path, stuck=3)
    assert (code, log) == (143, ["stuck"])


def test_a_step_under_way_at_sigterm_gets_the_rest_of_its_time_to_reach_its_boundary(tmp_path):
    body = """
    sigterm.boundary()
    ready()
    sigterm.requested.wait()
    time.sleep(1)  # the step ends 1 s after SIGTERM, inside its 30 s
    if sigterm.boundary():
        log.write("boundary\\n")
        sys.exit(143)
    """
    code, log = run(body, tmp_path, stuck=30)
    assert (code, log) == (143, ["boundary"])
