"""Models for `toolkit plan --model` in the tests (importable as tests.plan_models:NAME)."""

from __future__ import annotations

import torch


class Block(torch.nn.Module):
    """Linear 16 -> 64, Tanh, Linear 64 -> 16: a repeated block of four leaf outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(16, 64)
        self.act = torch.nn.Tanh()
        self.down = torch.nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


def blocks() -> torch.nn.Module:
    """Three Blocks between an input and an output Linear."""
    return torch.nn.Sequential(
        torch.nn.Linear(16, 16), Block(), Block(), Block(), torch.nn.Linear(16, 4)
    )
