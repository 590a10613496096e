"""Consolidated model weights for inference, and a summary of what a checkpoint holds.

`export_weights(..., to="safetensors")` writes a plain safetensors file with the metadata
`{"format": "pt"}` that Hugging Face `from_pretrained` expects of a `model.safetensors`;
`to="torch"` writes `torch.save` of a dict of tensors (loadable with `weights_only=True`)
through the `save_torch` the caller passes: torch is imported only by the backends, which
themselves import this package (so it cannot import them). Both are written through a
temporary file and a rename.
"""

from __future__ import annotations

import math
import os
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.checkpoint.manifest import SECTIONS
from toolkit.checkpoint.read import Checkpoint
from toolkit.checkpoint.tensorfile import ESCAPE_PREFIX, METADATA_KEY, write_tensors
from toolkit.errors import ToolkitError

EXPORT_FORMATS = ("safetensors", "torch")
SaveTorch = Callable[[dict[str, np.ndarray], Any], None]
"""Writes a dict of arrays to an open binary stream in torch.save's format."""


def summary(checkpoint: Checkpoint) -> dict[str, Any]:
    """What `toolkit checkpoint inspect` shows, from the verified manifest alone."""
    manifest = checkpoint.manifest
    sections = {}
    for section in SECTIONS:
        records = [record for record in manifest.files if record.section == section]
        if not records:
            continue
        index = checkpoint.index(section)
        sections[section] = {
            "files": [record.path for record in records],
            "tensors": len(index),
            "fragmented": sum(pieces[0][1].part_of is not None for pieces in index.values()),
            "elements": sum(math.prod(e.shape) for r in records for e in r.tensors),
            "bytes": sum(record.bytes for record in records),
            "dtypes": dict(sorted(Counter(p[0][1].dtype for p in index.values()).items())),
        }
    return {
        "path": str(checkpoint.path),
        "step": manifest.step,
        "backend": manifest.origin.backend,
        "framework": manifest.origin.framework,
        "world_size": manifest.origin.world_size,
        "format_version": manifest.format_version,
        "toolkit_version": manifest.toolkit_version,
        "created": manifest.created,
        "bytes": sum(record.bytes for record in manifest.files),
        "sections": sections,
        "scalars": sorted(manifest.scalars),
        "extras": sorted(manifest.extras),
    }


def export_weights(
    checkpoint: Checkpoint,
    out: str | os.PathLike[str],
    *,
    to: str,
    save_torch: SaveTorch | None = None,
) -> int:
    """Write the checkpoint's model weights to `out` as `to`; returns the tensor count."""
    if to not in EXPORT_FORMATS:
        raise ToolkitError(f"export format {to!r} is not one of {', '.join(EXPORT_FORMATS)}")
    weights = checkpoint.tensors("model")
    if not weights:
        raise ToolkitError(f"{checkpoint.path}: holds no model weights to export")
    unstorable = [
        name for name in weights if name == METADATA_KEY or name.startswith(ESCAPE_PREFIX)
    ]
    if unstorable and to == "safetensors":
        raise ToolkitError(
            f"weight {unstorable[0]!r} cannot be named so in a plain safetensors file",
            "export --to torch, or rename the weight in the model",
        )
    if to == "torch" and save_torch is None:
        raise ToolkitError(
            "export --to torch needs PyTorch, which is not installed",
            "pip install 'toolkit[torch]', or export --to safetensors",
        )
    target = Path(out)
    if not target.parent.is_dir():
        raise ToolkitError(f"--out {out}: directory {target.parent} does not exist")
    temporary = target.parent / f".{target.name}.{uuid.uuid4().hex}.tmp"
    try:
        with open(temporary, "xb") as stream:
            if to == "safetensors":
                write_tensors(stream, weights, metadata={"format": "pt"})
            elif save_torch is not None:
                save_torch(weights, stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, target)
    except OSError as error:
        raise ToolkitError(f"cannot write {out}: {error.strerror or error}") from None
    finally:
        temporary.unlink(missing_ok=True)
    return len(weights)
