"""examples/trainyard_launch.py: SIGTERM ends a torchrun agent blocked at its exit barrier once
its workers are gone, never while a worker still runs (it may be saving a checkpoint)."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

LAUNCH = Path(__file__).resolve().parents[1] / "trainyard_launch.py"


def launch(agent, tmp_path, terminate=True):
    """Runs `agent` (Python) under the launcher with a stuck time of 0.2 s; sends SIGTERM once
    the agent prints ready (when `terminate`). Returns (exit code, the agent's log)."""
    log = tmp_path / "log"
    launcher = subprocess.Popen(
        [sys.executable, str(LAUNCH), sys.executable, "-c", textwrap.dedent(agent), str(log)],
        env={**os.environ, "SIGTERM_STUCK_SECONDS": "0.2"},
        stdout=subprocess.PIPE,
        text=True,
    )
    watchdog = threading.Timer(60, launcher.kill)  # a launcher that never ends fails
    watchdog.start()
    try:
        assert launcher.stdout.readline() == "ready\n"
        if terminate:
            launcher.send_signal(signal.SIGTERM)
        code = launcher.wait()
    finally:
        watchdog.cancel()
        launcher.kill()
    return code, log.read_text().splitlines() if log.exists() else []


def test_an_agent_blocked_at_its_barrier_after_its_workers_exited_is_stopped(tmp_path):
    agent = """
    import os, signal, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # blocked in a store call: SIGTERM waits
    open(sys.argv[1], "w").write(str(os.getpid()))
    print("ready", flush=True)
    time.sleep(300)
    """
    code, log = launch(agent, tmp_path)
    assert code == 143
    pid = int(log[0])
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()


def test_an_agent_whose_worker_still_runs_is_left_to_finish(tmp_path):
    agent = """
    import signal, subprocess, sys
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    log = open(sys.argv[1], "a", buffering=1)
    worker = subprocess.Popen(["sleep", "1.5"])  # a worker saving its checkpoint
    print("ready", flush=True)
    worker.wait()
    log.write("worker done\\n")
    sys.exit(7)
    """
    code, log = launch(agent, tmp_path)
    assert (code, log) == (7, ["worker done"])


def test_sigterm_reaches_the_command(tmp_path):
    agent = """
    import time
    print("ready", flush=True)
    time.sleep(300)
    """
    code, _ = launch(agent, tmp_path)
    assert code == 128 + signal.SIGTERM


def test_without_sigterm_the_commands_exit_code_is_the_launchers(tmp_path):
    agent = """
    import sys
    print("ready", flush=True)
    sys.exit(3)
    """
    code, _ = launch(agent, tmp_path, terminate=False)
    assert code == 3


@pytest.mark.parametrize("setting", ["SIGTERM_STUCK_SECONDS", "MASTER_WAIT_SECONDS"])
def test_a_bad_setting_is_named(setting):
    out = subprocess.run(
        [sys.executable, str(LAUNCH), "true"],
        env={**os.environ, setting: "soon"},
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0
    assert f"{setting}='soon' is not a number" in out.stderr


def load_launcher():
    import importlib.util

    spec = importlib.util.spec_from_file_location("trainyard_launch", LAUNCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_master_that_accepts_or_refuses_is_reached_a_stale_address_is_not():
    import errno
    import socket

    launch_mod = load_launcher()
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    assert launch_mod.master_reachable("127.0.0.1", port) is None
    listener.close()
    # Nothing listens: refused, as on rank 0 before its store is up. torchrun retries that.
    assert launch_mod.master_reachable("127.0.0.1", port) is None

    def stale(address, timeout):
        raise OSError(errno.EHOSTUNREACH, "No route to host")

    why = launch_mod.master_reachable(
        "j-worker-0.j", 29500,
        resolve=lambda h, p, type: [(None, None, None, None, ("10.88.1.9", p))],
        connect=stale,
    )
    assert why == "j-worker-0.j (10.88.1.9): No route to host"

    def unknown(host, port, type):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    assert launch_mod.master_reachable("j-worker-0.j", 29500, resolve=unknown) == (
        "j-worker-0.j does not resolve (Name or service not known)"
    )


def test_the_launcher_waits_while_the_master_points_nowhere_and_starts_once_it_does():
    launch_mod = load_launcher()
    now = [0.0]
    answers = iter(["j-worker-0.j does not resolve", "j-worker-0.j (10.0.0.9): No route", None])
    env = {"MASTER_ADDR": "j-worker-0.j", "MASTER_PORT": "29500"}
    reached = launch_mod.wait_for_master(
        env, 120, check=lambda h, p: next(answers),
        sleep=lambda s: now.__setitem__(0, now[0] + s), clock=lambda: now[0],
    )
    assert reached and now[0] == 2.0
    # Past the limit it starts anyway: torchrun's own error then says what is wrong.
    now[0] = 0.0
    reached = launch_mod.wait_for_master(
        env, 5, check=lambda h, p: "j-worker-0.j does not resolve",
        sleep=lambda s: now.__setitem__(0, now[0] + s), clock=lambda: now[0],
    )
    assert not reached and now[0] == 5.0
    # Without a master (a single-node run) there is nothing to wait for.
    assert launch_mod.wait_for_master({}, 5, check=lambda h, p: "never asked")

