"""The batch contract: global = micro * accumulation * data-parallel ranks.

Data-parallel ranks (dp) are the world size divided by the pipeline stages and the tensor-
parallel degree (`toolkit.spec.layout`): every stage of one pipeline, and every rank of one
tensor-parallel group, sees the same samples. This is DeepSpeed's own rule (`train_batch_size ==
train_micro_batch_size_per_gpu * gradient_accumulation_steps * dp`, checked in
`DeepSpeedConfig._batch_assertion`), and every other engine is held to it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from toolkit.spec.errors import SpecError, SpecIssue
from toolkit.spec.layout import resolve_layout

if TYPE_CHECKING:
    from toolkit.spec.sections import BatchSpec, ParallelSpec

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


def resolve_batch(batch: BatchSpec, world_size: int, parallel: ParallelSpec) -> ResolvedBatch:
    """Derive the missing member of the triple for `world_size`; SpecError when impossible."""
    layout = resolve_layout(parallel, world_size)
    dp = layout.data
    global_, micro, accum = batch.global_, batch.micro, batch.accumulation
    ranks = f"data-parallel ranks({dp})"
    world = f" (world size {world_size}: {layout.describe()})"
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


def batch_issues(batch: BatchSpec, world_size: int, parallel: ParallelSpec) -> list[SpecIssue]:
    """`resolve_batch`'s and the layout's problems as a list (empty when both work)."""
    try:
        resolve_batch(batch, world_size, parallel)
    except SpecError as error:
        return list(error.issues)
    return []
