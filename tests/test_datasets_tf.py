"""A tf.data pipeline through the toolkit's loader, in this process: a stream of samples cut into
the same global batches as any other stream, for every world size."""

from __future__ import annotations

import numpy as np
import pytest

from toolkit.errors import ToolkitError
from toolkit.sharding import LoaderPlan, StepLayout, stream_steps

tf = pytest.importorskip("tensorflow")
from toolkit.backends.tf.batches import stack_micro_batches  # noqa: E402
from toolkit.backends.tf.data import TFDataLoader, make_tf_loader  # noqa: E402

X = np.arange(2 * 30, dtype=np.float32).reshape(30, 2)
Y = np.arange(30, dtype=np.int64)


def dataset() -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices(({"features": X}, Y))


def plan(rank: int, dp_size: int, shuffle: bool | None = None) -> LoaderPlan:
    layout = StepLayout(micro=4 // dp_size, accumulation=2, dp_size=dp_size)
    return LoaderPlan(layout=layout, dp_ranks=(rank,), seed=3, shuffle=shuffle)


@pytest.mark.parametrize("dp_size", [1, 2])
def test_tf_data_is_cut_like_any_stream(dp_size: int) -> None:
    for rank in range(dp_size):
        loader = make_tf_loader(dataset(), plan(rank, dp_size), {})
        assert isinstance(loader, TFDataLoader)
        assert loader.steps_per_epoch == 3  # 30 samples, global batch 8: 6 dropped
        expected = list(stream_steps(range(30), plan(rank, dp_size).layout, dp_ranks=[rank]))
        got = list(loader)
        assert len(got) == len(expected) == 3
        for want_step, step in zip(expected, got, strict=True):
            for want, (inputs, labels) in zip(want_step, step, strict=True):
                assert labels.tolist() == want
                assert np.array_equal(inputs["features"], X[want])


def test_a_seeded_tf_shuffle_is_the_same_on_every_rank_and_new_each_epoch() -> None:
    def epochs() -> list[list[int]]:
        shuffled = dataset().shuffle(30, seed=7, reshuffle_each_iteration=True)
        loader = make_tf_loader(shuffled, plan(0, 1), {})
        assert loader is not None
        return [[int(y) for step in loader for _, labels in step for y in labels] for _ in "ab"]

    first, second = epochs(), epochs()
    assert first == second
    assert first[0] != first[1]


def test_tf_data_refuses_torch_options_and_toolkit_shuffling() -> None:
    with pytest.raises(ToolkitError, match="num_parallel_calls"):
        make_tf_loader(dataset(), plan(0, 1), {"num_workers": 2})
    with pytest.raises(ToolkitError, match="cannot be shuffled by the toolkit"):
        make_tf_loader(dataset(), plan(0, 1, shuffle=True), {})
    assert make_tf_loader((X, Y), plan(0, 1), {}) is None


def test_micro_batches_of_any_structure_stack_leaf_by_leaf() -> None:
    micro = [({"features": X[:2]}, Y[:2]), ({"features": X[2:4]}, Y[2:4])]
    stacked = stack_micro_batches(micro)
    assert stacked[0]["features"].shape == (2, 2, 2)
    assert stacked[1].tolist() == [[0, 1], [2, 3]]
