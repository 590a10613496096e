"""TrainSpec -> tf.distribute settings: TF_CONFIG per worker and communication options.

Pure: imports no engine. Worker i listens on its host at `tf.port` + i, in the same rank order
every launcher uses (hosts in order, slots filled). Ports are unique across the job, not per
host: TensorFlow's gRPC server binds 0.0.0.0:port, so "hosts" that share a machine (containers
with host networking, the loopback test hosts) would otherwise collide ("Could not start gRPC
server"); a firewall needs one port range either way.
"""

from __future__ import annotations

import json
from typing import Any

from toolkit.render.layout import rank_layout
from toolkit.spec import SpecError, TrainSpec


def worker_addresses(spec: TrainSpec) -> list[str]:
    """host:port of every worker, by worker index."""
    return [f"{slot.host}:{spec.tf.port + slot.rank}" for slot in rank_layout(spec)]


def tf_config(spec: TrainSpec, index: int) -> str:
    """The TF_CONFIG JSON string of worker `index`."""
    workers = worker_addresses(spec)
    if not 0 <= index < len(workers):
        raise SpecError.single(
            "tf.worker_index", index, f"must be in [0, {len(workers)})", hint="one per rank"
        )
    return _tf_config(json.dumps(workers, separators=(",", ":")), index)


def tf_configs(spec: TrainSpec) -> list[str]:
    """TF_CONFIG for every worker; the worker list is encoded once (linear in the ranks)."""
    workers = json.dumps(worker_addresses(spec), separators=(",", ":"))
    return [_tf_config(workers, index) for index in range(spec.world_size)]


def _tf_config(workers_json: str, index: int) -> str:
    return f'{{"cluster":{{"worker":{workers_json}}},"task":{{"type":"worker","index":{index}}}}}'


def local_rank_environments(spec: TrainSpec) -> list[dict[str, str]]:
    """What MultiWorkerMirroredStrategy needs from the toolkit's local launcher, per rank:
    its TF_CONFIG."""
    return [{"TF_CONFIG": config} for config in tf_configs(spec)]


def communication_options(spec: TrainSpec) -> dict[str, Any]:
    """Keyword arguments of tf.distribute.experimental.CommunicationOptions, as names.

    The backend turns "RING" into CommunicationImplementation.RING.
    """
    return {"implementation": spec.tf.communication.upper()}
