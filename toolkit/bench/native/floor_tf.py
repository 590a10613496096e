"""The physical floor of a TensorFlow data-parallel step: the bench's Keras MLP, a compiled
GradientTape step with SGD and momentum on this rank's samples, with no strategy and no
communication, then the gradient bytes moved once at memory speed (see _floor_parts.py, which
says why the update is the toolkit's fused TorchSGD). Started by the same launcher as the
engines' runs, every rank at once; rank 0 writes the timings.

    python floor_tf.py --threads 1 --out timings.json
"""

from __future__ import annotations

import _bench
import _floor
import tensorflow as tf

from toolkit.bench.native._floor_parts import FloorStep, tf_compute


def main() -> None:
    args = _bench.parse(_bench.parser(__doc__ or ""))
    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    rank = _floor.launcher_rank()
    tf.keras.utils.set_random_seed(args.seed)
    step = FloorStep(*tf_compute(_bench.widths(args), args.lr, args.momentum))
    data = [tuple(tf.constant(a) for a in b) for b in _bench.batches(args, rank)]
    clock, loss = _bench.time_steps(step, data, args)
    _floor.write(args, rank, step, clock, loss, engine="floor-tf")


if __name__ == "__main__":
    main()
