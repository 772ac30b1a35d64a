"""torchrun as PyTorch 2.1 and later runs it, on the local cluster's torch 1.13: every worker
process starts in a session of its own (start_new_session=True), outside its agent's process
group and session. The chaos run's job runs its workers under it, so that its launcher must
stop workers that left the agent's session before it says an attempt stopped (the run's /proc
scans check that no older attempt's process outlives a newer attempt's first step).
Everything else is torch 1.13's own torchrun.

    python3 /app/torchrun_new_sessions.py [torchrun's arguments] script.py [its arguments]
"""
import subprocess
import sys

from torch.distributed.elastic.multiprocessing import api
from torch.distributed.run import main


def popen_in_a_new_session(self, args, env):
    return subprocess.Popen(args=args, env=env, stdout=self._stdout, stderr=self._stderr,
                            start_new_session=True)


api.SubprocessHandler._popen = popen_in_a_new_session

if __name__ == "__main__":
    sys.exit(main())
