"""The portable weights format every engine writes: one .npz of fp32 arrays plus metadata.

Written atomically (a temporary file in the same directory, fsync, then rename), so a crash
mid-save never leaves a truncated file where a good one was. Loaded with `allow_pickle=False`,
so a checkpoint from elsewhere cannot run code.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.errors import ToolkitError
from toolkit.spec import TrainSpec

META_KEY = "__toolkit_meta__"
FORMAT_VERSION = 1


def save_weights(path: str, weights: dict[str, np.ndarray], *, step: int, spec: TrainSpec) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    meta = {"format": FORMAT_VERSION, "step": step, "backend": spec.backend, "spec": spec.to_dict()}
    arrays: dict[str, Any] = {
        name: np.asarray(value, dtype=np.float32) for name, value in weights.items()
    }
    arrays[META_KEY] = np.array(json.dumps(meta))
    handle, temporary = tempfile.mkstemp(
        dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"
    )
    try:
        with os.fdopen(handle, "wb") as stream:
            np.savez(stream, **arrays)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def load_weights(path: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The weights and the metadata saved with them; a clear error for anything else."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            data = {name: archive[name] for name in archive.files}
    except (OSError, ValueError) as error:
        raise ToolkitError(
            f"{path} is not a readable toolkit checkpoint ({error})",
            "pass a .npz file written by run.save()",
        ) from None
    if META_KEY not in data:
        raise ToolkitError(f"{path} has no toolkit metadata", "pass a file written by run.save()")
    meta: dict[str, Any] = json.loads(str(data.pop(META_KEY)))
    return data, meta
