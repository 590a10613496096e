"""The weights-only .npz file `run.save(path)` writes until it moves to the checkpoint format.

One .npz of fp32 arrays plus a metadata entry, written atomically (a temporary file in the
same directory, fsync, then rename) with the umask's file mode; temporary files of killed
saves are removed by the next save. Loaded with `allow_pickle=False`, and anything that is not
such a file is one ToolkitError.
"""

from __future__ import annotations

import json
import os
import uuid
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.errors import ToolkitError
from toolkit.spec import TrainSpec

META_KEY = "__toolkit_meta__"
FORMAT_VERSION = 1
_UNREADABLE = (
    OSError,
    ValueError,
    EOFError,
    KeyError,
    zipfile.BadZipFile,
    zlib.error,
    NotImplementedError,
    RuntimeError,
)


def save_weights(path: str, weights: dict[str, np.ndarray], *, step: int, spec: TrainSpec) -> None:
    target = Path(path)
    if META_KEY in weights:
        raise ToolkitError(
            f"a weight is named {META_KEY!r}, the key this file format keeps its metadata in",
            "rename the weight, or save with toolkit.checkpoint.write_checkpoint",
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    for leftover in target.parent.glob(f".{target.name}.*.tmp"):
        leftover.unlink(missing_ok=True)
    meta = {"format": FORMAT_VERSION, "step": step, "backend": spec.backend, "spec": spec.to_dict()}
    arrays: dict[str, Any] = {
        name: np.asarray(value, dtype=np.float32) for name, value in weights.items()
    }
    arrays[META_KEY] = np.array(json.dumps(meta))
    temporary = target.parent / f".{target.name}.{uuid.uuid4().hex}.tmp"
    try:
        with open(temporary, "xb") as stream:  # default mode: the umask decides
            np.savez(stream, **arrays)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def load_weights(path: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The weights and the metadata saved with them; a clear error for anything else."""
    try:
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise ValueError("a single array, not an .npz archive")
        with loaded as archive:
            data = {name: archive[name] for name in archive.files}
        meta_array = data.pop(META_KEY, None)
        meta = None if meta_array is None else json.loads(str(meta_array))
    except _UNREADABLE as error:
        raise ToolkitError(
            f"{path} is not a readable toolkit checkpoint ({error.__class__.__name__}: {error})",
            "pass a .npz file written by run.save()",
        ) from None
    if not isinstance(meta, dict):
        raise ToolkitError(f"{path} has no toolkit metadata", "pass a file written by run.save()")
    return data, meta
