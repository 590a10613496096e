"""Activation checkpointing from the spec (`activation_checkpointing.modules`): each named
module's forward runs under a checkpoint function, so its activations are recomputed in the
backward pass instead of kept. Parameters and state_dict names are untouched, so checkpoints,
FSDP units and tensor-parallel plans see the model as it was. The engine chooses the
checkpoint function: torch's non-reentrant `torch.utils.checkpoint` (DDP, Horovod, FSDP) or
DeepSpeed's own."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils.checkpoint

from toolkit.errors import ToolkitError

Checkpoint = Callable[..., Any]
"""checkpoint(forward, *args, **kwargs) -> forward's output, its activations recomputed."""


def torch_checkpoint(forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """torch's non-reentrant checkpoint: inputs without gradients are fine, the RNG state is
    restored for the recomputation (dropout masks repeat), keyword arguments pass through."""
    return torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)


def modules_of_classes(
    module: torch.nn.Module, names: Sequence[str], field: str
) -> list[torch.nn.Module]:
    """The submodules whose class is one of `names`, outermost first; a ToolkitError naming
    `field` for a class the model does not have."""
    found = [m for m in module.modules() if m is not module and type(m).__name__ in names]
    missing = sorted(set(names) - {type(m).__name__ for m in found})
    if missing:
        classes = sorted({type(m).__name__ for m in module.modules()})
        raise ToolkitError(
            f"{field} names {missing}, but the model has no module of that class",
            f"name classes the model has: {', '.join(classes[:12])}",
        )
    return found


def recompute(
    module: torch.nn.Module, names: Sequence[str], checkpoint: Checkpoint = torch_checkpoint
) -> None:
    """Run the forward of every module of the classes `names` under `checkpoint`; a module
    inside another that is recomputed is left alone (the outer recomputation covers it)."""
    if not names:
        return
    chosen = modules_of_classes(module, names, "activation_checkpointing.modules")
    # A Hugging Face model appends each block's keys and values to its cache in the forward;
    # recomputed, a block would append them again. Its own gradient checkpointing turns the
    # cache off for training too.
    config = getattr(module, "config", None)
    if config is not None and getattr(config, "use_cache", False):
        config.use_cache = False
    inner = {id(m) for outer in chosen for m in outer.modules() if m is not outer}
    for target in chosen:
        if id(target) not in inner:
            target.forward = functools.partial(_recomputed, checkpoint, target.forward)


def _recomputed(
    checkpoint: Checkpoint, forward: Callable[..., Any], *args: Any, **kwargs: Any
) -> Any:
    if not torch.is_grad_enabled():  # evaluation: nothing is kept for a backward pass
        return forward(*args, **kwargs)
    return checkpoint(forward, *args, **kwargs)
