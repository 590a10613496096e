"""Pure logic: evaluation metrics are sums and counts, added over micro-batches and ranks, and
read as means only at the end."""

from __future__ import annotations

import math
import zlib
from typing import Any

import numpy as np
import pytest

from toolkit.backends.base import Backend, add_metrics
from toolkit.errors import ToolkitError
from toolkit.runtime.evaluation import Metrics, micro_batch_groups, own_loss_metrics
from toolkit.spec import TrainSpec


def test_means_are_read_from_sums() -> None:
    metrics = Metrics({"loss_sum": 6.0, "correct": 3.0, "count": 4.0})
    assert metrics.loss == 1.5 and metrics.accuracy == 0.75
    assert metrics.perplexity == pytest.approx(math.exp(1.5))
    assert metrics.summary() == {"loss": 1.5, "accuracy": 0.75}
    assert dict(metrics) == {"loss_sum": 6.0, "correct": 3.0, "count": 4.0}
    with pytest.raises(ToolkitError, match="no metric 'correct'"):
        Metrics({"loss_sum": 1.0, "count": 1.0}).accuracy  # noqa: B018
    with pytest.raises(ToolkitError, match="nothing was evaluated"):
        Metrics({"loss_sum": 0.0, "count": 0.0}).loss  # noqa: B018


def test_metrics_are_added_per_key_and_must_keep_their_keys() -> None:
    totals: dict[str, float] = {}
    add_metrics(totals, {"count": 2, "loss_sum": np.array([0.5, 1.5])}, lambda v: float(np.sum(v)))
    add_metrics(totals, {"count": 3, "loss_sum": 1.0}, lambda v: float(np.sum(v)))
    assert totals == {"count": 5.0, "loss_sum": 3.0}
    with pytest.raises(ToolkitError, match="same keys for every micro-batch"):
        add_metrics(totals, {"count": 1}, float)
    with pytest.raises(ToolkitError, match="must return a non-empty dict"):
        add_metrics({}, 3.0, float)  # type: ignore[arg-type]


def test_default_metrics_of_a_model_that_returns_its_loss() -> None:
    class Output:
        loss = 2.0

    assert own_loss_metrics(Output(), {"ids": np.zeros((4, 3))}) == {"loss_sum": 8.0, "count": 4}
    assert own_loss_metrics({"loss": 1.0}, (np.zeros(2),)) == {"loss_sum": 2.0, "count": 2}


def test_a_loader_is_grouped_by_steps_and_anything_else_one_micro_batch_at_a_time() -> None:
    class StepLoader:
        steps_per_epoch = 1

        def set_epoch(self, epoch: int) -> None:
            pass

        def __iter__(self) -> Any:
            yield ["a", "b"]

    assert list(micro_batch_groups(StepLoader())) == [["a", "b"]]
    assert list(micro_batch_groups(["a", "b"])) == [["a"], ["b"]]


class SummingRanks(Backend):
    """The reduction logic under two ranks whose shares are given (pure logic: the collective
    is replaced by adding this rank's value to the other rank's)."""

    def __init__(self, other: dict[str, float]) -> None:
        self.env = type("Env", (), {"world_size": 2})()  # type: ignore[assignment]
        self.other = other

    def allreduce(self, value: Any, op: str = "mean") -> Any:
        names = sorted(self.other)
        if len(value) == 1:  # the names' checksum
            mine = float(zlib.crc32("\x00".join(names).encode()))
            return value + mine
        return value + np.array([self.other[name] for name in names])

    setup = prepare = train_step = eval_sums = full_state_dict = broadcast = barrier = None  # type: ignore[assignment]


def test_sums_over_ranks_and_a_name_mismatch_is_an_error() -> None:
    backend = SummingRanks({"count": 3.0, "loss_sum": 1.5})
    assert backend.sum_over_ranks({"loss_sum": 0.5, "count": 1.0}) == {
        "count": 4.0,
        "loss_sum": 2.0,
    }
    with pytest.raises(ToolkitError, match="ranks reported different metric names"):
        backend.sum_over_ranks({"count": 1.0})


class TwoRanks(Backend):
    """Two ranks whose other one reports `other` (pure logic: the mean is computed here)."""

    def __init__(self, step_loss: str, other: float) -> None:
        self.spec = TrainSpec.from_dict({"step_loss": step_loss})
        self.other = other
        self.reductions = 0

    def allreduce(self, value: Any, op: str = "mean") -> Any:
        self.reductions += 1
        return (value + self.other) / 2

    setup = prepare = train_step = eval_sums = full_state_dict = broadcast = barrier = None  # type: ignore[assignment]


def test_step_loss_local_is_this_ranks_without_a_collective_and_global_is_the_mean() -> None:
    local = TwoRanks("local", other=3.0)
    assert local.reported_loss(1.0) == 1.0 and local.reductions == 0
    shared = TwoRanks("global", other=3.0)
    assert shared.reported_loss(1.0) == 2.0 and shared.reductions == 1
