"""The one protocol every engine implements. No engine imports here.

A backend owns everything engine-specific about a run: starting the engine's process group,
wrapping the model, one optimizer step over a step's micro-batches using the engine's own
accumulation, collectives, and the consolidated fp32 weights. `toolkit.runtime.Run` is the
user-facing object and delegates to it.

Conventions shared by every backend:
- A micro-batch is a tree of arrays or tensors of any structure (`toolkit.backends.batches`).
  With a `loss_fn`, it is an `(inputs, targets)` pair and `loss_fn(model(inputs), targets)`
  returns the mean loss of that micro-batch. Without one (`loss_fn=None`) the model gets the
  whole micro-batch and returns its own loss (a scalar tensor, or an object or dict with a
  `loss`, as Hugging Face models do). How the model is called: torch models take a dict as
  keyword arguments, a tuple or list as positional arguments and anything else as the one
  argument; Keras models take the structure as their one `inputs` argument (Keras' own rule).
- The gradient of a step is the mean over the step's micro-batches and the data-parallel ranks
  (each engine's averaging, made explicit), which equals the gradient of one batch of the
  global size when every micro-batch's loss is a mean over equally weighted samples.
- `train_step` returns the mean loss as a float: over this process's micro-batches, as the
  engines' own steps do, or with `step_loss: global` over the whole global batch (one all-reduce
  per step), so that per-step losses compare across engines (`reported_loss`).
- `eval_sums` runs the model without gradients over micro-batches and returns this process's
  share of each metric as a sum; `sum_over_ranks` adds the shares of every rank. Metrics are
  sums and counts, never means, so that no mean of means weighs ranks or batches wrongly.
- `full_state_dict` has exactly the keys of the user's unwrapped model's `state_dict()` (tied
  and shared parameters under every name they have there): floating tensors as float32 numpy
  arrays, other tensors (integer buffers such as BatchNorm's `num_batches_tracked`) in their
  own dtype, identical on every rank, so `model.load_state_dict(..., strict=True)` takes it.
"""

from __future__ import annotations

import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from toolkit.checkpoint import CheckpointState
from toolkit.errors import ToolkitError
from toolkit.launch.environment import LaunchEnvironment
from toolkit.sharding import LoaderPlan
from toolkit.spec import TrainSpec

MicroBatch = Any
"""Any structure; an `(inputs, targets)` pair when a loss_fn or a paired metric_fn is given."""
LossFn = Callable[[Any, Any], Any]
MetricFn = Callable[[Any, Any], Mapping[str, Any]]
"""(outputs, targets) -> {name: the micro-batch's sum}, e.g. loss_sum, correct, count."""
ReduceOp = str  # "mean" | "sum"


@dataclass(kw_only=True)
class StateShare:
    """This rank's part of a checkpoint (`toolkit.checkpoint`): the tensors it writes, as
    arrays or `Fragment`s of tensors partitioned across ranks (a tensor that every rank holds
    is written by one of them), and, on rank 0, the JSON-able rest."""

    model: dict[str, Any] = field(default_factory=dict)
    optimizer: dict[str, Any] = field(default_factory=dict)
    arrays: dict[str, Any] = field(default_factory=dict)
    scalars: dict[str, Any] = field(default_factory=dict)
    extras: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Loader(Protocol):
    """What `run.steps` and `run.evaluate` iterate: steps of micro-batches, epoch by epoch."""

    def set_epoch(self, epoch: int) -> None: ...

    def __iter__(self) -> Iterator[list[MicroBatch]]: ...

    @property
    def steps_per_epoch(self) -> int | None:
        """Steps in one epoch; None for a stream, whose length is known when it ends."""


class SkipCounter(Protocol):
    """A loss scaler, as far as the run sees it: how many fp16 steps it skipped."""

    skipped_steps: int


