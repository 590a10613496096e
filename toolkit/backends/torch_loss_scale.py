"""fp16 loss scaling under DDP, Horovod and FSDP: torch's GradScaler, on the spec's rule.

GradScaler multiplies the loss before the backward and divides the gradients after it
(`unscale_`); the scale it uses next is the one `toolkit.loss_scaling.LossScaleRule` decides,
given to `GradScaler.update(new_scale)`, torch's hook for a policy of one's own. Whether a step
overflowed is read from the unscaled gradients; under FSDP each rank holds a shard of them, so
the answer is all-reduced, as torch's ShardedGradScaler does.

A step that overflows is skipped: no optimizer step and no schedule step, as DeepSpeed does.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist

from toolkit.loss_scaling import LossScaleRule
from toolkit.spec import TrainSpec


class LossScaler:
    """One rank's fp16 loss scaling: `scale(loss)`, `unscale(optimizer, parameters)` before a
    clip, then `step(optimizer)`, which steps it unless the gradients overflowed."""

    def __init__(self, spec: TrainSpec, device: torch.device, *, sharded: bool = False) -> None:
        self.rule = LossScaleRule.from_spec(spec.loss_scaling)
        self.sharded = sharded
        self.device = device
        self.skipped_steps = 0
        self._grad_scaler = torch.amp.GradScaler(device.type, init_scale=self.rule.scale)
        self._overflow = False

    @property
    def scale_value(self) -> float:
        return self.rule.scale

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return self._grad_scaler.scale(loss)

    def unscale(self, optimizer: torch.optim.Optimizer, parameters: Iterable[Any]) -> None:
        """Divide the gradients by the scale and learn whether any rank's hold an inf or nan."""
        self._grad_scaler.unscale_(optimizer)
        self._overflow = self._any_not_finite(parameters)

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """The optimizer's step unless the gradients overflowed; the next scale either way.
        True when the step was taken."""
        taken = not self._overflow
        if taken:
            optimizer.step()
        else:
            self.skipped_steps += 1
        self.rule.update(self._overflow)
        self._grad_scaler.update(new_scale=self.rule.scale)
        return taken

    def state(self) -> dict[str, Any]:
        return {"loss_scaler": {**self.rule.state(), "skipped_steps": self.skipped_steps}}

    def load(self, extras: dict[str, Any]) -> None:
        saved = extras.get("loss_scaler")
        if isinstance(saved, dict) and "scale" in saved:
            self.rule.load(saved)
            self.skipped_steps = int(saved.get("skipped_steps", 0))
            state = self._grad_scaler.state_dict()
            state["scale"] = self.rule.scale
            self._grad_scaler.load_state_dict(state)

    def _any_not_finite(self, parameters: Iterable[Any]) -> bool:
        grads = [_local(p.grad) for p in parameters if p.grad is not None]
        found = torch.zeros(1, device=self.device)  # where the process group reduces
        for grad in grads:
            found += (~torch.isfinite(grad)).any().float()
        if self.sharded:
            dist.all_reduce(found, op=dist.ReduceOp.MAX)
        return bool(found.item())


def _local(grad: torch.Tensor) -> torch.Tensor:
    """A DTensor gradient's shard on this rank (FSDP, tensor parallelism); others as they are."""
    to_local = getattr(grad, "to_local", None)
    return to_local() if callable(to_local) else grad


def optimizer_step(scaler: LossScaler | None, optimizer: Any) -> bool:
    """The step: through fp16's scaler (which skips it on overflow), else the optimizer's own.
    True when the step was taken, so that the schedule steps too."""
    if scaler is None:
        optimizer.step()
        return True
    return scaler.step(optimizer)


def loss_scaler(
    spec: TrainSpec, device: torch.device, *, sharded: bool = False
) -> LossScaler | None:
    """fp16's loss scaler from the spec, None in fp32 and bf16 (whose range needs none)."""
    if spec.precision != "fp16":
        return None
    return LossScaler(spec, device, sharded=sharded)
