"""Each rank reports what run.allreduce, run.broadcast and run.barrier gave it (2 ranks), and
the loss run.train_step returned for one step of a one-layer model on data of its own (every
input 1.0 on rank 0, 2.0 on rank 1), under the spec's step_loss, and the size of its
framework's thread pool."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import numpy as np

import toolkit
from toolkit.cores import each_thread
from toolkit.launch.environment import split_local_rank_arg


def main() -> int:
    argv, _ = split_local_rank_arg(sys.argv[1:])
    run = toolkit.init(toolkit.load_spec(argv[0]))
    mine = float(run.rank + 1)  # rank 0 has 1.0, rank 1 has 2.0
    total = run.allreduce([mine], op="sum")
    mean = run.allreduce([mine])
    from_rank_1 = run.broadcast([10.0 * run.rank + 7.0], root=1)
    run.barrier()
    loss = run.train_step(own_micro_batches(run), prepare_one_layer_model(run))
    report = {
        "rank": run.rank,
        "sum": float(total[0]),
        "mean": float(mean[0]),
        "broadcast": float(from_rank_1[0]),
        "step_loss": run.spec.step_loss,
        "loss": loss,
        "threads": compute_threads(run),
        "cores": thread_cores(),
        "in_place": reduce_in_place(run, mine),
    }
    print(json.dumps(report), flush=True)
    run.shutdown()
    return 0


def reduce_in_place(run: Any, mine: float) -> Any:
    """run.allreduce_ on a torch tensor: its sums, and whether it returned that same tensor;
    under TensorFlow, the message it refuses with."""
    if run.spec.framework_name != "torch":
        try:
            run.allreduce_([mine], op="sum")
        except toolkit.ToolkitError as error:
            return str(error)
        return "not refused"
    import torch

    tensor = torch.tensor([mine, 2.0 * mine])
    returned = run.allreduce_(tensor, op="sum")
    mean = run.allreduce_(torch.tensor([mine]))
    return {"sum": tensor.tolist(), "same": returned is tensor, "mean": mean.tolist()}


def thread_cores() -> list[list[int]]:
    """The cores each thread of this rank may run on, after a step: the engine's own threads
    (Gloo's, MPI's, TensorFlow's pools) have started by then."""
    return each_thread(lambda thread: sorted(os.sched_getaffinity(thread)))


def compute_threads(run: Any) -> int:
    """The size of the framework's intra-op thread pool, as the backend configured it."""
    if run.spec.framework_name == "torch":
        import torch

        return torch.get_num_threads()
    import tensorflow as tf

    return tf.config.threading.get_intra_op_parallelism_threads()


def own_micro_batches(run: Any) -> list[tuple[np.ndarray, np.ndarray]]:
    layout = run.layout()
    x = np.full((layout.micro, 4), run.rank + 1.0, dtype=np.float32)
    y = np.zeros(layout.micro, dtype=np.int64)
    return [(x, y)] * layout.accumulation


def prepare_one_layer_model(run: Any) -> Any:
    """Prepares a 4 -> 2 linear layer in the spec's framework; returns its loss function."""
    if run.spec.framework_name == "torch":
        import torch

        torch.manual_seed(0)
        run.prepare(torch.nn.Linear(4, 2))
        return torch.nn.functional.cross_entropy
    import keras

    with run.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    run.prepare(model)

    def loss_fn(logits: Any, labels: Any) -> Any:
        return keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)

    return loss_fn


if __name__ == "__main__":
    sys.exit(main())
