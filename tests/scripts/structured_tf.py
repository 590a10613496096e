"""Train a Keras model with dict inputs from a shuffled tf.data pipeline, evaluate, and report.

    toolkit launch --spec S -- structured_tf.py --spec S --out DIR --model dict
    python structured_tf.py --reference --spec S --out DIR --model dict   # plain Keras loop

The data is the torch script's (tests/scripts/structured_data.py): integer tokens and float
features in a dict, integer labels. Rank 0 writes DIR/weights.npz and DIR/report.json; every
rank prints its weights digest.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import tensorflow as tf

sys.path.insert(0, str(Path(__file__).parent))
from structured_data import EPOCHS, HELD_OUT, TRAIN, VOCAB, WIDTH, arrays

from toolkit.report import print_json, weights_digest
from toolkit.spec import TrainSpec, load_spec


def build() -> keras.Model:
    tokens = keras.Input(shape=(3,), dtype="int64", name="tokens")
    features = keras.Input(shape=(WIDTH,), name="features")
    embedded = keras.layers.Embedding(VOCAB, WIDTH, name="embed")(tokens)
    pooled = keras.ops.mean(embedded, axis=1) + features
    hidden = keras.layers.Dense(WIDTH, activation="tanh", name="hidden")(pooled)
    logits = keras.layers.Dense(VOCAB, name="head")(hidden)
    model = keras.Model({"tokens": tokens, "features": features}, logits)
    rng = np.random.default_rng(0)  # the same start everywhere, whatever Keras' seeding
    model.set_weights([rng.normal(0, 0.3, w.shape).astype(np.float32) for w in model.weights])
    return model


def dataset(count: int, seed: int, shuffle_seed: int | None) -> tf.data.Dataset:
    data = arrays(count, seed)
    inputs = {"tokens": data["tokens"], "features": data["features"]}
    samples = tf.data.Dataset.from_tensor_slices((inputs, data["labels"]))
    if shuffle_seed is None:
        return samples
    return samples.shuffle(count, seed=shuffle_seed, reshuffle_each_iteration=True)


def loss_fn(logits: Any, labels: Any) -> Any:
    return keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)


def metric_fn(logits: Any, labels: Any) -> dict[str, Any]:
    predicted = tf.argmax(logits, axis=-1, output_type=labels.dtype)
    return {
        "loss_sum": tf.reduce_sum(loss_fn(logits, labels)),
        "correct": tf.reduce_sum(tf.cast(predicted == labels, tf.float64)),
        "count": tf.shape(labels)[0],
    }


def engine_run(spec: TrainSpec) -> tuple[dict[str, Any], dict, bool]:
    import toolkit

    run = toolkit.init(spec)
    with run.scope():
        model = build()
    expected_keys = [weight.path for weight in model.weights]
    run.prepare(model)
    train = run.loader(dataset(TRAIN, 1, spec.seed))
    held_out = run.loader(dataset(HELD_OUT, 2, None))
    losses: list[float] = []
    for batches in run.steps(train, epochs=EPOCHS):
        losses.append(run.train_step(batches, loss_fn))
        if len(losses) == train.steps_per_epoch:  # mid-training, beside the progress bar
            first_epoch = dict(run.evaluate(held_out, metric_fn))
    metrics = run.evaluate(held_out, metric_fn)
    weights = run.full_state_dict()
    print_json(rank=run.rank, weights_sha256=weights_digest(weights))
    report = {
        "losses": losses,
        "metrics": dict(metrics),
        "first_epoch": first_epoch,
        "keys": list(weights),
        "expected_keys": expected_keys,
    }
    is_main = run.is_main
    run.shutdown()
    return report, weights, is_main


def reference(spec: TrainSpec) -> tuple[dict[str, Any], dict]:
    """One process, plain Keras: each step is one batch of the global size, read from the same
    tf.data pipeline (its seeded shuffle gives the same order here as on every rank)."""
    from toolkit.backends.tf.optimizers import TorchAdam

    # A seeded shuffle's order depends on TF's global seed too, which toolkit.init sets.
    keras.utils.set_random_seed(spec.seed)
    model = build()
    opt = spec.optimizer
    optimizer = TorchAdam(
        learning_rate=opt.lr,
        beta_1=opt.betas[0],
        beta_2=opt.betas[1],
        epsilon=opt.eps,
        weight_decay=opt.weight_decay,
        decoupled=True,
    )
    train = dataset(TRAIN, 1, spec.seed).batch(spec.batch_for().global_, drop_remainder=True)
    held_out = next(iter(dataset(HELD_OUT, 2, None).batch(HELD_OUT)))

    def evaluate() -> dict[str, float]:
        found = metric_fn(model(held_out[0], training=False), held_out[1])
        return {name: float(value) for name, value in found.items()}

    losses, evaluations = [], []
    for _ in range(EPOCHS):
        for inputs, labels in train:
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(loss_fn(model(inputs, training=True), labels))
            # The embedding's gradient is IndexedSlices; the engines' accumulation densifies it.
            grads = [
                tf.convert_to_tensor(g) for g in tape.gradient(loss, model.trainable_variables)
            ]
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            losses.append(float(loss))
        evaluations.append(evaluate())
    weights = {w.path: np.asarray(w, dtype=np.float32) for w in model.weights}
    report = {
        "losses": losses,
        "metrics": evaluations[-1],
        "first_epoch": evaluations[0],
        "keys": list(weights),
    }
    return report, weights


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--model", choices=["dict"], required=True)
    parser.add_argument("--reference", action="store_true")
    args = parser.parse_args(sys.argv[1:])
    spec = load_spec(args.spec)
    if args.reference:
        tf.config.threading.set_intra_op_parallelism_threads(1)
        (report, weights), write = reference(spec), True
    else:
        report, weights, write = engine_run(spec)
    if write:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        np.savez(out / "weights.npz", **weights)
        (out / "report.json").write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    from toolkit.report import exit_on_user_error

    sys.exit(exit_on_user_error(main))
