"""The learning-rate schedule: one formula, the reference every engine follows step by step.

`lr_ratio(schedule, k)` is the factor on the peak learning rate (the spec's `optimizer.lr` after
`lr_scaling`) used by optimizer step k, counting from 0. Steps are optimizer steps, never
micro-batches. The shapes:

- constant:          1
- warmup_constant:   warmup from `warmup_start_ratio` over `warmup_steps`, then 1
- warmup_linear:     the same warmup, then linear decay to `min_ratio` at `total_steps`
- warmup_cosine:     the same warmup, then half a cosine down to `min_ratio` at `total_steps`
- step:              the same warmup, then times `step_gamma` every `step_size` steps after it

    warmup (k < W):  s + (1 - s) · k / W                 (warmup_shape linear)
                     s + (1 - s) · ln(k + 1) / ln(W)     (warmup_shape log, DeepSpeed's)
    linear (k ≥ W):  m + (1 - m) · max(0, (T - k) / (T - W))
    cosine (k ≥ W):  m + (1 - m) · (1 + cos(π · min(1, (k - W) / (T - W)))) / 2
    step   (k ≥ W):  gamma ^ ((k - W) // step_size)

These are the usual definitions (Hugging Face's get_*_schedule_with_warmup, torch's StepLR);
the log warmup is DeepSpeed's WarmupLR / WarmupDecayLR default (`warmup_type: log`), which real
DeepSpeed configs use without saying so. Note it reaches 1 at k = W - 1, one step before the
linear warmup does.

How DeepSpeed's own schedulers (deepspeed.runtime.lr_schedules, 0.19.8) differ, which decides
where the toolkit can hand the schedule to DeepSpeed and where it steps one itself
(docs/engine-notes.md):
- At construction they set the learning rate of iteration -1 (WarmupLR: warmup_min_lr;
  WarmupCosineLR: 0), and the engine steps them after each optimizer step, so step 0 runs at that
  value and step 1 at iteration 0's: the whole schedule lags one step. One `step()` right after
  `deepspeed.initialize` aligns iteration k with optimizer step k.
- WarmupLR and WarmupDecayLR force at least 2 warmup steps (`max(2, warmup_num_steps)`), and
  WarmupDecayLR decays to `warmup_min_lr`, i.e. its floor is the warmup's start.
- WarmupCosineLR's decay progress is (k - W + 1) / (T - W): one step ahead of the usual cosine.
So DeepSpeed's own scheduler is rendered for warmup_constant (WarmupLR) and for warmup_linear
when min_ratio equals warmup_start_ratio (WarmupDecayLR), with at least 2 warmup steps and
either warmup shape (`warmup_type` linear or log); every
other schedule runs as a scheduler the backend gives DeepSpeed to step (`deepspeed_scheduler`).
"""

from __future__ import annotations

import math
from typing import Any, Protocol


class Schedule(Protocol):
    """The spec's `schedule` section, as this module reads it."""

    @property
    def name(self) -> str: ...
    @property
    def warmup_steps(self) -> int: ...
    @property
    def warmup_shape(self) -> str: ...
    @property
    def total_steps(self) -> int | None: ...
    @property
    def warmup_start_ratio(self) -> float: ...
    @property
    def min_ratio(self) -> float: ...
    @property
    def step_size(self) -> int | None: ...
    @property
    def step_gamma(self) -> float: ...


def lr_ratio(schedule: Schedule, k: int) -> float:
    """The factor on the peak learning rate for optimizer step k (0-based)."""
    warmup = schedule.warmup_steps
    if schedule.name == "constant":
        return 1.0
    if k < warmup:
        start = schedule.warmup_start_ratio
        return start + (1.0 - start) * _warmup_progress(schedule.warmup_shape, k, warmup)
    after = k - warmup
    if schedule.name == "warmup_constant":
        return 1.0
    if schedule.name == "step":
        return float(schedule.step_gamma ** (after // (schedule.step_size or 1)))
    total, floor = schedule.total_steps or warmup, schedule.min_ratio
    span = max(1, total - warmup)
    if schedule.name == "warmup_linear":
        return floor + (1.0 - floor) * max(0.0, (total - k) / span)
    progress = min(1.0, after / span)
    return floor + (1.0 - floor) * (1.0 + math.cos(math.pi * progress)) / 2.0


def _warmup_progress(shape: str, k: int, warmup: int) -> float:
    """How far step k (< warmup) is through the warmup, from 0 to below or at 1."""
    if shape == "log":
        return math.log(k + 1) / math.log(warmup)
    return k / warmup


def deepspeed_scheduler(schedule: Schedule, peak_lr: float) -> dict[str, Any] | None:
    """DeepSpeed's own `scheduler` section when its formula is exactly `lr_ratio`, else None
    (then the backend steps a scheduler of its own; see the module notes)."""
    if schedule.name == "constant" or schedule.warmup_steps < 2:
        return None
    start = peak_lr * schedule.warmup_start_ratio
    params: dict[str, Any] = {
        "warmup_min_lr": start,
        "warmup_max_lr": peak_lr,
        "warmup_num_steps": schedule.warmup_steps,
        "warmup_type": schedule.warmup_shape,
    }
    if schedule.name == "warmup_constant":
        return {"type": "WarmupLR", "params": params}
    same_floor = schedule.min_ratio == schedule.warmup_start_ratio
    if schedule.name == "warmup_linear" and same_floor and schedule.total_steps:
        return {
            "type": "WarmupDecayLR",
            "params": {**params, "total_num_steps": schedule.total_steps},
        }
    return None
