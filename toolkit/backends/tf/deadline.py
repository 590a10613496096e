"""`timeouts.collective_s` for MultiWorkerMirroredStrategy, held by one watchdog thread per rank
instead of TensorFlow's per-collective timeout.

`CommunicationOptions(timeout_seconds=T)` makes TensorFlow start, for every collective, a
thread that sleeps T seconds before it checks whether the collective finished
(tensorflow/core/common_runtime/base_collective_executor.cc: "TODO: Share the timeout watchdog
thread among collectives"; the option's docstring: "This should only be used for debugging").
A rank therefore holds T × (collectives per second) sleeping threads, enough for a fast step
to exhaust the machine's pid_max (docs/engine-notes.md, TensorFlow).

Instead each call of the backend that runs collectives (a step, a reduction) is timed by one
thread per rank. A call that runs longer than the timeout aborts the rank's collectives
(`abort_collective_ops`, what the strategy's own peer health check calls when a peer is
unreachable): the collective it waits in fails with DeadlineExceededError and this module's
message naming the rank and its host, the rank exits, and the launcher or `toolkit launch` ends
the job. The timeout so bounds a whole call, its compute included, where TensorFlow's bounded
each collective alone: a step that computes for longer than `timeouts.collective_s` needs a
longer timeout, which the message says.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

LONGEST_POLL_SECONDS = 1.0
"""The watchdog looks at the running call this often at most (a tenth of the timeout if that is
shorter): a job ends within the timeout plus this."""


class CallDeadline:
    """Bound every call made inside `bounded()` to `seconds`; on the first call that overruns,
    `abort(message)` is called once, from the watchdog thread, and the watchdog stops.
    `where` names the rank for the message ("rank 1 on host-a")."""

    def __init__(self, seconds: float, where: str, abort: Callable[[str], None]) -> None:
        self.seconds = seconds
        self._where = where
        self._abort = abort
        self._lock = threading.Lock()
        self._depth = 0
        self._started: float | None = None
        self._what = ""
        self._closed = threading.Event()
        self._poll = min(LONGEST_POLL_SECONDS, seconds / 10)
        self._watchdog = threading.Thread(
            target=self._watch, name="toolkit-collective-deadline", daemon=True
        )
        self._watchdog.start()

    @contextmanager
    def bounded(self, what: str) -> Iterator[None]:
        """Time the call `what` ("a training step"); a call inside another is part of it."""
        with self._lock:
            self._depth += 1
            if self._depth == 1:
                self._started, self._what = time.monotonic(), what
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    self._started = None

    def close(self) -> None:
        self._closed.set()
        self._watchdog.join()

    def _watch(self) -> None:
        while not self._closed.wait(self._poll):
            with self._lock:
                started, what = self._started, self._what
            if started is not None and time.monotonic() - started > self.seconds:
                self._abort(self.overrun_message(what))
                return

    def overrun_message(self, what: str) -> str:
        return (
            f"tf (MultiWorkerMirroredStrategy): {what} on {self._where} ran longer than "
            f"{self.seconds:g} s (timeouts.collective_s) waiting for its peers; one of them is "
            "dead or stalled, or the call computes for longer than that (then raise "
            "timeouts.collective_s)"
        )
