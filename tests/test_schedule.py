"""The schedule formula, and DeepSpeed's own schedulers agreeing with it where the toolkit
hands the schedule to DeepSpeed (checked against DeepSpeed's real classes)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from toolkit.schedule import deepspeed_scheduler, lr_ratio
from toolkit.spec import SpecError
from toolkit.spec.model import build_spec

# Engines set environment variables when imported: import them before the leak fixture runs.
try:
    import torch
    from deepspeed.runtime import lr_schedules
except ImportError:  # the DeepSpeed check below skips
    lr_schedules = None


@dataclass
class Sched:
    name: str
    warmup_steps: int = 0
    warmup_shape: str = "linear"
    total_steps: int | None = None
    warmup_start_ratio: float = 0.0
    min_ratio: float = 0.0
    step_size: int | None = None
    step_gamma: float = 0.1


def test_warmup_then_cosine_hits_its_landmarks() -> None:
    s = Sched(
        "warmup_cosine", warmup_steps=4, total_steps=14, warmup_start_ratio=0.2, min_ratio=0.1
    )
    assert lr_ratio(s, 0) == pytest.approx(0.2)
    assert lr_ratio(s, 2) == pytest.approx(0.6)
    assert lr_ratio(s, 4) == pytest.approx(1.0)
    assert lr_ratio(s, 9) == pytest.approx(0.1 + 0.9 * (1 + math.cos(math.pi / 2)) / 2)
    assert lr_ratio(s, 14) == pytest.approx(0.1)
    assert lr_ratio(s, 100) == pytest.approx(0.1)


def test_linear_decay_and_step_decay() -> None:
    linear = Sched("warmup_linear", warmup_steps=2, total_steps=12, min_ratio=0.0)
    assert [lr_ratio(linear, k) for k in (0, 1, 2, 7, 12, 20)] == pytest.approx(
        [0.0, 0.5, 1.0, 0.5, 0.0, 0.0]
    )
    step = Sched("step", warmup_steps=0, step_size=3, step_gamma=0.5)
    assert [lr_ratio(step, k) for k in range(7)] == pytest.approx([1, 1, 1, 0.5, 0.5, 0.5, 0.25])
    assert lr_ratio(Sched("constant", warmup_steps=5), 0) == 1.0


@pytest.mark.parametrize(
    ("schedule", "ds_type"),
    [
        (Sched("warmup_constant", warmup_steps=5, warmup_start_ratio=0.1), "WarmupLR"),
        (Sched("warmup_constant", warmup_steps=6, warmup_shape="log"), "WarmupLR"),
        (
            Sched("warmup_linear", warmup_steps=4, warmup_shape="log", total_steps=9,
                  warmup_start_ratio=0.1, min_ratio=0.1),
            "WarmupDecayLR",
        ),
        (
            Sched("warmup_linear", warmup_steps=3, total_steps=10, warmup_start_ratio=0.05,
                  min_ratio=0.05),
            "WarmupDecayLR",
        ),
    ],
)  # fmt: skip
def test_deepspeed_scheduler_pre_stepped_once_equals_the_formula(
    schedule: Sched, ds_type: str
) -> None:
    if lr_schedules is None:
        pytest.skip("DeepSpeed is not installed")
    peak = 0.01
    section = deepspeed_scheduler(schedule, peak)
    assert section is not None and section["type"] == ds_type
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=peak)
    scheduler = getattr(lr_schedules, ds_type)(optimizer, **section["params"])
    scheduler.step()  # the alignment step the DeepSpeed backend takes after initialize
    seen = []
    for _ in range(14):
        seen.append(optimizer.param_groups[0]["lr"])
        scheduler.step()  # what the engine does after every optimizer step
    assert seen == pytest.approx([peak * lr_ratio(schedule, k) for k in range(14)], rel=1e-12)


def test_log_warmup_rises_by_the_logarithm_and_is_complete_one_step_early() -> None:
    log = Sched("warmup_constant", warmup_steps=5, warmup_shape="log", warmup_start_ratio=0.2)
    assert lr_ratio(log, 0) == pytest.approx(0.2)
    assert lr_ratio(log, 2) == pytest.approx(0.2 + 0.8 * math.log(3) / math.log(5))
    assert [lr_ratio(log, k) for k in (4, 5, 50)] == pytest.approx([1.0, 1.0, 1.0])


def test_a_log_warmup_of_one_step_is_refused_naming_the_field() -> None:
    schedule = {"name": "warmup_constant", "warmup_steps": 1, "warmup_shape": "log"}
    with pytest.raises(SpecError) as caught:
        build_spec({"schedule": schedule})
    (issue,) = caught.value.issues
    assert issue.path == "schedule.warmup_shape" and "at least 2" in str(caught.value)


def test_schedules_deepspeed_cannot_express_are_left_to_the_backend() -> None:
    cosine = Sched("warmup_cosine", warmup_steps=4, total_steps=10)
    assert deepspeed_scheduler(cosine, 0.1) is None
    floor_differs = Sched("warmup_linear", warmup_steps=4, total_steps=10, min_ratio=0.1)
    assert deepspeed_scheduler(floor_differs, 0.1) is None
    assert deepspeed_scheduler(Sched("warmup_constant", warmup_steps=1), 0.1) is None
