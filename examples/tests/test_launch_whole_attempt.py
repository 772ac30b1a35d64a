"""examples/trainyard_launch.py as the supervisor of in-place restarts ends every process of an
attempt, not only the command's session, before it reports the attempt stopped or exited:
torch >= 2.1's torchrun starts each worker in a session of its own, and a worker blocked in a
collective ignores SIGTERM. Its spare interpreter survives the stop. fake_torchrun.py is the
agent."""

import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from test_supervise import CONTINUE, Operator, wait_for

HERE = Path(__file__).resolve().parent
LAUNCH = HERE.parent / "trainyard_launch.py"
AGENT = HERE / "fake_torchrun.py"
RESTART_ENV = {"TRAINYARD_ATTEMPT": "4", "X": "y"}
# Imported by the spare interpreter: writes down its pid.
WARM_MODULE = """
import os, pathlib
with open(pathlib.Path(os.environ["WARM_LOG"]), "a") as f:
    f.write(f"{os.getpid()}\\n")
"""


@pytest.fixture
def operator():
    made = []

    def make(answer):
        made.append(Operator(answer))
        return made[-1]

    yield make
    for each in made:
        each.close()


def alive(identity, proc="/proc"):
    """Whether the process '<pid> <start time>' runs (a zombie does not)."""
    pid, started = identity.split()
    try:
        stat = Path(f"{proc}/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[19] == started and fields[0] not in ("Z", "X")


def marked(d, prefix):
    """{name: identity} of the processes fake_torchrun.py wrote down as `prefix`<i>."""
    return {p.name: p.read_text() for p in sorted(d.glob(f"{prefix}[0-9]"))}


def running(d, proc="/proc"):
    """The names of the agent's, workers' and detached processes that still run."""
    found = {**marked(d, "worker"), **marked(d, "detached")}
    if (d / "agent").exists():
        found["agent"] = (d / "agent").read_text()
    return sorted(name for name, identity in found.items() if alive(identity, proc))


@pytest.fixture
def leftovers(tmp_path):
    """Kills, after the test, what fake_torchrun.py started and a launcher left running."""
    yield
    for identity in [*marked(tmp_path, "worker").values(), *marked(tmp_path, "detached").values()]:
        if alive(identity):
            os.kill(int(identity.split()[0]), signal.SIGKILL)


class Launcher:
    """The launcher in supervisor mode running fake_torchrun.py (DIR, then `args`), under
    `prefix` (unshare: as PID 1)."""

    def __init__(self, tmp_path, args, url, prefix=(), **settings):
        token = tmp_path / "token"
        token.write_text("tok1\n")
        (tmp_path / "warmmod.py").write_text(WARM_MODULE)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("TRAINYARD_", "MASTER_", "NODE_RANK"))}
        env.update({
            "TRAINYARD_SUPERVISOR_URL": url,
            "TRAINYARD_PROGRESS_TOKEN_FILE": str(token),
            "TRAINYARD_JOB": "train",
            "NODE_RANK": "1",
            "TRAINYARD_ATTEMPT": "3",
            "TRAINYARD_SUPERVISOR_POLL_SECONDS": "0.1",
            "TRAINYARD_SUPERVISOR_HOLD_SECONDS": "0.5",
            "TRAINYARD_STOP_GRACE_SECONDS": "1",
            "SIGTERM_STUCK_SECONDS": "300",
            "TRAINYARD_WARM_IMPORTS": "warmmod",
            "TRAINYARD_WARM_AFTER_SECONDS": "0.2",
            "WARM_LOG": str(tmp_path / "warm.log"),
            "PYTHONPATH": str(tmp_path),
            **settings,
        })
        # A file, not a pipe: a process the launcher leaves behind keeps its stderr open.
        self.stderr = tmp_path / "stderr"
        with open(self.stderr, "w") as stderr:
            self.process = subprocess.Popen(
                [*prefix, sys.executable, str(LAUNCH), sys.executable, str(AGENT),
                 str(tmp_path), *args],
                env=env, stderr=stderr,
            )
        self.watchdog = threading.Timer(30, self.process.kill)  # a launcher that never ends
        self.watchdog.start()

    def finish(self):
        """(exit code, stderr lines) once it exits."""
        try:
            self.process.wait()
        finally:
            self.watchdog.cancel()
            self.process.kill()
        return self.process.returncode, self.stderr.read_text().splitlines()


def restarts(tmp_path, ready, at_report, state="stopped"):
    """An operator's answer: stops attempt 3 once `ready()`, records `at_report()` when
    attempt 3 reports `state` and starts attempt 4."""
    seen = []

    def answer(body):
        if body["attempt"] == 3 and body["state"] == "running" and ready():
            return {"action": "stop", "attempt": 4}
        if body["attempt"] == 3 and body["state"] == state:
            if not seen:
                seen.append(at_report())
            return {"action": "start", "attempt": 4, "env": RESTART_ENV}
        return CONTINUE

    return answer, seen


def test_the_stop_ends_workers_in_sessions_of_their_own_before_it_says_stopped(
    tmp_path, operator, leftovers
):
    # Worker 0 saves on the SIGTERM its agent passes on; worker 1, blocked in a collective,
    # ignores it, and so its agent waits for it until the launcher's deadline kills them.
    answer, at_stopped = restarts(tmp_path, lambda: (tmp_path / "agent").exists(),
                                  lambda: running(tmp_path))
    op = operator(answer)
    code, err = Launcher(tmp_path, ["save", "deaf"], op.url).finish()
    assert at_stopped == [[]], err  # nothing of attempt 3 ran when it said stopped
    assert code == 0, err
    assert running(tmp_path) == []
    assert (tmp_path / "saved0").exists()
    assert (tmp_path / "attempt4").read_text() == "4 y"
    assert op.reports() == [(3, "running"), (3, "stopped"), (4, "running")]
    assert any("did not exit within 1 s of SIGTERM: killing its processes" in line
               for line in err), err


