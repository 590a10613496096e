"""Probe: what Horovod's fusion buffer costs on the bench MLP's gradients (issue 13).

Horovod copies the tensors it fuses into its buffer and back out after the reduction; a tensor
reduced alone is reduced where it lies (`MPIAllreduce::Execute`, horovod/common/ops). This
probe all-reduces the eight gradient tensors of the bench's MLP (512-2048-2048-512-10, 25 MB),
as a step's optimizer does, and prints rank 0's median ms over `--reps` rounds, for whatever
HOROVOD_FUSION_THRESHOLD the launch sets. Under Open MPI, for example:

    for bytes in 67108864 1048576 0; do
      HOROVOD_FUSION_THRESHOLD=$bytes HOROVOD_CYCLE_TIME=1 OMP_NUM_THREADS=1 \
      OMPI_MCA_mpi_yield_when_idle=1 mpirun -np 2 -x HOROVOD_FUSION_THRESHOLD \
      -x HOROVOD_CYCLE_TIME -x OMP_NUM_THREADS -x OMPI_MCA_mpi_yield_when_idle \
      .venv/bin/python scripts/horovod_fusion_probe.py --framework tf
    done
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

LAYERS = (512, 2048, 2048, 512, 10)


def shapes() -> list[tuple[int, ...]]:
    pairs = itertools.pairwise(LAYERS)
    return [shape for fan_in, fan_out in pairs for shape in ((fan_in, fan_out), (fan_out,))]


def torch_round() -> tuple[Callable[[], None], int]:
    import horovod.torch as hvd
    import torch

    torch.set_num_threads(1)
    hvd.init()
    tensors = [torch.ones(shape) for shape in shapes()]

    def reduce_all() -> None:
        handles = [
            hvd.allreduce_async_(tensor, op=hvd.Average, name=f"gradient.{index}")
            for index, tensor in enumerate(tensors)
        ]
        for handle in handles:
            hvd.synchronize(handle)

    return reduce_all, hvd.rank()


def tf_round() -> tuple[Callable[[], None], int]:
    import horovod.tensorflow as hvd
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    hvd.init()
    tensors = [tf.ones(shape) for shape in shapes()]

    @tf.function
    def reduce_all(values: list[Any]) -> Any:
        # As arguments, not captured: Horovod names each op after its graph tensor.
        return [hvd.allreduce(value, op=hvd.Average) for value in values]

    return lambda: reduce_all(tensors)[-1].numpy(), hvd.rank()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--framework", choices=("torch", "tf"), default="torch")
    parser.add_argument("--reps", type=int, default=40)
    args = parser.parse_args()
    reduce_all, rank = torch_round() if args.framework == "torch" else tf_round()
    for _ in range(5):
        reduce_all()
    seconds = []
    for _ in range(args.reps):
        start = time.perf_counter()
        reduce_all()
        seconds.append(time.perf_counter() - start)
    if rank == 0:
        threshold = os.environ.get("HOROVOD_FUSION_THRESHOLD", "Horovod's default")
        print(
            f"{args.framework}, HOROVOD_FUSION_THRESHOLD={threshold}: median "
            f"{statistics.median(seconds) * 1e3:.2f} ms, least {min(seconds) * 1e3:.2f} ms"
        )


if __name__ == "__main__":
    main()
