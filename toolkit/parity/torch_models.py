"""The reference architectures as torch nn.Sequential models with the canonical initial weights."""

from __future__ import annotations

import numpy as np
import torch

from toolkit.parity.architectures import ARCHITECTURES, Layer


class GlobalAveragePool(torch.nn.Module):
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return images.mean(dim=(2, 3))


def _module(layer: Layer) -> torch.nn.Module:
    if layer.kind == "dense":
        return torch.nn.Linear(layer.fan_in, layer.fan_out)
    if layer.kind == "conv":
        return torch.nn.Conv2d(layer.fan_in, layer.fan_out, layer.kernel, padding=layer.kernel // 2)
    if layer.kind == "relu":
        return torch.nn.ReLU()
    return GlobalAveragePool()


def build(arch: str, weights: dict[str, np.ndarray]) -> torch.nn.Sequential:
    model = torch.nn.Sequential(*(_module(layer) for layer in ARCHITECTURES[arch]))
    model.load_state_dict({name: torch.from_numpy(value.copy()) for name, value in weights.items()})
    return model


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.float(), labels)
