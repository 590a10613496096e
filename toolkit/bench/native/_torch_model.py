"""The benchmark's MLP in PyTorch: Linear layers of the given widths with ReLU between them,
as an nn.Sequential (so DeepSpeed's pipeline engine can split it), torch's default init."""

from __future__ import annotations

import itertools

import torch


def mlp(dims: list[int]) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = []
    for index, (fan_in, fan_out) in enumerate(itertools.pairwise(dims)):
        layers.append(torch.nn.Linear(fan_in, fan_out))
        if index < len(dims) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)
