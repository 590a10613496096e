"""Torch micro-batches of any structure: made tensors, cast, fed to the model, its loss read.

Imported only by the torch backends. The rules (see `toolkit.backends.base`):
- numpy leaves become tensors; under DeepSpeed bf16 (whose model is cast whole) the floating
  tensors the model receives are cast to the model's dtype, and only floating ones: token ids
  and masks keep theirs, and the targets a loss_fn gets are not cast.
- the model is called with a dict as keyword arguments, a tuple or list as positional
  arguments, anything else as its one argument.
- with a loss_fn the micro-batch is `(inputs, targets)` and the loss is
  `loss_fn(model(inputs), targets)`; without one the model gets the whole micro-batch and
  returns its loss: a scalar tensor, or an object or mapping with a `loss` (Hugging Face).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import numpy as np
import torch

from toolkit.backends.base import LossFn, MetricFn, MicroBatch, add_metrics
from toolkit.backends.batches import describe, map_leaves
from toolkit.errors import ToolkitError


def to_torch(
    batch: MicroBatch, float_dtype: torch.dtype | None = None, device: torch.device | None = None
) -> Any:
    """Every numeric numpy leaf as a tensor on `device` (if given; non-blocking, which overlaps
    the copy from a loader's pinned memory); floating tensors cast to `float_dtype` if given."""

    def convert(leaf: Any) -> Any:
        if isinstance(leaf, np.ndarray | np.generic) and leaf.dtype.kind in "biufc":
            leaf = torch.as_tensor(leaf)
        if not isinstance(leaf, torch.Tensor):
            return leaf
        if device is not None and leaf.device != device:
            leaf = leaf.to(device, non_blocking=True)
        if float_dtype is not None and leaf.is_floating_point() and leaf.dtype != float_dtype:
            leaf = leaf.to(float_dtype)
        return leaf

    return map_leaves(convert, batch)


def call_model(model: Callable[..., Any], inputs: Any) -> Any:
    if isinstance(inputs, Mapping):
        return model(**inputs)
    if isinstance(inputs, tuple | list):
        return model(*inputs)
    return model(inputs)


def split_pair(batch: MicroBatch, what: str) -> tuple[Any, Any]:
    if isinstance(batch, tuple | list) and len(batch) == 2:
        return batch[0], batch[1]
    raise ToolkitError(
        f"{what} needs (inputs, targets) micro-batches, got {describe(batch)}",
        "yield (inputs, targets) pairs, or let the model compute its own loss from the whole "
        "micro-batch (train_step(micro_batches) without a loss_fn; evaluate(..., pairs=False))",
    )


def returned_loss(outputs: Any) -> torch.Tensor:
    """The loss a model returned: a tensor, or the `loss` of a mapping or an output object."""
    if isinstance(outputs, torch.Tensor):
        loss: Any = outputs
    elif isinstance(outputs, Mapping):
        loss = outputs.get("loss")
    else:
        loss = getattr(outputs, "loss", None)
    if not isinstance(loss, torch.Tensor):
        raise ToolkitError(
            f"train_step without a loss_fn needs the model to return its loss; it returned "
            f"{type(outputs).__name__} with no loss tensor",
            "return the loss (or an object with .loss; Hugging Face models need labels in the "
            "batch for that), or pass loss_fn=... with (inputs, targets) micro-batches",
        )
    if loss.dim() != 0:
        raise ToolkitError(
            f"the model's loss has shape {tuple(loss.shape)}; a micro-batch's loss is a scalar",
            "return the mean loss of the micro-batch",
        )
    return loss


def micro_batch_loss(
    model: Callable[..., Any],
    batch: MicroBatch,
    loss_fn: LossFn | None,
    float_dtype: torch.dtype | None = None,
    device: torch.device | None = None,
) -> torch.Tensor:
    if loss_fn is None:
        return returned_loss(call_model(model, to_torch(batch, float_dtype, device)))
    inputs, targets = split_pair(batch, "train_step with a loss_fn")
    outputs = call_model(model, to_torch(inputs, float_dtype, device))
    return loss_fn(outputs, to_torch(targets, device=device))


def share_of_step(loss: torch.Tensor, count: int) -> torch.Tensor:
    """A micro-batch's loss as its share of the step's gradient, loss / count; one micro-batch's
    loss as it is: x / 1 is x, and so is the gradient it passes back, so a step of one
    micro-batch skips the division and its backward, two of the few ops the toolkit's step
    adds to an engine's."""
    return loss if count == 1 else loss / count


def mean_loss(losses: Sequence[torch.Tensor]) -> torch.Tensor:
    """The micro-batches' mean loss (detached losses) in float64, added in order; one
    micro-batch's loss as it is (0 + x is x, and so is x / 1)."""
    if len(losses) == 1:
        return losses[0].double()
    total = torch.zeros((), dtype=torch.float64, device=losses[0].device)
    for loss in losses:
        total += loss.double()
    return total / len(losses)


def metric_float(value: Any) -> float:
    """A metric value as a Python float (bf16 tensors included, which numpy cannot hold)."""
    if isinstance(value, torch.Tensor):
        return float(value.detach().double().sum())
    return float(np.sum(np.asarray(value, dtype=np.float64)))


def evaluate_module(
    model: torch.nn.Module,
    micro_batches: Iterable[MicroBatch],
    metric_fn: MetricFn,
    *,
    pairs: bool,
    float_dtype: torch.dtype | None = None,
    precision: AbstractContextManager[Any] | None = None,
    device: torch.device | None = None,
) -> dict[str, float]:
    """This process's metric sums over `micro_batches`: eval mode, no gradients, then the
    model's mode as it was."""
    totals: dict[str, float] = {}
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), precision or nullcontext():
            for batch in micro_batches:
                if pairs:
                    inputs, targets = split_pair(batch, "evaluate with pairs=True")
                    outputs = call_model(model, to_torch(inputs, float_dtype, device))
                    metrics = metric_fn(outputs, to_torch(targets, device=device))
                else:
                    tensors = to_torch(batch, float_dtype, device)
                    metrics = metric_fn(call_model(model, tensors), tensors)
                add_metrics(totals, metrics, metric_float)
    finally:
        model.train(was_training)
    return totals
