"""How a launch ended, and the one exit-status convention of `toolkit launch`.

Whatever the launcher, `toolkit launch` exits with:

    0      every rank finished with status 0
    1      a rank failed: it exited with a non-zero status (the report says which), or the
           launcher failed and no rank's own end explains it
    2      a usage or spec error: nothing was started
    74     a checkpoint could not be saved (disk full, permissions) and checkpoint.save_failure
           is stop; every checkpoint saved before is intact
    75     preempted: a signal asked the job to stop, and every rank saved a checkpoint first
           (checkpoint.save_on_signal); a new launch resumes from it
    124    the job ran past --timeout, or a rank stalled (no heartbeat for --stall-timeout)
    128+N  a rank, or the launcher itself, was killed by signal N (137: SIGKILL)
    130    toolkit launch was interrupted (Ctrl-C); every rank was stopped first

A SIGTERM to `toolkit launch` stops every rank and then ends `toolkit launch` by that same
SIGTERM (143 in a shell), so that a caller running many launches stops as well.

The launchers themselves disagree (the same SIGKILLed rank gives 137 under mpirun, 1 under
torchrun and horovodrun, 247 under deepspeed), so the status is derived from how the rank that
failed first ended, as the supervisor saw it, never from the launcher's own status unless no
rank's end is known.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from toolkit.exit_status import PREEMPTED, SAVE_FAILED

OK = 0
RANK_FAILED = 1
USAGE_ERROR = 2
TIMED_OUT = 124  # what coreutils' timeout returns
INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for Ctrl-C
SIGNAL_BASE = 128

EXIT_STATUS_HELP = """exit status, the same under every launcher:
  0      every rank finished with status 0
  1      a rank failed: it exited non-zero (the report names it and its status)
  2      usage or spec error; nothing was started
  74     a checkpoint could not be saved (save_failure: stop); earlier ones are intact
  75     preempted: every rank saved a checkpoint, then stopped (save_on_signal)
  124    --timeout passed, or a rank stalled (no heartbeat for --stall-timeout)
  128+N  a rank (or the launcher) was killed by signal N, e.g. 137 for SIGKILL
  130    interrupted (Ctrl-C); the ranks were stopped first
A SIGTERM stops the ranks, then ends toolkit launch by that SIGTERM (143)."""


def describe_status(status: int | None) -> str:
    """A Popen-style status (negative: killed by that signal) in words."""
    if status is None:
        return "ended (its exit status was not seen)"
    if status == PREEMPTED:
        return f"was preempted (saved a checkpoint, exited with status {PREEMPTED})"
    if status == SAVE_FAILED:
        return f"could not save a checkpoint (exited with status {SAVE_FAILED})"
    if status >= 0:
        return f"exited with status {status}"
    try:
        return f"was killed by {signal.Signals(-status).name}"
    except ValueError:  # a real-time signal has no name
        return f"was killed by signal {-status}"


def exit_code(status: int | None) -> int:
    """The launch's exit status for a process that ended with `status` (Popen-style)."""
    if status is None:
        return RANK_FAILED
    if status < 0:
        return SIGNAL_BASE - status
    if status in (PREEMPTED, SAVE_FAILED):
        return status
    return OK if status == 0 else RANK_FAILED


def signal_in(launcher_status: int) -> int | None:
    """The signal a launcher's own status reports (Popen's negative status, or a shell-style
    128+N such as mpirun's 137 for a SIGKILLed rank), Popen-style; None when it shows none."""
    if launcher_status < 0:
        return launcher_status
    if SIGNAL_BASE < launcher_status <= SIGNAL_BASE + 64:
        return SIGNAL_BASE - launcher_status
    return None


@dataclass(frozen=True)
class LaunchResult:
    """How a launch ended; `returncode` follows the convention above."""

    returncode: int
    failed_rank: int | None = None
    """The rank that failed first, when known (under every launcher whose ranks call
    `toolkit.init`, and always under the local launcher)."""
    failed_host: str | None = None
    """The host that rank ran on, when known."""
    reason: str = ""
    """One line: what ended the job, empty on success."""
    tail: tuple[str, ...] = ()
    """The last stderr lines of the rank that failed first."""
    launcher_tail: tuple[str, ...] = ()
    """The launcher's own last lines of output (stdout and stderr, without the ranks' tagged
    lines): the launchers report a failed rank in words of their own."""
    by_request: bool = False
    """The job was stopped because it was asked to be (Ctrl-C, --timeout), not by a fault:
    such an end is never restarted (toolkit.launch.restarts)."""

    @property
    def ok(self) -> bool:
        return self.returncode == OK

    @property
    def preempted(self) -> bool:
        return self.returncode == PREEMPTED

    @property
    def save_failed(self) -> bool:
        return self.returncode == SAVE_FAILED

    def report(self) -> str:
        """The reason, then the failed rank's stderr tail and the launcher's, for printing."""
        if self.ok:
            return "launch succeeded"
        lines = [self.reason]
        if self.tail:
            whose = "" if self.failed_rank is None else f" of rank {self.failed_rank}"
            lines.append(f"last stderr lines{whose}:")
            lines += [f"  {line}" for line in self.tail]
        if self.launcher_tail:
            lines.append("last lines of the launcher:")
            lines += [f"  {line}" for line in self.launcher_tail]
        return "\n".join(lines)
