"""A sharded, seeded loader over in-memory arrays: one optimizer step's micro-batches at a time.

It yields, per step, the list of `accumulation` micro-batches this process trains on, cut by
`toolkit.sharding` so that every engine sees the same global batch at the same step. A process
that holds several data-parallel replicas (MirroredStrategy) gets each micro-batch as its
replicas' shards concatenated in replica order.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from toolkit.errors import ToolkitError
from toolkit.sharding import StepLayout, epoch_order, micro_batch_indices, steps_per_epoch

Arrays = Sequence[Any]


class ShardedLoader:
    def __init__(
        self,
        arrays: Arrays,
        layout: StepLayout,
        *,
        dp_ranks: Sequence[int],
        seed: int,
        shuffle: bool,
    ) -> None:
        self.arrays = [np.asarray(array) for array in arrays]
        lengths = {len(array) for array in self.arrays}
        if len(lengths) != 1:
            raise ToolkitError(
                f"dataset arrays have different lengths {sorted(lengths)}",
                "pass (inputs, targets) with one row per sample in each",
            )
        self.num_samples = lengths.pop()
        self.layout = layout
        self.dp_ranks = list(dp_ranks)
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0

    def __len__(self) -> int:
        return steps_per_epoch(self.num_samples, self.layout)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[tuple[Any, ...]]]:
        order = epoch_order(
            self.num_samples, seed=self.seed, epoch=self.epoch, shuffle=self.shuffle
        )
        for step in range(len(self)):
            per_replica = [
                micro_batch_indices(order, self.layout, step=step, dp_rank=rank)
                for rank in self.dp_ranks
            ]
            yield [
                tuple(array[np.concatenate([r[a] for r in per_replica])] for array in self.arrays)
                for a in range(self.layout.accumulation)
            ]
