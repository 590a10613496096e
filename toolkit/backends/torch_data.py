"""Torch datasets as toolkit loaders. Imported only by the torch backends.

- A map-style `Dataset` (with `__len__`) is read through a torch `DataLoader` whose batch
  sampler yields this process's micro-batches of each step in the toolkit's global order
  (`toolkit.sharding`: a permutation of (seed, epoch), so the same on every engine and world
  size, reshuffled every epoch, the trailing partial global batch dropped). Worker processes
  (`num_workers > 0`) load and collate whole micro-batches; the order is fixed by the sampler,
  which runs in this process, so it does not depend on the number of workers. Micro-batches
  are collated with torch's `default_collate` unless a `collate_fn` is given.
- An `IterableDataset` is a stream: read whole by every rank, in consecutive global batches,
  each rank keeping its share (see `toolkit.sharding`); no shuffling is added. With
  `num_workers > 0` each worker holds a copy of the dataset and must read only its part
  (`torch.utils.data.get_worker_info()`): split round-robin by sample (worker w of k takes
  samples w, w+k, ...) and the stream is the same for any number of workers, because the
  DataLoader takes one sample from each worker in turn. A dataset's `set_epoch(epoch)`, if it
  has one, is called before every epoch (workers must then not be persistent).

Worker processes draw their seeds from a generator seeded with spec.seed, not from torch's
global generator: a DataLoader otherwise takes a number from it on every epoch, which would
change the model's own random numbers (dropout) depending on how data is loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler, default_collate

from toolkit.backends.base import Loader, MicroBatch
from toolkit.errors import ToolkitError
from toolkit.sharding import LoaderPlan, steps_per_epoch, stream_steps

# The DataLoader arguments that decide which samples go where: the toolkit's to set.
OWNED_OPTIONS = ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last", "generator")


def make_torch_loader(data: Any, plan: LoaderPlan, options: dict[str, Any]) -> Loader | None:
    """A loader for a torch Dataset; None for anything else."""
    if not isinstance(data, Dataset):
        return None
    owned = sorted(set(options) & set(OWNED_OPTIONS))
    if owned:
        raise ToolkitError(
            f"run.loader() options {owned} are the toolkit's to set: it cuts every global "
            "batch the same way on every engine",
            "set batch sizes in the spec's batch section, and shuffling with shuffle=",
        )
    if isinstance(data, IterableDataset):
        return StreamLoader(data, plan, **options)
    return MapLoader(data, plan, **options)


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class StepSampler(Sampler[list[int]]):
    """Index lists of this process's micro-batches, step after step, for one epoch."""

    def __init__(self, num_samples: int, plan: LoaderPlan, steps: int) -> None:
        self.num_samples = num_samples
        self.plan = plan
        self.steps = steps
        self.epoch = 0

    def __len__(self) -> int:
        return self.steps * self.plan.layout.accumulation

    def __iter__(self) -> Iterator[list[int]]:
        order = self.plan.epoch_order(self.num_samples, self.epoch)
        for step in range(self.steps):
            for indices in self.plan.micro_batches(order, step):
                yield indices.tolist()


class MapLoader:
    """A map-style Dataset through a DataLoader (worker processes allowed)."""

    def __init__(
        self,
        dataset: Dataset[Any],
        plan: LoaderPlan,
        *,
        num_workers: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        **dataloader_options: Any,
    ) -> None:
        try:
            num_samples = len(dataset)  # type: ignore[arg-type]
        except TypeError:
            raise ToolkitError(
                f"{type(dataset).__name__} is a map-style Dataset without __len__",
                "define __len__, or make it an IterableDataset to read it as a stream",
            ) from None
        self.plan = plan
        self.steps = steps_per_epoch(num_samples, plan.layout)
        self.sampler = StepSampler(num_samples, plan, self.steps)
        self.loader = DataLoader(
            dataset,
            batch_sampler=self.sampler,
            num_workers=num_workers,
            collate_fn=collate_fn or default_collate,
            generator=_generator(plan.seed),
            **dataloader_options,
        )

    @property
    def steps_per_epoch(self) -> int:
        return self.steps

    def __len__(self) -> int:
        return self.steps

    def set_epoch(self, epoch: int) -> None:
        self.sampler.epoch = epoch

    def __iter__(self) -> Iterator[list[MicroBatch]]:
        micro_batches = iter(self.loader)
        for _ in range(self.steps):
            yield [next(micro_batches) for _ in range(self.plan.layout.accumulation)]


class StreamLoader:
    """An IterableDataset read as a stream, cut into global batches."""

    steps_per_epoch = None

    def __init__(
        self,
        dataset: IterableDataset[Any],
        plan: LoaderPlan,
        *,
        num_workers: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        **dataloader_options: Any,
    ) -> None:
        plan.check_stream("a torch IterableDataset")
        self.dataset = dataset
        self.plan = plan
        self.collate = collate_fn or default_collate
        # batch_size=None: the DataLoader hands over single samples (numpy made tensors).
        self.loader = DataLoader(
            dataset,
            batch_size=None,
            num_workers=num_workers,
            generator=_generator(plan.seed),
            **dataloader_options,
        )

    def set_epoch(self, epoch: int) -> None:
        set_epoch = getattr(self.dataset, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)

    def __iter__(self) -> Iterator[list[MicroBatch]]:
        for step in stream_steps(self.loader, self.plan.layout, dp_ranks=self.plan.dp_ranks):
            yield [self.collate(samples) for samples in step]


class TorchData:
    """The torch backends' `make_loader`: torch datasets, anything else left to the runtime.
    Under CUDA the DataLoader pins its batches (unless the script says `pin_memory=`), so
    that their copies to the GPU are non-blocking."""

    device: Any

    def make_loader(self, data: Any, plan: LoaderPlan, options: dict[str, Any]) -> Loader | None:
        if isinstance(self.device, torch.device) and self.device.type == "cuda":
            options = {"pin_memory": True, **options}
        return make_torch_loader(data, plan, options)
