"""Spec sections about how a run proceeds over time: its learning-rate schedule and its timeouts.

The schedule's formula is `toolkit.schedule.lr_ratio`; every engine follows it step by step.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from toolkit.spec.fields import Section, field_error

ScheduleName = Literal["constant", "warmup_constant", "warmup_linear", "warmup_cosine", "step"]
WarmupShape = Literal["linear", "log"]
DECAYS_TO_TOTAL = ("warmup_linear", "warmup_cosine")


class ScheduleSpec(Section):
    """The learning rate over optimizer steps, as a factor on the peak (optimizer.lr after
    lr_scaling). Steps are optimizer steps, never micro-batches."""

    name: ScheduleName = Field(
        default="constant",
        description="constant; warmup_constant; warmup_linear or warmup_cosine (warmup, then "
        "decay to min_ratio at total_steps); step (warmup, then x step_gamma every step_size).",
    )
    warmup_steps: int = Field(
        default=0, ge=0, description="Optimizer steps of warmup from warmup_start_ratio."
    )
    warmup_shape: WarmupShape = Field(
        default="linear",
        description="How the warmup rises: linear (k / warmup_steps) or log (ln(k + 1) / "
        "ln(warmup_steps), DeepSpeed's WarmupLR default; needs warmup_steps >= 2).",
    )
    warmup_start_ratio: float = Field(
        default=0.0, ge=0, le=1, description="Learning-rate factor at step 0 of the warmup."
    )
    total_steps: int | None = Field(
        default=None,
        ge=1,
        validate_default=True,
        description="Step at which warmup_linear and warmup_cosine reach min_ratio.",
    )
    min_ratio: float = Field(
        default=0.0, ge=0, le=1, description="Floor of the linear and cosine decays."
    )
    step_size: int | None = Field(
        default=None,
        ge=1,
        validate_default=True,
        description="step: optimizer steps between decays.",
    )
    step_gamma: float = Field(
        default=0.1, gt=0, le=1, description="step: factor applied every step_size steps."
    )

    @field_validator("warmup_shape")
    @classmethod
    def _log_needs_two_steps(cls, shape: WarmupShape, info: ValidationInfo) -> WarmupShape:
        warmup = info.data.get("warmup_steps")
        if shape == "log" and warmup is not None and 0 < warmup < 2:
            raise field_error(
                f"a log warmup needs warmup_steps of at least 2 (got {warmup})",
                "ln(warmup_steps) is its divisor; use warmup_steps: 2 or more, or linear",
            )
        return shape

    @field_validator("total_steps")
    @classmethod
    def _decays_need_an_end(cls, total: int | None, info: ValidationInfo) -> int | None:
        name, warmup = info.data.get("name"), info.data.get("warmup_steps")
        if name in DECAYS_TO_TOTAL and total is None:
            raise field_error(
                f"schedule {name} decays until total_steps: give it",
                "the optimizer steps of the whole run, e.g. total_steps: 10000",
            )
        if name in DECAYS_TO_TOTAL and total is not None and warmup is not None and total <= warmup:
            raise field_error(
                f"must be above warmup_steps ({warmup})", "lengthen the run or shorten the warmup"
            )
        return total

    @field_validator("step_size")
    @classmethod
    def _step_needs_a_size(cls, size: int | None, info: ValidationInfo) -> int | None:
        if info.data.get("name") == "step" and size is None:
            raise field_error(
                "schedule step needs step_size", "the optimizer steps between decays, e.g. 1000"
            )
        return size


class TimeoutsSpec(Section):
    """How long a job waits on a dead or stalled rank before it ends, naming that rank."""

    collective_s: float = Field(
        default=120.0,
        gt=0,
        le=86_400,
        description="Seconds any collective (and the start-up rendezvous) waits for its peers "
        "before failing; reaches every engine's process groups. Under TF MultiWorker it bounds "
        "each step or reduction as a whole, its compute included.",
    )
    stall_s: float = Field(
        default=60.0,
        gt=2,
        le=86_400,
        description="Seconds without a heartbeat from a rank before `toolkit launch` stops the "
        "job (ranks beat once a second).",
    )
