"""examples/trainyard_launch.py as the supervisor of in-place restarts (TRAINYARD_SUPERVISOR_URL,
docs/env-contract.md#in-place-restarts-the-supervisor), against a fake operator: it stops an
attempt on the operator's order and reports it only once nothing of it runs, starts the next
one with the operator's environment, and without an operator ends as the plain launcher."""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

LAUNCH = Path(__file__).resolve().parents[1] / "trainyard_launch.py"
CONTINUE = {"action": "continue"}


class Operator:
    """A fake operator: records every poll (its body and Authorization header) and answers
    with `answer(body)`, a dict (200 JSON) or (status, bytes)."""

    def __init__(self, answer=lambda body: CONTINUE):
        self.answer = answer
        self.polls = []
        self.lock = threading.Lock()
        operator = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with operator.lock:
                    operator.polls.append((body, self.headers.get("Authorization")))
                reply = operator.answer(body)
                if not isinstance(reply, tuple):
                    reply = (200, json.dumps(reply).encode())
                status, raw = reply
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.handle_error = lambda request, address: None  # a poll given up on
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/supervisor"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def bodies(self):
        with self.lock:
            return [body for body, _ in self.polls]

    def reports(self):
        """(attempt, state) as reported, each change once."""
        seen = []
        for body in self.bodies():
            report = (body["attempt"], body["state"])
            if not seen or seen[-1] != report:
                seen.append(report)
        return seen

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def operator():
    made = []

    def make(answer=lambda body: CONTINUE):
        made.append(Operator(answer))
        return made[-1]

    yield make
    for each in made:
        each.close()


def alive_in_session(leader):
    """The processes, zombies aside, of the process group or session `leader` leads."""
    alive = []
    for entry in os.listdir("/proc"):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except (OSError, ValueError):
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields[0] not in ("Z", "X") and str(leader) in (fields[2], fields[3]):
            alive.append(int(entry))
    return alive


def wait_for(condition, limit=10):
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


class Launcher:
    """The launcher under test, in supervisor mode when `url`, running `script` (Python, given
    the test's directory as argv[1]) as its command."""

    def __init__(self, tmp_path, script, url, **settings):
        self.dir = tmp_path
        token = tmp_path / "token"
        if not token.exists():
            token.write_text("tok1\n")
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("TRAINYARD_", "MASTER_", "NODE_RANK"))}
        env.update({
            "TRAINYARD_PROGRESS_TOKEN_FILE": str(token),
            "TRAINYARD_JOB": "train",
            "NODE_RANK": "1",
            "TRAINYARD_ATTEMPT": "3",
            "TRAINYARD_SUPERVISOR_POLL_SECONDS": "0.1",
            "TRAINYARD_SUPERVISOR_HOLD_SECONDS": "0.5",
            "TRAINYARD_STOP_GRACE_SECONDS": "0.5",
            "SIGTERM_STUCK_SECONDS": "1",
            # Every restart here runs in a spare interpreter, unless a test says otherwise.
            "TRAINYARD_WARM_IMPORTS": "decimal",
            "TRAINYARD_WARM_AFTER_SECONDS": "0.2",
        })
        if url:
            env["TRAINYARD_SUPERVISOR_URL"] = url
        env.update(settings)
        self.process = subprocess.Popen(
            [sys.executable, str(LAUNCH), sys.executable, "-c", textwrap.dedent(script),
             str(tmp_path)],
            env=env, stderr=subprocess.PIPE, text=True,
        )
        self.watchdog = threading.Timer(30, self.process.kill)  # a launcher that never ends
        self.watchdog.start()

    def finish(self):
        """(exit code, stderr lines) once it exits."""
        try:
            _, err = self.process.communicate()
        finally:
            self.watchdog.cancel()
            self.process.kill()
        return self.process.returncode, err.splitlines()


PRELUDE = """
import os, signal, subprocess, sys, time
from pathlib import Path
d = Path(sys.argv[1])
attempt = os.environ["TRAINYARD_ATTEMPT"]
def mark(name, text=""):
    (d / (name + ".tmp")).write_text(text)
    os.replace(d / (name + ".tmp"), d / name)
if attempt == "4":
    mark("attempt4", os.environ["TRAINYARD_ATTEMPT"] + " " + os.environ.get("X", "-"))
    sys.exit(0)
"""



def command(body):
    """PRELUDE and then `body` (indented as in a test)."""
    return PRELUDE + textwrap.dedent(body)


SAVES_ON_SIGTERM = PRELUDE + """
def save(signum, frame):
    mark("saved")
    sys.exit(143)
signal.signal(signal.SIGTERM, save)
mark("child", str(os.getpid()))
while True:
    time.sleep(1)
"""

