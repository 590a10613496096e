"""What the TensorFlow engines share (tf.distribute and Horovod for TF). Imports TensorFlow.

Keras 3 behaviours (the `tf.keras` of TF 2.21) that shape the backends (docs/engine-notes.md):
- Under a tf.distribute strategy, `optimizer.apply_gradients` in replica context all-reduces
  the gradients with SUM itself, and clips (clipnorm / global_clipnorm) *before* that sum, i.e.
  per replica. torch's clip_grad_norm_ clips the averaged gradient, so the toolkit clips itself,
  after an explicit all-reduce, with torch's formula (below), and never sets Keras' clipping.
- Keras variables have no `.ref()`, which Horovod's TF layer calls; gradients are taken with
  respect to each variable's underlying `tf.Variable` (`v.value`) instead (horovod issue 4290).
- `import keras` imports scikit-learn (for `keras.wrappers`) and matplotlib.pyplot (for
  `keras.visualization`) whenever they are installed, a large part of every TF rank's import.
  The toolkit leaves it: hiding them would take those Keras features from the user's script
  (the wrappers subclass scikit-learn's classes at import, so they cannot be made lazy).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import tensorflow as tf

from toolkit.backends.base import LossFn, refuse_missing_script_optimizer
from toolkit.backends.batches import describe
from toolkit.backends.tf.optimizers import TorchAdam, TorchSGD
from toolkit.cores import bind_rank, threads_in_rank
from toolkit.device import announce, check_gpus_for_ranks, resolve_device
from toolkit.errors import ToolkitError
from toolkit.launch.environment import LaunchEnvironment
from toolkit.schedule import lr_ratio
from toolkit.spec import TrainSpec

# torch.nn.utils.clip_grad_norm_ divides by (norm + 1e-6); tf.clip_by_global_norm does not.
TORCH_CLIP_EPS = 1e-6


def configure_threads(spec: TrainSpec, env: LaunchEnvironment) -> None:
    """Must run before TensorFlow starts its runtime (the first op or device query), whose
    thread pools then start on the rank's cores under launch.bind_cores."""
    bind_rank(spec.launch.bind_cores, env.local_rank, env.local_world_size)
    threads = threads_in_rank(spec.launch.threads_per_rank, env.local_world_size, os.environ)
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)


def place_on_devices(spec: TrainSpec, env: LaunchEnvironment, replicas: int) -> str:
    """The device the spec resolves to on this host, made the only one TensorFlow sees: no GPU
    for the CPU; under CUDA, this worker's own GPU (`cuda:<local rank>`) when the job has
    several processes, or the first `replicas` GPUs for MirroredStrategy in one process. Must
    run before TensorFlow starts its runtime, as configure_threads."""
    gpus = tf.config.list_physical_devices("GPU")
    device = resolve_device(spec.device, len(gpus))
    announce(spec.device, device, len(gpus), env.rank)
    if device == "cpu":
        if gpus:
            tf.config.set_visible_devices([], "GPU")
        return "cpu"
    if env.world_size > 1:
        check_gpus_for_ranks(env.local_world_size, len(gpus))
        tf.config.set_visible_devices(gpus[env.local_rank], "GPU")
    else:
        check_gpus_for_ranks(replicas, len(gpus), "this process (tf.local_devices)")
        tf.config.set_visible_devices(gpus[:replicas], "GPU")
    return "cuda"


def seed_everything(seed: int) -> None:
    keras.utils.set_random_seed(seed)


class SpecSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """The spec's schedule as Keras reads it, from the optimizer's count of applied steps, so
    step k uses the same rate as under the torch engines. The rate comes from the one formula,
    `toolkit.schedule.lr_ratio`, through `tf.py_function` (one Python call per step) rather than
    a second copy of the formula in TF ops."""

    def __init__(self, peak: float, spec: TrainSpec) -> None:
        self.peak = peak
        self.schedule = spec.schedule

    def _rate(self, step: Any) -> np.float32:
        return np.float32(self.peak * lr_ratio(self.schedule, int(step)))

    def __call__(self, step: Any) -> Any:
        rate = tf.py_function(self._rate, [step], tf.float32)
        rate.set_shape([])
        return rate

    def get_config(self) -> dict[str, Any]:
        return {"peak": self.peak, "schedule": self.schedule.model_dump()}


def build_optimizer(spec: TrainSpec, lr: float) -> keras.optimizers.Optimizer:
    """The spec's optimizer with PyTorch's update rule (see toolkit.backends.tf.optimizers),
    its learning rate following the spec's schedule."""
    refuse_missing_script_optimizer(spec)
    opt = spec.optimizer
    rate: Any = lr if spec.schedule.name == "constant" else SpecSchedule(lr, spec)
    if opt.name == "sgd":
        return TorchSGD(
            learning_rate=rate,
            momentum=opt.momentum,
            weight_decay=opt.weight_decay,
            nesterov=opt.nesterov,
        )
    return TorchAdam(
        learning_rate=rate,
        beta_1=opt.betas[0],
        beta_2=opt.betas[1],
        epsilon=opt.eps,
        weight_decay=opt.weight_decay,
        decoupled=opt.name == "adamw",
    )


