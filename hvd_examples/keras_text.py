"""Train a small Keras transformer on this repository's text, on either TensorFlow engine.

The Keras counterpart of gpt_text.py: the same bytes (text_common), the same GPT-2 shape (2
blocks of width 64 with 2 causal attention heads, GELU MLP, pre-layer-norm), built from Keras
layers, fed by a tf.data pipeline shuffled with the spec's seed. Each sample is (the block's
first 63 bytes, its last 63): the model returns logits and the loss is the next-byte cross
entropy. The script never names an engine or a launcher:

    S=hvd_examples/specs
    toolkit launch --spec $S/gpt_tf_multiworker.yaml -- hvd_examples/keras_text.py \
        --spec $S/gpt_tf_multiworker.yaml
    horovodrun -np 2 -H localhost:2 --gloo python hvd_examples/keras_text.py \
        --spec $S/gpt_horovod_tf.yaml

It trains for the schedule's total_steps (--steps to stop earlier), evaluates the held-out
perplexity every --eval-every steps and at the end, and on rank 0 loads the trained weights
into a fresh model by name, lets it continue a prompt and prints one JSON line of metrics;
every rank prints its weights' digest. Exit status 1 when the final perplexity is above
--max-perplexity.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import tensorflow as tf
from text_common import (
    BLOCK,
    PROMPT,
    VOCAB,
    argument_parser,
    corpus_blocks,
    parse_checked,
    report,
    steps_to_train,
    train,
)

import toolkit
from toolkit.report import exit_on_user_error

WIDTH, LAYERS, HEADS = 64, 2, 2
CONTEXT = BLOCK - 1  # inputs per sample


def parse_args(argv: list[str]) -> argparse.Namespace:
    return parse_checked(argument_parser(__doc__.splitlines()[0]), argv)


class PositionEmbedding(keras.layers.Layer):
    """A learned vector per position, added to the byte embeddings (GPT-2's wpe)."""

    def build(self, input_shape: Any) -> None:
        self.positions = self.add_weight(shape=(CONTEXT, WIDTH), name="positions")

    def call(self, embedded: Any) -> Any:
        return embedded + self.positions[: keras.ops.shape(embedded)[1]]


def build_model() -> keras.Model:
    """Every layer named, so weight paths are the same in every process and every build."""
    ids = keras.Input(shape=(None,), dtype="int32", name="ids")
    x = keras.layers.Embedding(VOCAB, WIDTH, name="embed")(ids)
    x = PositionEmbedding(name="position")(x)
    for i in range(LAYERS):
        h = keras.layers.LayerNormalization(epsilon=1e-5, name=f"block{i}_ln1")(x)
        h = keras.layers.MultiHeadAttention(HEADS, WIDTH // HEADS, name=f"block{i}_attention")(
            h, h, use_causal_mask=True
        )
        x = keras.layers.Add(name=f"block{i}_add1")([x, h])
        h = keras.layers.LayerNormalization(epsilon=1e-5, name=f"block{i}_ln2")(x)
        h = keras.layers.Dense(4 * WIDTH, activation="gelu", name=f"block{i}_fc")(h)
        h = keras.layers.Dense(WIDTH, name=f"block{i}_proj")(h)
        x = keras.layers.Add(name=f"block{i}_add2")([x, h])
    x = keras.layers.LayerNormalization(epsilon=1e-5, name="ln_final")(x)
    model = keras.Model(ids, keras.layers.Dense(VOCAB, name="head")(x), name="byte_transformer")
    initialize(model)
    return model


def initialize(model: keras.Model, seed: int = 0) -> None:
    """GPT-2's initialization from numpy: normal(0, 0.02) matrices, zero biases, unit layer-norm
    scales. The same start in every process and in a single-process comparison, whatever
    Keras' own seeding draws."""
    rng = np.random.default_rng(seed)
    values = []
    for weight in model.weights:
        if weight.path.endswith("gamma"):
            values.append(np.ones(weight.shape, np.float32))
        elif weight.path.endswith(("beta", "bias")):
            values.append(np.zeros(weight.shape, np.float32))
        else:
            values.append(rng.normal(0.0, 0.02, weight.shape).astype(np.float32))
    model.set_weights(values)


def dataset(blocks: np.ndarray, shuffle_seed: int | None) -> tf.data.Dataset:
    """(inputs, next bytes) per block; shuffled each epoch with the seed (the same order on
    every rank), or in order for evaluation."""
    samples = tf.data.Dataset.from_tensor_slices(blocks.astype(np.int32))
    if shuffle_seed is not None:
        samples = samples.shuffle(len(blocks), seed=shuffle_seed, reshuffle_each_iteration=True)
    return samples.map(lambda block: (block[:-1], block[1:]))


def loss_fn(logits: Any, targets: Any) -> Any:
    """Next-byte cross entropy per prediction; the toolkit takes the micro-batch's mean."""
    return keras.losses.sparse_categorical_crossentropy(targets, logits, from_logits=True)


def byte_sums(logits: Any, targets: Any) -> dict[str, Any]:
    return {"loss_sum": tf.reduce_sum(loss_fn(logits, targets)), "count": tf.size(targets)}


def load_by_name(weights: dict[str, np.ndarray]) -> keras.Model:
    """A fresh model holding `weights`: every weight path of the model, none other."""
    model = build_model()
    names = [weight.path for weight in model.weights]
    if sorted(names) != sorted(weights):
        raise ValueError(f"weights {sorted(weights)} do not match the model's {sorted(names)}")
    model.set_weights([weights[name] for name in names])
    return model


def continue_text(model: keras.Model, prompt: bytes, length: int = 46) -> str:
    """The model's greedy continuation of `prompt` (prompt + length bytes fit its context)."""
    ids = list(prompt)
    for _ in range(length):
        logits = model(np.array([ids[-CONTEXT:]], dtype=np.int32), training=False)
        ids.append(int(np.argmax(np.asarray(logits)[0, -1])))
    return bytes(ids[len(prompt) :]).decode("utf-8", errors="replace")


def main() -> int:
    args = parse_args(sys.argv[1:])
    spec = toolkit.load_spec(args.spec)
    steps = steps_to_train(args, spec)
    run = toolkit.init(spec)
    with run.scope():
        model = build_model()
    run.prepare(model)
    train_blocks, held_out = corpus_blocks()
    train_loader = run.loader(dataset(train_blocks, spec.seed))
    eval_loader = run.loader(dataset(held_out, None))
    trained = train(
        run,
        train_loader,
        steps,
        args.eval_every,
        step=lambda micro_batches: run.train_step(micro_batches, loss_fn),
        evaluate=lambda: run.evaluate(eval_loader, byte_sums),
    )
    status = report(
        run,
        args,
        run.full_state_dict(),
        trained,
        lambda weights: continue_text(load_by_name(weights), PROMPT),
        f"{spec.backend} ({spec.framework_name}), {run.dp_size} replicas",
        framework=spec.framework_name,
        replicas=run.dp_size,
    )
    run.shutdown()
    return status


if __name__ == "__main__":
    sys.exit(exit_on_user_error(main))