# Ignores SIGTERM (blocked at torchrun's barrier, say) and leaves two grandchildren in its
# session, one in its process group and one in a group of its own.
IGNORES_SIGTERM = PRELUDE + """
signal.signal(signal.SIGTERM, signal.SIG_IGN)
subprocess.Popen(["sleep", "300"], stderr=subprocess.DEVNULL)
subprocess.Popen(["sleep", "300"], stderr=subprocess.DEVNULL, process_group=0)
mark("child", str(os.getpid()))
while True:
    time.sleep(1)
"""

# Saves and exits on SIGTERM, leaving behind a process of its session that ignores it.
LEAVES_A_PROCESS = PRELUDE + """
subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 300"], stderr=subprocess.DEVNULL,
                 process_group=0)
def save(signum, frame):
    mark("saved")
    sys.exit(143)
signal.signal(signal.SIGTERM, save)
mark("child", str(os.getpid()))
while True:
    time.sleep(1)
"""

# torchrun's agent: passes SIGTERM on to its worker, which saves and exits, and then stays (at
# its exit barrier).
AGENT_AT_ITS_BARRIER = PRELUDE + """
worker = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\\n"
                           "signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))\\n"
                           "time.sleep(300)"])
def forward(signum, frame):
    worker.send_signal(signum)
    worker.wait()
    mark("saved")
signal.signal(signal.SIGTERM, forward)
mark("child", str(os.getpid()))
for _ in range(40):  # past the test's watchdog, so that a launcher that waits fails it
    time.sleep(1)
"""

# torchrun's agent after its worker failed (a peer lost): it stays, deaf to SIGTERM (blocked
# in its rendezvous' shutdown, say), with no worker left.
AGENT_AFTER_ITS_WORKER_FAILED = PRELUDE + """
signal.signal(signal.SIGTERM, signal.SIG_IGN)
worker = subprocess.Popen([sys.executable, "-c", "import sys, time\\n"
                           "time.sleep(1.5)\\n"
                           "sys.exit(1)"])
mark("child", str(os.getpid()))
worker.wait()
mark("worker-failed")
for _ in range(40):  # past the test's watchdog, so that a launcher that waits fails it
    time.sleep(1)
"""

FAILS_WITH_3 = PRELUDE + """
sys.exit(3)
"""

RESTART_ENV = {"TRAINYARD_ATTEMPT": "4", "X": "y"}


@pytest.mark.parametrize(
    "script", [SAVES_ON_SIGTERM, IGNORES_SIGTERM, LEAVES_A_PROCESS],
    ids=["saves", "ignores", "leaves-a-process"],
)
def test_the_operators_stop_ends_every_process_of_the_attempt_before_it_says_stopped(
    tmp_path, operator, script
):
    at_stopped = []

    def answer(body):
        if body["state"] == "running" and body["attempt"] == 3 and (tmp_path / "child").exists():
            return {"action": "stop", "attempt": 4}
        if body["state"] == "stopped" and body["attempt"] == 3:
            at_stopped.append(alive_in_session(int((tmp_path / "child").read_text())))
            return {"action": "start", "attempt": 4, "env": RESTART_ENV}
        return CONTINUE

    op = operator(answer)
    code, err = Launcher(tmp_path, script, op.url).finish()
    assert code == 0, err
    assert at_stopped and at_stopped[0] == []  # nothing of attempt 3 ran when it said stopped
    assert alive_in_session(int((tmp_path / "child").read_text())) == []
    assert (tmp_path / "attempt4").read_text() == "4 y"
    assert (tmp_path / "saved").exists() == (script is not IGNORES_SIGTERM)
    assert op.reports() == [(3, "running"), (3, "stopped"), (4, "running")]
    for body in op.bodies():
        assert body["job"] == "train" and body["rank"] == 1 and "exitCode" not in body
    stopped = "trainyard_launch.py: attempt 3 stopped on the operator's order (attempt 4 decided)"
    assert stopped in err
    assert "trainyard_launch.py: starting attempt 4 in place" in err


