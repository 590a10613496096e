"""Nothing of a job outlives `toolkit launch`, even when it is SIGKILLed.

Two mechanisms, because neither covers everything alone:

- Each process the supervisor starts directly (the launcher, or the local ranks) gets
  PR_SET_PDEATHSIG=SIGTERM (Linux prctl, set in the child between fork and exec): the kernel
  sends it SIGTERM when the supervisor dies, and a launcher then stops its own ranks.
- The launchers' children are not ours, and a launcher that dies by SIGKILL, or is slow to stop
  its ranks (torchrun waits up to 30 s), would leave them running. So a watchdog process
  (`python -m toolkit.launch.watchdog JOB_ID STARTED_AT`, in a session of its own) is told the
  pid of every process of the job as the supervisor sees it appear. If the supervisor goes
  away without saying "done", the watchdog's stdin reaches end of file at once and it stops
  that tree and every process carrying the job's id (toolkit.launch.tree.ProcessTree.add_job):
  SIGTERM, then SIGKILL after `WATCHDOG_GRACE_SECONDS`; then it removes the engine files the
  job left in /dev/shm, as the supervisor would have (shm_leftovers.py). The id matters: the
  supervisor learns new pids every 0.2 s, and a launcher that dies of its SIGTERM at once
  (mpirun) leaves ranks started since the last of those with no parent link to anything the
  watchdog knows.

The parent-death signal goes to the child when the *thread* that started it exits; the
supervisor starts and waits for its processes in the same thread, so this only fires when
the supervisor is gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1
WATCHDOG_GRACE_SECONDS = 2.0

try:
    _prctl: Callable[..., int] | None = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: the watchdog alone
    _prctl = None


def die_with_parent(parent: int) -> Callable[[], None] | None:
    """A preexec_fn giving the child SIGTERM when `parent` dies (None where unsupported).
    It only calls prctl and getppid: nothing that could take a lock in the forked child."""
    prctl = _prctl
    if prctl is None:
        return None

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


class Watchdog:
    """The supervisor's end of the watchdog process."""

    def __init__(self, job_id: str, started_at: float) -> None:
        """`started_at`: when the job started, a time.time() (its /dev/shm files are newer)."""
        self._process = subprocess.Popen(
            [sys.executable, "-m", "toolkit.launch.watchdog", job_id, repr(started_at)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )

    def watch(self, pids: list[int]) -> None:
        """Add processes of the job."""
        if not pids:
            return
        stdin = self._process.stdin
        assert stdin is not None  # PIPE above
        with contextlib.suppress(OSError):
            stdin.write("".join(f"{pid}\n" for pid in pids).encode())
            stdin.flush()

    def close(self) -> None:
        """The job is over and stopped: the watchdog may leave without doing anything."""
        stdin = self._process.stdin
        assert stdin is not None
        with contextlib.suppress(OSError):
            stdin.write(b"done\n")
            stdin.close()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
