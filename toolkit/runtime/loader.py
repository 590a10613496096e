"""Loaders: one optimizer step's micro-batches at a time, this process's share, seeded.

Every loader yields, per step, the list of `accumulation` micro-batches this process trains on,
cut by `toolkit.sharding` so that every engine sees the same global batch at the same step. A
process that holds several data-parallel replicas (MirroredStrategy) gets each micro-batch as
its replicas' shards concatenated in replica order.

What `run.loader(data)` accepts, tried in this order:
- whatever the backend's own loader takes (`Backend.make_loader`): a torch map-style `Dataset`
  or `IterableDataset` under the torch engines, a `tf.data.Dataset` under the TF engines;
- in-memory arrays in any structure (`ArrayLoader`): one array, or a tuple, list or dict of
  arrays, nested as you like, all with one row per sample. `(x, y)` yields `(x_rows, y_rows)`
  micro-batches; `{"input_ids": ids, "labels": labels}` yields dicts.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from toolkit.backends.base import MicroBatch
from toolkit.backends.batches import describe, leaves, map_leaves
from toolkit.errors import ToolkitError
from toolkit.sharding import LoaderPlan, steps_per_epoch


class ArrayLoader:
    """In-memory arrays of any structure, permuted by (seed, epoch) and cut per rank."""

    def __init__(self, data: Any, plan: LoaderPlan) -> None:
        self.data = map_leaves(_as_array, data)
        lengths = {len(leaf) for leaf in leaves(self.data)}
        if len(lengths) != 1:
            raise ToolkitError(
                f"dataset arrays have different lengths {sorted(lengths)}",
                "pass arrays with one row per sample in each, e.g. (inputs, targets)",
            )
        self.num_samples = lengths.pop()
        self.plan = plan
        self.epoch = 0
        self.steps = steps_per_epoch(self.num_samples, plan.layout)

    def __len__(self) -> int:
        return self.steps

    @property
    def steps_per_epoch(self) -> int:
        return self.steps

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[MicroBatch]]:
        order = self.plan.epoch_order(self.num_samples, self.epoch)
        for step in range(self.steps):
            yield [
                map_leaves(lambda array, rows=rows: array[rows], self.data)
                for rows in self.plan.micro_batches(order, step)
            ]


def _as_array(leaf: Any) -> np.ndarray:
    array = np.asarray(leaf)
    if array.ndim == 0:
        raise ToolkitError(
            f"run.loader() got a scalar leaf ({type(leaf).__name__}) where it needs one row per "
            "sample",
            "pass arrays (or a torch / tf.data dataset); every leaf needs the samples on axis 0",
        )
    return array


def foreign_dataset(data: Any) -> str | None:
    """What `data` is when it belongs to an engine this run does not use, else None.

    Judged by the modules of its classes, so that no engine is imported to find out.
    """
    modules = [cls.__module__ for cls in type(data).__mro__]
    if any(module == "torch.utils.data.dataloader" for module in modules):
        return "a torch DataLoader"
    if any(module.startswith("torch.utils.data") for module in modules):
        return "a torch Dataset"
    if any(module.startswith("tensorflow.python.data") for module in modules):
        return "a tf.data.Dataset"
    return None


def refuse_unusable(data: Any, framework: str, options: dict[str, Any]) -> None:
    """A clear error for data the array loader would misread."""
    kind = foreign_dataset(data)
    if kind == "a torch DataLoader":
        raise ToolkitError(
            "run.loader() got a torch DataLoader; the toolkit builds the DataLoader itself so "
            "that every rank reads its own share in the global order",
            "pass the Dataset instead: run.loader(dataset, num_workers=...)",
        )
    if kind is not None:
        raise ToolkitError(
            f"run.loader() got {kind}, which the {framework} engines cannot read",
            "pass in-memory arrays, a torch Dataset to a torch engine, or a tf.data.Dataset to "
            "a TensorFlow engine",
        )
    if options:
        raise ToolkitError(
            f"run.loader() options {sorted(options)} apply to torch datasets only, and the data "
            f"here is in-memory arrays ({describe(data)})",
            "drop those options, or wrap the data in a torch Dataset",
        )
