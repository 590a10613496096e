"""Native Horovod for TensorFlow 2, as Horovod's TensorFlow 2 guide writes it: `hvd.init()`, a
`tf.function` step whose tape is wrapped in `hvd.DistributedGradientTape`, a Keras SGD optimizer,
and the variables broadcast from rank 0 after the first step. Tuning comes from the launcher.

Keras 3 (TF 2.21's tf.keras) variables have no `.ref()`, which the tape calls (horovod issue
4290), so gradients are taken with respect to each variable's underlying tf.Variable (`.value`):
the one change from the guide.

    horovodrun -np 2 -H localhost:2 --gloo python horovod_tf.py --out timings.json

`--torch-optimizer` swaps in the toolkit's torch-semantics SGD (a candidate cost, not native).
`--inter-op N` sizes the inter-op thread pool apart from `--threads` (a candidate setting).
"""

from __future__ import annotations

from typing import Any

import _bench
import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from _keras_model import mlp


def main() -> None:
    p = _bench.parser(__doc__ or "")
    p.add_argument("--torch-optimizer", action="store_true")
    p.add_argument("--inter-op", type=int, default=None, help="inter-op threads; unset = --threads")
    args = _bench.parse(p)
    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.inter_op or args.threads)
    hvd.init()
    rank, world = hvd.rank(), hvd.size()
    tf.keras.utils.set_random_seed(args.seed)
    model = mlp(_bench.widths(args))
    if args.torch_optimizer:
        from toolkit.backends.tf.optimizers import TorchSGD

        optimizer = TorchSGD(
            learning_rate=args.lr, momentum=args.momentum, weight_decay=0.0, nesterov=False
        )
    else:
        optimizer = tf.keras.optimizers.SGD(learning_rate=args.lr, momentum=args.momentum)
    loss_object = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def training_step(inputs: tf.Tensor, labels: tf.Tensor, first_batch: bool) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_object(labels, model(inputs, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, [v.value for v in model.trainable_variables])
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        if first_batch:
            hvd.broadcast_variables([v.value for v in model.variables], root_rank=0)
            hvd.broadcast_variables([v.value for v in optimizer.variables], root_rank=0)
        if args.loss_allreduce:
            return hvd.allreduce(loss, op=hvd.Average)
        return loss

    first = [True]

    def run(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        loss = training_step(x, y, first[0])
        first[0] = False
        return loss

    data = _bench.batches(args, rank)

    def step(batch: tuple[Any, Any]) -> tf.Tensor:
        if args.host_copy:
            # The toolkit stacks a step's micro-batches into one array and copies it to a tensor.
            batch = tuple(tf.constant(np.stack([array])[0]) for array in batch)
        return run(*batch)

    inputs = data if args.host_copy else [tuple(tf.constant(a) for a in b) for b in data]
    clock, loss = _bench.time_steps(step, inputs, args)
    _bench.write(args, rank, world, clock, loss, engine="horovod-tf")
    hvd.shutdown()


if __name__ == "__main__":
    main()
