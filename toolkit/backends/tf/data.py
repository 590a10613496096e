"""A `tf.data.Dataset` as a toolkit loader. Imported only by the TF backends.

A tf.data dataset is a stream (no random access): its elements are single samples, in the
dataset's own order, which the toolkit does not change. Every rank reads the whole stream in
consecutive global batches of G samples (`dataset.batch(G, drop_remainder=True)`, so the
trailing partial global batch is dropped) and keeps its share of each, cut as
`toolkit.sharding` cuts every global batch: the same global batches on every engine and world
size. Shuffle inside the dataset, seeded, e.g. `dataset.shuffle(buffer, seed=spec.seed)`: with
a seed, tf.data gives the same order on every rank, and a new one every epoch
(reshuffle_each_iteration). That order depends on TF's global seed as well, which
`toolkit.init` sets to spec.seed: a single-process comparison must set it too
(`keras.utils.set_random_seed(spec.seed)`) before building its dataset. Elements must have
one shape to be batched; pad variable-length samples in the dataset.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from toolkit.backends.base import Loader, MicroBatch
from toolkit.backends.batches import map_leaves
from toolkit.backends.tf import common
from toolkit.errors import ToolkitError
from toolkit.sharding import LoaderPlan, process_micro_batches

tf = common.tf


def make_tf_loader(data: Any, plan: LoaderPlan, options: dict[str, Any]) -> Loader | None:
    """A loader for a tf.data.Dataset; None for anything else."""
    if not isinstance(data, tf.data.Dataset):
        return None
    if options:
        raise ToolkitError(
            f"run.loader() options {sorted(options)} apply to torch datasets; a tf.data "
            "pipeline sets its own parallelism",
            "use dataset.map(..., num_parallel_calls=tf.data.AUTOTUNE) and .prefetch() instead",
        )
    return TFDataLoader(data, plan)


class TFDataLoader:
    def __init__(self, dataset: Any, plan: LoaderPlan) -> None:
        plan.check_stream("a tf.data.Dataset")
        self.dataset = dataset
        self.plan = plan
        size = plan.layout.global_batch
        self.cut = process_micro_batches(
            np.arange(size), plan.layout, step=0, dp_ranks=plan.dp_ranks
        )
        self.global_batches = dataset.batch(size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)

    @property
    def steps_per_epoch(self) -> int | None:
        steps = int(self.global_batches.cardinality())
        return steps if steps >= 0 else None  # INFINITE (-1) and UNKNOWN (-2)

    def set_epoch(self, epoch: int) -> None:
        """tf.data reshuffles on each iteration itself (reshuffle_each_iteration)."""

    def __iter__(self) -> Iterator[list[MicroBatch]]:
        for batch in self.global_batches.as_numpy_iterator():
            yield [map_leaves(lambda leaf, rows=rows: leaf[rows], batch) for rows in self.cut]
