"""The training state of the TensorFlow engines in the portable checkpoint layout, and back.

Imported only by the TF backends (tf.distribute and Horovod for TF). The layout
(`toolkit.checkpoint.state`):
- model: every Keras weight under its path ("sequential/dense/kernel"), the names
  `full_state_dict` gives, float32, in Keras' own layout (a Dense kernel is [in, out]).
- optimizer: the toolkit's optimizers (toolkit.backends.tf.optimizers) follow torch's update
  rules line by line, so their slots are torch's state under torch's names: TorchSGD's
  "momentum" is "momentum_buffer", TorchAdam's "exp_avg" and "exp_avg_sq" are already named
  so, each with its parameter's shape. SGD without momentum keeps no state, as in torch.
- scalars: {"step": optimizer.iterations}. Keras keeps one counter for Adam's bias correction
  and for the schedule (`common.SpecSchedule` reads it), so restoring the checkpoint's applied
  steps (its step less those fp16 skipped) into it restores both: the rate and the update of
  the next step are the uninterrupted run's.
- arrays: the states of the model's Keras seed generators (Dropout's and the like), per rank,
  as "rng/keras/<variable path>/rank<r>". TensorFlow's op-level random ops (a seedless
  tf.random.uniform, tf.data's shuffle) keep counters that cannot be read or set; the runtime
  restores numpy's and Python's generators itself (toolkit.runtime.resume).

Every replica holds the same weights and optimizer state, so rank 0 alone writes them, and
every rank reads the whole checkpoint back (no broadcast). A checkpoint written by a torch
engine does not fit: its weights have state_dict names and torch layouts (Linear [out, in]);
`restore` refuses it with one error saying so.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from toolkit.backends.base import StateShare
from toolkit.backends.tf.common import numpy_state
from toolkit.backends.tf.optimizers import TorchAdam, TorchSGD
from toolkit.checkpoint import CheckpointState, optimizer_key, split_optimizer_key
from toolkit.errors import ToolkitError

STEP = "step"
RESUME_HINT = "resume with the model the checkpoint was saved from, or set checkpoint.resume: never"


def slot_lists(optimizer: keras.optimizers.Optimizer) -> dict[str, list[Any]]:
    """torch's slot name -> the optimizer's slot variables, in Keras' variable-index order
    (fp16's LossScaleOptimizer: its inner optimizer's)."""
    optimizer = inner(optimizer)
    if isinstance(optimizer, TorchSGD):
        return {"momentum_buffer": optimizer.momenta} if optimizer.momentum else {}
    if isinstance(optimizer, TorchAdam):
        return {"exp_avg": optimizer.exp_avgs, "exp_avg_sq": optimizer.exp_avg_sqs}
    raise ToolkitError(
        f"a TensorFlow engine saves and restores the optimizer state of the spec's optimizers "
        f"only; this run's optimizer is {type(optimizer).__module__}.{type(optimizer).__name__}",
        "name the optimizer in the spec (optimizer.name: sgd, adam or adamw) and let "
        "run.prepare(model) build it, or set checkpoint.resume: never",
    )


def inner(optimizer: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
    """The optimizer that steps: a LossScaleOptimizer's inner one, else itself."""
    return getattr(optimizer, "inner_optimizer", optimizer)


def slot_variables(model: keras.Model, optimizer: keras.optimizers.Optimizer) -> dict[str, Any]:
    """optimizer_key(torch slot, weight path) -> the Keras slot variable."""
    found: dict[str, Any] = {}
    for slot, variables in slot_lists(optimizer).items():
        for weight in model.trainable_variables:
            found[optimizer_key(slot, weight.path)] = variables[
                inner(optimizer)._get_variable_index(weight)
            ]
    return found


def rng_variables(model: keras.Model) -> list[Any]:
    """The model's variables that are not weights: Keras' seed-generator states."""
    weights = {weight.path for weight in model.weights}
    return [variable for variable in model.variables if variable.path not in weights]


def rng_key(path: str, rank: int) -> str:
    return f"rng/keras/{path}/rank{rank}"


