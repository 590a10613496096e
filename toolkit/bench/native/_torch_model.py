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


def issue_mlp() -> torch.nn.Sequential:
    """Issue 13's MLP, the step bench's default (for `toolkit plan --model`)."""
    return mlp([512, 2048, 2048, 512, 10])


def memory_mlp() -> torch.nn.Sequential:
    """The memory bench's MLP (toolkit.bench.memory.DEFAULT_LAYERS)."""
    return mlp([512, 4096, 4096, 512, 10])
