"""What both floor scripts share: which rank this process is, and rank 0's record.

The physical floor of a data-parallel step (issue 13) is one rank's compute plus moving its
gradients once at memory speed (the parts: _floor_parts.py). The floor launches every rank of
the job at once, each on its share of the global batch, so the cores and the memory bus are as
busy as in the engines' runs; no rank talks to another.

Unlike the engines' native scripts, the floor is the toolkit's own measurement: a rank learns
its place from the toolkit's launcher detection (toolkit.launch.environment), which knows every
launcher's variables, the toolkit's local launcher's included.
"""

from __future__ import annotations

import argparse
import os
import sys

import _bench

from toolkit.bench.native._floor_parts import FloorStep
from toolkit.launch.environment import detect_environment


def launcher_rank() -> int:
    return detect_environment(os.environ, sys.argv).rank


def write(
    args: argparse.Namespace,
    rank: int,
    step: FloorStep,
    clock: _bench.Clock,
    loss: float,
    engine: str,
) -> None:
    """Rank 0's record: whole steps, and the timed steps' compute and move apart."""
    timed = slice(args.warmup, None)
    parts = {"compute_s": step.compute_seconds[timed], "move_s": step.move.seconds[timed]}
    _bench.write(
        args, rank, 1, clock, loss, parts, engine=engine, move_bytes=step.move.source.nbytes
    )
