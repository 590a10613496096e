"""The parallel layout for one world size: data x pipeline x tensor = ranks, and FSDP's
data-parallel ranks split into replicate x shard.

`parallel:` says what the user fixed; this module derives the rest for the job's world size
(known at `spec check` when the spec fixes it, else when the ranks start) and refuses a layout
that does not multiply out, naming the field as written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from toolkit.spec.errors import SpecError

if TYPE_CHECKING:
    from toolkit.spec.sections import ParallelSpec


@dataclass(frozen=True, kw_only=True)
class Layout:
    """How `world` ranks split: always world = data * pipeline * tensor, data = replicate * shard.

    Rank order: a tensor-parallel group is consecutive ranks, then the data-parallel index;
    the pipeline engine places its stages by its own topology (DeepSpeed's PipeDataParallel).
    """

    world: int
    data: int
    pipeline: int
    tensor: int
    replicate: int
    shard: int

    def describe(self) -> str:
        """`data 2 x tensor 2` style, naming only the degrees above 1 (data always)."""
        parts = [f"data {self.data}"]
        if self.replicate > 1:
            parts = [f"replicate {self.replicate} x shard {self.shard}"]
        model = (("pipeline", self.pipeline), ("tensor", self.tensor))
        parts += [f"{name} {degree}" for name, degree in model if degree > 1]
        return " x ".join(parts)


def resolve_layout(parallel: ParallelSpec, world: int) -> Layout:
    """The layout of `parallel` over `world` ranks; SpecError naming the field that does not fit."""
    if world < 1:
        raise SpecError.single(
            "launch.np", world, "must be at least 1", hint="a job has at least one rank"
        )
    model = parallel.pipeline * parallel.tensor
    if world % model:
        field, value = _model_field(parallel)
        raise SpecError.single(
            field,
            value,
            f"pipeline({parallel.pipeline}) x tensor({parallel.tensor}) = {model} must divide "
            f"the world size ({world})",
            hint=f"make the world size a multiple of {model}, or lower {field}",
        )
    data = world // model
    if parallel.data is not None and parallel.data != data:
        raise SpecError.single(
            "parallel.data",
            parallel.data,
            f"must be the world size ({world}) / (pipeline({parallel.pipeline}) x "
            f"tensor({parallel.tensor})) = {data}",
            hint="leave parallel.data out to derive it, or change launch.np",
        )
    if data % parallel.replicate:
        raise SpecError.single(
            "parallel.replicate",
            parallel.replicate,
            f"must divide the data-parallel ranks ({data}): replicate x shard = data",
            hint=f"use one of {[d for d in range(1, data + 1) if data % d == 0]}",
        )
    shard = data // parallel.replicate
    if parallel.shard is not None and parallel.shard != shard:
        raise SpecError.single(
            "parallel.shard",
            parallel.shard,
            f"must be data({data}) / replicate({parallel.replicate}) = {shard}",
            hint="leave parallel.shard out to derive it, or change parallel.replicate",
        )
    return Layout(
        world=world,
        data=data,
        pipeline=parallel.pipeline,
        tensor=parallel.tensor,
        replicate=parallel.replicate,
        shard=shard,
    )


def _model_field(parallel: ParallelSpec) -> tuple[str, int]:
    """The model-parallel field to blame: the tensor degree when it is set, else the stages."""
    if parallel.tensor > 1:
        return "parallel.tensor", parallel.tensor
    return "parallel.pipeline", parallel.pipeline