def test_on_the_operators_stop_an_agent_that_outlives_its_workers_is_ended_without_the_barrier_wait(
    tmp_path, operator
):
    # A barrier rule of 300 s would outlast the test's 30-s watchdog: the launcher must not wait
    # for it once the workers the agent ran have exited.
    def answer(body):
        if body["state"] == "running" and body["attempt"] == 3 and (tmp_path / "child").exists():
            return {"action": "stop", "attempt": 4}
        if body["state"] == "stopped" and body["attempt"] == 3:
            return {"action": "start", "attempt": 4, "env": RESTART_ENV}
        return CONTINUE

    op = operator(answer)
    launcher = Launcher(tmp_path, AGENT_AT_ITS_BARRIER, op.url, SIGTERM_STUCK_SECONDS="300",
                        TRAINYARD_STOP_GRACE_SECONDS="300")
    code, err = launcher.finish()
    assert code == 0
    assert (tmp_path / "saved").exists()
    assert (tmp_path / "attempt4").read_text() == "4 y"
    assert op.reports() == [(3, "running"), (3, "stopped"), (4, "running")]
    def said(text):
        return next(i for i, line in enumerate(err) if text in line)

    exited = said("workers exited on the operator's stop")
    stopped = said("attempt 3 stopped on the operator's")
    assert exited < stopped
    assert not any("outlived its workers" in line for line in err)


def test_on_the_operators_stop_an_agent_whose_workers_failed_before_it_is_ended_at_once(
    tmp_path, operator
):
    # Its worker failed before the stop came: the agent had workers in this attempt, and has
    # none left to save anything, so no barrier wait (300 s here) applies.
    def answer(body):
        if (body["state"] == "running" and body["attempt"] == 3
                and (tmp_path / "worker-failed").exists()):
            return {"action": "stop", "attempt": 4}
        if body["state"] == "stopped" and body["attempt"] == 3:
            return {"action": "start", "attempt": 4, "env": RESTART_ENV}
        return CONTINUE

    op = operator(answer)
    launcher = Launcher(tmp_path, AGENT_AFTER_ITS_WORKER_FAILED, op.url,
                        SIGTERM_STUCK_SECONDS="300", TRAINYARD_STOP_GRACE_SECONDS="300")
    code, err = launcher.finish()
    assert code == 0, err
    assert (tmp_path / "attempt4").read_text() == "4 y"
    assert op.reports() == [(3, "running"), (3, "stopped"), (4, "running")]
    assert any("workers exited on the operator's stop" in line for line in err), err
    assert not any("outlived its workers" in line for line in err)


def test_a_failed_command_is_reported_and_without_a_decision_its_code_ends_the_launcher(
    tmp_path, operator
):
    op = operator()
    launcher = Launcher(tmp_path, FAILS_WITH_3, op.url)
    code, err = launcher.finish()
    assert code == 3
    exited = [b for b in op.bodies() if b["state"] == "exited"]
    ages = [b.pop("exitedSecondsAgo") for b in exited]
    assert exited and all(b == {"job": "train", "rank": 1, "attempt": 3, "state": "exited",
                                "exitCode": 3, "waitSeconds": 3} for b in exited)
    assert len(exited) >= 2  # every quarter second over the half-second hold
    # Each poll dates the exit from its own clock: the age grows, and within the hold.
    assert ages == sorted(ages) and 0 <= ages[0] and ages[-1] < 1.5, ages
    assert ("trainyard_launch.py: child exited 3; holding for the operator's decision up to "
            "0.5 s") in err


def test_an_exit_the_operator_does_not_hear_ends_the_launcher_after_one_held_poll_not_the_hold(
    tmp_path, operator
):
    # The operator's replica that should answer is gone (a roll, a restart): polls are refused
    # with no answer. A container without a supervisor would show the failure at once; this
    # one holds it no longer than one held poll, not the 30-s hold.
    op = operator(lambda body: (503, b"no leader"))
    started = time.monotonic()
    launcher = Launcher(tmp_path, FAILS_WITH_3, op.url, TRAINYARD_SUPERVISOR_HOLD_SECONDS="30",
                        TRAINYARD_SUPERVISOR_WAIT_SECONDS="1")
    code, err = launcher.finish()
    took = time.monotonic() - started
    assert code == 3
    assert any("did not answer the report of the exit within 4 s: exiting 3" in line
               for line in err), err
    assert took < 10, took
    assert [b["state"] for b in op.bodies()].count("exited") >= 1


def test_an_exit_the_operator_heard_is_held_for_its_decision(tmp_path, operator):
    op = operator()
    started = time.monotonic()
    launcher = Launcher(tmp_path, FAILS_WITH_3, op.url, TRAINYARD_SUPERVISOR_HOLD_SECONDS="6",
                        TRAINYARD_SUPERVISOR_WAIT_SECONDS="1")
    code, err = launcher.finish()
    assert code == 3
    assert time.monotonic() - started >= 6
    assert any("no start from the operator within 6 s: exiting 3" in line for line in err), err