def test_an_orphan_of_the_attempt_in_a_session_of_its_own_gets_sigterm_and_then_sigkill(
    tmp_path, operator, leftovers
):
    # The worker forked a process that left it (two forks, a session of its own) and ignores
    # SIGTERM; the worker saves and its agent exits at once. The orphan re-parented to the
    # launcher (a subreaper): it gets SIGTERM, and SIGKILL at the deadline.
    answer, at_stopped = restarts(tmp_path, lambda: (tmp_path / "agent").exists(),
                                  lambda: running(tmp_path))
    op = operator(answer)
    code, err = Launcher(tmp_path, ["detached"], op.url).finish()
    assert at_stopped == [[]], err
    assert code == 0, err
    assert (tmp_path / "saved0").exists()
    assert op.reports() == [(3, "running"), (3, "stopped"), (4, "running")]
    detached = (tmp_path / "detached0").read_text().split()[0]
    said = [line for line in err if "left processes of the attempt: SIGTERM to" in line]
    assert said and f"{detached} (python" in said[0], err
    assert any("s after the stop order: killing" in line for line in err), err
    assert not any("did not exit within" in line for line in err)  # the agent did


def test_a_crashed_agents_workers_are_gone_before_it_says_exited(tmp_path, operator, leftovers):
    answer, at_exited = restarts(tmp_path, lambda: False, lambda: running(tmp_path),
                                 state="exited")
    op = operator(answer)
    code, err = Launcher(tmp_path, ["deaf", "save", "--crash"], op.url,
                         TRAINYARD_SUPERVISOR_HOLD_SECONDS="10").finish()
    assert at_exited == [[]], err
    assert code == 0, err
    assert op.reports()[:3] == [(3, "running"), (3, "exited"), (4, "running")]
    assert (tmp_path / "attempt4").read_text() == "4 y"


def test_the_spare_interpreter_survives_the_stop_and_runs_the_next_attempt(
    tmp_path, operator, leftovers
):
    log = tmp_path / "warm.log"

    def spare_and_workers():
        return alive_pid(log.read_text().split()[0]), running(tmp_path)

    answer, at_stopped = restarts(
        tmp_path, lambda: (tmp_path / "agent").exists() and log.exists(), spare_and_workers)
    op = operator(answer)
    code, err = Launcher(tmp_path, ["save", "deaf"], op.url).finish()
    assert at_stopped == [(True, [])], err
    assert code == 0, err
    spare = log.read_text().split()[0]
    assert f"trainyard_launch.py: attempt 4 runs in the spare interpreter {spare}" in err
    assert (tmp_path / "attempt4").read_text() == "4 y"


def alive_pid(pid, proc="/proc"):
    try:
        stat = Path(f"{proc}/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].split()[0] not in ("Z", "X")


def in_namespace(launcher_pid):
    """The /proc of the pid namespace the launcher (started by unshare) is PID 1 of."""
    children = Path(f"/proc/{launcher_pid}/task/{launcher_pid}/children").read_text().split()
    return f"/proc/{children[0]}/root/proc" if children else None


def pid_namespaces_work():
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("nsenter"):
        return False
    return subprocess.run(["unshare", "-pf", "--mount-proc", "true"],
                          capture_output=True).returncode == 0


@pytest.mark.skipif(not pid_namespaces_work(), reason="needs root, unshare and nsenter")
def test_as_pid_1_every_process_but_the_spare_is_the_attempts(tmp_path, operator):
    # The launcher is its container's first process: a process entered into the container
    # (kubectl exec), not its descendant, is the attempt's too, and is ended with it.
    log = tmp_path / "warm.log"
    proc = []

    def live():
        return sorted(int(p) for p in os.listdir(proc[0]) if p.isdigit() and alive_pid(p, proc[0]))

    answer, at_stopped = restarts(
        tmp_path, lambda: (tmp_path / "entered").exists() and log.exists(),
        lambda: (live(), running(tmp_path, proc[0])))
    op = operator(answer)
    launcher = Launcher(tmp_path, ["save", "deaf"], op.url,
                        prefix=["unshare", "-pf", "--mount-proc"])
    try:
        wait_for(lambda: (tmp_path / "agent").exists())
        proc.append(in_namespace(launcher.process.pid))
        inner = int(Path(f"/proc/{launcher.process.pid}/task/{launcher.process.pid}/children")
                    .read_text().split()[0])
        entered = subprocess.Popen(
            ["nsenter", "-t", str(inner), "-p", "--", sys.executable, "-c",
             "import os, signal, sys, time\n"
             "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
             f"open({str(tmp_path / 'entered')!r}, 'w').write(str(os.getpid()))\n"
             "time.sleep(60)"])
        code, err = launcher.finish()
        entered.wait(5)
    finally:
        launcher.process.kill()
    spare = int(log.read_text().split()[0])
    assert at_stopped == [([1, spare], [])], err
    assert code == 0, err
    assert entered.returncode != 0  # killed
    assert f"trainyard_launch.py: attempt 4 runs in the spare interpreter {spare}" in err
    assert op.reports() == [(3, "running"), (3, "stopped"), (4, "running")]
