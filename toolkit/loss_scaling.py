"""fp16 dynamic loss scaling: one rule, DeepSpeed's, that every engine follows step by step.

The spec's `loss_scaling` section uses DeepSpeed's names, and `LossScaleRule.update` is
DeepSpeed's DynamicLossScaler.update_scale (deepspeed.runtime.fp16.loss_scaler, 0.19.8), so that
a torch engine skips the steps DeepSpeed skips and is left with the scale DeepSpeed would have:

- A step whose gradients hold an inf or a nan is skipped (no optimizer step, no schedule step).
- An overflow spends one unit of hysteresis; when none is left the scale halves, down to
  `min_loss_scale`. An overflow at the minimum ends the run, as DeepSpeed's does.
- After `loss_scale_window` overflow-free steps past the last overflow plus one (DeepSpeed's
  count: the first growth comes at step window + 1, counting from 1), the scale doubles and the
  hysteresis refills; with `consecutive_hysteresis` it refills on every overflow-free step.
- A fixed `loss_scale` never changes; a step that overflows under it is still skipped.

torch's GradScaler grows after `growth_interval` clean steps (one step earlier) and has neither
hysteresis nor a floor, which is why the torch engines give GradScaler this rule's scale
(toolkit.backends.torch_loss_scale) instead of using its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from toolkit.errors import ToolkitError
from toolkit.spec.sections import LossScalingSpec

SCALE_FACTOR = 2.0


@dataclass
class LossScaleRule:
    """The loss scale and the counters that decide its next value (DeepSpeed's names)."""

    scale: float
    window: int
    hysteresis: int
    consecutive_hysteresis: bool
    min_scale: float
    dynamic: bool
    cur_iter: int = 0
    last_overflow_iter: int = -1
    cur_hysteresis: int = 0

    @classmethod
    def from_spec(cls, scaling: LossScalingSpec) -> LossScaleRule:
        dynamic = not scaling.loss_scale
        return cls(
            scale=2.0**scaling.initial_scale_power if dynamic else scaling.loss_scale,
            window=scaling.loss_scale_window,
            hysteresis=scaling.hysteresis,
            consecutive_hysteresis=scaling.consecutive_hysteresis,
            min_scale=float(scaling.min_loss_scale),
            dynamic=dynamic,
            cur_hysteresis=scaling.hysteresis,
        )

    def update(self, overflow: bool) -> None:
        """The scale after a step that did (or did not) overflow."""
        if self.dynamic and overflow:
            self._overflowed()
        elif self.dynamic:
            self._clean_step()
        self.cur_iter += 1

    def _overflowed(self) -> None:
        if self.hysteresis == 1 or self.cur_hysteresis == 1:
            if self.scale == self.min_scale:
                raise ToolkitError(
                    f"fp16 gradients overflowed at the minimum loss scale {self.min_scale:g} "
                    f"(step {self.cur_iter}): the scale cannot go lower",
                    "lower loss_scaling.min_loss_scale, lower the learning rate, or train in "
                    "bf16, whose range needs no loss scaling",
                )
            self.scale = max(self.scale / SCALE_FACTOR, self.min_scale)
        else:
            self.cur_hysteresis -= 1
        self.last_overflow_iter = self.cur_iter

    def _clean_step(self) -> None:
        if self.consecutive_hysteresis:
            self.cur_hysteresis = self.hysteresis
        stable = self.cur_iter - self.last_overflow_iter - 1
        if stable > 0 and stable % self.window == 0:
            if not self.consecutive_hysteresis:
                self.cur_hysteresis = self.hysteresis
            self.scale *= SCALE_FACTOR

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: DeepSpeed's fields, so that it resumes on any engine."""
        return {
            "scale": self.scale,
            "cur_iter": self.cur_iter,
            "last_overflow_iter": self.last_overflow_iter,
            "cur_hysteresis": self.cur_hysteresis,
        }

    def load(self, saved: dict[str, Any]) -> None:
        """A checkpoint's state; one written by GradScaler's rule (scale and growth_tracker,
        the clean steps since the scale last changed) resumes with as many clean steps."""
        self.scale = float(saved["scale"])
        if "cur_iter" in saved:
            self.cur_iter = int(saved["cur_iter"])
            self.last_overflow_iter = int(saved.get("last_overflow_iter", -1))
            self.cur_hysteresis = int(saved.get("cur_hysteresis", self.hysteresis))
        else:
            self.cur_iter = int(saved.get("growth_tracker", 0))
            self.last_overflow_iter = -1