def test_the_operators_hold_outlasts_the_launchers_own_setting(tmp_path, operator):
    # The operator will start the next attempt only after a backoff longer than the
    # supervisor's own hold (0.5 s here): it says so, and the launcher waits that long.
    op = operator(lambda body: {"action": "continue", "holdSeconds": 3})
    started = time.monotonic()
    code, err = Launcher(tmp_path, FAILS_WITH_3, op.url).finish()
    assert code == 3
    assert time.monotonic() - started >= 3
    assert any("no start from the operator within 3 s: exiting 3" in line for line in err), err


def test_a_failed_command_is_started_again_when_the_operator_says_so(tmp_path, operator):
    def answer(body):
        if body["state"] == "exited":
            return {"action": "start", "attempt": 4, "env": RESTART_ENV}
        return CONTINUE

    op = operator(answer)
    code, _ = Launcher(tmp_path, FAILS_WITH_3, op.url,
                       TRAINYARD_SUPERVISOR_HOLD_SECONDS="30").finish()
    assert code == 0
    assert (tmp_path / "attempt4").read_text() == "4 y"
    assert op.reports()[:2] == [(3, "running"), (3, "exited")]
    assert (4, "running") in op.reports()


def test_sigterm_to_the_launcher_is_passed_on_and_ends_it_without_a_hold(tmp_path, operator):
    op = operator()
    script = command("""
    mark("child", str(os.getpid()))
    time.sleep(300)
    """)
    launcher = Launcher(tmp_path, script, op.url, TRAINYARD_SUPERVISOR_HOLD_SECONDS="30")
    wait_for(lambda: (tmp_path / "child").exists() and op.bodies())
    started = time.monotonic()
    launcher.process.send_signal(signal.SIGTERM)
    code, _ = launcher.finish()
    assert code == 128 + signal.SIGTERM
    assert time.monotonic() - started < 5
    polls = len(op.bodies())
    time.sleep(0.3)
    assert len(op.bodies()) == polls
    assert "exited" not in {b["state"] for b in op.bodies()}


@pytest.mark.parametrize("ordered", [False, True], ids=["sigterm", "sigterm-during-a-stop"])
def test_sigterm_to_the_launcher_says_stopped_once_nothing_of_the_attempt_is_left(
    tmp_path, operator, ordered
):
    """The pod is being deleted (a noticed worker whose replacement waits): its last poll says
    the attempt stopped, sent only once no process of it is left, so that the operator can
    start the next attempt without waiting for the pod's teardown."""
    at_stopped = []

    def answer(body):
        if body["state"] == "stopped":
            at_stopped.append(alive_in_session(int((tmp_path / "child").read_text())))
        if ordered and body["state"] == "running" and (tmp_path / "child").exists():
            return {"action": "stop", "attempt": 4}
        return CONTINUE

    op = operator(answer)
    # A stop's grace long enough that the SIGTERM comes while the launcher waits for the
    # process the command left.
    launcher = Launcher(tmp_path, LEAVES_A_PROCESS, op.url, TRAINYARD_STOP_GRACE_SECONDS="20",
                        TRAINYARD_SUPERVISOR_HOLD_SECONDS="30")
    if ordered:
        wait_for(lambda: (tmp_path / "saved").exists())
    else:
        wait_for(lambda: (tmp_path / "child").exists() and op.bodies())
    assert at_stopped == []
    started = time.monotonic()
    launcher.process.send_signal(signal.SIGTERM)
    code, err = launcher.finish()
    assert time.monotonic() - started < 5, err
    assert code == 143, err
    assert op.reports() == [(3, "running"), (3, "stopped")], err
    assert at_stopped == [[]], "nothing of attempt 3 ran when it said stopped"


def test_sigterm_while_holding_ends_the_launcher_with_the_commands_code(tmp_path, operator):
    op = operator()
    launcher = Launcher(tmp_path, FAILS_WITH_3, op.url, TRAINYARD_SUPERVISOR_HOLD_SECONDS="30")
    wait_for(lambda: any(b["state"] == "exited" for b in op.bodies()))
    started = time.monotonic()
    launcher.process.send_signal(signal.SIGTERM)
    code, _ = launcher.finish()
    assert code == 3
    assert time.monotonic() - started < 5


def test_the_operators_exit_ends_the_launcher_with_the_commands_code(tmp_path, operator):
    op = operator(lambda body: {"action": "exit"} if body["state"] == "exited" else CONTINUE)
    code, err = Launcher(tmp_path, FAILS_WITH_3, op.url,
                         TRAINYARD_SUPERVISOR_HOLD_SECONDS="30").finish()
    assert code == 3
    assert "trainyard_launch.py: the operator ended the job: exiting 3" in err


