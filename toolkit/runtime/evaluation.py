"""Evaluation reduced as sums and counts over every rank, and what to read from them.

    metrics = run.evaluate(run.loader((x_test, y_test), shuffle=False), metric_fn)
    metrics["correct"], metrics.loss, metrics.accuracy, metrics.perplexity

`metric_fn(outputs, targets)` returns one micro-batch's sums, for example
`{"loss_sum": cross_entropy(outputs, targets, reduction="sum"), "correct": ..., "count": n}`.
The toolkit adds them over micro-batches on each rank and then over ranks, in float64. Means
are taken once, at the end (`Metrics.mean`): a mean of per-rank or per-batch means would weigh
batches of different sizes wrongly. A value that is not a scalar adds its sum, so per-sample
values work too.

Which samples: a toolkit loader yields whole global batches and drops a trailing partial one
(see `toolkit.sharding`), so size a held-out set as a multiple of the global batch to evaluate
all of it; the `count` says how many samples were evaluated. Every rank must evaluate the same
number of micro-batches: under ZeRO-3 and the pipeline engine the forward pass is collective.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from toolkit.backends.base import Loader, MicroBatch
from toolkit.backends.batches import batch_size
from toolkit.errors import ToolkitError

# Reading sums: "<name>_sum" / count is the mean <name>; correct / count is the accuracy.
SUM_SUFFIX = "_sum"


class Metrics(Mapping[str, float]):
    """Metric sums over every rank and micro-batch, with the means read from them."""

    def __init__(self, sums: Mapping[str, float], count_key: str = "count") -> None:
        self.sums = dict(sums)
        self.count_key = count_key

    def __getitem__(self, key: str) -> float:
        return self.sums[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.sums)

    def __len__(self) -> int:
        return len(self.sums)

    def __repr__(self) -> str:
        return f"Metrics({self.sums})"

    def mean(self, key: str) -> float:
        """sums[key] / sums[count]."""
        for needed in (key, self.count_key):
            if needed not in self.sums:
                raise ToolkitError(
                    f"no metric {needed!r} to take a mean with (metrics: {sorted(self.sums)})",
                    f"return {needed!r} from metric_fn",
                )
        count = self.sums[self.count_key]
        if count == 0:
            raise ToolkitError(f"{self.count_key} is 0: nothing was evaluated")
        return self.sums[key] / count

    @property
    def loss(self) -> float:
        return self.mean("loss" + SUM_SUFFIX)

    @property
    def accuracy(self) -> float:
        return self.mean("correct")

    @property
    def perplexity(self) -> float:
        """exp of the mean loss: meaningful when loss_sum sums per-token cross-entropy and
        count counts the tokens."""
        return math.exp(self.loss)

    def summary(self) -> dict[str, float]:
        """The means that can be read: every <name>_sum as <name>, correct as accuracy."""
        if not self.sums.get(self.count_key):
            return {}
        found = {
            key.removesuffix(SUM_SUFFIX): self.mean(key)
            for key in self.sums
            if key.endswith(SUM_SUFFIX)
        }
        if "correct" in self.sums:
            found["accuracy"] = self.accuracy
        return found


def own_loss_metrics(outputs: Any, batch: MicroBatch) -> dict[str, Any]:
    """The default metric_fn for a model that returns its own loss: that (mean) loss weighed by
    the micro-batch's samples."""
    loss = outputs["loss"] if isinstance(outputs, Mapping) else getattr(outputs, "loss", outputs)
    samples = batch_size(batch)
    return {"loss" + SUM_SUFFIX: loss * samples, "count": samples}


def micro_batch_groups(batches: Loader | Iterable[MicroBatch]) -> Iterator[list[MicroBatch]]:
    """A toolkit loader's steps as they come; any other iterable one micro-batch at a time."""
    if isinstance(batches, Loader):
        yield from batches
    else:
        for batch in batches:
            yield [batch]
