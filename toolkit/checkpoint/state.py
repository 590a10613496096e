"""`CheckpointState`: the whole training state, as plain numpy arrays and JSON values.

Engines translate to and from this; the on-disk format knows nothing about any engine.
Conventions that let a checkpoint move between engines (the format does not enforce them):

- model: the user's state_dict names, full shapes, fp32 for floating weights (buffers keep
  their dtype, e.g. int64 counters).
- optimizer: torch's per-parameter state keys are the slot names for every engine:
  "momentum_buffer" (SGD), "exp_avg" and "exp_avg_sq" (Adam, AdamW), each with the
  parameter's full shape; a TF engine maps its slots onto these. Per-parameter step counts
  go in as "step/<param>" 0-d arrays, or as one count in `scalars["step"]`.
- arrays: RNG states as "rng/<generator>/rank<r>" (e.g. the uint8 torch CPU state).
- extras: {"schedule": {...}, "loss_scaler": {...}, "data": {"epoch": e, "samples": n}},
  and RNG states that are plain ints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from toolkit.errors import ToolkitError

SLOT_SEPARATOR = "/"


@dataclass(kw_only=True)
class CheckpointState:
    """Everything a run needs to continue exactly, independent of engine and world size."""

    step: int
    """Optimizer steps taken."""
    model: dict[str, np.ndarray]
    """Full (consolidated) fp32 weights and buffers, by the user's state_dict names."""
    optimizer: dict[str, np.ndarray] = field(default_factory=dict)
    """Per-parameter optimizer state as `optimizer_key(slot, param)` -> array of the
    parameter's full shape, e.g. "exp_avg/fc.weight", "momentum_buffer/fc.weight"."""
    scalars: dict[str, Any] = field(default_factory=dict)
    """JSON-able optimizer scalars, e.g. {"step": 120} or per param group values."""
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    """Other arrays, e.g. RNG states ("rng/torch/rank0" -> uint8 array)."""
    extras: dict[str, Any] = field(default_factory=dict)
    """JSON-able: schedule position, loss-scaler state, data position (epoch, samples seen),
    RNG states that are plain ints. Tuples come back as lists, numpy scalars as Python ones."""

    @property
    def applied_steps(self) -> int:
        """The steps that moved the weights: `step` less those fp16 skipped for an overflow
        (the loss scaler's `skipped_steps`), which advanced no optimizer count or schedule."""
        saved = self.extras.get("loss_scaler")
        skipped = saved.get("skipped_steps", 0) if isinstance(saved, dict) else 0
        return self.step - int(skipped)


def optimizer_key(slot: str, param: str) -> str:
    """The optimizer-section name of `slot` (e.g. "exp_avg") of parameter `param`."""
    if not slot or SLOT_SEPARATOR in slot:
        raise ToolkitError(f"optimizer slot {slot!r} must be non-empty and contain no '/'")
    return f"{slot}{SLOT_SEPARATOR}{param}"


def split_optimizer_key(key: str) -> tuple[str, str]:
    """(slot, param) of an optimizer-section name; the param part may itself contain '/'."""
    slot, separator, param = key.partition(SLOT_SEPARATOR)
    if not separator or not slot:
        raise ToolkitError(f"optimizer tensor {key!r} is not named '<slot>/<parameter>'")
    return slot, param