def test_the_operators_exit_stops_a_running_command_first(tmp_path, operator):
    def answer(body):
        return {"action": "exit"} if (tmp_path / "child").exists() else CONTINUE

    op = operator(answer)
    code, _ = Launcher(tmp_path, SAVES_ON_SIGTERM, op.url).finish()
    assert code == 143
    assert (tmp_path / "saved").exists()
    assert alive_in_session(int((tmp_path / "child").read_text())) == []


def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("status", [0, 5])
def test_an_unreachable_operator_leaves_the_command_to_run_and_end(tmp_path, status):
    script = command(f"""
    time.sleep(0.5)
    sys.exit({status})
    """)
    url = f"http://127.0.0.1:{closed_port()}/v1/supervisor"
    code, err = Launcher(tmp_path, script, url, TRAINYARD_SUPERVISOR_HOLD_SECONDS="0.3").finish()
    assert code == status
    complaints = [line for line in err if "supervisor poll" in line]
    assert len(complaints) == 1 and complaints[0].startswith("trainyard_launch.py: ")


def test_answers_it_does_not_know_are_continue_and_logged_once(tmp_path, operator):
    answers = iter([
        (500, b"{}"), (200, b"not json"), {"action": "restart"}, {"action": "stop"},
        {"action": "start", "attempt": 9, "env": {"X": "y"}},  # while running: ignored
    ])
    op = operator(lambda body: next(answers, CONTINUE))
    script = command("""
    mark("child", str(os.getpid()))
    time.sleep(1.2)
    sys.exit(0)
    """)
    code, err = Launcher(tmp_path, script, op.url).finish()
    assert code == 0
    assert len(op.bodies()) >= 6
    assert {b["state"] for b in op.bodies()} == {"running"}
    assert len([line for line in err if "supervisor poll" in line]) == 1
    assert len([line for line in err if "ignoring the operator's start" in line]) == 1
    assert not (tmp_path / "attempt4").exists()


def test_the_token_file_is_read_on_every_poll(tmp_path, operator):
    def answer(body):
        (tmp_path / "token").write_text("tok2\n")
        return CONTINUE

    op = operator(answer)
    script = command("""
    deadline = time.monotonic() + 10
    while not (d / "seen2").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    """)
    launcher = Launcher(tmp_path, script, op.url)
    wait_for(lambda: "Bearer tok2" in [auth for _, auth in op.polls])
    (tmp_path / "seen2").write_text("")
    code, _ = launcher.finish()
    assert code == 0
    auths = [auth for _, auth in op.polls]
    assert auths[0] == "Bearer tok1" and "Bearer tok2" in auths


def test_without_a_supervisor_url_nothing_polls_and_the_command_shares_the_session(
    tmp_path, operator
):
    op = operator()
    script = """
    import os, sys, time
    from pathlib import Path
    Path(sys.argv[1], "sessions").write_text(f"{os.getsid(0)} {os.getsid(os.getppid())}")
    time.sleep(0.5)
    sys.exit(3)
    """
    code, _ = Launcher(tmp_path, script, None, TRAINYARD_PROGRESS_URL=op.url).finish()
    assert code == 3  # at once: no hold
    child, launcher = (tmp_path / "sessions").read_text().split()
    assert child == launcher
    assert op.polls == []


@pytest.mark.parametrize("setting", ["TRAINYARD_STOP_GRACE_SECONDS",
                                     "TRAINYARD_SUPERVISOR_HOLD_SECONDS",
                                     "TRAINYARD_SUPERVISOR_POLL_SECONDS",
                                     "TRAINYARD_SUPERVISOR_WAIT_SECONDS"])
def test_a_bad_supervisor_setting_is_named(setting):
    out = subprocess.run(
        [sys.executable, str(LAUNCH), "true"],
        env={**os.environ, "TRAINYARD_SUPERVISOR_URL": "http://127.0.0.1:9/", setting: "soon"},
        capture_output=True, text=True,
    )
    assert out.returncode != 0
    assert f"{setting}='soon' is not a number" in out.stderr


def test_a_supervisor_needs_its_rank_and_attempt():
    env = {k: v for k, v in os.environ.items() if k not in ("NODE_RANK", "TRAINYARD_ATTEMPT")}
    out = subprocess.run(
        [sys.executable, str(LAUNCH), "true"],
        env={**env, "TRAINYARD_SUPERVISOR_URL": "http://127.0.0.1:9/", "TRAINYARD_ATTEMPT": "x"},
        capture_output=True, text=True,
    )
    assert out.returncode != 0
    assert "NODE_RANK is not set" in out.stderr


