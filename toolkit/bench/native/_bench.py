"""What every native reference script shares, standard library and numpy only: arguments, the
synthetic data, the timing loop and the result file.

Nothing here touches an engine or the toolkit, so each script's training step is the engine's
own code as its documentation writes it. The scripts are run as files (`python ddp.py ...`),
which puts this directory first on sys.path; that is how they import this module.

Timing: each step is timed alone (perf_counter around the step function), after `--warmup`
untimed steps, with the step's batch already in memory; fetching data is not part of a step.
Rank 0 writes {"step_s": [...], "cpu_s": [...], "faults": [...], "loss": ..., "world": ...,
"settings": {...}} to `--out` (wall and CPU seconds and minor page faults per timed step; see
`Clock`).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

# Distinct batches each rank cycles through; enough that no step reuses the previous one's.
DISTINCT_BATCHES = 4


def parser(description: str) -> argparse.ArgumentParser:
    """The arguments every native script takes; scripts add their engine's own."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--layers", default="512,2048,2048,512,10", help="MLP widths, input first")
    p.add_argument("--micro", type=int, default=64, help="samples per micro-batch per rank")
    p.add_argument("--micro-batches", type=int, default=1, help="micro-batches per step")
    p.add_argument("--steps", type=int, default=30, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--threads", type=int, default=None, help="compute threads per rank; unset = engine default"
    )
    p.add_argument("--out", required=True, help="rank 0 writes its timings here (JSON)")
    # Candidate costs, off by default: each adds one thing the toolkit's step does.
    p.add_argument("--loss-allreduce", action="store_true", help="average the loss every step")
    p.add_argument("--host-copy", action="store_true", help="build each step's tensors from numpy")
    return p


def parse(p: argparse.ArgumentParser) -> argparse.Namespace:
    # The deepspeed launcher appends --local_rank=N unless told not to.
    args, _ = p.parse_known_args()
    return args


def widths(args: argparse.Namespace) -> list[int]:
    return [int(width) for width in args.layers.split(",")]


def batches(args: argparse.Namespace, rank: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """This rank's distinct step batches: inputs [micro-batches * micro, in] float32 and int64
    labels, from a generator seeded by (seed, rank)."""
    dims = widths(args)
    rng = np.random.default_rng([args.seed, rank])
    samples = args.micro * args.micro_batches
    return [
        (
            rng.standard_normal((samples, dims[0]), dtype=np.float32),
            rng.integers(0, dims[-1], samples, dtype=np.int64),
        )
        for _ in range(DISTINCT_BATCHES)
    ]


class Clock:
    """Per-step wall seconds, this process's CPU seconds and its minor page faults (all its
    threads: the engine's communication threads too). On a machine other jobs share, wall time
    also counts the time the process waited for a core; CPU time does not, but misses time spent
    asleep waiting for a peer or for Horovod's next cycle. The faults count memory the step
    touched for the first time since the allocator returned it to the kernel."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.faults: list[int] = []

    def time(self, step: Callable[[], Any], *, keep: bool) -> Any:
        faults = minor_faults()
        wall, cpu = time.perf_counter(), time.process_time()
        result = step()
        if keep:
            self.cpu.append(time.process_time() - cpu)
            self.wall.append(time.perf_counter() - wall)
            self.faults.append(minor_faults() - faults)
        return result


def minor_faults() -> int:
    """This process's minor page faults so far (a page mapped in without reading a disk)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def time_steps(
    step: Callable[[Any], Any], inputs: Sequence[Any], args: argparse.Namespace
) -> tuple[Clock, float]:
    """Run warmup + timed steps cycling over `inputs`; the clock and the last loss."""
    clock = Clock()
    loss: Any = None
    for index in range(args.warmup + args.steps):
        batch = inputs[index % len(inputs)]
        loss = clock.time(functools.partial(step, batch), keep=index >= args.warmup)
    return clock, float(loss)


def write(
    args: argparse.Namespace,
    rank: int,
    world: int,
    clock: Clock,
    loss: float,
    **settings: Any,
) -> None:
    """Rank 0's record."""
    if rank != 0:
        return
    record = {
        "step_s": clock.wall,
        "cpu_s": clock.cpu,
        "faults": clock.faults,
        "loss": loss,
        "world": world,
        "pid": os.getpid(),
        "settings": {"threads": args.threads, **settings},
    }
    write_record(args.out, record)


def write_record(out: str, record: Any) -> None:
    """A rank's measurements as JSON at `out` (its folder created), for the parent to read."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
