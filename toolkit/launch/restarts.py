"""Starting a failed job again (`launch.max_restarts`): the toolkit's own supervisor restarts
the whole job, under every launcher alike.

A fault ends the job as it always does (every rank stopped, nothing left behind, the report
printed); then the same plan starts again and its ranks resume from checkpoint.dir by
themselves (toolkit.runtime.resume), up to `max_restarts` times. An end that was asked for
is final: Ctrl-C, --timeout, a preemption (status 75: the next start is the scheduler's), a
SIGTERM to `toolkit launch` (which never returns here), a save that failed (status 74: the
next start would fail the same way).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from toolkit.launch.outcome import LaunchResult


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class CannotRestart(Exception):
    """The job cannot start again (toolkit.launch.elastic: too few ranks answer); the
    message says why."""


def with_restarts(
    start: Callable[[int], LaunchResult],
    max_restarts: int,
    resume_point: Callable[[], str],
    report: Callable[[str], None] = say,
) -> LaunchResult:
    """Run `start(restart)` (0 for the first start) until it succeeds, ends on request, or
    has failed `max_restarts` + 1 times; the last result is returned. Before each restart
    `report` gets the failure's report and one line: which restart, from where
    (`resume_point()`), how long the failed attempt ran. A start that raises CannotRestart
    ends the job with the failure before it, and the reason in one line."""
    began = time.monotonic()
    result = start(0)
    for restart in range(1, max_restarts + 1):
        if result.ok or result.by_request or result.preempted or result.save_failed:
            break
        report(f"toolkit launch: {result.report()}")
        report(
            f"toolkit launch: restart {restart} of {max_restarts} after "
            f"{time.monotonic() - began:.0f} s, continuing from {resume_point()}"
        )
        began = time.monotonic()
        try:
            result = start(restart)
        except CannotRestart as reason:
            report(f"toolkit launch: not restarting: {reason}")
            break
    return result
