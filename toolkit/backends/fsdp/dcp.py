"""Toolkit checkpoints to and from PyTorch's distributed checkpoint format (DCP), the format
FSDP2 jobs and torchtitan write with `torch.distributed.checkpoint.save`.

The layout is `get_state_dict`'s: {"model": {name: tensor}, "optimizer": {"state": {name:
{slot: tensor, "step": tensor}}}}, by the model's state_dict names and torch's own slot names,
which is the portable layout's too (toolkit.checkpoint.state). An export writes both from one
process (`no_dist`); `dcp.load` reads it into any world size. An import takes the model's
weights (under "model", or at the top level) and, where present, the optimizer state; DCP's
`.metadata` file is a pickle, so import only checkpoints you trust.
"""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from toolkit.backends.torch_common import portable
from toolkit.backends.torch_state import slot_arrays
from toolkit.checkpoint import (
    Checkpoint,
    CheckpointState,
    Origin,
    refuse_used_target,
    write_checkpoint,
)
from toolkit.checkpoint.state import split_optimizer_key
from toolkit.errors import ToolkitError

STEP = "step"
METADATA = ".metadata"


@dataclass(frozen=True)
class Imported:
    path: Path
    """The step directory written."""
    state: CheckpointState


def export_dcp(checkpoint: Checkpoint, out: str | Path) -> int:
    """Write the checkpoint's weights and optimizer state into the new directory `out` as a
    DCP checkpoint; returns the tensor count."""
    target = Path(out)
    if target.exists() and any(target.iterdir()):
        raise ToolkitError(f"--out {out}: is not empty", "export into a new or empty directory")
    weights = {name: torch.from_numpy(np.array(a, order="C")) for name, a in _model(checkpoint)}
    slots: dict[str, dict[str, torch.Tensor]] = {}
    for key, array in checkpoint.tensors("optimizer").items():
        slot, name = split_optimizer_key(key)
        slots.setdefault(name, {})[slot] = torch.from_numpy(np.array(array, order="C"))
    common_step = checkpoint.manifest.scalars.get(STEP)
    if common_step is not None:
        for held in slots.values():
            held.setdefault(STEP, torch.tensor(float(common_step)))
    state: dict[str, Any] = {"model": weights}
    if slots:
        state["optimizer"] = {"state": slots}
    with _one_process():
        dcp.save(state, checkpoint_id=str(target), no_dist=True)
    return len(weights) + sum(len(held) for held in slots.values())


def import_dcp(source: str | Path, target: str | Path) -> Imported:
    """Convert the DCP checkpoint `source` into `target`/step-N (N: the optimizer's step count,
    else 0), resumable by every torch engine."""
    directory = Path(source)
    if not (directory / METADATA).is_file():
        raise ToolkitError(
            f"{source}: no {METADATA} file, so it is not a PyTorch distributed checkpoint",
            "name the directory torch.distributed.checkpoint.save wrote",
        )
    refuse_used_target(target)
    with tempfile.TemporaryDirectory() as scratch:
        whole = Path(scratch) / "whole.pt"
        with _one_process():
            dcp_to_torch_save(str(directory), str(whole))
        saved = torch.load(whole, weights_only=True)
    model = saved.get("model", saved) if isinstance(saved, dict) else None
    weights = {name: value for name, value in (model or {}).items() if torch.is_tensor(value)}
    if not weights:
        raise ToolkitError(f"{source}: holds no model tensors (under 'model' or at the top)")
    optimizer, steps = _optimizer(saved.get("optimizer") if "model" in saved else None)
    step = int(max(steps)) if steps else 0
    state = CheckpointState(
        step=step,
        model={name: portable(value) for name, value in weights.items()},
        optimizer=optimizer,
        scalars={STEP: step} if steps else {},
        extras={"data": {"epoch": 0, "samples": 0}, "imported": {"from": str(directory)}},
    )
    path = write_checkpoint(target, state, origin=Origin(framework="torch"))
    return Imported(path=path, state=state)


def _model(checkpoint: Checkpoint) -> list[tuple[str, np.ndarray]]:
    weights = checkpoint.tensors("model")
    if not weights:
        raise ToolkitError(f"{checkpoint.path}: holds no model weights to export")
    return sorted(weights.items())


def _optimizer(section: Any) -> tuple[dict[str, np.ndarray], list[float]]:
    """The portable optimizer tensors and the step counts of get_optimizer_state_dict's
    "state" (by parameter name); nothing when the checkpoint has none."""
    if not isinstance(section, dict) or not isinstance(section.get("state"), dict):
        return {}, []
    tensors, steps = slot_arrays(section["state"])
    return tensors, list(steps.values())


@contextmanager
def _one_process() -> Iterator[None]:
    """DCP from one process without a process group, which it runs but warns about each time."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield
