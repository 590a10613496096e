"""TrainSpec -> tf.distribute settings: TF_CONFIG per rank and communication options.

Pure: imports no engine. Rank i listens on its host at `tf.port` + i, in the same rank order
every launcher uses (hosts in order, slots filled). Under MultiWorkerMirroredStrategy every rank
is a worker; under `tf.strategy: parameter_server` rank 0 is the chief, the last `tf.ps` ranks
are parameter servers ("ps") and the ranks between are workers (`task_of`).

Ports are unique across the job, not per host: TensorFlow's gRPC server binds 0.0.0.0:port,
so "hosts" that share a machine (containers with host networking, the loopback test hosts)
would otherwise collide ("Could not start gRPC server"); a firewall needs one port range
either way.
"""

from __future__ import annotations

import json
from typing import Any

from toolkit.render.layout import rank_layout
from toolkit.spec import SpecError, TrainSpec


def worker_addresses(spec: TrainSpec) -> list[str]:
    """host:port of every rank, by rank."""
    return [f"{slot.host}:{spec.tf.port + slot.rank}" for slot in rank_layout(spec)]


def task_of(rank: int, world: int, ps: int | None) -> tuple[str, int]:
    """(task type, index) of `rank`: a worker of MultiWorkerMirroredStrategy when `ps` is None,
    else its parameter-server role (module docs)."""
    if ps is None:
        return "worker", rank
    if rank == 0:
        return "chief", 0
    workers = world - ps - 1
    return ("worker", rank - 1) if rank <= workers else ("ps", rank - 1 - workers)


def cluster_of(addresses: list[str], ps: int | None) -> dict[str, list[str]]:
    """TF_CONFIG's "cluster": the addresses (by rank) grouped by task type."""
    cluster: dict[str, list[str]] = {}
    for rank, address in enumerate(addresses):
        cluster.setdefault(task_of(rank, len(addresses), ps)[0], []).append(address)
    return cluster


def parameter_servers(spec: TrainSpec) -> int | None:
    """tf.ps under `tf.strategy: parameter_server`, else None (every rank a worker)."""
    return spec.tf.ps if spec.parameter_server else None


def rank_roles(spec: TrainSpec) -> dict[int, str]:
    """Each rank's role in a parameter-server job ("chief", "worker 0", "ps 0"); none for
    MultiWorkerMirroredStrategy, whose ranks are all workers in rank order."""
    ps = parameter_servers(spec)
    if ps is None:
        return {}
    roles = (task_of(rank, spec.world_size, ps) for rank in range(spec.world_size))
    return {
        rank: kind if kind == "chief" else f"{kind} {index}"
        for rank, (kind, index) in enumerate(roles)
    }


def survivable_ranks(spec: TrainSpec) -> dict[int, str]:
    """Ranks whose loss a job survives, each with why: the workers of a parameter-server job,
    whose steps the chief's coordinator runs on the other workers (TensorFlow's rule for the
    strategy); none otherwise."""
    why = "a worker of tf.strategy parameter_server: the chief runs its steps on the other workers"
    return {rank: why for rank, role in rank_roles(spec).items() if role.startswith("worker")}


def tf_config_of(addresses: list[str], rank: int, ps: int | None) -> str:
    """The TF_CONFIG JSON string of `rank`, given every rank's address."""
    return _tf_config(_encoded_cluster(addresses, ps), rank, len(addresses), ps)


def tf_config(spec: TrainSpec, index: int) -> str:
    """The TF_CONFIG JSON string of rank `index`."""
    addresses = worker_addresses(spec)
    if not 0 <= index < len(addresses):
        raise SpecError.single(
            "tf.worker_index", index, f"must be in [0, {len(addresses)})", hint="one per rank"
        )
    return tf_config_of(addresses, index, parameter_servers(spec))


def tf_configs(spec: TrainSpec) -> list[str]:
    """TF_CONFIG for every rank; the cluster is encoded once (linear in the ranks)."""
    addresses, ps = worker_addresses(spec), parameter_servers(spec)
    cluster = _encoded_cluster(addresses, ps)
    return [_tf_config(cluster, rank, len(addresses), ps) for rank in range(len(addresses))]


def _encoded_cluster(addresses: list[str], ps: int | None) -> str:
    return json.dumps(cluster_of(addresses, ps), separators=(",", ":"))


def _tf_config(cluster_json: str, rank: int, world: int, ps: int | None) -> str:
    kind, index = task_of(rank, world, ps)
    return f'{{"cluster":{cluster_json},"task":{{"type":"{kind}","index":{index}}}}}'


def local_rank_environments(spec: TrainSpec) -> list[dict[str, str]]:
    """What tf.distribute needs from the toolkit's local launcher, per rank: its TF_CONFIG."""
    return [{"TF_CONFIG": config} for config in tf_configs(spec)]


def communication_options(spec: TrainSpec) -> dict[str, Any]:
    """Keyword arguments of tf.distribute.experimental.CommunicationOptions, as names.

    The backend turns "RING" into CommunicationImplementation.RING.
    """
    return {"implementation": spec.tf.communication.upper()}
