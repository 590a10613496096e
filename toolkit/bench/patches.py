"""Variants of the toolkit's step, applied to a running rank, so that the bench measures what a
candidate change or a setting costs before anyone changes a backend. Measurement only.

Each is a context manager over a `Run` (after `toolkit.init`): `toolkit bench step --patch NAME`
enters it for the whole launch, `--in-process` around the steps of its own variant only. A TF
step compiled inside the block keeps the change after it (a compiled function is traced once):
the in-process bench gives each variant a loss function of its own, so each is compiled apart.

- `global-loss`: `train_step` returns the mean loss over every rank (`step_loss: global`, one
  all-reduce per step) instead of this rank's: what asking for it costs. Changes what the step
  returns, not the weights.
- `keras-sgd`: the TF engines' step with Keras' SGD instead of the toolkit's torch-semantics
  one (measurement only: it moves the weights' rounding).
- `horovod-own-wait`: Horovod torch's step waiting for its gradients in Horovod's own
  `synchronize` (a `sched_yield` spin) instead of the toolkit's spin-then-sleep wait.
- `deepspeed-bucket`: ZeRO-1/2's step with DeepSpeed's own reduce bucket, 5e8 elements, in
  place of the spec's default: what the default the toolkit replaced costs.
- `deepspeed-multi-rank-allreduce`: ZeRO-1/2's step all-reducing every rank's gradient
  partitions together, DeepSpeed's default, in place of reducing each to its owner
  (`zero.multi_rank_bucket_allreduce: false`, the spec's default).
- `deepspeed-grad-norm`: ZeRO-1/2's step computing the global gradient norm, DeepSpeed's
  default, where the spec's null skips it (`zero.compute_grad_norm`).

Candidates measured here and since built in: the TF engines' gradient sum started from the first
micro-batch's gradient (toolkit.backends.tf.common), Horovod TF's per-tensor allreduce
(toolkit.backends.horovod.tf_backend), the loss left local by default (`step_loss`).
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any

from toolkit.render.deepspeed_import import DEEPSPEED_REDUCE_BUCKET


@contextmanager
def global_loss(run: Any) -> Iterator[None]:
    spec = run.backend.spec
    run.backend.spec = spec.model_copy(update={"step_loss": "global"})
    try:
        yield
    finally:
        run.backend.spec = spec


_keras_optimizers: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
"""One Keras SGD per backend, built on first use: the patch is entered around every step, and
building an optimizer allocates and zero-fills a momentum slot per weight (a first version
built one per step and measured that, 1.29x native)."""


@contextmanager
def keras_sgd(run: Any) -> Iterator[None]:
    """The TF engines' step with Keras' own SGD (v = m*v - lr*g; p += v) in place of the
    toolkit's torch-semantics one: what the optimizer's formulation costs. Moves the weights'
    rounding, so a measurement only. The bench's spec is SGD with momentum."""
    import keras

    backend = run.backend
    optimizer = backend.optimizer
    keras_optimizer = _keras_optimizers.get(backend)
    if keras_optimizer is None:
        keras_optimizer = keras.optimizers.SGD(
            learning_rate=backend.spec.effective_lr(run.world_size),
            momentum=backend.spec.optimizer.momentum,
        )
        keras_optimizer.build(backend.model.trainable_variables)
        _keras_optimizers[backend] = keras_optimizer
    backend.optimizer = keras_optimizer
    try:
        yield
    finally:
        backend.optimizer = optimizer


@contextmanager
def horovod_own_wait(run: Any) -> Iterator[None]:
    """Horovod torch's step without the toolkit's wait for the gradients' all-reduces
    (toolkit.backends.horovod.waiting.wait_quietly): `optimizer.step()` then waits in
    Horovod's own `synchronize`, as a native script does. The backend's module is reached
    through its class, so the bench imports no engine."""
    module: Any = sys.modules[type(run.backend).__module__]
    wait = module.wait_quietly
    module.wait_quietly = lambda handles, **_: None
    try:
        yield
    finally:
        module.wait_quietly = wait


@contextmanager
def deepspeed_bucket(run: Any) -> Iterator[None]:
    """DeepSpeed's ZeRO-1/2 step with DeepSpeed's own reduce bucket (5e8 elements) instead of
    the toolkit's (toolkit.spec.sections.REDUCE_BUCKET_ELEMENTS): what the default the toolkit
    replaced costs. Those stages allocate the bucket anew at every backward from the
    optimizer's `reduce_bucket_size`, so setting it around a step sizes that step's bucket; the
    sums are the same with 2 ranks. Refused at other stages, which allocate it once."""
    optimizer = _zero_1_2_optimizer(run, "deepspeed-bucket")
    size = optimizer.reduce_bucket_size
    optimizer.reduce_bucket_size = DEEPSPEED_REDUCE_BUCKET
    try:
        yield
    finally:
        optimizer.reduce_bucket_size = size


@contextmanager
def deepspeed_multi_rank_allreduce(run: Any) -> Iterator[None]:
    """DeepSpeed's ZeRO-1/2 step with its own `use_multi_rank_bucket_allreduce: true`: the
    optimizer reads the flag at every reduction (`average_tensor`), so setting it around a step
    sets that step's. The owners' sums are the same."""
    optimizer = _zero_1_2_optimizer(run, "deepspeed-multi-rank-allreduce")
    chosen = optimizer.use_multi_rank_bucket_allreduce
    optimizer.use_multi_rank_bucket_allreduce = True
    try:
        yield
    finally:
        optimizer.use_multi_rank_bucket_allreduce = chosen


@contextmanager
def deepspeed_grad_norm(run: Any) -> Iterator[None]:
    """DeepSpeed's ZeRO-1/2 step computing the global gradient norm (its default): the
    optimizer reads `compute_grad_norm` at every `step`, so setting it around a step sets that
    step's. Without clipping the norm changes no finite step."""
    optimizer = _zero_1_2_optimizer(run, "deepspeed-grad-norm")
    chosen = optimizer.compute_grad_norm
    optimizer.compute_grad_norm = True
    try:
        yield
    finally:
        optimizer.compute_grad_norm = chosen


def _zero_1_2_optimizer(run: Any, patch: str) -> Any:
    """The engine's ZeRO-1/2 optimizer; refused at other stages, which have neither setting."""
    optimizer = run.backend.engine.optimizer
    if type(optimizer).__name__ != "DeepSpeedZeroOptimizer":
        raise RuntimeError(
            f"{patch}: for ZeRO-1/2's optimizer (DeepSpeedZeroOptimizer); this engine's is "
            f"{type(optimizer).__name__}"
        )
    return optimizer


PATCHES: dict[str, Callable[[Any], AbstractContextManager[None]]] = {
    "global-loss": global_loss,
    "keras-sgd": keras_sgd,
    "horovod-own-wait": horovod_own_wait,
    "deepspeed-bucket": deepspeed_bucket,
    "deepspeed-multi-rank-allreduce": deepspeed_multi_rank_allreduce,
    "deepspeed-grad-norm": deepspeed_grad_norm,
}


def applied(run: Any, names: str) -> ExitStack:
    """Every patch of "a+b+..." entered in one stack (enter it with `with`)."""
    stack = ExitStack()
    for name in names.split("+"):
        stack.enter_context(PATCHES[name](run))
    return stack
