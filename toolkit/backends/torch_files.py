"""Weights to PyTorch's own file format, for `toolkit checkpoint export --to torch`.

Here because torch is imported only under toolkit/backends; the checkpoint layer calls it
lazily, so inspecting or exporting to safetensors never imports torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def save_tensors(weights: dict[str, np.ndarray], stream: Any) -> None:
    """`torch.save` of a dict of tensors (loadable with `weights_only=True`)."""
    tensors = {name: torch.from_numpy(np.array(array)) for name, array in weights.items()}
    torch.save(tensors, stream)
