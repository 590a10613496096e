"""Pure logic: every loader cuts the same global batches, whatever the data's structure, kind
(indexed or a stream) and the number of data-parallel ranks."""

from __future__ import annotations

import numpy as np
import pytest

from toolkit.errors import ToolkitError
from toolkit.runtime.loader import ArrayLoader, foreign_dataset, refuse_unusable
from toolkit.sharding import LoaderPlan, StepLayout, process_micro_batches, stream_steps


def plan(layout: StepLayout, ranks: tuple[int, ...], shuffle: bool | None = None) -> LoaderPlan:
    return LoaderPlan(layout=layout, dp_ranks=ranks, seed=5, shuffle=shuffle)


def global_batch(steps: list[list[np.ndarray]]) -> list[int]:
    return sorted(int(i) for step in steps for micro in step for i in micro)


def test_a_stream_is_cut_like_an_unshuffled_index_order() -> None:
    layout = StepLayout(micro=2, accumulation=2, dp_size=2)
    order = np.arange(20)
    for rank in range(2):
        streamed = list(stream_steps(range(20), layout, dp_ranks=[rank]))
        assert len(streamed) == 2  # 20 samples, global batch 8: the last 4 are dropped
        for step, micro_batches in enumerate(streamed):
            indexed = process_micro_batches(order, layout, step=step, dp_ranks=[rank])
            assert micro_batches == [list(indices) for indices in indexed]


@pytest.mark.parametrize("dp_size", [1, 2, 4])
def test_a_stream_gives_the_same_global_batches_for_any_world_size(dp_size: int) -> None:
    layout = StepLayout(micro=8 // dp_size, accumulation=1, dp_size=dp_size)
    per_rank = [list(stream_steps(range(30), layout, dp_ranks=[r])) for r in range(dp_size)]
    for step in range(3):
        samples = sorted(s for rank in per_rank for micro in rank[step] for s in micro)
        assert samples == list(range(step * 8, step * 8 + 8))


def test_a_process_holding_several_replicas_gets_them_concatenated() -> None:
    layout = StepLayout(micro=2, accumulation=1, dp_size=2)
    both = list(stream_steps(range(8), layout, dp_ranks=[0, 1]))
    assert both == [[[0, 1, 2, 3]], [[4, 5, 6, 7]]]


def test_array_loader_keeps_any_structure_and_cuts_like_a_tuple() -> None:
    layout = StepLayout(micro=3, accumulation=2, dp_size=2)
    x = np.arange(40, dtype=np.float32).reshape(20, 2)
    y = np.arange(20)
    for rank in range(2):
        pairs = ArrayLoader((x, y), plan(layout, (rank,)))
        dicts = ArrayLoader({"inputs": {"x": x}, "labels": y}, plan(layout, (rank,)))
        pairs.set_epoch(1)
        dicts.set_epoch(1)
        assert len(pairs) == pairs.steps_per_epoch == 1
        for pair_step, dict_step in zip(pairs, dicts, strict=True):
            for (px, py), d in zip(pair_step, dict_step, strict=True):
                assert np.array_equal(px, d["inputs"]["x"]) and np.array_equal(py, d["labels"])
                assert np.array_equal(px[:, 0] / 2, py)  # rows stay together


def test_array_loader_reshuffles_per_epoch_and_shuffle_false_keeps_order() -> None:
    layout = StepLayout(micro=4, accumulation=1, dp_size=1)
    loader = ArrayLoader(np.arange(8), plan(layout, (0,)))
    first = [m.tolist() for step in loader for m in step]
    loader.set_epoch(1)
    assert first != [m.tolist() for step in loader for m in step]
    ordered = ArrayLoader(np.arange(8), plan(layout, (0,), shuffle=False))
    assert [m.tolist() for step in ordered for m in step] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_array_loader_refuses_ragged_and_scalar_leaves() -> None:
    layout = StepLayout(micro=1, accumulation=1, dp_size=1)
    with pytest.raises(ToolkitError, match="different lengths"):
        ArrayLoader((np.zeros(3), np.zeros(4)), plan(layout, (0,)))
    with pytest.raises(ToolkitError, match="scalar leaf"):
        ArrayLoader({"x": np.zeros(3), "n": 3}, plan(layout, (0,)))


def test_a_stream_refuses_shuffle_true_only() -> None:
    layout = StepLayout(micro=1, accumulation=1, dp_size=1)
    plan(layout, (0,)).check_stream("a stream")
    plan(layout, (0,), shuffle=False).check_stream("a stream")
    with pytest.raises(ToolkitError, match="cannot be shuffled by the toolkit"):
        plan(layout, (0,), shuffle=True).check_stream("a stream")


def test_datasets_of_the_other_framework_are_named_without_importing_it() -> None:
    class Dataset:  # stands for a class defined in torch.utils.data
        pass

    Dataset.__module__ = "torch.utils.data.dataset"
    assert foreign_dataset(Dataset()) == "a torch Dataset"
    assert foreign_dataset(np.zeros(2)) is None
    with pytest.raises(ToolkitError, match="got a torch Dataset, which the tensorflow engines"):
        refuse_unusable(Dataset(), "tensorflow", {})
    with pytest.raises(ToolkitError, match=r"options \['num_workers'\] apply to torch datasets"):
        refuse_unusable((np.zeros(2),), "torch", {"num_workers": 2})
