"""Torch datasets through the toolkit's loaders, in this process (no engine needed to cut data):
a map-style Dataset read by DataLoader worker processes gives exactly the micro-batches the array
loader gives; an IterableDataset is a stream cut the same way for every world size."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from toolkit.errors import ToolkitError
from toolkit.runtime.loader import ArrayLoader
from toolkit.sharding import LoaderPlan, StepLayout

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info  # noqa: E402

from toolkit.backends.torch_data import MapLoader, StreamLoader, make_torch_loader  # noqa: E402

X = np.arange(2 * 40, dtype=np.float32).reshape(40, 2)
Y = np.arange(40, dtype=np.int64)


class DictSamples(Dataset):
    def __len__(self) -> int:
        return len(Y)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"features": X[index], "label": Y[index]}


class Stream(IterableDataset):
    """Samples 0..n-1; with workers, worker w of k yields samples w, w+k, ... (round-robin)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.epochs: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)

    def __iter__(self) -> Any:
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for index in range(start, self.n, step):
            yield {"features": X[index], "label": Y[index]}


def plan(rank: int, dp_size: int = 2, shuffle: bool | None = None) -> LoaderPlan:
    """Global batch 12 for any number of ranks."""
    layout = StepLayout(micro=6 // dp_size, accumulation=2, dp_size=dp_size)
    return LoaderPlan(layout=layout, dp_ranks=(rank,), seed=11, shuffle=shuffle)


@pytest.mark.parametrize("workers", [0, 2])
def test_map_style_dataset_gives_the_array_loaders_micro_batches(workers: int) -> None:
    for rank in range(2):
        arrays = ArrayLoader({"features": X, "label": Y}, plan(rank))
        dataset = make_torch_loader(DictSamples(), plan(rank), {"num_workers": workers})
        assert isinstance(dataset, MapLoader)
        assert dataset.steps_per_epoch == len(arrays) == 3
        for epoch in range(2):  # reshuffled per epoch, identically
            arrays.set_epoch(epoch)
            dataset.set_epoch(epoch)
            steps = 0
            for expected, got in zip(arrays, dataset, strict=True):
                steps += 1
                assert len(got) == 2
                for want, micro in zip(expected, got, strict=True):
                    assert isinstance(micro["features"], torch.Tensor)  # default_collate
                    assert np.array_equal(micro["features"].numpy(), want["features"])
                    assert np.array_equal(micro["label"].numpy(), want["label"])
            assert steps == 3


def test_loading_does_not_touch_torchs_global_generator() -> None:
    torch.manual_seed(0)
    expected = torch.rand(1)
    torch.manual_seed(0)
    loader = make_torch_loader(DictSamples(), plan(0), {})
    assert loader is not None
    for _ in loader:
        pass
    assert torch.equal(torch.rand(1), expected)


@pytest.mark.parametrize("workers", [0, 2])
def test_iterable_dataset_is_a_stream_with_the_same_global_batches_for_any_world_size(
    workers: int,
) -> None:
    def samples(dp_size: int) -> list[list[int]]:
        per_step: list[list[int]] = []
        for rank in range(dp_size):
            loader = make_torch_loader(Stream(40), plan(rank, dp_size), {"num_workers": workers})
            assert isinstance(loader, StreamLoader) and loader.steps_per_epoch is None
            for step, micro_batches in enumerate(loader):
                if len(per_step) <= step:
                    per_step.append([])
                per_step[step] += [int(y) for micro in micro_batches for y in micro["label"]]
        return [sorted(step) for step in per_step]

    one, two = samples(1), samples(2)
    assert one == two
    # consecutive global batches of 12 samples, the last 4 samples dropped
    assert [len(step) for step in two] == [12, 12, 12]
    assert two[0] == list(range(12))


def test_iterable_dataset_gets_set_epoch_and_refuses_shuffle_true() -> None:
    stream = Stream(40)
    loader = make_torch_loader(stream, plan(0), {})
    assert loader is not None
    loader.set_epoch(3)
    assert stream.epochs == [3]
    with pytest.raises(ToolkitError, match="cannot be shuffled"):
        make_torch_loader(Stream(40), plan(0, shuffle=True), {})


def test_sample_routing_options_are_the_toolkits() -> None:
    with pytest.raises(ToolkitError, match=r"\['batch_size', 'shuffle'\] are the toolkit's"):
        make_torch_loader(DictSamples(), plan(0), {"batch_size": 4, "shuffle": True})
    assert make_torch_loader((X, Y), plan(0), {}) is None
    assert make_torch_loader(DataLoader(DictSamples()), plan(0), {}) is None
