"""Preemption on the supervisor's side: a SIGTERM or SIGUSR1 to `toolkit launch`, for a job
that saves on a signal (checkpoint.save_on_signal), is passed on to the ranks on this machine
as SIGUSR1; they save at their next step boundary and exit with status 75
(toolkit.runtime.preemption), and the job is stopped if they have not within `seconds`."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable

from toolkit.launch.heartbeat import RankRecord

SIGNALS = frozenset({signal.SIGTERM, signal.SIGUSR1})
"""What preempts a job that saves on a signal, sent to `toolkit launch` or to a rank."""


class PassOn:
    """A preemption under way: when it began, and the ranks already told."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds
        self.told: set[int] = set()

    def tell(self, ranks: Iterable[RankRecord], here: str) -> None:
        """SIGUSR1 to every rank on host `here` not told yet (ranks may join later)."""
        for record in ranks:
            if record.host != here or record.ended or record.pid in self.told:
                continue
            self.told.add(record.pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(record.pid, signal.SIGUSR1)

    def expired(self) -> bool:
        return time.monotonic() >= self.deadline
