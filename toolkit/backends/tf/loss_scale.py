"""fp16 under the TensorFlow engines: Keras' mixed_float16 policy and LossScaleOptimizer, on
the spec's loss-scaling rule.

Keras' LossScaleOptimizer scales the loss (`scale_loss`), divides the gradients by the scale,
and skips the inner optimizer's step when any gradient is not finite. Its own rule halves the
scale at every overflow and doubles it every `dynamic_growth_steps` clean steps counted from
the last change, which is neither DeepSpeed's rule (hysteresis, a floor, growth counted from the
last overflow) nor the torch engines'. So its growth is switched off and, after each step, its
`dynamic_scale` is set to the scale the spec's rule gives (toolkit.loss_scaling), as the torch
engines give theirs to GradScaler. Whether a step overflowed is whether the inner optimizer's
step count moved.

Keras checks the gradients it is given, so every replica must be given the same, all-reduced
ones for all of them to agree on a skip: the engines all-reduce before `apply_gradients` in
fp16 (the TF backend does so only for clipping otherwise).
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from toolkit.loss_scaling import LossScaleRule
from toolkit.spec import TrainSpec

NEVER = 2**30
"""dynamic_growth_steps that never arrive: the rule decides growth."""


class KerasLossScale:
    """One worker's fp16 loss scaling around Keras' LossScaleOptimizer."""

    def __init__(self, spec: TrainSpec) -> None:
        self.rule = LossScaleRule.from_spec(spec.loss_scaling)
        self.skipped_steps = 0

    def wrap(self, optimizer: keras.optimizers.Optimizer) -> keras.optimizers.LossScaleOptimizer:
        return keras.optimizers.LossScaleOptimizer(
            optimizer, initial_scale=self.rule.scale, dynamic_growth_steps=NEVER
        )

    def after_step(self, optimizer: Any, applied_before: int) -> None:
        """The rule's next scale, from whether the step just run was applied."""
        overflow = applied_steps(optimizer) == applied_before
        self.skipped_steps += overflow
        self.rule.update(overflow)
        optimizer.dynamic_scale.assign(self.rule.scale)

    def state(self) -> dict[str, Any]:
        return {"loss_scaler": {**self.rule.state(), "skipped_steps": self.skipped_steps}}

    def load(self, extras: dict[str, Any], optimizer: Any) -> None:
        saved = extras.get("loss_scaler")
        if isinstance(saved, dict) and "scale" in saved:
            self.rule.load(saved)
            self.skipped_steps = int(saved.get("skipped_steps", 0))
            optimizer.dynamic_scale.assign(self.rule.scale)


def applied_steps(optimizer: Any) -> int:
    """The optimizer's count of applied steps (a MirroredVariable under a strategy)."""
    return int(np.asarray(optimizer.iterations))


def use_precision(spec: TrainSpec) -> KerasLossScale | None:
    """Keras' mixed_float16 policy for the models built after this (fp16 only), and the loss
    scaling that goes with it; None in fp32."""
    if spec.precision != "fp16":
        return None
    keras.mixed_precision.set_dtype_policy("mixed_float16")
    return KerasLossScale(spec)
