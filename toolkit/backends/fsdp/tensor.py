"""Tensor parallelism's plan: module-name patterns -> DTensor's column and row styles.

torch's ColwiseParallel and RowwiseParallel split `nn.Linear` and `nn.Embedding`. Hugging
Face's `Conv1D` (GPT-2's projections) is a linear layer that stores its weight as (in, out), the
transpose of `nn.Linear`'s, so the styles here split it along the other weight dimension and
otherwise are torch's own: the same input and output layouts, `distribute_module`, and the
same collectives (the row style's outputs summed over the tensor-parallel group).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from functools import partial

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import (
    Placement,
    Replicate,
    Shard,
    distribute_module,
    distribute_tensor,
)
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel

from toolkit.errors import ToolkitError


def stores_weight_transposed(module: torch.nn.Module) -> bool:
    """Hugging Face's Conv1D: `weight` is (in, out) and `nf` the output features."""
    weight = getattr(module, "weight", None)
    return (
        type(module).__name__ == "Conv1D"
        and isinstance(weight, torch.Tensor)
        and weight.dim() == 2
        and getattr(module, "nf", None) == weight.shape[1]
    )


def _distribute_transposed(
    style: ColwiseParallel | RowwiseParallel,
    module: torch.nn.Module,
    mesh: DeviceMesh,
    weight: Placement,
    bias: Placement,
) -> torch.nn.Module:
    """`distribute_module` as torch's style does it, with a transposed-weight layer's weight
    and bias placed as given."""

    def place(_name: str, part: torch.nn.Module, on: DeviceMesh) -> None:
        for name, placement in (("weight", weight), ("bias", bias)):
            parameter = getattr(part, name, None)
            if parameter is not None:
                distributed = distribute_tensor(parameter, on, [placement])
                part.register_parameter(
                    name, torch.nn.Parameter(distributed, requires_grad=parameter.requires_grad)
                )

    return distribute_module(
        module,
        mesh,
        place,
        partial(style._prepare_input_fn, style.input_layouts, style.desired_input_layouts),
        partial(style._prepare_output_fn, style.output_layouts, style.use_local_output),
    )


class Colwise(ColwiseParallel):
    """torch's ColwiseParallel; a transposed-weight linear layer splits its weight's columns
    (its output features) and its bias."""

    def _apply(self, module: torch.nn.Module, device_mesh: DeviceMesh) -> torch.nn.Module:
        if not stores_weight_transposed(module):
            return super()._apply(module, device_mesh)
        return _distribute_transposed(self, module, device_mesh, Shard(1), Shard(0))


class Rowwise(RowwiseParallel):
    """torch's RowwiseParallel; a transposed-weight linear layer splits its weight's rows (its
    input features) and keeps its bias whole, added once to the summed outputs."""

    def _apply(self, module: torch.nn.Module, device_mesh: DeviceMesh) -> torch.nn.Module:
        if not stores_weight_transposed(module):
            return super()._apply(module, device_mesh)
        self.desired_input_layouts = (Shard(-1),)  # as torch's row style for nn.Linear
        return _distribute_transposed(self, module, device_mesh, Shard(0), Replicate())


STYLES: dict[str, type[ParallelStyle]] = {"colwise": Colwise, "rowwise": Rowwise}


def tensor_plan(module: torch.nn.Module, written: Mapping[str, str]) -> dict[str, ParallelStyle]:
    """parallelize_module's plan: the spec's `parallel.tensor_plan`, else the model's own (a
    Hugging Face model's `_tp_plan`); every pattern must name a module, and every style be one
    the toolkit maps."""
    plan = dict(written) or dict(getattr(module, "_tp_plan", None) or {})
    if not plan:
        raise ToolkitError(
            "parallel.tensor > 1, but parallel.tensor_plan is empty and the model has no "
            "tensor-parallel plan of its own (a Hugging Face model's _tp_plan)",
            'give parallel.tensor_plan, e.g. {"layers.*.mlp.up_proj": colwise, '
            '"layers.*.mlp.down_proj": rowwise}',
        )
    names = [name for name, _ in module.named_modules() if name]
    for pattern, style in plan.items():
        if style not in STYLES:
            raise ToolkitError(
                f"the tensor-parallel plan's {pattern!r}: {style!r} is not a style the toolkit "
                f"runs ({', '.join(STYLES)})",
                "write parallel.tensor_plan with colwise and rowwise modules only",
            )
        if not any(fnmatch.fnmatchcase(name, pattern) for name in names):
            raise ToolkitError(
                f"the tensor-parallel plan's {pattern!r} names no module of the model",
                f"name modules it has: {', '.join(names[:8])}",
            )
    return {pattern: STYLES[style]() for pattern, style in plan.items()}
