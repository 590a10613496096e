"""What DeepSpeed's pipeline engine accepts, and evaluation through its `eval_batch`.

The pipeline engine (parallel.pipeline > 1) moves data between stages as tensors, so it takes
less than the other engines:
- every micro-batch is an `(inputs, labels)` pair (under bf16 the floating inputs are cast to
  the model's dtype, the labels are not) and a `loss_fn(outputs, labels)` is given:
  the last stage computes the loss; a model cannot compute its own from the batch, because only
  the first stage sees the inputs and only the last one sees the labels;
- `inputs` is a tensor or a flat tuple (or list) of tensors: the first stage's first layer gets
  it as its one argument (a tuple stays a tuple), and each layer passes a tensor or a tuple of
  tensors to the next;
- `labels` is a tensor or a flat tuple (or list) of tensors, handed to loss_fn as they are;
- dicts, nesting deeper than one tuple, and non-tensor leaves are refused with a ToolkitError
  before any stage runs (every stage checks the same batch, so all of them stop alike).

Evaluation: `eval_batch` runs the inference schedule, and the last stage calls the module's
loss_fn on each micro-batch. The toolkit sets loss_fn to the user's metric_fn, packed into one
float64 vector per micro-batch; with `reduce_output=None` the last stage gets those vectors
back unaveraged, and sums them. Other stages contribute zeros under the same names, learnt from
the last stage with one all_gather_object.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from toolkit.backends import torch_batches as batches
from toolkit.backends.base import LossFn, MetricFn, MicroBatch, add_metrics
from toolkit.backends.batches import describe
from toolkit.errors import ToolkitError

PairOfTensors = tuple[Any, Any]


def refusal(stages: int, what: str) -> ToolkitError:
    return ToolkitError(
        f"the pipeline engine (parallel.pipeline={stages}) {what}",
        "give it (inputs, labels) micro-batches whose inputs and labels are each a tensor or a "
        "flat tuple of tensors, and a loss_fn(outputs, labels); dict batches and models that "
        "return their own loss need parallel.pipeline: 1 (ZeRO runs them)",
    )


def _is_tensors(part: Any) -> bool:
    if isinstance(part, torch.Tensor):
        return True
    return (
        isinstance(part, tuple | list)
        and len(part) > 0
        and all(isinstance(t, torch.Tensor) for t in part)
    )


def pipeline_batch(batch: MicroBatch, stages: int, dtype: torch.dtype) -> PairOfTensors:
    """A micro-batch as the pipeline engine takes it, or a ToolkitError saying why not."""
    if not (isinstance(batch, tuple | list) and len(batch) == 2):
        raise refusal(stages, f"takes (inputs, labels) micro-batches, got {describe(batch)}")
    inputs, labels = batches.to_torch(batch[0], dtype), batches.to_torch(batch[1])
    for name, part in (("inputs", inputs), ("labels", labels)):
        if not _is_tensors(part):
            raise refusal(
                stages,
                f"takes {name} as a tensor or a flat tuple of tensors, got {describe(part)}",
            )
    inputs = tuple(inputs) if isinstance(inputs, list) else inputs
    labels = tuple(labels) if isinstance(labels, list) else labels
    return inputs, labels


def require_loss_fn(loss_fn: LossFn | None, stages: int) -> LossFn:
    if loss_fn is None:
        raise refusal(stages, "computes the loss on its last stage and needs a loss_fn")
    return loss_fn


def evaluate(
    engine: Any,
    micro_batches: Sequence[MicroBatch],
    metric_fn: MetricFn,
    *,
    stages: int,
    dtype: torch.dtype,
    world_size: int,
) -> dict[str, float]:
    """This rank's share of the metric sums: the last stage's sums, zeros elsewhere."""
    data = [pipeline_batch(batch, stages, dtype) for batch in micro_batches]
    names: list[str] = []

    def packed_metrics(outputs: Any, labels: Any) -> torch.Tensor:
        totals: dict[str, float] = {}
        add_metrics(totals, metric_fn(outputs, labels), batches.metric_float)
        names[:] = sorted(totals)
        return torch.tensor([totals[name] for name in names], dtype=torch.float64)

    totals: dict[str, float] = {}
    if data:
        saved = engine.module.loss_fn
        engine.module.loss_fn = packed_metrics
        engine.total_loss = None  # eval_batch adds into it; a training scalar would not fit
        try:
            outputs = engine.eval_batch(
                iter(data),
                compute_loss=True,
                reduce_output=None,
                bcast_loss=False,
                num_micro_batches=len(data),
            )
        finally:
            engine.module.loss_fn = saved
            engine.total_loss = None
        if engine.is_last_stage():
            for vector in outputs:
                add_metrics(totals, dict(zip(names, vector.tolist(), strict=True)), float)
    everyone: list[dict[str, float]] = [{} for _ in range(world_size)]
    dist.all_gather_object(everyone, totals)
    shared = next((found for found in everyone if found), {})
    return totals if totals else dict.fromkeys(shared, 0.0)
