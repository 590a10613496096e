"""The one protocol every engine implements. No engine imports here.

A backend owns everything engine-specific about a run: starting the engine's process group,
wrapping the model, one optimizer step over a step's micro-batches using the engine's own
accumulation, collectives, and the consolidated fp32 weights. `toolkit.runtime.Run` is the
user-facing object and delegates to it.

Conventions shared by every backend:
- A micro-batch is `(inputs, targets)`; `loss_fn(outputs, targets)` returns the mean loss of
  that micro-batch. The gradient of a step is the mean over the step's micro-batches and the
  data-parallel ranks (each engine's averaging, made explicit), which equals the gradient of one
  batch of the global size.
- `train_step` returns the mean loss over the whole global batch (all ranks), as a float, so
  that per-step losses can be compared across engines.
- `full_state_dict` returns every parameter as a float32 numpy array under the name it has in
  the user's unwrapped model, identical on every rank.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import numpy as np

from toolkit.launch.environment import LaunchEnvironment
from toolkit.spec import TrainSpec

MicroBatch = tuple[Any, Any]
LossFn = Callable[[Any, Any], Any]
ReduceOp = str  # "mean" | "sum"


class Backend(ABC):
    """One engine. Constructed by `toolkit.init` after the launch environment is known."""

    def __init__(self, spec: TrainSpec, env: LaunchEnvironment) -> None:
        self.spec = spec
        self.env = env

    # -- topology -----------------------------------------------------------------------------
    @property
    def dp_size(self) -> int:
        """Data-parallel replicas: the ranks that see different samples."""
        return self.env.world_size // self.spec.pipeline.stages

    @property
    def dp_rank(self) -> int:
        """This process's data-parallel index (which shard of each global batch it reads)."""
        return self.env.rank % self.dp_size

    @property
    def replicas_per_process(self) -> int:
        """Data-parallel replicas inside this process (more than 1 only for MirroredStrategy)."""
        return 1

    # -- life cycle ---------------------------------------------------------------------------
    @abstractmethod
    def setup(self) -> None:
        """Start the engine (process group, hvd.init, strategy, ...)."""

    @abstractmethod
    def prepare(self, model: Any, optimizer: Any | None = None) -> Any:
        """Wrap the model for the engine; build the optimizer from the spec unless given."""

    @abstractmethod
    def train_step(self, micro_batches: Sequence[MicroBatch], loss_fn: LossFn) -> float:
        """Forward, backward and accumulate every micro-batch, then one optimizer step."""

    @abstractmethod
    def full_state_dict(self) -> dict[str, np.ndarray]:
        """The consolidated fp32 weights, identical on every rank."""

    def shutdown(self) -> None:  # noqa: B027 - optional hook, most engines need nothing
        """Release the engine's resources; safe to call twice."""

    def scope(self) -> AbstractContextManager[Any]:
        """Where TensorFlow models must be built (a strategy scope); a no-op for torch."""
        return nullcontext()

    # -- collectives --------------------------------------------------------------------------
    @abstractmethod
    def allreduce(self, value: Any, op: ReduceOp = "mean") -> Any:
        """Reduce a tensor or number over all ranks."""

    @abstractmethod
    def broadcast(self, value: Any, root: int = 0) -> Any:
        """Every rank gets `root`'s value."""

    @abstractmethod
    def barrier(self) -> None:
        """Wait for every rank."""