def clip_like_torch(grads: list[Any], max_norm: float, loss_scale: Any = None) -> list[Any]:
    """torch's clip_grad_norm_: scale by min(1, max_norm / (global_norm + 1e-6)). Gradients
    still multiplied by fp16's `loss_scale` are clipped by their norm divided by it."""
    norm = tf.linalg.global_norm(grads)
    if loss_scale is not None:
        norm = norm / tf.cast(loss_scale, norm.dtype)
    coefficient = tf.minimum(1.0, max_norm / (norm + TORCH_CLIP_EPS))
    return [g * tf.cast(coefficient, g.dtype) for g in grads]


def mean_loss(loss: Any) -> Any:
    """The micro-batch's mean loss whether loss_fn returned per-sample values or a scalar."""
    return tf.reduce_mean(loss)


def micro_batch_loss(model: keras.Model, batch: Any, loss_fn: LossFn | None) -> Any:
    """A Keras model takes its inputs, of any structure, as its one argument (Keras' rule).
    With a loss_fn the micro-batch is (inputs, targets); without one the model gets all of it
    and returns its loss (a tensor, or a dict with a "loss")."""
    if loss_fn is None:
        outputs = model(batch, training=True)
        if isinstance(outputs, Mapping):
            if "loss" not in outputs:
                raise ToolkitError(
                    f"train_step without a loss_fn needs the model to return its loss; it "
                    f"returned a dict with keys {sorted(outputs)}",
                    "return the loss (or a dict with a 'loss'), or pass a loss_fn",
                )
            return outputs["loss"]
        return outputs
    inputs, targets = split_pair(batch, "train_step with a loss_fn")
    return loss_fn(model(inputs, training=True), targets)


def split_pair(batch: Any, what: str) -> tuple[Any, Any]:
    if isinstance(batch, tuple | list) and len(batch) == 2:
        return batch[0], batch[1]
    raise ToolkitError(
        f"{what} needs (inputs, targets) micro-batches, got {describe(batch)}",
        "yield (inputs, targets) pairs, or let the model compute its own loss from the whole "
        "micro-batch (train_step(micro_batches) without a loss_fn; evaluate(..., pairs=False))",
    )


def accumulated_gradients(
    model: keras.Model,
    loss_fn: LossFn | None,
    batch: Any,
    sources: list[Any],
    scale_loss: Callable[[Any], Any] | None = None,
) -> tuple[list[Any], Any]:
    """Inside a compiled step: the mean gradient w.r.t. `sources` and the mean loss over the
    step's micro-batches (the leading axis of every leaf of `batch`, see
    `toolkit.backends.tf.batches.stack_micro_batches`), one backward each, unrolled.
    The first micro-batch's gradient starts the sum rather than zeros: 0 + g is g exactly, so
    the result is the same bit for bit, without filling and adding a zero buffer the size of the
    model every step; a step of one micro-batch is not divided by 1 either.

    With `scale_loss` (fp16's LossScaleOptimizer.scale_loss) each backward is of the scaled
    share of the step, loss / count times the scale, as under the torch engines, so that the
    same micro-batches overflow; the gradients returned are then scaled, the loss is not.
    """
    grads: list[Any] = []
    losses = []
    count = tf.nest.flatten(batch)[0].shape[0]
    for micro in range(count):
        piece = tf.nest.map_structure(lambda leaf, micro=micro: leaf[micro], batch)
        with tf.GradientTape() as tape:
            loss = mean_loss(micro_batch_loss(model, piece, loss_fn))
            target = loss if scale_loss is None else scale_loss(loss / count if count > 1 else loss)
        # Dense, as adding them made them before: an Embedding's IndexedSlices would otherwise
        # reach Horovod's allreduce, which gathers sparse gradients instead of reducing them.
        found = [tf.convert_to_tensor(g) for g in tape.gradient(target, sources)]
        grads = found if not grads else [a + g for a, g in zip(grads, found, strict=True)]
        losses.append(loss)
    if count == 1:
        return grads, losses[0]
    mean = tf.add_n(losses) / float(count)
    return (grads if scale_loss else [g / float(count) for g in grads]), mean


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


def numpy_state(model: keras.Model) -> dict[str, np.ndarray]:
    """Every weight under its Keras path, as float32 numpy copies."""
    return {weight.path: np.asarray(weight, dtype=np.float32).copy() for weight in model.weights}
