"""What every native reference script shares, standard library and numpy only: arguments, the
synthetic data, the timing loop and the result file.

Nothing here touches an engine or the toolkit, so each script's training step is the engine's
own code as its documentation writes it. The scripts are run as files (`python ddp.py ...`),
which puts this directory first on sys.path; that is how they import this module.

Timing: each step is timed alone (perf_counter around the step function), after `--warmup`
untimed steps, with the step's batch already in memory; fetching data is not part of a step.
Rank 0 writes {"step_s": [...], "cpu_s": [...], "faults": [...], "loss": ..., "world": ...,
"settings": {...}} to `--out` (wall and CPU seconds and minor page faults per timed step; see
`Clock`), and with `--link IFACE` "sent_bytes_per_step": what its host sent over IFACE.
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
    p.add_argument(
        "--link", default=None, metavar="IFACE", help="count what this host sends over IFACE"
    )
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
    touched for the first time since the allocator returned it to the kernel.

    With a `link` (a network interface's name), it also counts the bytes this host sent over
    it from the start of the first timed step to the end of the last: every process on the
    host, the engine's background sends between steps included."""

    def __init__(self, link: str | None = None) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.faults: list[int] = []
        self.counter = None if link is None else sent_bytes_counter(link)
        self.sent: list[int] = []
        """The counter at the first timed step's start and at the latest one's end."""

    def time(self, step: Callable[[], Any], *, keep: bool) -> Any:
        faults = minor_faults()
        if keep and self.counter is not None and not self.sent:
            self.sent = [self.read_sent()]
        wall, cpu = time.perf_counter(), time.process_time()
        result = step()
        if keep:
            self.cpu.append(time.process_time() - cpu)
            self.wall.append(time.perf_counter() - wall)
            self.faults.append(minor_faults() - faults)
            if self.counter is not None:
                self.sent[1:] = [self.read_sent()]
        return result

    def read_sent(self) -> int:
        assert self.counter is not None
        return int(self.counter.read_text())

    @property
    def sent_bytes_per_step(self) -> float | None:
        """Bytes sent over the link per timed step; None without a link."""
        if len(self.sent) < 2:
            return None
        return (self.sent[1] - self.sent[0]) / len(self.wall)

    def record(self) -> dict[str, Any]:
        """The timings as rank 0 writes them."""
        record: dict[str, Any] = {"step_s": self.wall, "cpu_s": self.cpu, "faults": self.faults}
        if self.counter is not None:
            record["sent_bytes_per_step"] = self.sent_bytes_per_step
        return record


def sent_bytes_counter(link: str) -> Path:
    """Linux's count of the bytes this host has sent over interface `link`."""
    counter = Path("/sys/class/net") / link / "statistics" / "tx_bytes"
    if "/" in link or not counter.is_file():
        raise SystemExit(f"bench: this host has no network interface {link!r} ({counter})")
    return counter


def minor_faults() -> int:
    """This process's minor page faults so far (a page mapped in without reading a disk)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def time_steps(
    step: Callable[[Any], Any], inputs: Sequence[Any], args: argparse.Namespace
) -> tuple[Clock, float]:
    """Run warmup + timed steps cycling over `inputs`; the clock and the last loss."""
    clock = Clock(args.link)
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
        **clock.record(),
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
