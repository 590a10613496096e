"""The Keras text example's training as a plain single-process Keras loop: what the TF engines
must match.

    python keras_text_reference.py --spec S --steps N --out DIR

Same model, data, optimizer and schedule as hvd_examples/keras_text.py, without the toolkit's
runtime: each step is one batch of the global size read from the same seeded tf.data pipeline
(with TF's global seed set to spec.seed, as toolkit.init sets it, the order is the ranks');
torch's AdamW update (toolkit.backends.tf.optimizers.TorchAdam) at the peak times
lr_ratio(schedule, k); gradients clipped with torch's formula. Writes DIR/weights.npz and
DIR/history.json as the example's --out does. A separate process: importing TensorFlow
changes the environment of the process that imports it.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hvd_examples"))

import keras
import keras_text
import numpy as np
import tensorflow as tf
import text_common

from toolkit.backends.tf.optimizers import TorchAdam
from toolkit.schedule import lr_ratio
from toolkit.spec import load_spec

TORCH_CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_ divides by (norm + 1e-6)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    spec = load_spec(args.spec)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    keras.utils.set_random_seed(spec.seed)
    model = keras_text.build_model()
    opt, peak = spec.optimizer, spec.effective_lr()
    optimizer = TorchAdam(
        learning_rate=peak,
        beta_1=opt.betas[0],
        beta_2=opt.betas[1],
        epsilon=opt.eps,
        weight_decay=opt.weight_decay,
        decoupled=True,
    )
    train, held_out = text_common.corpus_blocks()
    size = spec.batch_for().global_
    batches = keras_text.dataset(train, spec.seed).batch(size, drop_remainder=True)

    @tf.function
    def step(inputs: tf.Tensor, targets: tf.Tensor, rate: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras_text.loss_fn(model(inputs, training=True), targets))
        grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, model.trainable_variables)]
        if spec.clip_grad_norm > 0:
            norm = tf.linalg.global_norm(grads)
            grads = [
                g * tf.minimum(1.0, spec.clip_grad_norm / (norm + TORCH_CLIP_EPS)) for g in grads
            ]
        optimizer.learning_rate.assign(rate)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    losses: list[float] = []
    while len(losses) < args.steps:  # one pass over `batches` per epoch, reshuffled each time
        for inputs, targets in batches:
            if len(losses) == args.steps:
                break
            rate = tf.constant(peak * lr_ratio(spec.schedule, len(losses)), tf.float32)
            losses.append(float(step(inputs, targets, rate)))
    evaluated = held_out[: len(held_out) // size * size].astype(np.int32)
    logits = model(evaluated[:, :-1], training=False)
    mean = float(tf.reduce_mean(keras_text.loss_fn(logits, evaluated[:, 1:])))
    weights = {w.path: np.asarray(w, dtype=np.float32) for w in model.weights}
    history = {
        "losses": losses,
        "evaluations": [(args.steps, math.exp(mean))],
        "keys": list(weights),
    }
    text_common.write_outputs(args.out, weights, history)
    return 0


if __name__ == "__main__":
    sys.exit(main())
