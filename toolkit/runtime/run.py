"""`toolkit.init(spec)` and the `Run` it returns: the same training loop on every engine.

    run = toolkit.init(spec)
    model = run.prepare(model)
    for micro_batches in run.steps(run.loader((x, y)), epochs=3):
        loss = run.train_step(micro_batches, loss_fn)
    weights = run.full_state_dict()

No engine is imported here: `init` detects the launcher, refuses a launcher the backend cannot
run under, then loads the backend class from the registry.
"""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

import numpy as np

from toolkit.backends.base import Backend, LossFn, MicroBatch
from toolkit.backends.registry import check_environment, load_backend_class
from toolkit.launch.environment import LaunchEnvironment, detect_environment
from toolkit.launch.rank_side import join_supervisor
from toolkit.runtime.loader import Arrays, ShardedLoader
from toolkit.runtime.progress import progress
from toolkit.sharding import StepLayout
from toolkit.spec import TrainSpec


class Run:
    def __init__(self, spec: TrainSpec, env: LaunchEnvironment, backend: Backend) -> None:
        self.spec = spec
        self.env = env
        self.backend = backend
        self.step = 0

    # -- where this process stands ------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def local_rank(self) -> int:
        return self.env.local_rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def is_main(self) -> bool:
        return self.env.rank == 0

    @property
    def dp_size(self) -> int:
        return self.backend.dp_size * self.backend.replicas_per_process

    # -- the loop -----------------------------------------------------------------------------
    def scope(self) -> AbstractContextManager[Any]:
        """Build TensorFlow models inside `with run.scope():` (a no-op for torch)."""
        return self.backend.scope()

    def prepare(self, model: Any, optimizer: Any | None = None) -> Any:
        return self.backend.prepare(model, optimizer)

    def layout(self) -> StepLayout:
        batch = self.spec.batch_for(self.env.world_size)
        return StepLayout(micro=batch.micro, accumulation=batch.accumulation, dp_size=batch.dp)

    def loader(self, arrays: Arrays, *, shuffle: bool = True) -> ShardedLoader:
        replicas = self.backend.replicas_per_process
        first = self.backend.dp_rank * replicas
        return ShardedLoader(
            arrays,
            self.layout(),
            dp_ranks=range(first, first + replicas),
            seed=self.spec.seed,
            shuffle=shuffle,
        )

    def steps(
        self, loader: ShardedLoader, *, epochs: int = 1, desc: str = "train"
    ) -> Iterator[list[tuple[Any, ...]]]:
        """Every step's micro-batches for `epochs` epochs, with a progress bar on rank 0."""
        with progress(total=epochs * len(loader), desc=desc, enabled=self.is_main) as bar:
            for epoch in range(epochs):
                loader.set_epoch(epoch)
                for micro_batches in loader:
                    yield micro_batches
                    bar.update(1)

    def train_step(self, micro_batches: Sequence[MicroBatch], loss_fn: LossFn) -> float:
        """One optimizer step over this process's micro-batches; the global mean loss."""
        loss = self.backend.train_step(micro_batches, loss_fn)
        self.step += 1
        return loss

    def full_state_dict(self) -> dict[str, np.ndarray]:
        return self.backend.full_state_dict()

    def save(self, path: str) -> None:
        """Write the consolidated fp32 weights to `path` (.npz) atomically, from rank 0."""
        from toolkit.checkpoint import save_weights

        weights = self.full_state_dict()
        if self.is_main:
            save_weights(path, weights, step=self.step, spec=self.spec)
        self.barrier()

    # -- collectives --------------------------------------------------------------------------
    def allreduce(self, value: Any, op: str = "mean") -> Any:
        return self.backend.allreduce(value, op)

    def broadcast(self, value: Any, root: int = 0) -> Any:
        return self.backend.broadcast(value, root)

    def barrier(self) -> None:
        self.backend.barrier()

    def shutdown(self) -> None:
        self.backend.shutdown()


def init(spec: TrainSpec, *, launcher: str | None = None, argv: Sequence[str] | None = None) -> Run:
    """Detect the launcher, check the backend runs under it, seed, and start the engine."""
    env = detect_environment(os.environ, sys.argv if argv is None else argv, launcher)
    check_environment(spec.backend, spec.framework_name, env.launcher)
    join_supervisor(env.rank)  # heartbeats to `toolkit launch`, if it started this process
    random.seed(spec.seed)
    np.random.seed(spec.seed % 2**32)
    backend = load_backend_class(spec.backend, spec.framework_name)(spec, env)
    backend.setup()
    return Run(spec, env, backend)
