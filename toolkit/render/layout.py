"""Which rank runs where, and on which device: the one rank order every renderer shares.

Hosts are taken in order and filled slot by slot (Open MPI's `--map-by slot`, and the order
the deepspeed launcher, torchrun and Slurm's block distribution use). Ranks beyond the slots
(mpirun --oversubscribe) wrap around the hosts again.

Under `device: cuda` each rank binds `cuda:<local rank>` (toolkit.device), so a host's ranks are
also its GPUs: the launchers' per-host process counts stay the ranks per host, and what a
cluster is asked for per host (`requested_gpus`) is `launch.gpus_per_host`, else those ranks.
`device: auto` asks a cluster for no GPU: a job that wants GPUs there says `device: cuda`.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolkit import engines
from toolkit.cores import threads_per_rank, usable_cores
from toolkit.device import Device, process_group_backend
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


def gpus_per_host(spec: TrainSpec) -> int:
    """GPUs each host gives the job under CUDA: `launch.gpus_per_host`, else one per rank of
    the busiest host (each replica of a one-process MirroredStrategy job counting as one)."""
    if spec.launch.gpus_per_host is not None:
        return spec.launch.gpus_per_host
    return max(ranks_per_host(spec)) * spec.replicas_per_process()


def requested_gpus(spec: TrainSpec) -> int | None:
    """GPUs per host a cluster job (Slurm, MPIJob) asks for: `gpus_per_host` for device cuda,
    None for cpu and auto, which request no GPU."""
    return gpus_per_host(spec) if spec.device == "cuda" else None


def _collectives(spec: TrainSpec) -> str:
    """What carries the collectives between GPUs, from the engine table's features: engines
    with their own controllers (Horovod) use the NCCL operations they were built with, TF's
    strategies the spec's tf.communication, torch engines NCCL process groups."""
    if engines.engine(spec.backend, spec.framework_name).controllers:
        return "Horovod's NCCL operations where Horovod was built with them"
    if spec.framework_name == "tensorflow":
        return f"tf.communication {spec.tf.communication}"
    return process_group_backend("cuda").upper()


def device_binding(spec: TrainSpec) -> str:
    """Under CUDA, how the ranks take their GPUs and what carries their collectives."""
    replicas = spec.replicas_per_process()
    if replicas > 1:
        binding = f"one process, its {replicas} replicas on cuda:0..{replicas - 1}"
    else:
        binding = "one GPU per rank (rank r binds cuda:<local rank>)"
    return f"{binding}, {_collectives(spec)}"


def device_summary(spec: TrainSpec, here: Device | None = None) -> str:
    """One line for people on the device the ranks train on: under CUDA the GPUs per host,
    each rank's binding and the collective backend. `here` is what `auto` resolved to on this
    host, when the ranks run here."""
    if spec.device == "cpu":
        return "device: cpu"
    named = "cuda"
    if spec.device == "auto":
        if here is None:
            return "device: auto (each rank: cuda where its host shows a GPU, else cpu)"
        if here == "cpu":
            return "device: auto (cpu on this host: no GPU visible)"
        named = "auto (cuda on this host)"
    gpus = gpus_per_host(spec)
    counted = f"{gpus} GPU{'' if gpus == 1 else 's'} per host"
    return f"device: {named}, {counted}, {device_binding(spec)}"