def test_a_hanging_operator_delays_neither_sigterm_nor_the_commands_end(tmp_path, operator):
    release = threading.Event()
    op = operator(lambda body: release.wait(5) and CONTINUE)  # each poll times out at 2 s
    try:
        script = command("""
        mark("child", str(os.getpid()))
        time.sleep(300)
        """)
        launcher = Launcher(tmp_path, script, op.url, TRAINYARD_SUPERVISOR_HOLD_SECONDS="30")
        wait_for(lambda: (tmp_path / "child").exists() and op.bodies())
        started = time.monotonic()
        launcher.process.send_signal(signal.SIGTERM)
        code, _ = launcher.finish()
        assert code == 128 + signal.SIGTERM
        assert time.monotonic() - started < 1

        quick = command("""
        time.sleep(0.3)
        sys.exit(0)
        """)
        started = time.monotonic()
        code, _ = Launcher(tmp_path, quick, op.url).finish()
        assert code == 0
        assert time.monotonic() - started < 1.5
    finally:
        release.set()


class HoldingOperator:
    """Answers as the operator does when a running supervisor asks it to wait (waitSeconds):
    holds the poll until `decided` is set (then stop, for attempt 4) or the wait is up."""

    def __init__(self, operator, tmp_path):
        self.decided = threading.Event()
        self.released = threading.Event()  # the test's end: nothing is held past it
        self.held = []  # the waitSeconds of every held poll, as it began

        def answer(body):
            if body["state"] == "running" and body["attempt"] == 3 and body.get("waitSeconds"):
                self.held.append(body["waitSeconds"])
                deadline = time.monotonic() + body["waitSeconds"]
                while time.monotonic() < deadline and not self.released.is_set():
                    if self.decided.wait(0.05):
                        return {"action": "stop", "attempt": 4}
                return CONTINUE
            if body["state"] == "stopped" and body["attempt"] == 3:
                return {"action": "start", "attempt": 4, "env": RESTART_ENV}
            return CONTINUE

        self.op = operator(answer)


def test_a_held_poll_brings_the_operators_stop_as_soon_as_it_is_decided(tmp_path, operator):
    holding = HoldingOperator(operator, tmp_path)
    try:
        launcher = Launcher(tmp_path, SAVES_ON_SIGTERM, holding.op.url,
                            TRAINYARD_SUPERVISOR_WAIT_SECONDS="20")
        wait_for(lambda: (tmp_path / "child").exists() and holding.held)
        # The poll in flight is held for 20 s: only its answer can bring the stop in time.
        holding.decided.set()
        wait_for(lambda: (tmp_path / "attempt4").exists(), limit=10)
        code, err = launcher.finish()
    finally:
        holding.released.set()
    assert code == 0, err
    assert holding.held[0] == 20
    assert (tmp_path / "saved").exists()
    assert holding.op.reports() == [(3, "running"), (3, "stopped"), (4, "running")]


def test_a_held_poll_brings_the_start_of_the_next_attempt_as_soon_as_it_is_decided(
    tmp_path, operator
):
    start, released, held = threading.Event(), threading.Event(), []

    def answer(body):
        if body["state"] == "running" and body["attempt"] == 3:
            return {"action": "stop", "attempt": 4}
        if body["state"] == "stopped" and body["attempt"] == 3 and body.get("waitSeconds"):
            held.append(body["waitSeconds"])
            deadline = time.monotonic() + body["waitSeconds"]
            while time.monotonic() < deadline and not released.is_set():
                if start.wait(0.05):
                    return {"action": "start", "attempt": 4, "env": RESTART_ENV}
        return CONTINUE

    op = operator(answer)
    try:
        launcher = Launcher(tmp_path, SAVES_ON_SIGTERM, op.url,
                            TRAINYARD_SUPERVISOR_WAIT_SECONDS="20",
                            TRAINYARD_SUPERVISOR_HOLD_SECONDS="30")
        wait_for(lambda: held, limit=10)
        # Stopped, its poll held for 20 s: only the held answer can bring the start in time.
        start.set()
        wait_for(lambda: (tmp_path / "attempt4").exists(), limit=10)
        code, err = launcher.finish()
    finally:
        released.set()
    assert code == 0, err
    assert held[0] == 20
    assert op.reports() == [(3, "running"), (3, "stopped"), (4, "running")]


