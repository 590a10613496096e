"""The benches' orders: every variant behind every other one equally often, and (the allreduce
bench) every path's buffer at every place in memory."""

from __future__ import annotations

import itertools

import pytest

from toolkit.bench.ordering import carryover_balanced
from toolkit.bench.ranks.toolkit_allreduce import allocation_order, lead_in, rounds


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


@pytest.mark.parametrize("count", [2, 5, 6])
def test_allreduce_allocation_order_puts_each_path_at_each_place_once_in_n_rounds(
    count: int,
) -> None:
    paths = [f"path{index}" for index in range(count)]
    orders = [allocation_order(paths, round_index) for round_index in range(count)]
    assert all(sorted(order) == paths for order in orders)
    for place in range(count):
        assert sorted(order[place] for order in orders) == paths
    assert allocation_order(paths, count) == orders[0]


def test_allreduce_rounds_are_whole_and_give_every_path_its_blocks() -> None:
    paths = ["raw", "toolkit", "memcpy"]
    planned = rounds(paths, blocks=5, places=1)
    # 3 paths: 2 blocks each a round, so 5 blocks take 3 whole rounds.
    assert len(planned) == 3
    assert all(sorted(order) == sorted(paths * 2) for order in planned)
    # Two buffers (raw's and toolkit's; memcpy keeps its own) take whole turns of 2 rounds.
    assert len(rounds(paths, blocks=5, places=2)) == 4
    assert len(rounds(paths, blocks=1, places=2)) == 2


@pytest.mark.parametrize("count", [2, 4, 5, 6])
def test_every_timed_allreduce_block_follows_its_designed_predecessor_once(count: int) -> None:
    paths = [f"path{index}" for index in range(count)]
    (round_order,) = rounds(paths, blocks=1, places=1)
    run = [lead_in(round_order), *round_order]  # the lead-in is not timed
    pairs = sorted(itertools.pairwise(run))
    assert pairs == sorted((a, b) for a in paths for b in paths if a != b)


@pytest.mark.parametrize(("names", "blocks"), [(3, 9), (4, 9), (5, 9), (4, 25)])
def test_every_allreduce_buffer_takes_every_place_equally_often_in_a_launch(
    names: int, blocks: int
) -> None:
    paths = [f"path{index}" for index in range(names)]
    planned = rounds([*paths, "memcpy"], blocks, places=names)
    places = [allocation_order(paths, round_index) for round_index in range(len(planned))]
    for path in paths:
        counts = [sum(order[place] == path for order in places) for place in range(names)]
        assert len(set(counts)) == 1, (path, counts)
