"""Waiting for Horovod's torch operations without spinning a core on a late or stalled peer.

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

A collective the user calls (`run.allreduce`, `run.allreduce_`, `run.broadcast`) under the MPI
controller spins for `spin_budget` of its bytes instead: as long as moving them takes at
`SPIN_BANDWIDTH_BYTES_S`, at least `SPIN_S`. Findings (2 ranks, launches of 24-40 rounds of
64 MiB in-place allreduces on one buffer, each wait's speed against Horovod's own wait in the
same rounds):
- over MPI a 64 MiB allreduce takes about 32 ms here, past the 20 ms spin, and the sleeps after
  it cost 0.4-3.0% of its speed (8 launches), where spinning for the whole operation cost
  nothing resolved (0.988-1.001, 6 launches). Sleeping in pauses of 1/256 of the time waited
  cost more (2.4-3.7%, 3 launches).
- over Gloo the same wait (about 62 ms) ran at 1.17-1.25 of the speed of Horovod's own, and
  spinning throughout at 1.00-1.03 (3 launches): Gloo moves the bytes through TCP, whose work in
  the kernel and in Gloo's threads needs the cores a spinning wait holds. Under Gloo every wait
  keeps `SPIN_S`.
A wait that lasts longer than its bytes could take is a wait for a peer, and gives the core
away as before.
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


SPIN_BANDWIDTH_BYTES_S = 0.5e9
"""A quarter of Horovod's allreduce bus bandwidth over MPI at 64 MiB here (about 2 GB/s;
`toolkit bench allreduce`), so that an operation still spins through on a slower machine."""


def spin_budget(nbytes: int, *, over_mpi: bool) -> float:
    """How long a wait for one operation on `nbytes` bytes spins before it sleeps."""
    if not over_mpi:
        return SPIN_S
    return max(SPIN_S, nbytes / SPIN_BANDWIDTH_BYTES_S)


def wait_quietly(handles: Iterable[Any], spin_s: float = SPIN_S) -> None:
    """Return once every handle's operation is done (or failed; `synchronize` raises it),
    spinning for the first `spin_s` seconds."""
    spin_until = time.monotonic() + spin_s
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
