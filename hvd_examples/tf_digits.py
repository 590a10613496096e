"""Train a Keras MLP on the digits data with whichever TensorFlow engine the spec names.

    python hvd_examples/tf_digits.py --spec hvd_examples/specs/tf_mirrored.yaml   # 2 devices
    toolkit launch --spec hvd_examples/specs/tf_multiworker.yaml -- hvd_examples/tf_digits.py
    mpirun -np 2 python hvd_examples/tf_digits.py --spec hvd_examples/specs/tf_multiworker.yaml
    horovodrun -np 2 -H localhost:2 --gloo python hvd_examples/tf_digits.py \
        --spec hvd_examples/specs/horovod_tf.yaml

Rank 0 shows a progress bar and prints one JSON line of metrics; the exit status is 1 when the
held-out accuracy is below --min-accuracy.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras

import toolkit
from toolkit.datasets import digits
from toolkit.report import exit_on_user_error, print_json, weights_digest


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", help="the training spec; default: the one toolkit launch names")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--min-accuracy", type=float, default=0.9)
    parser.add_argument(
        "--save", help="save the final training state here (a checkpoint directory)"
    )
    return parser.parse_args(argv)


def build_model() -> keras.Model:
    return keras.Sequential(
        [
            keras.Input(shape=(64,)),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ]
    )


def loss_fn(logits: object, labels: object) -> object:
    return keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)


def main() -> int:
    args = parse_args(sys.argv[1:])
    spec = toolkit.load_spec(args.spec)
    run = toolkit.init(spec)
    data = digits()
    with run.scope():
        model = build_model()
    run.prepare(model)
    losses = []
    for micro_batches in run.steps(run.loader((data.x_train, data.y_train)), epochs=args.epochs):
        losses.append(run.train_step(micro_batches, loss_fn))
    weights = run.full_state_dict()
    if args.save:
        run.save(args.save)
    predictions = np.argmax(np.asarray(model(data.x_test)), axis=1)
    held_out = float((predictions == data.y_test).mean())
    print_json(rank=run.rank, weights_sha256=weights_digest(weights))
    if run.is_main:
        print_json(
            backend=spec.backend,
            launcher=run.env.launcher,
            world_size=run.world_size,
            replicas=run.dp_size,
            steps=len(losses),
            first_loss=losses[0],
            final_loss=losses[-1],
            accuracy=held_out,
            weights_checksum=float(sum(np.abs(w).sum() for w in weights.values())),
        )
    run.shutdown()
    return 0 if held_out >= args.min_accuracy else 1


if __name__ == "__main__":
    sys.exit(exit_on_user_error(main))