class Backend(ABC):
    """One engine. Constructed by `toolkit.init` after the launch environment is known."""

    device: Any = "cpu"
    """Where this rank trains: the torch engines' torch.device (`cuda:<local rank>` under
    CUDA), bound in setup; "cpu" until then and for engines that place ops themselves."""
    scaler: SkipCounter | None = None
    """fp16's loss scaler on the engines whose loss the toolkit scales; None otherwise."""

    def __init__(self, spec: TrainSpec, env: LaunchEnvironment) -> None:
        self.spec = spec
        self.env = env

    # -- topology -----------------------------------------------------------------------------
    @property
    def dp_size(self) -> int:
        """Data-parallel replicas: the ranks that see different samples."""
        return self.spec.layout_for(self.env.world_size).data

    @property
    def dp_rank(self) -> int:
        """This process's data-parallel index (which shard of each global batch it reads)."""
        if self.spec.parallel.tensor > 1:  # a tensor-parallel group is consecutive ranks
            return self.env.rank // self.spec.parallel.tensor
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
    def train_step(self, micro_batches: Sequence[MicroBatch], loss_fn: LossFn | None) -> float:
        """Forward, backward and accumulate every micro-batch, then one optimizer step."""

    @property
    def skipped_steps(self) -> int:
        """fp16 steps skipped for overflowed gradients, on the engines that scale the loss."""
        return self.scaler.skipped_steps if self.scaler is not None else 0

    def reported_loss(self, local: Any) -> float:
        """What train_step returns, from this process's mean loss (spec.step_loss): as it is, or
        averaged over the ranks. The all-reduce blocks until every rank has finished its step,
        which the local loss never waits for, so `global` costs a little time every step."""
        if self.spec.step_loss == "global":
            return float(self.allreduce(local))
        return float(local)

    @abstractmethod
    def eval_sums(
        self, micro_batches: Sequence[MicroBatch], metric_fn: MetricFn, *, pairs: bool
    ) -> dict[str, float]:
        """No-gradient forward over micro-batches; this process's share of each metric's sum.

        Every rank must pass the same number of micro-batches (ZeRO-3 and the pipeline engine
        run collectives inside the forward). `pairs`: the micro-batches are (inputs, targets)
        and metric_fn gets (outputs, targets); otherwise the model gets the whole micro-batch
        and metric_fn gets (outputs, micro_batch).
        """

    def sum_over_ranks(self, local: Mapping[str, float]) -> dict[str, float]:
        """Each metric summed over all ranks, in float64.

        Every rank must report the same names. A checksum of the names is summed first, in a
        fixed-size collective, so that a mismatch is an error on every rank, never misaligned
        sums or a collective of mismatched sizes.
        """
        names = sorted(local)
        checksum = float(zlib.crc32("\x00".join(names).encode()))
        agreed = np.asarray(self.allreduce(np.array([checksum]), op="sum"), dtype=np.float64)
        if float(agreed[0]) != checksum * self.env.world_size:
            raise ToolkitError(
                f"ranks reported different metric names (this rank: {names})",
                "return the same keys from metric_fn on every rank, and give every rank the "
                "same number of evaluation micro-batches",
            )
        if not names:
            return {}
        values = np.array([float(local[name]) for name in names], dtype=np.float64)
        total = np.asarray(self.allreduce(values, op="sum"), dtype=np.float64)
        return {name: float(value) for name, value in zip(names, total, strict=True)}

    # -- data ---------------------------------------------------------------------------------
    def make_loader(self, data: Any, plan: LoaderPlan, options: dict[str, Any]) -> Loader | None:
        """A loader for the engine's own dataset types (torch datasets, tf.data), else None:
        the runtime then reads `data` as in-memory arrays."""
        return None

    @abstractmethod
    def full_state_dict(self) -> dict[str, np.ndarray]:
        """The consolidated weights under the unwrapped model's names, identical on every rank."""

    # -- checkpoints --------------------------------------------------------------------------
    def capture_state(self) -> StateShare:
        """This rank's share of the whole training state (collective: every rank calls it).

        Every engine here overrides this and `restore_state`; the defaults are what a new
        engine gets before it does: `run.save` writes the consolidated weights only, and
        resuming is refused.
        """
        weights = self.full_state_dict()
        return StateShare(model=weights if self.env.rank == 0 else {})

    def restore_state(self, state: CheckpointState) -> None:
        """Continue from `state` (read whole by every rank), after `prepare`: weights,
        optimizer state, schedule position, loss scaler and this rank's torch generator."""
        raise ToolkitError(
            f"resuming from a checkpoint is not implemented for backend {self.spec.backend} "
            f"({self.spec.framework_name}) yet",
            "set checkpoint.resume: never, or resume under another engine; the weights are "
            "in the checkpoint (toolkit checkpoint export)",
        )

    def shutdown(self) -> None:  # noqa: B027 - optional hook, most engines need nothing
        """Release the engine's resources; safe to call twice."""

    def scope(self) -> AbstractContextManager[Any]:
        """Where TensorFlow models must be built (a strategy scope); a no-op for torch."""
        return nullcontext()

    # -- collectives --------------------------------------------------------------------------
    @abstractmethod
    def allreduce(self, value: Any, op: ReduceOp = "mean") -> Any:
        """Reduce a tensor or number over all ranks."""

    def allreduce_(self, tensor: Any, op: ReduceOp = "mean") -> Any:
        """Reduce a tensor of the framework in place and return it, as torch.distributed's
        `all_reduce` and Horovod's `allreduce_` do: no copy, where `allreduce` copies so that
        its argument stays as it was. TensorFlow's tensors cannot change in place."""
        raise ToolkitError(
            f"run.allreduce_ reduces a tensor in place; the {self.spec.backend} backend's "
            "tensors (TensorFlow) cannot change in place",
            "use run.allreduce(value), which returns the reduced value",
        )

    @abstractmethod
    def broadcast(self, value: Any, root: int = 0) -> Any:
        """Every rank gets `root`'s value."""

    @abstractmethod
    def barrier(self) -> None:
        """Wait for every rank."""


def add_metrics(
    totals: dict[str, float], metrics: Mapping[str, Any], to_float: Callable[[Any], float]
) -> None:
    """Add one micro-batch's metrics into `totals`; a value that is not a scalar (per-sample
    values, say) adds its sum."""
    if not isinstance(metrics, Mapping) or not metrics:
        raise ToolkitError(
            f"metric_fn returned {type(metrics).__name__}; it must return a non-empty dict of "
            "sums, e.g. {'loss_sum': ..., 'correct': ..., 'count': ...}",
            "return sums and counts, not means: the toolkit adds them over batches and ranks",
        )
    if totals and set(totals) != set(metrics):
        raise ToolkitError(
            f"metric_fn returned keys {sorted(metrics)} after {sorted(totals)}",
            "return the same keys for every micro-batch",
        )
    for name, value in metrics.items():
        totals[str(name)] = totals.get(str(name), 0.0) + to_float(value)


SCRIPT_OPTIMIZER = "script"
"""optimizer.name meaning "the script passes its own optimizer to `run.prepare`"."""


def refuse_missing_script_optimizer(spec: TrainSpec) -> None:
    """A spec whose optimizer is the script's own, reached without one: a ToolkitError."""
    if spec.optimizer.name == SCRIPT_OPTIMIZER:
        raise ToolkitError(
            "optimizer.name=script: the spec says the script brings its own optimizer, but "
            "run.prepare(model) got none",
            "pass it: run.prepare(model, optimizer), or name one in the spec's optimizer.name",
        )