def test_a_command_that_fails_during_a_held_poll_is_reported_at_once(tmp_path, operator):
    holding = HoldingOperator(operator, tmp_path)
    try:
        script = command("""
        mark("child", str(os.getpid()))
        time.sleep(1)
        sys.exit(3)
        """)
        launcher = Launcher(tmp_path, script, holding.op.url,
                            TRAINYARD_SUPERVISOR_WAIT_SECONDS="20")
        # The running poll is held for 20 s; the exit is reported beside it, well before.
        wait_for(lambda: (3, "exited") in holding.op.reports(), limit=10)
        code, _ = launcher.finish()
    finally:
        holding.released.set()
    assert code == 3
    assert holding.held and all(body.get("exitCode") == 3 for body in holding.op.bodies()
                                if body["state"] == "exited")


def test_an_operator_that_answers_at_once_is_polled_every_interval_not_in_a_loop(
    tmp_path, operator
):
    op = operator()  # ignores waitSeconds, as an older operator does
    code, _ = Launcher(tmp_path, command("""
    time.sleep(1)
    sys.exit(0)
    """), op.url).finish()
    assert code == 0
    running = [b for b in op.bodies() if b["state"] == "running"]
    assert all(b["waitSeconds"] == 3 for b in running)
    assert 3 <= len(running) <= 15  # every 0.1 s for about a second


# The spare interpreter: the next attempt starts with its modules already imported.

WARM_MODULE = """
import os, pathlib
with open(pathlib.Path(os.environ["WARM_LOG"]), "a") as f:
    f.write(f"imported {os.getpid()}\\n")
if os.environ.get("WARM_DIES"):
    os._exit(3)
"""

# Attempt 3 waits for the stop; attempt 4 writes down where and how it runs.
RUNS_AGAIN = PRELUDE.replace('if attempt == "4":', 'if attempt == "5":') + """
import json
if attempt == "4":
    mark("attempt4", json.dumps({"pid": os.getpid(), "argv": sys.argv, "name": __name__,
                                 "x": os.environ.get("X"), "stdin": sys.stdin.read(),
                                 "comm": Path("/proc/self/comm").read_text().strip()}))
    sys.exit(0)
def save(signum, frame):
    sys.exit(143)
signal.signal(signal.SIGTERM, save)
mark("child", str(os.getpid()))
while True:
    time.sleep(1)
"""


def restarted_once(tmp_path, operator, **settings):
    """Runs RUNS_AGAIN under an operator that stops attempt 3 once the spare (if any) has
    imported and starts attempt 4; (exit code, stderr, attempt 4's record, the warm log at
    the start order)."""
    (tmp_path / "warmmod.py").write_text(WARM_MODULE)
    log = tmp_path / "warm.log"
    at_start = []

    def answer(body):
        if body["state"] == "running" and body["attempt"] == 3 and (tmp_path / "child").exists():
            # Once the spare (started 0.2 s after attempt 3) has imported, or died doing so.
            if log.exists() or not settings.get("TRAINYARD_WARM_IMPORTS", "warmmod"):
                return {"action": "stop", "attempt": 4}
        if body["state"] == "stopped" and body["attempt"] == 3:
            at_start.append(log.read_text() if log.exists() else "")
            return {"action": "start", "attempt": 4, "env": RESTART_ENV}
        return CONTINUE

    op = operator(answer)
    env = {"TRAINYARD_WARM_IMPORTS": "warmmod", "WARM_LOG": str(log),
           "PYTHONPATH": str(tmp_path), **settings}
    code, err = Launcher(tmp_path, RUNS_AGAIN, op.url, **env).finish()
    attempt4 = json.loads((tmp_path / "attempt4").read_text())
    return code, err, attempt4, at_start


def test_a_restart_in_place_runs_in_the_spare_that_imported_the_modules_ahead(
    tmp_path, operator
):
    code, err, attempt4, at_start = restarted_once(tmp_path, operator)
    assert code == 0, err
    # The spare imported the module before the start order, and became attempt 4.
    assert at_start == [f"imported {attempt4['pid']}\n"]
    assert (attempt4["name"], attempt4["argv"], attempt4["x"]) == (
        "__main__", ["-c", str(tmp_path)], "y")
    assert attempt4["stdin"] == ""  # the go line is not left for the command to read
    assert attempt4["comm"] == "trainyard-a4"  # /proc/<pid>/environ shows no attempt
    assert f"trainyard_launch.py: attempt 4 runs in the spare interpreter {attempt4['pid']}" in err


def test_a_spare_that_died_leaves_the_restart_to_a_new_process(tmp_path, operator):
    code, err, attempt4, at_start = restarted_once(tmp_path, operator, WARM_DIES="1")
    assert code == 0, err
    died = int(at_start[0].split()[1])
    assert attempt4["pid"] != died and attempt4["x"] == "y"
    assert not any("runs in the spare interpreter" in line for line in err)


