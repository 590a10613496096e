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

Data that can be indexed (arrays, a torch map-style Dataset) is permuted as above. A stream (a
torch IterableDataset, a tf.data.Dataset) cannot be: its own order is the epoch order, read in
consecutive global batches of G samples, each cut the same way. Every rank reads the whole
stream and keeps its share, which is what keeps the global batches independent of the world
size; the toolkit adds no shuffle to a stream (shuffle it in the dataset, seeded).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import TypeVar

import numpy as np

from toolkit.errors import ToolkitError

Sample = TypeVar("Sample")


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


def process_micro_batches(
    order: np.ndarray, layout: StepLayout, *, step: int, dp_ranks: Sequence[int]
) -> list[np.ndarray]:
    """This process's `accumulation` index arrays at `step`: the shards of the data-parallel
    replicas it holds, concatenated in replica order (one replica, except MirroredStrategy)."""
    per_replica = [micro_batch_indices(order, layout, step=step, dp_rank=r) for r in dp_ranks]
    return [
        np.concatenate([shards[a] for shards in per_replica]) for a in range(layout.accumulation)
    ]


@dataclass(frozen=True, kw_only=True)
class LoaderPlan:
    """Everything a loader needs to cut this process's share of every global batch."""

    layout: StepLayout
    dp_ranks: tuple[int, ...]
    """The data-parallel replicas this process holds, in order."""
    seed: int
    shuffle: bool | None
    """None: shuffle what can be indexed (arrays, map-style datasets); leave streams as they are."""

    def micro_batches(self, order: np.ndarray, step: int) -> list[np.ndarray]:
        return process_micro_batches(order, self.layout, step=step, dp_ranks=self.dp_ranks)

    def epoch_order(self, num_samples: int, epoch: int) -> np.ndarray:
        return epoch_order(
            num_samples, seed=self.seed, epoch=epoch, shuffle=self.shuffle is not False
        )

    def check_stream(self, what: str) -> None:
        """A stream has no random access: asking the toolkit to shuffle it is an error."""
        if self.shuffle:
            raise ToolkitError(
                f"shuffle=True for {what}: a stream cannot be shuffled by the toolkit (no random "
                "access); its own order is the sample order",
                "shuffle inside the dataset with a fixed seed (tf.data: "
                "dataset.shuffle(buffer, seed=spec.seed)), or pass a map-style dataset",
            )


def stream_steps(
    samples: Iterable[Sample], layout: StepLayout, *, dp_ranks: Sequence[int]
) -> Iterator[list[list[Sample]]]:
    """A stream's steps: consecutive global batches of G samples, each cut like an indexed
    global batch; per step, this process's `accumulation` lists of samples. A trailing partial
    global batch is dropped."""
    size = layout.global_batch
    cut = process_micro_batches(np.arange(size), layout, step=0, dp_ranks=dp_ranks)
    stream = iter(samples)
    while len(chunk := list(islice(stream, size))) == size:
        yield [[chunk[i] for i in indices] for indices in cut]
