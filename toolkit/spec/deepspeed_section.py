"""The spec's `deepspeed` section: DeepSpeed's own config keys that no other engine has a word for.

They arrive mostly from imported DeepSpeed configs (`toolkit spec from-deepspeed`), which must
keep them exactly: the two ZeRO guard flags (no effect on the math, but DeepSpeed refuses to
start without the right ones, e.g. Megatron's configs with their own optimizers), gradient
pre-division, `fp16.auto_cast`, and the dtypes of gradient accumulation and communication.
Keys are DeepSpeed's own names, so a DeepSpeed user reads them as in ds_config.json.

On engines without DeepSpeed's settings (`Engine.deepspeed_settings` in toolkit.engines), a value
that changes the math must be what those engines do anyway (`deepspeed_issues`); the guard
flags are DeepSpeed-only and ignored elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

from pydantic import Field, JsonValue, field_validator

from toolkit import engines
from toolkit.spec.errors import SpecIssue
from toolkit.spec.fields import Section, field_error

Dtype = Literal["fp32", "fp16", "bf16"]
OBSERVABILITY: frozenset[str] = frozenset(
    (
        "tensorboard",
        "wandb",
        "csv_monitor",
        "comet",
        "flops_profiler",
        "comms_logger",
        "wall_clock_breakdown",
        "memory_breakdown",
        "dump_state",
        "timers",
    )
)
"""DeepSpeed's top-level keys that log, monitor or profile a run and change no math."""


class DeepSpeedSpec(Section):
    """DeepSpeed-only settings, named as in ds_config.json; null = the toolkit's choice."""

    zero_allow_untested_optimizer: bool | None = Field(
        default=None,
        description="Let ZeRO run an optimizer DeepSpeed has not tested (a script's own); null = "
        "true only for sgd at ZeRO stage > 0, which needs it.",
    )
    zero_force_ds_cpu_optimizer: bool = Field(
        default=True,
        description="With optimizer offload, refuse any optimizer but DeepSpeed's CPU Adam "
        "(DeepSpeed's default, true).",
    )
    prescale_gradients: bool = Field(
        default=False,
        description="Divide gradients before the all-reduce instead of after (same mean, other "
        "rounding).",
    )
    gradient_predivide_factor: float = Field(
        default=1.0,
        gt=0,
        description="Divide gradients by this before the all-reduce and by world/factor after.",
    )
    auto_cast: bool = Field(
        default=False,
        description="fp16: autocast the forward pass (fp32 weights) instead of casting the model "
        "to fp16 (DeepSpeed's fp16.auto_cast).",
    )
    grad_accum_dtype: Dtype | None = Field(
        default=None,
        description="dtype gradients are accumulated in (data_types.grad_accum_dtype); null = "
        "the precision's.",
    )
    communication_data_type: Dtype | None = Field(
        default=None,
        description="dtype gradients are all-reduced in; null = the precision's.",
    )
    observability: dict[str, JsonValue] = Field(
        default_factory=dict,
        description="DeepSpeed's logging, monitor and profiler keys ("
        + ", ".join(sorted(OBSERVABILITY))
        + "), written into the config as given; they change no math. Other engines ignore them.",
    )

    @field_validator("observability")
    @classmethod
    def _only_observability_keys(cls, value: dict[str, JsonValue]) -> dict[str, JsonValue]:
        unknown = sorted(set(value) - OBSERVABILITY)
        if unknown:
            raise field_error(
                f"holds {', '.join(map(repr, unknown[:5]))}, which are not DeepSpeed logging, "
                f"monitor or profiler keys (allowed: {', '.join(sorted(OBSERVABILITY))})",
                "put settings that change the math in their own spec fields",
            )
        return value


def _issue(key: str, value: object, allowed: str) -> SpecIssue:
    return SpecIssue(
        path=f"deepspeed.{key}",
        value=value,
        allowed=allowed,
        hint=f"remove deepspeed.{key}, or set backend: "
        + ", ".join(engines.backends_with("deepspeed_settings")),
    )


def deepspeed_issues(section: DeepSpeedSpec, backend: str, precision: str) -> Iterator[SpecIssue]:
    """Settings that change the math, on an engine that cannot honour them."""
    if engines.engine(backend).deepspeed_settings:
        return
    where = f"backend {backend}"
    if section.prescale_gradients or section.gradient_predivide_factor != 1.0:
        key = "prescale_gradients" if section.prescale_gradients else "gradient_predivide_factor"
        yield _issue(key, getattr(section, key), f"{where} divides gradients after the sum only")
    if section.auto_cast:
        yield _issue("auto_cast", True, f"{where} has no fp16.auto_cast switch")
    for key in ("grad_accum_dtype", "communication_data_type"):
        value = getattr(section, key)
        if value is not None and value != precision:
            yield _issue(key, value, f"{where} uses the precision's dtype ({precision})")


def bias_correction_issues(bias_correction: bool, backend: str) -> Iterator[SpecIssue]:
    """Adam without bias correction runs only where DeepSpeed's own Adam does."""
    if not bias_correction and not engines.engine(backend).deepspeed_settings:
        with_it = ", ".join(engines.backends_with("deepspeed_settings"))
        yield SpecIssue(
            path="optimizer.bias_correction",
            value=False,
            allowed=f"Adam without bias correction runs on backend {with_it} only "
            f"(backend is {backend})",
            hint=f"set backend: {with_it}, or remove optimizer.bias_correction",
        )
