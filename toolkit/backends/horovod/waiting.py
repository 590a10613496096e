"""Waiting for Horovod's torch operations without spinning a core.

Finding: Horovod 0.28's `synchronize(handle)` waits in a `sched_yield` loop
(`WaitAndClear` in horovod/torch/mpi_ops_v2.cc). While a peer is late, stalled or dead, the
waiting rank burns a whole core until the job is stopped: 84-95% of a core was measured for
the surviving rank of a 2-rank job whose other rank was SIGSTOPped (tests/test_stalled_engines).

The wait here spins as Horovod's does (poll, `sched_yield`) for the first `SPIN_S` of a wait,
then polls with a short, growing sleep: a few percent of a core for as long as a peer is late,
and at most `LONGEST_PAUSE_S` of extra latency once past the spin. `synchronize` then returns
at once. Finding: sleeping from the first poll, as this module did before, cost small messages
half their speed (`toolkit bench allreduce`: 6.2 ms fitted latency against Horovod's 3.5 ms over
Gloo, 0.5-0.7 of its bus bandwidth below 1 MiB). The likely reason, not measured apart: on a
host whose cores are all busy a sleeping thread runs again only when the scheduler gets to it,
which can be milliseconds rather than the microseconds asked for, while a spinning one is
still runnable when the operation completes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Any

import horovod.torch as hvd

SPIN_S = 0.02
"""Four Gloo-controller cycles (5 ms each): long enough for a small operation to complete, short
against any timeout that stops a job."""
FIRST_PAUSE_S = 20e-6
LONGEST_PAUSE_S = 500e-6


def wait_quietly(handles: Iterable[Any]) -> None:
    """Return once every handle's operation is done (or failed; `synchronize` raises it)."""
    spin_until = time.monotonic() + SPIN_S
    for handle in handles:
        pause = FIRST_PAUSE_S
        while not hvd.poll(handle):
            if time.monotonic() < spin_until:
                os.sched_yield()
                continue
            time.sleep(pause)
            pause = min(pause * 2, LONGEST_PAUSE_S)


def pending_gradient_handles(optimizer: Any) -> list[Any]:
    """The all-reduce handles a `hvd.DistributedOptimizer` will synchronize in `step()`.

    `_handles` maps a parameter (or a group of them) to (handle, context); a handle is None
    until the parameter's gradient hook fired, and callable for process sets that reduce
    without one. Horovod is pinned (0.28.1), so this private attribute is stable here."""
    return [h for h, _ in optimizer._handles.values() if h is not None and not callable(h)]
