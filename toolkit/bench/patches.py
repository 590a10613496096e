"""Candidate fixes, applied to a running toolkit rank by monkeypatching, so that the bench can
measure what each would buy before anyone changes a backend. Measurement only.

Each is a context manager over a `Run` (after `toolkit.init`): `toolkit bench step --patch NAME`
enters it for the whole launch, `--in-process` around the steps of its own variant only. A TF
step compiled inside the block keeps the change after it (a compiled function is traced once):
the in-process bench gives each variant a loss function of its own, so each is compiled apart.

- `global-loss`: `train_step` returns the mean loss over every rank (`step_loss: global`, one
  all-reduce per step) instead of this rank's: what asking for it costs. Changes what the step
  returns, not the weights.
- `per-tensor-allreduce`: Horovod TF reduces each gradient with its own `hvd.allreduce` (as
  `DistributedGradientTape` does, Horovod fusing them) instead of one `grouped_allreduce`, which
  waits for the last gradient before any is sent.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any

HOROVOD_TF = "toolkit.backends.horovod.tf_backend"


class _ModuleProxy:
    """A module whose named attributes are replaced; everything else is the module's own."""

    def __init__(self, module: Any, **replaced: Any) -> None:
        self._module = module
        self.__dict__.update(replaced)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


@contextmanager
def _replaced(module_name: str, attribute: str, make: Callable[[Any], Any]) -> Iterator[None]:
    """`module.attribute = make(old)` for the block, if that module is loaded at all."""
    module = sys.modules.get(module_name)
    if module is None:
        yield
        return
    old = getattr(module, attribute)
    setattr(module, attribute, make(old))
    try:
        yield
    finally:
        setattr(module, attribute, old)


@contextmanager
def global_loss(run: Any) -> Iterator[None]:
    spec = run.backend.spec
    run.backend.spec = spec.model_copy(update={"step_loss": "global"})
    try:
        yield
    finally:
        run.backend.spec = spec


def per_tensor_allreduce(run: Any) -> AbstractContextManager[None]:
    def make(hvd: Any) -> Any:
        def grouped(tensors: list[Any], **options: Any) -> list[Any]:
            return [hvd.allreduce(tensor, **options) for tensor in tensors]

        return _ModuleProxy(hvd, grouped_allreduce=grouped)

    return _replaced(HOROVOD_TF, "hvd", make)


PATCHES: dict[str, Callable[[Any], AbstractContextManager[None]]] = {
    "global-loss": global_loss,
    "per-tensor-allreduce": per_tensor_allreduce,
}


def applied(run: Any, names: str) -> ExitStack:
    """Every patch of "a+b+..." entered in one stack (enter it with `with`)."""
    stack = ExitStack()
    for name in names.split("+"):
        stack.enter_context(PATCHES[name](run))
    return stack
