"""Raw allreduce paths, each the engine's own call with nothing of the toolkit around it.

A path is built once per process and then asked for an operation per message size: a closure
that runs one in-place (or, where the engine has none, out-of-place) SUM allreduce of a float32
buffer of that size, allocated and touched before timing. Engines are imported only by the
path that needs them, so a launch loads only its own. A name with the suffix `AGAIN` is a
second, separate instance of the same path: the bench's A/A.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

Operation = Callable[[], Any]
PathFactory = Callable[[Any], Callable[[int], Operation]]
"""run -> (elements -> operation)"""


def torch_gloo(run: Any) -> Callable[[int], Operation]:
    """torch.distributed.all_reduce on the default (gloo) group, in place."""
    import torch
    import torch.distributed as dist

    def make(elements: int) -> Operation:
        tensor = torch.ones(elements, dtype=torch.float32)
        return lambda: dist.all_reduce(tensor)

    return make


def mpi4py_allreduce(run: Any) -> Callable[[int], Operation]:
    """MPI_Allreduce through mpi4py on numpy buffers (Open MPI chooses the algorithm)."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD

    def make(elements: int) -> Operation:
        send = np.ones(elements, dtype=np.float32)
        receive = np.zeros(elements, dtype=np.float32)
        return lambda: comm.Allreduce(send, receive, op=MPI.SUM)

    return make


def horovod_torch(run: Any) -> Callable[[int], Operation]:
    """hvd.allreduce_ (in place) with op=Sum; Horovod's controller is the launcher's."""
    import horovod.torch as hvd
    import torch

    def make(elements: int) -> Operation:
        tensor = torch.ones(elements, dtype=torch.float32)
        name = f"bench.raw.{elements}"
        return lambda: hvd.allreduce_(tensor, op=hvd.Sum, name=name)

    return make


def tf_collective(run: Any) -> Callable[[int], Operation]:
    """A cross-worker all_reduce in replica context, compiled once per size, on the strategy
    the process already runs (MultiWorkerMirroredStrategy: TF's collective ops)."""
    import tensorflow as tf

    strategy = run.backend.strategy

    def make(elements: int) -> Operation:
        tensor = tf.ones([elements], dtype=tf.float32)

        @tf.function
        def reduce() -> Any:
            context_sum = tf.distribute.ReduceOp.SUM
            return strategy.run(
                lambda: tf.distribute.get_replica_context().all_reduce(context_sum, tensor)
            )

        reduce()  # trace before timing
        return reduce

    return make


def toolkit_allreduce(run: Any) -> Callable[[int], Operation]:
    """`run.allreduce(tensor, op="sum")` on a tensor of the run's framework."""
    framework = run.spec.framework_name

    def make(elements: int) -> Operation:
        if framework == "torch":
            import torch

            tensor: Any = torch.ones(elements, dtype=torch.float32)
        else:
            import tensorflow as tf

            tensor = tf.ones([elements], dtype=tf.float32)
        return lambda: run.allreduce(tensor, op="sum")

    return make


def toolkit_allreduce_in_place(run: Any) -> Callable[[int], Operation]:
    """`run.allreduce_(tensor, op="sum")`: in place, on a torch tensor."""
    import torch

    def make(elements: int) -> Operation:
        tensor = torch.ones(elements, dtype=torch.float32)
        return lambda: run.allreduce_(tensor, op="sum")

    return make


PATHS: dict[str, PathFactory] = {
    "torch-gloo": torch_gloo,
    "mpi4py": mpi4py_allreduce,
    "horovod-torch": horovod_torch,
    "tf-collective": tf_collective,
    "toolkit": toolkit_allreduce,
    "toolkit-inplace": toolkit_allreduce_in_place,
}


AGAIN = "-again"


def factory(name: str) -> PathFactory:
    """The path `name` names: one of PATHS, or one of them with the suffix AGAIN."""
    return PATHS[name.removesuffix(AGAIN)]


def memcpy(elements: int) -> Operation:
    """One core copying the buffer (numpy's copyto is a single-threaded memcpy)."""
    source = np.ones(elements, dtype=np.float32)
    target = np.zeros(elements, dtype=np.float32)
    return lambda: np.copyto(target, source)
