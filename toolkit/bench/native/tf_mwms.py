"""Native tf.distribute MultiWorkerMirroredStrategy, as TensorFlow's "custom training loop with
MultiWorkerMirroredStrategy" tutorial writes it: TF_CONFIG from the launcher, the model and a
Keras SGD optimizer built in the strategy's scope, a `tf.function` that runs `strategy.run`
with `tf.nn.compute_average_loss` over the global batch and reduces the loss with
`strategy.reduce` (the tutorial's loss reporting, one collective per step).

    (each worker, its TF_CONFIG set) python tf_mwms.py --communication RING --out timings.json

`--torch-optimizer` swaps in the toolkit's torch-semantics SGD (a candidate cost, not native).
`--inter-op N` sizes the inter-op thread pool apart from `--threads` (a candidate setting).
`--collective-timeout S` passes TF's per-collective timeout, which the tutorial leaves out: TF
then starts a thread for every collective that sleeps S seconds (a candidate cost).
"""

from __future__ import annotations

from typing import Any

import _bench
import numpy as np
import tensorflow as tf
from _keras_model import mlp


def main() -> None:
    p = _bench.parser(__doc__ or "")
    p.add_argument("--communication", default=None, help="RING, NCCL or AUTO; unset = TF's")
    p.add_argument("--torch-optimizer", action="store_true")
    p.add_argument("--inter-op", type=int, default=None, help="inter-op threads; unset = --threads")
    p.add_argument("--collective-timeout", type=float, default=None, help="seconds; unset = TF's")
    args = _bench.parse(p)
    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.inter_op or args.threads)
    chosen: dict[str, Any] = {"timeout_seconds": args.collective_timeout}
    if args.communication:
        implementation = tf.distribute.experimental.CommunicationImplementation
        chosen["implementation"] = getattr(implementation, args.communication)
    options = tf.distribute.experimental.CommunicationOptions(**chosen)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    world = strategy.num_replicas_in_sync
    rank = strategy.cluster_resolver.task_id
    global_batch = args.micro * world
    tf.keras.utils.set_random_seed(args.seed)
    with strategy.scope():
        model = mlp(_bench.widths(args))
        if args.torch_optimizer:
            from toolkit.backends.tf.optimizers import TorchSGD

            optimizer = TorchSGD(
                learning_rate=args.lr, momentum=args.momentum, weight_decay=0.0, nesterov=False
            )
        else:
            optimizer = tf.keras.optimizers.SGD(learning_rate=args.lr, momentum=args.momentum)
        loss_object = tf.keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction="none"
        )

    @tf.function
    def train_step(inputs: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        def step_fn(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
            with tf.GradientTape() as tape:
                per_example = loss_object(y, model(x, training=True))
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        per_replica = strategy.run(step_fn, args=(inputs, labels))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    data = _bench.batches(args, rank)

    def step(batch: tuple[Any, Any]) -> tf.Tensor:
        if args.host_copy:
            # The toolkit stacks a step's micro-batches into one array and copies it to a tensor.
            batch = tuple(tf.constant(np.stack([array])[0]) for array in batch)
        return train_step(*batch)

    inputs = data if args.host_copy else [tuple(tf.constant(a) for a in b) for b in data]
    clock, loss = _bench.time_steps(step, inputs, args)
    _bench.write(args, rank, world, clock, loss, engine="tf-mwms")


if __name__ == "__main__":
    main()
