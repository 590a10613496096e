"""TensorFlow micro-batches of any structure: stacked for a compiled step, and evaluated.

Imported only by the TF backends. Structures are handled with `tf.nest`, so a dict, a tuple or
any nesting of them reaches the Keras model as its one `inputs` argument (Keras' own rule).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from toolkit.backends.base import MetricFn, MicroBatch, add_metrics
from toolkit.backends.batches import map_leaves
from toolkit.backends.tf import common

tf = common.tf


def stack_micro_batches(micro_batches: Sequence[MicroBatch]) -> Any:
    """A step's micro-batches as one structure whose leaves are [micro-batches, samples, ...]."""
    return map_leaves(
        lambda *leaves: np.stack([np.asarray(leaf) for leaf in leaves]), *micro_batches
    )


def constants(batch: Any) -> Any:
    return tf.nest.map_structure(tf.constant, batch)


def metric_float(value: Any) -> float:
    return float(np.sum(np.asarray(value, dtype=np.float64)))


class Evaluator:
    """No-gradient evaluation of a Keras model, one compiled function per metric_fn.

    The model runs on this process's whole micro-batch outside any replica context: a forward
    pass in inference mode is the same on every replica, and no collective runs in it, so
    the metric sums are this process's alone until `Backend.sum_over_ranks` adds them up.
    """

    def __init__(self, model: Any) -> None:
        self.model = model
        self._compiled: dict[tuple[MetricFn, bool], Callable[[Any], Any]] = {}

    def _function(self, metric_fn: MetricFn, pairs: bool) -> Callable[[Any], Any]:
        key = (metric_fn, pairs)
        if key not in self._compiled:
            model = self.model

            @tf.function(reduce_retracing=True)
            def evaluate(batch: Any) -> Any:
                if pairs:
                    inputs, targets = common.split_pair(batch, "evaluate with pairs=True")
                    return metric_fn(model(inputs, training=False), targets)
                return metric_fn(model(batch, training=False), batch)

            self._compiled[key] = evaluate
        return self._compiled[key]

    def sums(
        self, micro_batches: Sequence[MicroBatch], metric_fn: MetricFn, *, pairs: bool
    ) -> dict[str, float]:
        function = self._function(metric_fn, pairs)
        totals: dict[str, float] = {}
        for batch in micro_batches:
            add_metrics(totals, function(constants(batch)), metric_float)
        return totals
