"""What the bench's rank programs that run the toolkit share: the toolkit started from the spec
file the bench wrote, and synthetic classification data for the bench MLP."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

import toolkit
from toolkit.spec import TrainSpec


def start_toolkit(spec_file: str) -> tuple[TrainSpec, Any]:
    """The spec in `spec_file` (JSON) and the `Run` that `toolkit.init` started from it."""
    spec = TrainSpec.from_dict(json.loads(Path(spec_file).read_text()))
    return spec, toolkit.init(spec)


def synthetic(widths: list[int], samples: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """`samples` float32 inputs as wide as the MLP's input and int64 labels for its output."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((samples, widths[0]), dtype=np.float32)
    return x, rng.integers(0, widths[-1], samples, dtype=np.int64)
