"""What the TensorFlow engines share (tf.distribute and Horovod for TF). Imports TensorFlow.

Findings about Keras 3 (the `tf.keras` of TF 2.21) that shape the backends:
- Under a tf.distribute strategy, `optimizer.apply_gradients` in replica context all-reduces
  the gradients with SUM itself, and clips (clipnorm / global_clipnorm) *before* that sum, i.e.
  per replica. torch's clip_grad_norm_ clips the averaged gradient, so the toolkit clips itself,
  after an explicit all-reduce, with torch's formula (below), and never sets Keras' clipping.
- Keras variables have no `.ref()`, which Horovod's TF layer calls; gradients are taken with
  respect to each variable's underlying `tf.Variable` (`v.value`) instead (horovod issue 4290).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import tensorflow as tf

from toolkit.backends.base import LossFn, MicroBatch
from toolkit.backends.tf.optimizers import TorchAdam, TorchSGD
from toolkit.errors import ToolkitError
from toolkit.spec import TrainSpec

# torch.nn.utils.clip_grad_norm_ divides by (norm + 1e-6); tf.clip_by_global_norm does not.
TORCH_CLIP_EPS = 1e-6


def configure_threads(spec: TrainSpec) -> None:
    """Must run before TensorFlow starts its runtime (the first op or device query)."""
    tf.config.threading.set_intra_op_parallelism_threads(spec.launch.threads_per_rank)
    tf.config.threading.set_inter_op_parallelism_threads(spec.launch.threads_per_rank)


def seed_everything(seed: int) -> None:
    keras.utils.set_random_seed(seed)


def build_optimizer(spec: TrainSpec, lr: float) -> keras.optimizers.Optimizer:
    """The spec's optimizer with PyTorch's update rule (see toolkit.backends.tf.optimizers)."""
    opt = spec.optimizer
    if opt.name == "sgd":
        return TorchSGD(
            learning_rate=lr,
            momentum=opt.momentum,
            weight_decay=opt.weight_decay,
            nesterov=opt.nesterov,
        )
    return TorchAdam(
        learning_rate=lr,
        beta_1=opt.betas[0],
        beta_2=opt.betas[1],
        epsilon=opt.eps,
        weight_decay=opt.weight_decay,
        decoupled=opt.name == "adamw",
    )


def clip_like_torch(grads: list[Any], max_norm: float) -> list[Any]:
    """torch's clip_grad_norm_: scale by min(1, max_norm / (global_norm + 1e-6))."""
    norm = tf.linalg.global_norm(grads)
    coefficient = tf.minimum(1.0, max_norm / (norm + TORCH_CLIP_EPS))
    return [g * tf.cast(coefficient, g.dtype) for g in grads]


def mean_loss(loss: Any) -> Any:
    """The micro-batch's mean loss whether loss_fn returned per-sample values or a scalar."""
    return tf.reduce_mean(loss)


def stack_micro_batches(micro_batches: Sequence[MicroBatch]) -> tuple[np.ndarray, np.ndarray]:
    """A step's micro-batches as [micro-batches, samples, ...] inputs and targets."""
    inputs = np.stack([np.asarray(x) for x, _ in micro_batches])
    targets = np.stack([np.asarray(y) for _, y in micro_batches])
    return inputs, targets


def accumulated_gradients(
    model: keras.Model, loss_fn: LossFn, inputs: Any, targets: Any, sources: list[Any]
) -> tuple[list[Any], Any]:
    """Inside a compiled step: the mean gradient w.r.t. `sources` and the mean loss over the
    step's micro-batches (the leading axis of inputs and targets), one backward each, unrolled.
    """
    grads = [tf.zeros_like(source) for source in sources]
    losses = []
    for micro in range(inputs.shape[0]):
        with tf.GradientTape() as tape:
            loss = mean_loss(loss_fn(model(inputs[micro], training=True), targets[micro]))
        grads = [a + g for a, g in zip(grads, tape.gradient(loss, sources), strict=True)]
        losses.append(loss)
    count = float(inputs.shape[0])
    return [g / count for g in grads], tf.add_n(losses) / count


def require_keras_model(model: Any) -> keras.Model:
    if not isinstance(model, keras.Model):
        raise ToolkitError(
            f"prepare() needs a keras.Model for a TensorFlow backend, got {type(model).__name__}.",
            "build the model with keras inside `with run.scope():`, or use a torch backend",
        )
    if not model.built:
        raise ToolkitError(
            "the Keras model has no weights yet (it was never built).",
            "start it with keras.Input(shape=...) or call model.build(input_shape) first",
        )
    return model


def check_precision(spec: TrainSpec) -> None:
    if spec.precision != "fp32":
        raise ToolkitError(
            f"precision={spec.precision!r} is not supported by the TensorFlow engines here: "
            "Keras mixed precision on CPU changes the optimizer path and is not parity-checked.",
            "use precision: fp32 with TensorFlow, or a torch backend for bf16/fp16",
        )


def numpy_state(model: keras.Model) -> dict[str, np.ndarray]:
    """Every weight under its Keras path, as float32 numpy copies."""
    return {weight.path: np.asarray(weight, dtype=np.float32).copy() for weight in model.weights}
