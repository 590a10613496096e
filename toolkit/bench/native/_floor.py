"""What both floor scripts share: which rank this process is, and the move of the gradient bytes.

The physical floor of a data-parallel step (issue 13) is one rank's compute plus moving its
gradients once at memory speed. With 2 ranks over shared memory an allreduce must at least bring
each rank the peer's share of the sum, about the gradient bytes once; a single-threaded copy of
that many bytes between two buffers already in memory is the cheapest way to move them. The
floor launches every rank of the job at once, each on its share of the global batch, so the
cores and the memory bus are as busy as in the engines' runs; no rank talks to another.

Unlike the engines' native scripts, the floor is the toolkit's own measurement: a rank learns
its place from the toolkit's launcher detection (toolkit.launch.environment), which knows every
launcher's variables, the toolkit's local launcher's included.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import _bench
import numpy as np

from toolkit.launch.environment import detect_environment


def launcher_rank() -> int:
    return detect_environment(os.environ, sys.argv).rank


class GradientMove:
    """A single-threaded copy of `parameters` float32 values between two buffers, both touched
    first so that no page fault is timed."""

    def __init__(self, parameters: int) -> None:
        self.source = np.ones(parameters, dtype=np.float32)
        self.target = np.zeros(parameters, dtype=np.float32)
        self.seconds: list[float] = []

    def __call__(self) -> None:
        start = time.perf_counter()
        np.copyto(self.target, self.source)
        self.seconds.append(time.perf_counter() - start)


class FloorStep:
    """A framework's compute step, timed apart from the gradient move that follows it."""

    def __init__(self, compute: Callable[[Any], Any], parameters: int) -> None:
        self.compute = compute
        self.move = GradientMove(parameters)
        self.compute_seconds: list[float] = []

    def __call__(self, batch: Any) -> Any:
        start = time.perf_counter()
        loss = self.compute(batch)
        self.compute_seconds.append(time.perf_counter() - start)
        self.move()
        return loss

    def write(
        self, args: argparse.Namespace, rank: int, clock: _bench.Clock, loss: float, engine: str
    ) -> None:
        """Rank 0's record: whole steps, and the timed steps' compute and move apart."""
        timed = slice(args.warmup, None)
        parts = {"compute_s": self.compute_seconds[timed], "move_s": self.move.seconds[timed]}
        _bench.write(
            args, rank, 1, clock, loss, parts, engine=engine, move_bytes=self.move.source.nbytes
        )
