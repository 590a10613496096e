"""How many compute threads each rank runs: the spec's number, or with `auto` the cores this
process may use shared evenly by the ranks of its host.

The engines' own choices differ: torch and TensorFlow start one thread per core in every
process, Horovod, mpirun and the deepspeed launcher leave that as it is (deepspeed sets
OMP_NUM_THREADS only with --bind_cores_to_rank), torchrun sets OMP_NUM_THREADS=1 whenever it
starts more than one process. Ranks that together run more threads than there are cores make
the compute threads fight the engines' communication threads (seen on 2 cores), and ranks
with one thread each leave the cores of a larger host idle; `auto` gives each rank its share.

Where `auto` is resolved: once, by the renderers, into OMP_NUM_THREADS, with the cores of the
machine that renders the launch and the ranks of the busiest host (the hosts of one job are
taken to be alike); for a cluster (Slurm, MPIJob), as Slurm's own one CPU per task, since the
machine that renders such a job tells nothing of the nodes that run it. Each rank then sizes
torch's or TensorFlow's thread pool from that OMP_NUM_THREADS, and resolves `auto` itself only
when it was started without one (a launcher run by hand). A neutral module: renderers and
backends both use it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Literal, TypeVar

from toolkit.errors import ToolkitError

Threads = int | Literal["auto"]
T = TypeVar("T")


def usable_cores() -> int:
    """The cores this process may run on: its affinity mask, which taskset, cpusets and
    Slurm's task binding narrow, rather than the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # platforms without sched_getaffinity (macOS)
        return os.cpu_count() or 1


def threads_per_rank(setting: Threads, ranks_on_host: int, cores: int) -> int:
    """`setting` itself, or for `auto` an even share of `cores` among `ranks_on_host` ranks
    (at least one thread: more ranks than cores oversubscribe whatever is chosen)."""
    if setting != "auto":
        return setting
    return max(1, cores // max(1, ranks_on_host))


def threads_in_rank(setting: Threads, ranks_on_host: int, env: Mapping[str, str]) -> int:
    """What a rank gives torch's or TensorFlow's thread pools: the number written, else the
    OMP_NUM_THREADS its launch set (the toolkit's renderers resolve `auto` there, torchrun sets
    1), else an even share of the cores this rank may use."""
    if setting != "auto":
        return setting
    launched_with = env.get("OMP_NUM_THREADS", "")
    if launched_with.isdigit() and int(launched_with) > 0:
        return int(launched_with)
    return threads_per_rank("auto", ranks_on_host, usable_cores())


def core_share(cores: Sequence[int], local_rank: int, ranks_on_host: int) -> list[int]:
    """The cores local rank `local_rank` of `ranks_on_host` is bound to under
    `launch.bind_cores`: an even, contiguous slice of `cores` (the host's usable cores, in
    order), the remainder left unused so that every rank gets as many; with fewer cores than
    ranks, core `local_rank mod len(cores)`, shared."""
    ordered = sorted(cores)
    if len(ordered) < ranks_on_host:
        return [ordered[local_rank % len(ordered)]]
    per_rank = len(ordered) // ranks_on_host
    return ordered[local_rank * per_rank : (local_rank + 1) * per_rank]


def bind_to_cores(cores: Sequence[int]) -> None:
    """This process, each thread it has started so far among them, onto `cores`.

    sched_setaffinity binds one thread (pid 0 is the calling thread, not the process); a
    thread inherits its creator's mask, so the threads an engine starts later (Gloo's, MPI's,
    Horovod's background thread, the compute pools) follow the main thread's. The ones started
    before, such as an engine's import-time threads, are bound here one by one."""
    mask = set(cores)
    each_thread(lambda thread: os.sched_setaffinity(thread, mask))


def each_thread(act: Callable[[int], T]) -> list[T]:
    """`act` on each thread of this process by its id (/proc/self/task), leaving out the
    threads that end between the listing and their call."""
    results = []
    for task in os.listdir("/proc/self/task"):
        try:
            results.append(act(int(task)))
        except ProcessLookupError:  # the thread ended since the listing
            continue
    return results


def bind_rank(bind: bool, local_rank: int, ranks_on_host: int) -> None:
    """Under `launch.bind_cores`, this rank onto its share of the cores it may use (which a
    launcher's or Slurm's own binding may already have narrowed: the share is taken inside
    it); otherwise nothing, and the kernel moves threads between cores as it likes."""
    if not bind:
        return
    if not hasattr(os, "sched_setaffinity"):
        raise ToolkitError(
            "launch.bind_cores: true needs the kernel's sched_setaffinity, which this platform "
            "lacks",
            "set launch.bind_cores: false",
        )
    bind_to_cores(core_share(list(os.sched_getaffinity(0)), local_rank, ranks_on_host))