def test_without_warm_imports_no_spare_is_started(tmp_path, operator):
    code, err, attempt4, at_start = restarted_once(tmp_path, operator, TRAINYARD_WARM_IMPORTS="")
    assert code == 0, err
    assert at_start == [""] and attempt4["x"] == "y"
    assert not any("spare interpreter" in line for line in err)


def load_launcher():
    import importlib.util
    spec = importlib.util.spec_from_file_location("trainyard_launch", LAUNCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_spare_runs_only_python_programs_of_the_launchers_interpreter(tmp_path):
    launch = load_launcher()
    py = sys.executable
    script = tmp_path / "tool"
    script.write_text(f"#!{py}\nprint('hi')\n")
    script.chmod(0o755)
    other = tmp_path / "other"
    other.write_text("#!/bin/sh\necho hi\n")
    other.chmod(0o755)
    flagged = tmp_path / "flagged"
    flagged.write_text(f"#!{py} -u\nprint('hi')\n")
    flagged.chmod(0o755)
    assert launch.spare_run([py, "-c", "code", "a"]) == (("code", "code"), ["-c", "a"])
    assert launch.spare_run([py, "-m", "pkg.mod", "a"]) == (
        ("module", "pkg.mod"), ["pkg.mod", "a"])
    assert launch.spare_run([py, "train.py", "a"]) == (
        ("path", os.path.abspath("train.py")), ["train.py", "a"])
    assert launch.spare_run([str(script), "a"]) == (("path", str(script)), [str(script), "a"])
    assert launch.spare_run([py, "-u", "train.py"]) is None  # interpreter flags: as it is
    assert launch.spare_run([str(other)]) is None  # not Python
    assert launch.spare_run([str(flagged)]) is None
    assert launch.spare_run(["/bin/sh", "-c", "true"]) is None
    assert launch.spare_run([str(tmp_path / "missing")]) is None
    # A virtual environment's python links to the same file from elsewhere: other packages.
    (tmp_path / "venv").mkdir()
    (tmp_path / "venv" / "python3").symlink_to(os.path.realpath(py))
    venv_tool = tmp_path / "venv_tool"
    venv_tool.write_text(f"#!{tmp_path / 'venv' / 'python3'}\nprint('hi')\n")
    venv_tool.chmod(0o755)
    assert launch.spare_run([str(venv_tool)]) is None


def test_a_link_beside_the_launchers_interpreter_is_that_interpreter(tmp_path, monkeypatch):
    launch = load_launcher()
    real = os.path.realpath(sys.executable)
    (tmp_path / "bin").mkdir()
    for name in ("python3.11", "python3"):
        (tmp_path / "bin" / name).symlink_to(real)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python3.11"))
    beside = str(tmp_path / "bin" / "python3")
    assert launch.spare_run([beside, "-c", "x"]) == (("code", "x"), ["-c"])


def test_a_standby_runs_nothing_and_waits_past_the_hold_until_the_operator_starts_its_attempt(
        tmp_path, operator):
    # TRAINYARD_ATTEMPT 4: the attempt the standby waits for; it reports 3 as stopped.
    started = time.monotonic()

    def answer(body):
        if time.monotonic() - started < 2:
            return CONTINUE
        return {"action": "start", "attempt": 4, "env": RESTART_ENV}

    op = operator(answer)
    code, err = Launcher(tmp_path, PRELUDE, op.url, TRAINYARD_ATTEMPT="4",
                         TRAINYARD_STANDBY="1").finish()
    assert code == 0, err
    # Run once, by the start order (its X): a run before it would have ended the launcher
    # with X unset.
    assert (tmp_path / "attempt4").read_text() == "4 y"
    reports = op.reports()
    assert reports[0] == (3, "stopped"), reports
    assert (4, "running") in reports
    # Held past its 0.5-s hold: a standby waits for the operator, not for the setting.
    assert time.monotonic() - started >= 2
    assert any("standby for attempt 4" in line for line in err), err
    assert any("runs in the spare interpreter" in line for line in err), err
    # Warming until its spare imported, said at once when it had.
    bodies = op.bodies()
    assert bodies[0].get("warming") is True, bodies[0]
    warm = [i for i, b in enumerate(bodies) if b["state"] == "stopped" and "warming" not in b]
    assert warm, bodies
    assert all(b.get("warming") is True for b in bodies[:warm[0]]), bodies
    assert any("standby for attempt 4: warm" in line for line in err), err
