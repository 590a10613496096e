"""The fp16 loss-scaling rule (toolkit.loss_scaling) against DeepSpeed's own DynamicLossScaler,
and the torch engines' LossScaler that applies it around GradScaler."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from deepspeed.runtime.fp16 import loss_scaler as deepspeed_scalers

from toolkit.backends.torch_loss_scale import LossScaler
from toolkit.errors import ToolkitError
from toolkit.loss_scaling import LossScaleRule
from toolkit.spec import SpecError, TrainSpec
from toolkit.spec.sections import LossScalingSpec

SETTINGS = [
    {"initial_scale_power": 16, "loss_scale_window": 1000, "hysteresis": 2},
    {"initial_scale_power": 12, "loss_scale_window": 3, "hysteresis": 1},
    {"initial_scale_power": 10, "loss_scale_window": 2, "hysteresis": 3, "min_loss_scale": 64},
    {"initial_scale_power": 8, "loss_scale_window": 4, "hysteresis": 2,
     "consecutive_hysteresis": True},
]  # fmt: skip


def deepspeeds(scaling: LossScalingSpec) -> Any:
    """DeepSpeed's scaler built as its fp16 optimizer builds it from the fp16 section."""
    return deepspeed_scalers.DynamicLossScaler(
        init_scale=2.0**scaling.initial_scale_power,
        scale_window=scaling.loss_scale_window,
        min_scale=scaling.min_loss_scale,
        delayed_shift=scaling.hysteresis,
        consecutive_hysteresis=scaling.consecutive_hysteresis,
    )


@pytest.mark.parametrize("settings", SETTINGS)
def test_the_rule_is_deepspeeds_step_for_step(
    settings: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(deepspeed_scalers.dist, "get_rank", lambda: 0)  # its log line's rank
    scaling = LossScalingSpec(**settings)
    ours, theirs = LossScaleRule.from_spec(scaling), deepspeeds(scaling)
    overflows = random.Random(7)
    for step in range(400):
        # Runs of clean steps long enough for the scale to grow, broken by overflows.
        overflow = overflows.random() < 0.15 and ours.scale > scaling.min_loss_scale
        ours.update(overflow)
        theirs.update_scale(overflow)
        assert (ours.scale, ours.cur_hysteresis) == (theirs.cur_scale, theirs.cur_hysteresis), step
        assert ours.last_overflow_iter == theirs.last_overflow_iter


def test_the_first_growth_comes_after_window_plus_one_clean_steps() -> None:
    """DeepSpeed's count, one step later than GradScaler's growth_interval."""
    rule = LossScaleRule.from_spec(LossScalingSpec(initial_scale_power=4, loss_scale_window=3))
    scales = []
    for _ in range(5):
        rule.update(False)
        scales.append(rule.scale)
    assert scales == [16, 16, 16, 32, 32]


def test_an_overflow_at_the_minimum_scale_ends_the_run() -> None:
    rule = LossScaleRule.from_spec(
        LossScalingSpec(initial_scale_power=2, hysteresis=1, min_loss_scale=2)
    )
    rule.update(True)
    assert rule.scale == 2
    with pytest.raises(ToolkitError, match="minimum loss scale 2"):
        rule.update(True)


def test_a_fixed_scale_never_moves() -> None:
    rule = LossScaleRule.from_spec(LossScalingSpec(loss_scale=128, loss_scale_window=1))
    for overflow in (True, False, False, True, False):
        rule.update(overflow)
    assert rule.scale == 128


def test_the_state_round_trips_and_gradscalers_state_still_loads() -> None:
    scaling = LossScalingSpec(initial_scale_power=10, loss_scale_window=2, hysteresis=2)
    rule = LossScaleRule.from_spec(scaling)
    for overflow in (True, False, True, False, False):
        rule.update(overflow)
    resumed = LossScaleRule.from_spec(scaling)
    resumed.load(rule.state())
    assert resumed == rule
    legacy = LossScaleRule.from_spec(scaling)
    legacy.load({"scale": 256.0, "growth_tracker": 1})  # written before this rule
    legacy.update(False)
    assert legacy.scale == 256
    legacy.update(False)
    assert legacy.scale == 512  # clean steps 1 + 2: the window of 2 plus DeepSpeed's one


def _one_step(scaler: LossScaler, model: torch.nn.Linear, x: torch.Tensor) -> bool:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer.zero_grad()
    scaler.scale(model(x).sum()).backward()
    scaler.unscale(optimizer, model.parameters())
    return scaler.step(optimizer)


def test_the_torch_scaler_skips_an_overflowed_step_and_scales_by_the_rule() -> None:
    spec = TrainSpec.from_dict(
        {"precision": "fp16", "loss_scaling": {"initial_scale_power": 8, "hysteresis": 1}}
    )
    scaler = LossScaler(spec, torch.device("cpu"))
    model = torch.nn.Linear(3, 1)
    before = [p.detach().clone() for p in model.parameters()]
    assert not _one_step(scaler, model, torch.tensor([[1.0, float("inf"), 0.0]]))
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert (scaler.skipped_steps, scaler.scale_value) == (1, 128.0)
    assert float(scaler.scale(torch.tensor(1.0))) == 128.0  # GradScaler uses the rule's scale
    assert _one_step(scaler, model, torch.ones(1, 3))
    assert not torch.equal(before[0], model.weight)
    # The gradient the step used is the true one: the scale was divided out.
    assert torch.allclose(model.weight.grad, torch.ones(1, 3))
    resumed = LossScaler(spec, torch.device("cpu"))
    resumed.load(scaler.state())
    assert (resumed.skipped_steps, resumed.scale_value) == (1, 128.0)
    assert float(resumed.scale(torch.tensor(1.0))) == 128.0


def test_the_tensorflow_engines_train_in_fp32_and_fp16_only() -> None:
    for backend in ({"backend": "tf"}, {"backend": "horovod", "framework": "tensorflow"}):
        assert TrainSpec.from_dict({**backend, "precision": "fp16"}).precision == "fp16"
        with pytest.raises(SpecError) as caught:
            TrainSpec.from_dict({**backend, "precision": "bf16"})
        (issue,) = caught.value.issues
        assert (issue.path, issue.allowed.split(" with ")[0]) == ("precision", "fp32 or fp16")
        assert "ddp+torch" in (issue.hint or "")
