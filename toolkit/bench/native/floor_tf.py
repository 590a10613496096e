"""The physical floor of a TensorFlow data-parallel step: the bench's Keras MLP, a compiled
GradientTape step with Keras SGD and momentum on this rank's samples, with no strategy and no
communication, then the gradient bytes moved once at memory speed (see _floor.py). Started by
the same launcher as the engines' runs, every rank at once; rank 0 writes the timings.

    python floor_tf.py --threads 1 --out timings.json
"""

from __future__ import annotations

import time

import _bench
import _floor
import tensorflow as tf
from _keras_model import mlp


def main() -> None:
    args = _bench.parse(_bench.parser(__doc__ or ""))
    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    rank = _floor.launcher_rank()
    tf.keras.utils.set_random_seed(args.seed)
    model = mlp(_bench.widths(args))
    optimizer = tf.keras.optimizers.SGD(learning_rate=args.lr, momentum=args.momentum)
    loss_object = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    move = _floor.GradientMove(sum(int(tf.size(v)) for v in model.trainable_variables))
    compute_s: list[float] = []

    @tf.function
    def train_step(inputs: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_object(labels, model(inputs, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    def step(batch: tuple[tf.Tensor, tf.Tensor]) -> tf.Tensor:
        start = time.perf_counter()
        loss = train_step(*batch).numpy()
        compute_s.append(time.perf_counter() - start)
        move()
        return loss

    data = [tuple(tf.constant(a) for a in b) for b in _bench.batches(args, rank)]
    clock, loss = _bench.time_steps(step, data, args)
    timed = slice(args.warmup, None)
    _bench.write(
        args,
        rank,
        1,
        clock,
        loss,
        {"compute_s": compute_s[timed], "move_s": move.seconds[timed]},
        engine="floor-tf",
        move_bytes=move.source.nbytes,
    )


if __name__ == "__main__":
    main()
