"""Which rank runs where: the one rank order every renderer shares.

Hosts are taken in order and filled slot by slot (Open MPI's `--map-by slot`, and the order
the deepspeed launcher, torchrun and Slurm's block distribution use). Ranks beyond the slots
(mpirun --oversubscribe) wrap around the hosts again.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.cores import threads_per_rank, usable_cores
from toolkit.spec import Host, TrainSpec

LOCALHOST = "localhost"


@dataclass(frozen=True, kw_only=True)
class Slot:
    """One rank's place in the job."""

    rank: int
    """Global rank."""
    host: str
    """Host name the rank runs on."""
    node: int
    """Index of that host."""
    local_rank: int
    """Rank among the ranks on that host."""
    local_size: int
    """Ranks on that host."""


def job_hosts(spec: TrainSpec) -> tuple[Host, ...]:
    """The spec's hosts, or this machine with np slots."""
    return spec.hosts or (Host(name=LOCALHOST, slots=spec.world_size),)


def ranks_per_host(spec: TrainSpec) -> list[int]:
    """How many ranks each host runs: its slots filled in host order, the ranks beyond all
    slots dealt round the hosts again, the first hosts first."""
    filled, left = [], spec.world_size
    for host in job_hosts(spec):
        filled.append(min(host.slots, left))
        left -= filled[-1]
    extra, first_hosts = divmod(left, len(filled))
    return [count + extra + (node < first_hosts) for node, count in enumerate(filled)]


def rank_layout(spec: TrainSpec) -> list[Slot]:
    """Every rank's host and local rank."""
    hosts = job_hosts(spec)
    nodes = [node for node, host in enumerate(hosts) for _ in range(host.slots)]
    nodes = nodes[: spec.world_size]
    nodes += [extra % len(hosts) for extra in range(spec.world_size - len(nodes))]
    counts = ranks_per_host(spec)
    seen = [0] * len(hosts)
    slots = []
    for rank, node in enumerate(nodes):
        slots.append(
            Slot(
                rank=rank,
                host=hosts[node].name,
                node=node,
                local_rank=seen[node],
                local_size=counts[node],
            )
        )
        seen[node] += 1
    return slots


def uniform_slots(spec: TrainSpec) -> int | None:
    """Slots per host when every host has the same number, else None."""
    slots = {host.slots for host in job_hosts(spec)}
    return slots.pop() if len(slots) == 1 else None


def rendered_threads(spec: TrainSpec) -> int:
    """OMP_NUM_THREADS for every rank: `launch.threads_per_rank`, with `auto` resolved on this
    machine for its busiest host (toolkit.cores)."""
    busiest = max(ranks_per_host(spec))
    return threads_per_rank(spec.launch.threads_per_rank, busiest, usable_cores())


def cluster_threads(spec: TrainSpec) -> int:
    """Threads per rank of a job a cluster places (Slurm, MPIJob): the number written, or for
    `auto` one, Slurm's own CPU per task, since the machine that renders the job tells nothing
    of the nodes that will run it."""
    setting = spec.launch.threads_per_rank
    return 1 if setting == "auto" else setting
