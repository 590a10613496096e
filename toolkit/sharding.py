"""Which samples each rank sees in each micro-batch of each optimizer step. No engine imports.

The order is fixed per global step so that every engine, and a single-process reference, sees
the same global batch at the same step; only how it is cut up differs:

    epoch order    = permutation(seed, epoch) of the sample indices (or 0..N-1 unshuffled)
    step s         = epoch order[s*G : (s+1)*G]                 G = global batch
    reshaped       = step s as [accumulation, data-parallel ranks, micro]
    rank r, micro a = reshaped[a, r, :]

Every engine averages the loss over equally sized micro-batches and ranks, so any fixed cut of
the G samples gives the same gradient as one batch of G: that is what makes parity checkable.
A trailing partial global batch is dropped, as `drop_last=True` does, because a smaller last
step would weigh its samples differently on different engines.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from toolkit.errors import ToolkitError


@dataclass(frozen=True, kw_only=True)
class StepLayout:
    """How one optimizer step's global batch is cut: global = micro × accumulation × dp_size."""

    micro: int
    accumulation: int
    dp_size: int

    @property
    def global_batch(self) -> int:
        return self.micro * self.accumulation * self.dp_size


def steps_per_epoch(num_samples: int, layout: StepLayout) -> int:
    steps = num_samples // layout.global_batch
    if steps == 0:
        raise ToolkitError(
            f"dataset has {num_samples} samples, fewer than one global batch "
            f"({layout.global_batch} = micro {layout.micro} × accumulation "
            f"{layout.accumulation} × data-parallel ranks {layout.dp_size})",
            hint="lower batch.global or use more data",
        )
    return steps


def epoch_order(num_samples: int, *, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    if not shuffle:
        return np.arange(num_samples)
    # One generator per (seed, epoch): the order does not depend on how many steps ran before.
    return np.random.default_rng([seed, epoch]).permutation(num_samples)


def micro_batch_indices(
    order: np.ndarray, layout: StepLayout, *, step: int, dp_rank: int
) -> list[np.ndarray]:
    """The `accumulation` index arrays that `dp_rank` trains on at `step` of an epoch."""
    if not 0 <= dp_rank < layout.dp_size:
        raise ValueError(f"dp_rank {dp_rank} outside 0..{layout.dp_size - 1}")
    size = layout.global_batch
    step_indices = order[step * size : (step + 1) * size]
    grid = step_indices.reshape(layout.accumulation, layout.dp_size, layout.micro)
    return [grid[a, dp_rank] for a in range(layout.accumulation)]
