"""The in-process bench's order of steps: every variant behind every other one equally often."""

from __future__ import annotations

import pytest

from toolkit.bench.ordering import carryover_balanced


@pytest.mark.parametrize("count", [2, 3, 4, 5, 7])
def test_every_ordered_pair_follows_once_per_round(count: int) -> None:
    order = carryover_balanced(count)
    pairs = [(order[i], order[(i + 1) % len(order)]) for i in range(len(order))]
    assert sorted(pairs) == [(a, b) for a in range(count) for b in range(count) if a != b]
    assert all(order.count(variant) == count - 1 for variant in range(count))


def test_one_variant_runs_alone_and_none_is_refused() -> None:
    assert carryover_balanced(1) == [0]
    with pytest.raises(ValueError, match="at least 1"):
        carryover_balanced(0)
