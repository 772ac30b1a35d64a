"""SIGTERM for a training process, heard even while its main thread is blocked.

Python runs a signal handler only between the main thread's bytecodes, so a rank blocked in
a collective with a lost peer (torch's call holds it until the collective's timeout) would
never see SIGTERM and would hold its GPUs, and the gang's next attempt, until the grace
period's SIGKILL. `Sigterm`'s handler only sets a flag, which the main loop reads at each
step boundary (`boundary()`), where it saves and exits as usual. The signal also writes a
byte to a wakeup socket (`signal.set_wakeup_fd`, done by the interpreter's C handler in
whichever thread the signal lands), read by a thread of its own: if the main loop reaches no
step boundary within `stuck_seconds` of its last one, it is blocked, and the thread runs
`on_stuck` while it holds `state` and ends the process with the code `on_stuck` returns. The
clock runs from the last boundary, not from the signal: a step under way gets the rest of its
`stuck_seconds`, and a rank that has hung in a collective for longer (the operator's hang
restart comes only after `progressTimeoutSeconds` without progress) saves and exits at once. The trainer changes its
weights and its step count only under `state`, so what `on_stuck` saves is the last step
completed on every rank, never half of one.

Used by examples/train.py; it only needs the standard library.
"""

import os
import signal
import socket
import sys
import threading
import time


class Sigterm:
    """Call from the main thread, before anything else handles SIGTERM (module docstring)."""

    def __init__(self, stuck_seconds):
        self.stuck_seconds = stuck_seconds
        self.requested = threading.Event()
        self.at_boundary = threading.Event()
        self.last_boundary = time.monotonic()  # the start counts as one
        # Held while the model, the optimizer and the step count change, and while saving.
        self.state = threading.RLock()
        self._wakeup, writer = socket.socketpair()
        writer.setblocking(False)
        self._writer = writer  # kept open for the process's life
        signal.signal(signal.SIGTERM, lambda signum, frame: self.requested.set())
        signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)

    def watch(self, on_stuck):
        """Starts the thread that waits for SIGTERM; `on_stuck()` returns an exit code."""
        threading.Thread(target=self._wait, args=(on_stuck,), daemon=True).start()

    def boundary(self):
        """At a step boundary: True when SIGTERM came (the main loop then saves and exits)."""
        if self.requested.is_set():
            self.at_boundary.set()
            return True
        self.last_boundary = time.monotonic()
        return False

    def _wait(self, on_stuck):
        while self._wakeup.recv(1) != bytes([signal.SIGTERM]):
            pass
        self.requested.set()
        left = self.last_boundary + self.stuck_seconds - time.monotonic()
        if self.at_boundary.wait(max(0.0, left)):
            return
        with self.state:
            code = on_stuck()
            sys.stdout.flush()
            os._exit(code)
