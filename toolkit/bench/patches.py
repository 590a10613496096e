"""Candidate fixes, applied to a running toolkit rank by monkeypatching, so that the bench can
measure what each would buy before anyone changes a backend (`toolkit bench step --patch NAME`).
Each takes the `Run` right after `toolkit.init`, before `prepare` and the first step, and is
for measurement only.

- `local-loss`: `train_step` returns this rank's loss without the allreduce that makes it the
  global mean (torch backends: `backend.allreduce` becomes the identity; Horovod TF: the
  `hvd.allreduce` of the loss inside the compiled step). Changes what the step returns, not the
  weights.
- `single-micro-batch`: the TF engines' compiled step, when a step has one micro-batch, takes
  the gradient directly instead of adding it to a zero-filled accumulator and dividing by 1
  (exact: 0 + g and g / 1 are g).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class _WithoutAllreduce:
    """A module proxy whose `allreduce` hands its input back; everything else is the module's."""

    def __init__(self, module: Any) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)

    @staticmethod
    def allreduce(value: Any, *args: Any, **kwargs: Any) -> Any:
        return value


def local_loss(run: Any) -> None:
    run.backend.allreduce = lambda value, op="mean": value
    horovod_tf = sys.modules.get("toolkit.backends.horovod.tf_backend")
    if horovod_tf is not None:
        setattr(horovod_tf, "hvd", _WithoutAllreduce(horovod_tf.hvd))  # noqa: B010


@contextmanager
def without_loss_allreduce(run: Any) -> Iterator[None]:
    """`local-loss` for the duration of a block, then undone (the in-process comparison runs
    the toolkit's step with and without it in the same processes). A TF step compiled inside
    the block keeps the change: give it a loss function of its own so it is compiled apart."""
    horovod_tf = sys.modules.get("toolkit.backends.horovod.tf_backend")
    module = getattr(horovod_tf, "hvd", None)
    local_loss(run)
    try:
        yield
    finally:
        del run.backend.allreduce  # the instance attribute; the class's method shows again
        if horovod_tf is not None:
            setattr(horovod_tf, "hvd", module)  # noqa: B010


def single_micro_batch(run: Any) -> None:
    tf_common = sys.modules.get("toolkit.backends.tf.common")
    if tf_common is None:
        return  # a torch engine: nothing to change
    tf = tf_common.tf
    accumulated = tf_common.accumulated_gradients

    def direct(model: Any, loss_fn: Any, inputs: Any, targets: Any, sources: Any) -> Any:
        if inputs.shape[0] != 1:
            return accumulated(model, loss_fn, inputs, targets, sources)
        with tf.GradientTape() as tape:
            loss = tf_common.mean_loss(loss_fn(model(inputs[0], training=True), targets[0]))
        return tape.gradient(loss, sources), loss

    setattr(tf_common, "accumulated_gradients", direct)  # noqa: B010 - a module attribute


PATCHES: dict[str, Callable[[Any], None]] = {
    "local-loss": local_loss,
    "single-micro-batch": single_micro_batch,
}
