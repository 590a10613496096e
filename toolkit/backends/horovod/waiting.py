"""Waiting for Horovod's torch operations without spinning a core.

Finding: Horovod 0.28's `synchronize(handle)` waits in a `sched_yield` loop
(`WaitAndClear` in horovod/torch/mpi_ops_v2.cc). While a peer is late, stalled or dead, the
waiting rank burns a whole core until the job is stopped: 84-95% of a core was measured for
the surviving rank of a 2-rank job whose other rank was SIGSTOPped (tests/test_stalled_engines).
Polling the handle with a short, growing sleep first costs at most `LONGEST_PAUSE_S` of extra
latency per wait and a few percent of a core while waiting; `synchronize` then returns at once.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import horovod.torch as hvd

FIRST_PAUSE_S = 20e-6
LONGEST_PAUSE_S = 500e-6


def wait_quietly(handles: Iterable[Any]) -> None:
    """Return once every handle's operation is done (or failed; `synchronize` raises it)."""
    for handle in handles:
        pause = FIRST_PAUSE_S
        while not hvd.poll(handle):
            time.sleep(pause)
            pause = min(pause * 2, LONGEST_PAUSE_S)


def pending_gradient_handles(optimizer: Any) -> list[Any]:
    """The all-reduce handles a `hvd.DistributedOptimizer` will synchronize in `step()`.

    `_handles` maps a parameter (or a group of them) to (handle, context); a handle is None
    until the parameter's gradient hook fired, and callable for process sets that reduce
    without one. Horovod is pinned (0.28.1), so this private attribute is stable here."""
    return [h for h, _ in optimizer._handles.values() if h is not None and not callable(h)]
