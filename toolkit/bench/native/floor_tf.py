"""The physical floor of a TensorFlow data-parallel step: the bench's Keras MLP, a compiled
GradientTape step with SGD and momentum on this rank's samples, with no strategy and no
communication, then the gradient bytes moved once at memory speed (see _floor.py). The update is
the cheapest TensorFlow has, one fused kernel per weight (the toolkit's TorchSGD,
toolkit.backends.tf.optimizers), not Keras' SGD, whose several element-wise passes would raise
the floor. Started by
the same launcher as the engines' runs, every rank at once; rank 0 writes the timings.

    python floor_tf.py --threads 1 --out timings.json
"""

from __future__ import annotations

from typing import Any

import _bench
import _floor
import tensorflow as tf
from _keras_model import mlp

from toolkit.backends.tf.optimizers import TorchSGD


def main() -> None:
    args = _bench.parse(_bench.parser(__doc__ or ""))
    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    rank = _floor.launcher_rank()
    tf.keras.utils.set_random_seed(args.seed)
    model = mlp(_bench.widths(args))
    optimizer = TorchSGD(
        learning_rate=args.lr, momentum=args.momentum, weight_decay=0.0, nesterov=False
    )
    loss_object = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(inputs: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_object(labels, model(inputs, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    def compute(batch: tuple[tf.Tensor, tf.Tensor]) -> Any:
        return train_step(*batch).numpy()  # .numpy(): the step has finished before the move

    parameters = sum(int(tf.size(v)) for v in model.trainable_variables)
    step = _floor.FloorStep(compute, parameters)
    data = [tuple(tf.constant(a) for a in b) for b in _bench.batches(args, rank)]
    clock, loss = _bench.time_steps(step, data, args)
    step.write(args, rank, clock, loss, engine="floor-tf")


if __name__ == "__main__":
    main()
