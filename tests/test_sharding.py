"""Pure logic: every global step is covered exactly once, whatever the cut."""

from __future__ import annotations

import numpy as np
import pytest

from toolkit.errors import ToolkitError
from toolkit.sharding import StepLayout, epoch_order, micro_batch_indices, steps_per_epoch

LAYOUTS = [
    StepLayout(micro=8, accumulation=1, dp_size=1),
    StepLayout(micro=4, accumulation=2, dp_size=1),
    StepLayout(micro=4, accumulation=1, dp_size=2),
    StepLayout(micro=2, accumulation=2, dp_size=2),
]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_step_is_the_same_global_batch_for_every_cut(layout: StepLayout) -> None:
    order = epoch_order(37, seed=3, epoch=1, shuffle=True)
    reference = StepLayout(micro=8, accumulation=1, dp_size=1)
    for step in range(steps_per_epoch(37, layout)):
        pieces = [
            index
            for rank in range(layout.dp_size)
            for micro in micro_batch_indices(order, layout, step=step, dp_rank=rank)
            for index in micro
        ]
        (whole,) = micro_batch_indices(order, reference, step=step, dp_rank=0)
        assert sorted(pieces) == sorted(whole)
        assert all(
            len(m) == layout.micro for m in micro_batch_indices(order, layout, step=step, dp_rank=0)
        )


def test_order_depends_on_seed_and_epoch_only() -> None:
    first = epoch_order(100, seed=1, epoch=0, shuffle=True)
    assert np.array_equal(first, epoch_order(100, seed=1, epoch=0, shuffle=True))
    assert not np.array_equal(first, epoch_order(100, seed=1, epoch=1, shuffle=True))
    assert not np.array_equal(first, epoch_order(100, seed=2, epoch=0, shuffle=True))
    assert np.array_equal(epoch_order(5, seed=1, epoch=0, shuffle=False), np.arange(5))


def test_partial_last_step_is_dropped_and_too_little_data_is_an_error() -> None:
    assert steps_per_epoch(17, StepLayout(micro=4, accumulation=1, dp_size=2)) == 2
    with pytest.raises(ToolkitError, match="fewer than one global batch"):
        steps_per_epoch(7, StepLayout(micro=4, accumulation=1, dp_size=2))
