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

from pydantic import Field

from toolkit import engines
from toolkit.spec.errors import SpecIssue
from toolkit.spec.fields import AllreduceTransport, Section

Dtype = Literal["fp32", "fp16", "bf16"]


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
    allreduce: AllreduceTransport = Field(
        default="auto",
        description="The toolkit's, not a ds_config key: how ZeRO reduces its gradients "
        "(all-reduce at stages 0-2, reduce-scatter at 3) and gathers its weights (stages 1-3) "
        "across ranks. gloo: DeepSpeed's torch.distributed process group, over TCP. "
        "shared_memory: through /dev/shm, for ranks on one x86-64 host (as ddp.allreduce; 2 "
        "slots of 4 MiB per rank). auto: shared_memory wherever it can run, else gloo. The "
        "pipeline engine reduces through Gloo either way.",
    )
    send_recv: AllreduceTransport = Field(
        default="auto",
        description="The toolkit's, not a ds_config key: how the pipeline engine hands "
        "activations and their gradients between stages. gloo: DeepSpeed's blocking "
        "torch.distributed send and receive, over TCP; each send waits for its receive. "
        "shared_memory: through a 2 MiB mailbox per direction between neighbouring stages in "
        "/dev/shm, for ranks on one x86-64 host; a send returns once its bytes are in the "
        "mailbox. auto: shared_memory wherever it can run, else gloo. The same bits either way.",
    )


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


def collectives_over_every_rank(pipeline_stages: int) -> bool:
    """Whether DeepSpeed reduces gradients and gathers weights over every rank, the collectives
    `deepspeed.allreduce` chooses the transport of: at every ZeRO stage (all-reduces at 0-2,
    all-gathers at 1-3, reduce-scatters at 3) without the pipeline engine, which reduces over
    groups of some ranks."""
    return pipeline_stages == 1


def allreduce_issues(
    section: DeepSpeedSpec, backend: str, pipeline_stages: int
) -> Iterator[SpecIssue]:
    """`deepspeed.allreduce` written where it would be ignored: the transport is DeepSpeed's,
    of the gradient reductions and weight gathers of ZeRO without the pipeline engine."""
    if section.allreduce == "auto":
        return
    if not engines.engine(backend).deepspeed_settings:
        yield SpecIssue(
            path="deepspeed.allreduce",
            value=section.allreduce,
            allowed=f"the DeepSpeed engine's transport; backend {backend} does not read it",
            hint="remove deepspeed.allreduce (ddp.allreduce is DDP's)",
        )
    elif section.allreduce == "shared_memory" and not collectives_over_every_rank(pipeline_stages):
        yield SpecIssue(
            path="deepspeed.allreduce",
            value=section.allreduce,
            allowed="auto or gloo with the pipeline engine, which reduces over Gloo in groups "
            "of some ranks",
            hint="set deepspeed.allreduce: auto, or remove the pipeline stages",
        )


def send_recv_issues(
    section: DeepSpeedSpec, backend: str, pipeline_stages: int
) -> Iterator[SpecIssue]:
    """`deepspeed.send_recv` written where it would be ignored: only the pipeline engine sends
    between stages."""
    if section.send_recv == "auto":
        return
    if not engines.engine(backend).deepspeed_settings:
        yield SpecIssue(
            path="deepspeed.send_recv",
            value=section.send_recv,
            allowed=f"the DeepSpeed pipeline engine's transport; backend {backend} does not "
            "read it",
            hint="remove deepspeed.send_recv",
        )
    elif pipeline_stages == 1:
        yield SpecIssue(
            path="deepspeed.send_recv",
            value=section.send_recv,
            allowed="auto without pipeline stages: only the pipeline engine sends between "
            "stages (pipeline.stages > 1)",
            hint="remove deepspeed.send_recv, or set pipeline.stages",
        )


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
