"""Train a tiny Keras MLP for --steps optimizer steps, saving and resuming through checkpoint.dir.

    horovodrun -np 2 -H localhost:2 --gloo python resume_tf.py --spec S --steps 7 --out W.npz
    mpirun -np 2 python resume_tf.py --spec S --steps 7 --stop-at 5    # interrupted
    mpirun -np 2 python resume_tf.py --spec S --steps 7 --out W.npz    # resumes

The TensorFlow twin of resume_torch.py (same data, same loop): with checkpoint.dir and
every_steps in the spec, the run saves periodically and a new launch resumes from the latest
checkpoint by itself. --stop-at ends the run after that step, as a job that is stopped
would; --kill-at and --kill-once crash rank 1 once (crash_once.py); --step-seconds
slows every step down (a preemption test's signal then comes mid-run).
Rank 0 writes the final full weights to --out (.npz, Keras paths with "/" as "."), and every
rank prints one JSON line (rank, step, the step it resumed from).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import crash_once  # beside this script
import keras

import toolkit
from toolkit.report import print_json

SAMPLES, FEATURES, CLASSES = 256, 8, 4


def build_model() -> keras.Model:
    return keras.Sequential(
        [
            keras.Input(shape=(FEATURES,)),
            keras.layers.Dense(16, activation="tanh"),
            keras.layers.Dense(CLASSES),
        ]
    )


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(SAMPLES, FEATURES)).astype(np.float32)
    return x, (x[:, :CLASSES].argmax(axis=1)).astype(np.int64)


def loss_fn(logits: object, labels: object) -> object:
    return keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--stop-at", type=int, default=0)
    parser.add_argument("--out")
    crash_once.add_arguments(parser)
    parser.add_argument("--step-seconds", type=float, default=0.0, help="sleep after each step")
    args = parser.parse_args()
    spec = toolkit.load_spec(args.spec)
    run = toolkit.init(spec)
    with run.scope():
        model = build_model()
    run.prepare(model)
    resumed_from = run.step
    for micro_batches in run.steps(run.loader(data()), epochs=1000):
        if run.step >= args.steps:
            break
        run.train_step(micro_batches, loss_fn)
        crash_once.maybe_crash(args, run.rank, run.step)
        time.sleep(args.step_seconds)
        if run.step == args.stop_at:
            break
    weights = run.full_state_dict()
    if args.out and run.is_main:
        np.savez(args.out, **{name.replace("/", "."): value for name, value in weights.items()})
    print_json(rank=run.rank, step=run.step, resumed_from=resumed_from)
    run.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
