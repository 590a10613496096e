"""Preemption on the rank side (`checkpoint.save_on_signal`): a signal asks the run to save and
stop at the next step boundary.

SIGTERM or SIGUSR1 only records that it came (a handler may run in the middle of a collective).
After each optimizer step every rank learns whether any rank got one, in one all-reduce of a
single number: the signal reaches ranks at different moments (Slurm signals each task, `toolkit
launch` each local rank), and all of them must save the same step. The run then saves, which
ends in a barrier past the commit, and every rank exits with PREEMPTED. No engine is imported:
the all-reduce is the backend's.
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType

import numpy as np

from toolkit.backends.base import Backend
from toolkit.exit_status import PREEMPTED
from toolkit.launch.preemption import SIGNALS


class Preemption:
    """The signals this rank has received since `install`."""

    def __init__(self) -> None:
        self.received: signal.Signals | None = None

    def install(self) -> None:
        """Record SIGTERM and SIGUSR1 from now on; only the main thread can install handlers,
        which is where `toolkit.init` runs in a training script."""
        if threading.current_thread() is not threading.main_thread():
            print(
                "toolkit: checkpoint.save_on_signal needs toolkit.init on the main thread; "
                "a signal stops this run without a save",
                file=sys.stderr,
                flush=True,
            )
            return
        for signum in SIGNALS:
            signal.signal(signum, self._record)

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self.received = signal.Signals(signum)

    def agreed(self, backend: Backend) -> bool:
        """Whether any rank has received a signal: collective, every rank calls it each step."""
        local = np.array([0.0 if self.received is None else 1.0])
        total = np.asarray(backend.allreduce(local, op="sum"), dtype=np.float64)
        return float(total[0]) > 0


def exit_preempted(step: int, saved: str, rank: int, received: signal.Signals | None) -> SystemExit:
    """What ends a preempted rank, after its save: said once, on rank 0."""
    if rank == 0:
        why = received.name if received is not None else "another rank's signal"
        print(
            f"toolkit: preempted ({why}): saved step {step} to {saved}; exiting with status "
            f"{PREEMPTED}",
            file=sys.stderr,
            flush=True,
        )
    return SystemExit(PREEMPTED)