def capture(model: keras.Model, optimizer: keras.optimizers.Optimizer, *, rank: int) -> StateShare:
    """This rank's share: its seed generators; on rank 0 also weights, slots and the step.

    An optimizer the script brought (not the spec's) leaves the optimizer section empty: the
    weights still save, and `restore` refuses to continue from them (see `slot_lists`)."""
    share = StateShare(
        arrays={rng_key(v.path, rank): np.asarray(v).copy() for v in rng_variables(model)}
    )
    if rank != 0:
        return share
    share.model = numpy_state(model)
    share.scalars = {STEP: int(np.asarray(optimizer.iterations))}
    if isinstance(inner(optimizer), TorchSGD | TorchAdam):
        share.optimizer = {
            key: np.asarray(variable, dtype=np.float32).copy()
            for key, variable in slot_variables(model, optimizer).items()
        }
    return share


def require_same_weights(model: keras.Model, state: CheckpointState) -> None:
    """The checkpoint's weights are this model's, by Keras path and shape."""
    own = {weight.path: tuple(weight.shape) for weight in model.weights}
    missing = sorted(set(own) - set(state.model))
    unexpected = sorted(set(state.model) - set(own))
    if missing or unexpected:
        raise ToolkitError(
            f"the checkpoint's weights do not fit this Keras model (missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}); the TF engines name weights by Keras path "
            "('sequential/dense/kernel', Dense kernels [in, out]), the torch engines by "
            "state_dict name ('0.weight', Linear weights [out, in])",
            "resume a TF run from a checkpoint written by a TF engine with the same model "
            "(build it the same way, so its layers get the same names), or set "
            "checkpoint.resume: never; `toolkit checkpoint export` gives the weights to convert",
        )
    for path, shape in own.items():
        saved = tuple(state.model[path].shape)
        if saved != shape:
            raise ToolkitError(
                f"the checkpoint's {path!r} has shape {saved}, the model's {shape}", RESUME_HINT
            )


def require_same_slots(expected: dict[str, Any], state: CheckpointState) -> None:
    """The checkpoint's optimizer state is this optimizer's, whole (a checkpoint of a run
    that has stepped must hold every slot: zeros in their place would not continue it)."""
    saved = {key for key in state.optimizer if split_optimizer_key(key)[0] != STEP}
    unexpected = sorted(saved - set(expected))
    missing = sorted(set(expected) - saved) if state.step > 0 else []
    if unexpected or missing:
        raise ToolkitError(
            f"the checkpoint's optimizer state does not fit this run's optimizer (missing "
            f"{missing[:5]}, unexpected {unexpected[:5]})",
            "resume with the optimizer and model the checkpoint was saved with, or set "
            "checkpoint.resume: never",
        )
    for key, variable in expected.items():
        if key in state.optimizer and tuple(state.optimizer[key].shape) != tuple(variable.shape):
            raise ToolkitError(
                f"the checkpoint's {key!r} has shape {tuple(state.optimizer[key].shape)}, "
                f"the optimizer's {tuple(variable.shape)}",
                RESUME_HINT,
            )


def restore(
    model: keras.Model, optimizer: keras.optimizers.Optimizer, state: CheckpointState, *, rank: int
) -> None:
    """Weights, optimizer slots, the step (hence the schedule position) and this rank's seed
    generators, from the whole checkpoint; everything is checked before anything changes."""
    require_same_weights(model, state)
    slots = slot_variables(model, optimizer)
    require_same_slots(slots, state)
    for weight in model.weights:
        weight.assign(state.model[weight.path])
    for key, variable in slots.items():
        value = state.optimizer.get(key)
        variable.assign(np.zeros(variable.shape, np.float32) if value is None else value)
    optimizer.iterations.assign(state.applied_steps)
    for variable in rng_variables(model):
        saved = state.arrays.get(rng_key(variable.path, rank))
        if saved is not None:  # a rank the saving run did not have keeps its seeded state
            variable.assign(saved)
