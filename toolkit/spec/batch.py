"""The batch contract: global = micro * accumulation * data-parallel ranks.

Data-parallel ranks (dp) are the world size divided by the pipeline stages and the tensor-
parallel degree: every stage of one pipeline, and every rank of one tensor-parallel group,
sees the same samples. This is DeepSpeed's own rule (`train_batch_size ==
train_micro_batch_size_per_gpu * gradient_accumulation_steps * dp`, checked in
`DeepSpeedConfig._batch_assertion`), and every other engine is held to it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from toolkit.spec.errors import SpecError, SpecIssue

if TYPE_CHECKING:
    from toolkit.spec.sections import BatchSpec

X = "\u00d7"
"""The multiplication sign of the messages (escaped: ruff flags it as confusable)."""


@dataclass(frozen=True, kw_only=True)
class ResolvedBatch:
    """The batch triple for one data-parallel size; always global = micro * accumulation * dp."""

    global_: int
    """Samples per optimizer step over all data-parallel ranks."""
    micro: int
    """Samples per forward/backward pass on one rank."""
    accumulation: int
    """Micro-batches per optimizer step."""
    dp: int
    """Data-parallel ranks: world size / (pipeline stages x tensor-parallel degree)."""


def data_parallel_size(world_size: int, stages: int, tensor: int = 1) -> int:
    """World size / (pipeline stages x tensor-parallel degree); SpecError when they do not
    divide the world."""
    if world_size < 1:
        raise SpecError.single(
            "launch.np", world_size, "must be at least 1", hint="a job has at least one rank"
        )
    if stages < 1 or world_size % stages:
        raise SpecError.single(
            "pipeline.stages",
            stages,
            f"must divide the world size ({world_size})",
            hint=f"use a divisor of {world_size}, or change launch.np",
        )
    if tensor < 1 or (world_size // stages) % tensor:
        raise SpecError.single(
            "parallel.tensor",
            tensor,
            f"must divide the world size / pipeline stages ({world_size // stages})",
            hint="use a divisor of it, or change launch.np",
        )
    return world_size // (stages * tensor)


def resolve_batch(batch: BatchSpec, world_size: int, stages: int, tensor: int = 1) -> ResolvedBatch:
    """Derive the missing member of the triple for `world_size`; SpecError when impossible."""
    dp = data_parallel_size(world_size, stages, tensor)
    global_, micro, accum = batch.global_, batch.micro, batch.accumulation
    ranks = f"data-parallel ranks({dp})"
    world = f" (world size {world_size} / pipeline stages {stages})"
    if tensor > 1:
        world = f" (world size {world_size} / tensor-parallel degree {tensor})"
    if global_ is None:
        micro = 1 if micro is None else micro
        accum = 1 if accum is None else accum
        return ResolvedBatch(global_=micro * accum * dp, micro=micro, accumulation=accum, dp=dp)
    if micro is None:
        accum = 1 if accum is None else accum
        if global_ % (accum * dp):
            raise SpecError.single(
                "batch.global",
                global_,
                f"must be divisible by accumulation({accum}) {X} {ranks} = {accum * dp} "
                f"to derive micro{world}",
                hint=f"make batch.global a multiple of {accum * dp} or give batch.micro",
            )
        return ResolvedBatch(
            global_=global_, micro=global_ // (accum * dp), accumulation=accum, dp=dp
        )
    if accum is None:
        if global_ % (micro * dp):
            raise SpecError.single(
                "batch.global",
                global_,
                f"must be divisible by micro({micro}) {X} {ranks} = {micro * dp} "
                f"to derive accumulation{world}",
                hint=f"make batch.global a multiple of {micro * dp}",
            )
        return ResolvedBatch(
            global_=global_, micro=micro, accumulation=global_ // (micro * dp), dp=dp
        )
    if global_ != micro * accum * dp:
        raise SpecError.single(
            "batch.global",
            global_,
            f"must equal micro({micro}) {X} accumulation({accum}) {X} {ranks} "
            f"= {micro * accum * dp}{world}",
            hint="give only two of global, micro and accumulation and let the third be derived",
        )
    return ResolvedBatch(global_=global_, micro=micro, accumulation=accum, dp=dp)


def batch_issues(
    batch: BatchSpec, world_size: int, stages: int, tensor: int = 1
) -> list[SpecIssue]:
    """`resolve_batch`'s problems as a list (empty when the triple works)."""
    try:
        resolve_batch(batch, world_size, stages, tensor)
    except SpecError as error:
        return list(error.issues)
    return []
