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

With TRAINYARD_SUPERVISOR_URL set (the operator sets it for a job with restartPolicy.inPlace)
the launcher is also the supervisor of in-place restarts. A gang restart then keeps the pods on
healthy nodes: their containers go on, and replacing the trainer's processes with the next
attempt's is this launcher's job, not the kubelet's (no new pod to schedule, image to pull or
volume to attach). Without the variable none of what follows happens. Every process of the
container but the launcher and its spare interpreter (below) belongs to the attempt, whatever
session it started: the command runs in a session of its own, and the launcher makes itself a
child subreaper, so that a process whose parent exits (the workers of a killed agent)
re-parents to it as to a container's first process; an attempt's processes are then the
launcher's descendants, or, when it is PID 1, every other process of the container (one entered
with kubectl exec too). The launcher polls the operator (a POST with the progress channel's
token, re-read each time as the kubelet rotates it) with its rank, attempt and state: running,
exited (the command failed on its own) or stopped (on the operator's order). Each poll asks the
operator to hold it for up to TRAINYARD_SUPERVISOR_WAIT_SECONDS (3) until the job's restart
decision changes, so that a stop, or the start of the next attempt, arrives as soon as it is
decided; an answer that comes sooner is followed by the next poll after
TRAINYARD_SUPERVISOR_POLL_SECONDS (1) while the command runs, a quarter second while it waits
for an order, and a change of state is reported at once, without waiting for the held answer.
The answer says what to do:

- continue: nothing.
- stop: a new attempt was decided. SIGTERM to the command (torchrun passes it to its
  workers, which save), and once it has exited to every process of the attempt it left; at
  TRAINYARD_STOP_GRACE_SECONDS (30) after the order, SIGKILL to every process of the attempt
  still there: torch 2.x starts each worker in a session of its own, and a worker blocked in
  a collective may ignore SIGTERM. A command that ran workers of its own in the attempt
  (torchrun's agent) is ended as soon as none is left, without the barrier rule's wait: the
  attempt is over, also when its workers failed before the stop came (a peer lost), leaving
  the agent blocked. One that never ran any (the trainer itself) gets the barrier rule.
  Only once nothing is left does it report stopped: the operator starts the next attempt on
  the strength of it, and a process of the old one would hold its GPUs or write an old
  checkpoint.
- start: the next attempt, with the environment the answer gives over the container's own
  (every variable a new pod of this rank would have), after waiting for its master as above.
  It runs in the spare interpreter when one is ready (below).
- exit: the job ended; exit with the command's code (stopping it first if it runs).

A restart in place still pays the next attempt's start-up, of which importing torch is most
(seconds, more with CUDA's libraries). So, when the command is a Python program of this
launcher's interpreter (`python SCRIPT`, `python -m MODULE`, `python -c CODE`, or a script
such as torchrun whose #! line names that interpreter), the launcher keeps a spare
interpreter: a process that imports TRAINYARD_WARM_IMPORTS (comma-separated, default torch;
empty: no spare) and then waits. It is started TRAINYARD_WARM_AFTER_SECONDS (10) after an
attempt starts, so that it takes no CPU from that start, or at the stop order if none is
ready by then. On the start order the spare gets the attempt's environment and arguments
and runs the command in its own process (runpy), with the modules already loaded; without a
spare (it died, or the command is not such a program) the command starts as a new process.
The spare runs nothing of an attempt before the start order, which comes only once every
process of the old attempt is gone, and it initialises no GPU by importing torch. It starts
with TRAINYARD_SPARE=1 and without TRAINYARD_ATTEMPT, and once handed attempt N it names
itself trainyard-aN (/proc/<pid>/comm): its /proc/<pid>/environ still shows the environment
it started with. A module imported ahead sees the container's environment, not the
attempt's: name only modules that read no per-attempt variable (TRAINYARD_*, RESUME_FROM,
MASTER_*, RANK...) when imported.

A standby (TRAINYARD_STANDBY=1: a replacement the operator created ahead of a termination
notice, beside the pod it replaces, for the attempt TRAINYARD_ATTEMPT) runs nothing at first:
it reports the attempt before its own as stopped, starts its spare interpreter at once (each
poll says "warming": true until the spare has imported: the operator asks for the switch once
its standbys are warm), and waits, without the hold's limit, for the operator's start order (then it starts that attempt
as above), its exit order, or its pod's deletion.

An operator that cannot be reached, or an answer the launcher does not know, means continue:
the command runs on (logged at most once a minute). When the command exits 0 the launcher
exits 0 at once: the rank finished. When it fails, what it left running is killed before
the launcher reports exited, with how long ago the command exited (exitedSecondsAgo), so
that a replica that hears it late, a new leader, still dates the failure right. Then, as
once it was stopped, the launcher waits up to TRAINYARD_SUPERVISOR_HOLD_SECONDS (30), or the
longer hold the operator's answers tell (holdSeconds: its own longest wait), for the
operator to start the next attempt, and exits with the command's code (143 when stopped).
An exit the operator has not answered within one held poll (TRAINYARD_SUPERVISOR_WAIT_SECONDS
plus 3 s) is not held at all: the launcher exits with the code, so that the pod shows the
failure as it would without a supervisor, and an operator that cannot be reached hides none.
SIGTERM or SIGINT to the launcher itself (the pod is
deleted) is passed on as above, and it exits with the command's code, waiting for no order.
Once every process of the attempt is gone it first says so in one last poll (state stopped,
at most FAREWELL_SECONDS): the operator may then start the next attempt on the replacements
it created ahead of a termination notice without waiting for this pod's teardown.
docs/env-contract.md describes the protocol, for a supervisor of your own.
"""

import ctypes
import errno
import json
import os
import queue
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

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
    return any(ppid == pid for _, _, ppid, _, _ in processes())


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


# The in-place restart supervisor (TRAINYARD_SUPERVISOR_URL; docs/env-contract.md).

WAITING_POLL_SECONDS = 0.25  # between polls while exited or stopped: a restart is imminent
HTTP_TIMEOUT_SECONDS = 2
QUIET_SECONDS = 60  # between two logged poll errors
FAREWELL_SECONDS = 0.5  # the last poll of a launcher whose pod is being deleted
GONE_SECONDS = 2  # for the leftovers of a command on the way out: the container ends anyway


def say(message):
    print(f"trainyard_launch.py: {message}", file=sys.stderr, flush=True)


def exit_status(code):
    """A Popen return code as a shell would give it: killed by signal N is 128 + N."""
    return 128 - code if code < 0 else code


def integer_setting(name):
    raw = os.environ.get(name)
    if raw is None:
        sys.exit(f"trainyard_launch.py: {name} is not set (TRAINYARD_SUPERVISOR_URL needs it)")
    if not raw.strip().isdigit():
        sys.exit(f"trainyard_launch.py: {name}={raw!r} is not a non-negative integer")
    return int(raw)


def processes():
    """(pid, state, ppid, process group, session) of every process, from /proc/<pid>/stat."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue  # ended while we looked
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) < 4 or not all(field.lstrip("-").isdigit() for field in fields[1:4]):
            continue
        yield int(entry), fields[0], int(fields[1]), int(fields[2]), int(fields[3])


PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>


def become_subreaper():
    """Makes this process the reaper of its descendants' orphans (prctl PR_SET_CHILD_SUBREAPER),
    as a container's first process is: a process of the attempt whose parent exits (the
    workers of a killed agent, a daemon that forked twice) re-parents to the launcher, and so
    stays among its descendants. Whether it is."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def attempt_processes(leader, keep=()):
    """The live processes of the attempt whose command is `leader`: every process but this
    launcher when it is PID 1 (its container's: they all belong to the attempt), else its
    descendants (a subreaper's, orphans included), and in any case those of the command's
    process group and session; less `keep` (the spare interpreter) and its descendants. A
    zombie counts as gone (it holds nothing); the launcher's own are reaped on the way, but
    not `leader`'s or `keep`'s, whose status their Popen needs."""
    me = os.getpid()
    table = list(processes())
    children = {}
    for pid, _, ppid, _, _ in table:
        children.setdefault(ppid, []).append(pid)

    def subtree(roots):
        found, todo = set(), [pid for pid in roots if pid is not None]
        while todo:
            pid = todo.pop()
            if pid not in found:
                found.add(pid)
                todo.extend(children.get(pid, ()))
        return found

    spared = subtree(keep)
    descendants = None if me == 1 else subtree([me])
    alive = set()
    for pid, state, ppid, group, session in table:
        if pid == me or pid in spared:
            continue
        if state in ("Z", "X"):
            if ppid == me and pid != leader:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
            continue
        if descendants is None or pid in descendants or leader in (group, session):
            alive.add(pid)
    return alive


def signal_each(pids, signum):
    for pid in pids:
        try:
            os.kill(pid, signum)
        except OSError:
            pass  # ended since


def described(pids):
    """`pids` for the log: each with its name, the first ten."""
    names = []
    for pid in sorted(pids)[:10]:
        try:
            with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
                names.append(f"{pid} ({f.read().strip()})")
        except OSError:
            names.append(str(pid))
    return ", ".join(names) + (f" and {len(pids) - 10} more" if len(pids) > 10 else "")


def parse_order(answer):
    """(action, attempt, env) from the operator's answer, None for continue; ValueError for
    one this launcher does not know."""
    if not isinstance(answer, dict):
        raise ValueError(f"the answer is not a JSON object: {json.dumps(answer)[:100]}")
    action = answer.get("action")
    if action == "continue":
        return None
    if action == "exit":
        return ("exit", None, {})
    if action not in ("stop", "start"):
        raise ValueError(f"unknown action {json.dumps(action)[:100]}")
    attempt = answer.get("attempt")
    if type(attempt) is not int or attempt < 0:
        raise ValueError(f"{action} without a valid attempt: {json.dumps(attempt)[:100]}")
    env = answer.get("env", {}) if action == "start" else {}
    if not isinstance(env, dict) or not all(
        isinstance(value, str) and "\0" not in value and name and "=" not in name
        and "\0" not in name
        for name, value in env.items()
    ):
        raise ValueError("start with an env that is not an object of variables and strings")
    return (action, attempt, env)


# The spare interpreter's program: import ahead, wait for the go (one JSON line on stdin:
# the environment, sys.argv and what to run), then become the command.
SPARE_PROGRAM = r"""
import importlib, json, os, resource, runpy, sys, time, types


def prepare():
    began, names = time.monotonic(), [n for n in sys.argv[1].split(",") if n]
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as err:
            print(f"trainyard_launch.py: spare interpreter: import {name}: {err}",
                  file=sys.stderr, flush=True)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"trainyard_launch.py: spare interpreter {os.getpid()} ready: imported "
          f"{', '.join(names)} in {time.monotonic() - began:.1f} s ({rss:.0f} MiB)",
          file=sys.stderr, flush=True)
    os.write(int(sys.argv[2]), b"r")
    os.close(int(sys.argv[2]))
    line = sys.stdin.readline()
    if not line:
        os._exit(0)
    go = json.loads(line)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.environ.clear()
    os.environ.update(go["env"])
    sys.argv = go["argv"]
    # /proc/<pid>/environ keeps showing the environment it started with (no attempt's): the
    # process's name tells which attempt it runs.
    try:
        with open("/proc/self/comm", "w") as f:
            f.write(f"trainyard-a{os.environ.get('TRAINYARD_ATTEMPT', '')}"[:15])
    except OSError:
        pass
    return go["run"]


def become(kind, target):
    if kind == "module":
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    elif kind == "path":
        sys.path[0] = os.path.dirname(target)
        runpy.run_path(target, run_name="__main__")
    else:
        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        exec(compile(target, "<string>", "exec"), vars(main))


become(*prepare())
"""


def same_interpreter(program):
    """Whether `program` (a name or path) is this launcher's Python interpreter: the same path,
    or a link to the same file in the same directory (python3 beside python3.11). A link from
    elsewhere is not: a virtual environment's python is a link to the system's, with other
    packages."""
    found = shutil.which(program)
    if found is None:
        return False
    found, mine = os.path.abspath(found), os.path.abspath(sys.executable)
    return found == mine or (os.path.dirname(found) == os.path.dirname(mine)
                             and os.path.realpath(found) == os.path.realpath(mine))


def spare_run(command):
    """What a spare interpreter runs for `command` ((kind, target), argv), or None when the
    command is not a Python program of this interpreter that it can run in-process."""
    if same_interpreter(command[0]):
        rest = command[1:]
        if len(rest) >= 2 and rest[0] in ("-c", "-m"):
            kind = "code" if rest[0] == "-c" else "module"
            argv = ["-c", *rest[2:]] if kind == "code" else [rest[1], *rest[2:]]
            return (kind, rest[1]), argv
        if rest and not rest[0].startswith("-"):
            return ("path", os.path.abspath(rest[0])), rest
        return None
    script = shutil.which(command[0])
    if script is None:
        return None
    try:
        with open(script, "rb") as f:
            first = f.readline(200).decode("utf-8", "replace").strip()
    except OSError:
        return None
    words = first[2:].split() if first.startswith("#!") else []
    if words and os.path.basename(words[0]) == "env":
        words = words[1:]
    if len(words) != 1 or not same_interpreter(words[0]):
        return None  # another interpreter, or one with flags: start it as it is
    script = os.path.abspath(script)
    return ("path", script), [script, *command[1:]]


class Spare:
    """A spare interpreter (module docstring), in a session of its own like the command."""

    READY_SECONDS = 60  # for its imports, once the start order came; then a new process

    def __init__(self, imports, run, argv):
        self.run, self.argv = run, argv
        self.ready, ready = os.pipe()  # a byte once it has imported; EOF: it died
        self.answer = None  # whether it imported (True) or died (False), once known
        try:
            # Of no attempt until it is handed one: no TRAINYARD_ATTEMPT, a mark instead.
            env = {k: v for k, v in os.environ.items() if k != "TRAINYARD_ATTEMPT"}
            self.process = subprocess.Popen(
                [sys.executable, "-c", SPARE_PROGRAM, imports, str(ready)],
                stdin=subprocess.PIPE, start_new_session=True, pass_fds=(ready,),
                env={**env, "TRAINYARD_SPARE": "1"})
        finally:
            os.close(ready)

    def poll_ready(self, timeout=0.0):
        """Whether it has imported (True) or died (False); None while it still imports."""
        if self.answer is None and select.select([self.ready], [], [], timeout)[0]:
            self.answer = os.read(self.ready, 1) == b"r"
        return self.answer

    def wait_ready(self, interrupted):
        """Whether it has imported and waits (for at most READY_SECONDS, until `interrupted()`);
        a spare that died before (a crash, the OOM killer) is never handed an attempt."""
        deadline = time.monotonic() + self.READY_SECONDS
        while not interrupted() and time.monotonic() < deadline:
            answer = self.poll_ready(0.1)
            if answer is not None:
                return answer
        return False

    def go(self, env, interrupted):
        """Hands the attempt over; its process, or None when the spare is not there for it."""
        if not self.wait_ready(interrupted):
            self.discard()
            return None
        line = json.dumps({"env": env, "argv": self.argv, "run": self.run}) + "\n"
        try:
            self.process.stdin.write(line.encode())
            self.process.stdin.close()
        except OSError:  # it died since
            self.discard()
            return None
        os.close(self.ready)
        return self.process

    def discard(self):
        os.close(self.ready)
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            self.process.stdin.close()
        except OSError:
            pass
        self.process.wait()


class Signalled(Exception):
    """SIGTERM or SIGINT came while no command ran (waiting for the master)."""


class Supervisor:
    """Runs the command's attempts (main thread) and polls the operator (a daemon thread, so
    that a slow or hanging poll never delays passing SIGTERM on or reaping the command). The
    poll thread only reports and hands the answers over; the main thread acts on them."""

    def __init__(self, command, stuck, master_wait):
        self.command = command
        self.stuck = stuck
        self.master_wait = master_wait
        self.grace = seconds_setting("TRAINYARD_STOP_GRACE_SECONDS", "30")
        self.hold = seconds_setting("TRAINYARD_SUPERVISOR_HOLD_SECONDS", "30")
        self.told_hold = 0.0  # what the operator said to hold, in any answer
        self.poll_seconds = seconds_setting("TRAINYARD_SUPERVISOR_POLL_SECONDS", "1")
        self.wait_seconds = seconds_setting("TRAINYARD_SUPERVISOR_WAIT_SECONDS", "3")
        # How long an exit may go unheard before the container ends with it: one held poll.
        self.ack = self.wait_seconds + HTTP_TIMEOUT_SECONDS + 1
        if self.poll_seconds == 0:
            sys.exit("trainyard_launch.py: TRAINYARD_SUPERVISOR_POLL_SECONDS='0' is not more "
                     "than 0")
        self.url = os.environ["TRAINYARD_SUPERVISOR_URL"]
        self.token_file = os.environ.get("TRAINYARD_PROGRESS_TOKEN_FILE")
        self.job = os.environ.get("TRAINYARD_JOB", "")
        self.rank = integer_setting("NODE_RANK")
        # What the poll thread reports, under the lock: the attempt this launcher runs or last
        # ran, its state and, when exited, the command's code.
        self.lock = threading.Lock()
        self.attempt = integer_setting("TRAINYARD_ATTEMPT")
        self.state = "running"
        # A standby waits for the start of its attempt as if the one before had stopped here.
        self.standby = os.environ.get("TRAINYARD_STANDBY") == "1" and self.attempt > 0
        if self.standby:
            self.attempt -= 1
            self.state = "stopped"
        self.exit_code = None
        self.exited_at = None  # when the command exited on its own (monotonic)
        self.exit_heard = False  # the operator answered a poll that reported the exit
        self.polling = True
        self.wake = threading.Event()  # report at once: the state changed
        self.orders = queue.Queue()
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self.last_complaint = None
        # The main thread's own.
        self.overlay = {}  # every start's env, each over the last
        self.child = None
        self.signalled = None  # SIGTERM or SIGINT to the launcher: the pod is being deleted
        self.sigterm_at = None  # when the command got SIGTERM (the barrier rule)
        self.childless_since = None
        self.stuck_killed = False
        self.stopping = None  # the operator's stop: {"decided", "deadline", "exit"}
        self.held_since = None
        self.ignored = set()
        self.warm_imports = ",".join(
            n.strip() for n in os.environ.get("TRAINYARD_WARM_IMPORTS", "torch").split(",")
            if n.strip())
        self.warm_after = seconds_setting("TRAINYARD_WARM_AFTER_SECONDS", "10")
        self.spare_for = spare_run(command) if self.warm_imports else None
        self.spare = None
        self.spare_due = None  # when to start the next attempt's spare
        # A standby whose spare still imports, said in each poll from the first.
        self.warming = self.standby and self.spare_for is not None

    # The poll thread.

    def poll_forever(self):
        while True:
            self.wake.clear()
            with self.lock:
                if not self.polling:
                    return
                body = {"job": self.job, "rank": self.rank, "attempt": self.attempt,
                        "state": self.state}
                if self.warming:
                    body["warming"] = True
                if self.state == "exited":
                    body["exitCode"] = self.exit_code
                    # Dates the exit for whichever replica leads, also one that hears it late.
                    body["exitedSecondsAgo"] = round(time.monotonic() - self.exited_at, 3)
                running = self.state == "running"
                interval = self.poll_seconds if running else WAITING_POLL_SECONDS
            sent = time.monotonic()
            if self.wait_seconds > 0:
                # The operator may hold it until the job's directive changes (a stop while the
                # command runs, a start while it waits): asked on a thread of its own, so that
                # a change of state here is reported at once.
                body["waitSeconds"] = self.wait_seconds
                answer = queue.Queue(maxsize=1)
                threading.Thread(target=lambda: (answer.put(self.ask(body)), self.wake.set()),
                                 name="supervisor-held", daemon=True).start()
                self.wake.wait(self.wait_seconds + HTTP_TIMEOUT_SECONDS)
                try:
                    answered, order = answer.get_nowait()
                except queue.Empty:
                    continue  # the state changed first: the held answer is dropped
            else:
                answered, order = self.ask(body)
            if answered and body["state"] == "exited":
                with self.lock:
                    if (self.state, self.attempt) == ("exited", body["attempt"]):
                        self.exit_heard = True
            if order is not None and self.polling:
                self.orders.put(order)
            # An operator that answers at once (no hold) is polled every interval; a change of
            # state, before or during that wait, is reported at once.
            self.wake.clear()
            with self.lock:
                same = ((self.state, self.attempt, self.warming)
                        == (body["state"], body["attempt"], "warming" in body))
            if same:
                self.wake.wait(max(0.0, interval - (time.monotonic() - sent)))

    def ask(self, body, timeout=None):
        """POSTs one poll: (whether the operator answered, its order or None for continue).
        An error is (False, None), logged at most once a minute."""
        try:
            if not self.token_file:
                raise ValueError("TRAINYARD_PROGRESS_TOKEN_FILE is not set")
            with open(self.token_file, encoding="utf-8") as f:
                token = f.read().strip()  # the kubelet rotates it: read it every time
            request = urllib.request.Request(
                self.url, json.dumps(body).encode(),
                {"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
                method="POST",
            )
            if timeout is None:
                timeout = HTTP_TIMEOUT_SECONDS + body.get("waitSeconds", 0)
            with self.opener.open(request, timeout=timeout) as response:
                if response.status != 200:
                    raise ValueError(f"HTTP {response.status}")
                answer = json.load(response)
                self.note_hold(answer)
                return True, parse_order(answer)
        except urllib.error.HTTPError as err:
            try:
                detail = err.read(300).decode("utf-8", "replace").strip()
            except Exception:
                detail = ""
            why = f"HTTP {err.code}" + (f": {detail}" if detail else "")
        except Exception as err:  # refused, timed out, not JSON, an unknown order
            why = str(err) or type(err).__name__
        now = time.monotonic()
        if self.last_complaint is None or now - self.last_complaint >= QUIET_SECONDS:
            self.last_complaint = now
            say(f"supervisor poll to {self.url}: {why} (taken as continue; logged at most once "
                "a minute)")
        return False, None

    def note_hold(self, answer):
        """Takes the hold the operator tells (holdSeconds: its own longest wait before it
        starts the next attempt here), when it is longer than the setting."""
        told = answer.get("holdSeconds") if isinstance(answer, dict) else None
        if isinstance(told, (int, float)) and not isinstance(told, bool) and told >= 0:
            self.told_hold = float(told)

    # The main thread.

    def report(self, state, exit_code=None, attempt=None):
        with self.lock:
            self.state, self.exit_code = state, exit_code
            self.exit_heard = False
            if attempt is not None:
                self.attempt = attempt
        self.wake.set()

    def on_signal(self, signum, frame):
        # No lock here: the main thread, which runs this, may hold it.
        self.signalled = signum
        self.polling = False  # no more polls: the pod is being deleted
        if signum == signal.SIGTERM and self.sigterm_at is None:
            self.sigterm_at = time.monotonic()
        if self.child is not None:
            self.child.send_signal(signum)  # a no-op once it has exited

    def nap(self, seconds):
        """wait_for_master's sleep: SIGTERM ends it."""
        end = time.monotonic() + seconds
        while self.signalled is None:
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, 0.1))
        raise Signalled

    def start_child(self):
        self.child, self.sigterm_at, self.childless_since = None, None, None
        self.stuck_killed, self.stopping, self.held_since = False, None, None
        self.exited_at = None
        # Whether the command has had processes of its own in this attempt (torchrun's
        # workers), looked for every second until it has.
        self.had_workers, self.workers_look = False, time.monotonic()
        env = {**os.environ, **self.overlay}
        try:
            wait_for_master(env, self.master_wait, sleep=self.nap)
        except Signalled:
            return
        spare, self.spare = self.spare, None
        self.child = None
        if spare is not None:
            self.child = spare.go(env, lambda: self.signalled is not None)
        if self.child is None:
            self.child = subprocess.Popen(self.command, env=env, start_new_session=True)
        else:
            say(f"attempt {self.attempt} runs in the spare interpreter {self.child.pid}")
        self.spare_due = time.monotonic() + self.warm_after
        if self.signalled is not None:  # came between the wait and the start
            if self.signalled == signal.SIGTERM:
                self.sigterm_at = time.monotonic()
            self.child.send_signal(self.signalled)

    def run(self):
        if os.getpid() != 1 and not become_subreaper():
            say("cannot become a child subreaper: a process of an attempt whose parent exits "
                "escapes its stop")
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)
        threading.Thread(target=self.poll_forever, name="supervisor", daemon=True).start()
        try:
            if self.standby:
                self.held_since = time.monotonic()
                say(f"standby for attempt {self.attempt + 1}: waiting for the operator's start")
                self.warm()
                if self.spare is None:
                    with self.lock:
                        self.warming = False
            else:
                self.start_child()
            while True:
                try:
                    order = self.orders.get(timeout=POLL_SECONDS)
                except queue.Empty:
                    order = None
                if order is not None and self.signalled is None:
                    code = self.obey(*order)
                    if code is not None:
                        return code
                if self.warming and (self.spare is None or self.spare.poll_ready() is not None):
                    with self.lock:
                        self.warming = False
                    say(f"standby for attempt {self.attempt + 1}: warm")
                    self.wake.set()  # said at once: the operator waits for it
                code = self.step()
                if code is not None:
                    return code
        finally:
            self.polling = False
            if self.spare is not None:
                self.spare.discard()

    def warm(self):
        """Starts the next attempt's spare interpreter, when the command can have one."""
        self.spare_due = None
        if self.spare is None and self.spare_for is not None and self.signalled is None:
            self.spare = Spare(self.warm_imports, *self.spare_for)

    def obey(self, action, decided, env):
        """Acts on the operator's order; the launcher's exit code when it says to exit now."""
        with self.lock:
            state, attempt = self.state, self.attempt
        if action == "exit":
            if state == "running":
                self.begin_stop(None, then_exit=True)
                return None
            code = self.exit_code if state == "exited" else 143
            say(f"the operator ended the job: exiting {code}")
            return code
        if action == "stop":
            # Otherwise an answer to a poll sent before the last change: nothing runs any more.
            if state == "running" and decided > attempt and self.child is not None:
                self.begin_stop(decided)
            return None
        # start
        if state == "running" or decided <= attempt:
            key = (decided, attempt, state)
            if key not in self.ignored and not (state == "running" and decided == attempt):
                self.ignored.add(key)  # (the same start again answers a poll sent before it)
                say(f"ignoring the operator's start of attempt {decided}: attempt {attempt} is "
                    f"{state}")
            return None
        self.overlay.update(env)
        self.standby = False
        with self.lock:
            self.warming = False
        say(f"starting attempt {decided} in place")
        self.report("running", attempt=decided)
        self.start_child()
        return None

    def begin_stop(self, decided, then_exit=False):
        if self.stopping is not None:
            self.stopping["exit"] |= then_exit
            return
        with self.lock:
            attempt = self.attempt
        why = "the job ended" if decided is None else f"attempt {decided} decided"
        say(f"stopping attempt {attempt} on the operator's order ({why}): SIGTERM to "
            f"{self.command[0]}, up to {self.grace:g} s to exit")
        now = time.monotonic()
        # Whether the command ran workers of its own (torchrun's agent does), now or earlier
        # in the attempt (workers that failed when a peer was lost leave their agent behind,
        # blocked in its rendezvous): once they are gone after the stop, nothing of the
        # attempt is left worth waiting for.
        self.stopping = {"why": why, "deadline": now + self.grace, "exit": then_exit,
                         "had_workers": self.had_workers or has_children(self.child.pid)}
        if self.sigterm_at is None:
            self.sigterm_at = now
        self.child.send_signal(signal.SIGTERM)
        if not then_exit:
            self.warm()  # a restart is coming: at least the stop overlaps the imports

    def step(self):
        """Checks the command and the clocks; the launcher's exit code when it is time to go."""
        now = time.monotonic()
        with self.lock:
            state, attempt, exit_code = self.state, self.attempt, self.exit_code
        if state in ("exited", "stopped"):
            code = exit_code if state == "exited" else 143
            if self.signalled is not None:
                if state == "stopped":
                    self.farewell()  # its report may not have gone out before the signal
                return code
            if self.standby:
                return None  # the operator starts it, ends the job, or deletes the pod
            hold = max(self.hold, self.told_hold)
            if now - self.held_since >= hold:
                say(f"no start from the operator within {hold:g} s: exiting {code}")
                return code
            if state == "exited" and not self.exit_heard and now - self.held_since >= self.ack:
                # Unheard, the exit would stay hidden in a running container: end it, as the
                # container would without a supervisor, so that the pod shows the failure.
                say(f"the operator did not answer the report of the exit within {self.ack:g} s: "
                    f"exiting {code}")
                return code
            return None
        if self.child is None:  # SIGTERM while it waited for the master
            self.farewell()
            return 128 + self.signalled
        if self.child.poll() is None:
            if now >= self.workers_look:
                self.leftovers(confirm=False)  # reaps the attempt's orphans that exited
                if not self.had_workers:
                    self.had_workers = has_children(self.child.pid)
                self.workers_look = now + 1
            if self.spare_due is not None and now >= self.spare_due:
                self.warm()
            self.enforce_stop(now)
            if self.child.poll() is None:
                return None
        code = 143 if self.stuck_killed else exit_status(self.child.returncode)
        if self.stopping is None and self.exited_at is None:
            self.exited_at = time.monotonic()
        if self.signalled is not None or (code == 0 and self.stopping is None):
            if self.kill_attempt(GONE_SECONDS) and self.signalled is not None:
                self.farewell()
            return code
        # Never report stopped or exited while a process of the attempt runs.
        if self.stopping is None:
            self.kill_attempt()
        elif not self.finish_stop():
            self.farewell()
            return code  # SIGTERM to the launcher: the pod is being deleted
        self.held_since = time.monotonic()
        if self.stopping is not None:
            say(f"attempt {attempt} stopped on the operator's order ({self.stopping['why']})")
            self.report("stopped")
            return code if self.stopping["exit"] else None
        self.report("exited", code)
        say(f"child exited {code}; holding for the operator's decision up to {self.hold:g} s")
        return None

    def farewell(self):
        """The pod is being deleted (SIGTERM or SIGINT to the launcher): once no process of
        the attempt is left, one last poll says the attempt stopped here (at most
        FAREWELL_SECONDS), so that the next attempt need not wait for the pod's teardown."""
        if self.child is not None and self.leftovers():
            return
        with self.lock:
            self.state = "stopped"
            body = {"job": self.job, "rank": self.rank, "attempt": self.attempt,
                    "state": "stopped"}
        self.ask(body, timeout=FAREWELL_SECONDS)

    def enforce_stop(self, now):
        """The operator's grace and the barrier rule for a command that got SIGTERM."""
        if self.stopping is not None and now >= self.stopping["deadline"]:
            say(f"{self.command[0]} did not exit within {self.grace:g} s of SIGTERM: killing "
                "its processes")
            # All at once, so that the agent cannot act on its workers' end.
            signal_each(self.leftovers(confirm=False) | {self.child.pid}, signal.SIGKILL)
            self.child.wait()
            return
        if self.sigterm_at is None:
            return
        if has_children(self.child.pid):
            self.childless_since = None
            return
        if self.stopping is not None and self.stopping["had_workers"]:
            # The operator's stop, and the workers it had have saved and exited: the attempt
            # is over, so its agent is not given the barrier rule's wait.
            say(f"{self.command[0]}'s workers exited on the operator's stop: stopping it")
            self.stuck_killed = True
        else:
            self.childless_since = self.childless_since or now
            if now - self.childless_since < self.stuck:
                return
            say(f"{self.command[0]} outlived its workers by {self.stuck:g} s after SIGTERM "
                "(torchrun's exit barrier): stopping it")
            self.stuck_killed = True
        # The command and what else its session holds; anything of the attempt still there
        # after that is ended as after any exit of the command (step).
        leader = self.child.pid
        signal_each({pid for pid, state, _, group, session in processes()
                     if leader in (group, session) and state not in ("Z", "X")} | {leader},
                    signal.SIGKILL)
        self.child.wait()

    def leftovers(self, confirm=True):
        """The live processes of the attempt (attempt_processes), the spare not among them.
        With `confirm`, none only when a second look 20 ms later finds none either: one whose
        parent ended as the first looked may have shown under neither."""
        keep = [self.spare.process.pid] if self.spare is not None else []
        left = attempt_processes(self.child.pid, keep)
        if not left and confirm:
            time.sleep(0.02)
            left = attempt_processes(self.child.pid, keep)
        return left

    def kill_attempt(self, limit=None):
        """SIGKILL to every process of the attempt until none is left (for at most `limit`
        seconds); whether none is."""
        started = time.monotonic()
        while True:
            left = self.leftovers()
            if not left:
                return True
            signal_each(left, signal.SIGKILL)
            if limit is not None and time.monotonic() - started >= limit:
                return False
            time.sleep(0.05)

    def finish_stop(self):
        """The command exited on the operator's stop: SIGTERM, once, to each process of the
        attempt it left (a worker in a session of its own, an orphan), and SIGKILL to those
        still there at the stop's deadline. Returns once none is left: True, or False when
        SIGTERM or SIGINT came to the launcher meanwhile (then they are killed at once, within
        GONE_SECONDS)."""
        termed = set()
        while self.signalled is None and time.monotonic() < self.stopping["deadline"]:
            left = self.leftovers()
            if not left:
                return True
            if left - termed:
                say(f"{self.command[0]} exited and left processes of the attempt: SIGTERM to "
                    f"{described(left - termed)}")
                signal_each(left - termed, signal.SIGTERM)
                termed |= left
            time.sleep(0.05)
        if self.signalled is not None:
            self.kill_attempt(GONE_SECONDS)
            return False
        left = self.leftovers()
        if left and termed:
            say(f"processes of the attempt still there {self.grace:g} s after the stop order: "
                f"killing {described(left)}")
        self.kill_attempt()
        return True


def main(argv):
    if len(argv) < 2:
        sys.exit("usage: trainyard_launch.py COMMAND [ARG]...")
    stuck = seconds_setting("SIGTERM_STUCK_SECONDS", "2")
    if os.environ.get("TRAINYARD_SUPERVISOR_URL"):
        supervisor = Supervisor(argv[1:], stuck, seconds_setting("MASTER_WAIT_SECONDS", "120"))
        try:
            return supervisor.run()
        except FileNotFoundError as err:
            sys.exit(f"trainyard_launch.py: {err}")
    wait_for_master(os.environ, seconds_setting("MASTER_WAIT_SECONDS", "120"))
    try:
        return run(argv[1:], stuck)
    except FileNotFoundError as err:
        sys.exit(f"trainyard_launch.py: {err}")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
