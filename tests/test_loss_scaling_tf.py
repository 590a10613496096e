"""Keras' LossScaleOptimizer under the spec's loss-scaling rule (toolkit.backends.tf.loss_scale):
a step with a non-finite gradient is skipped and the scale is the rule's, not Keras' own."""

from __future__ import annotations

import numpy as np
import pytest

from toolkit.spec import TrainSpec

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

from toolkit.backends.tf.loss_scale import KerasLossScale, applied_steps  # noqa: E402
from toolkit.backends.tf.optimizers import TorchSGD  # noqa: E402


def test_a_skipped_step_leaves_the_weights_and_the_scale_follows_the_rule() -> None:
    spec = TrainSpec.from_dict(
        {
            "backend": "tf",
            "precision": "fp16",
            "loss_scaling": {"initial_scale_power": 8, "hysteresis": 2, "loss_scale_window": 1},
        }
    )
    scaling = KerasLossScale(spec)
    weight = keras.Variable(np.ones(2, np.float32))
    optimizer = scaling.wrap(
        TorchSGD(learning_rate=0.5, momentum=0.0, weight_decay=0.0, nesterov=False)
    )
    optimizer.build([weight])
    scales, kept = [], []
    for gradient in ([np.inf, 1.0], [1.0, 1.0], [np.nan, 0.0], [np.inf, 0.0], [1.0, 1.0]):
        before, old = applied_steps(optimizer), weight.numpy().copy()
        # Gradients as the engines hand them over: multiplied by the scale.
        scaled = tf.constant(gradient, tf.float32) * optimizer.dynamic_scale
        optimizer.apply_gradients([(scaled, weight)])
        scaling.after_step(optimizer, before)
        scales.append(float(optimizer.dynamic_scale.numpy()))
        kept.append(bool(np.array_equal(weight.numpy(), old)))
    # Hysteresis 2: the first overflow spends it and keeps the scale; it refills only when the
    # scale grows, which one clean step right after an overflow does not do (DeepSpeed's count),
    # so the next two overflows halve it. Keras alone halves at every overflow.
    assert kept == [True, False, True, True, False]
    assert scales == [256.0, 256.0, 128.0, 64.0, 64.0]
    assert scaling.skipped_steps == 3
    np.testing.assert_allclose(weight.numpy(), [0.0, 0.0])  # two steps of 0.5 x the true 1.0
