"""Probe: do this machine's cores slow each other down, and does binding a process to one help?

A pipeline stage's pass, a rank's share of a data-parallel step: one thread multiplying the
bubble bench's matrices (128 samples through a 1024x1024 layer, forward and backward, torch on
one thread). Each child process times `--iterations` of them, after a warm-up, under one of:

- alone: one process, the other core idle;
- both: two processes at once, each left to the kernel's scheduler (the toolkit's default);
- both, bound: two processes at once, each bound to a core of its own (`launch.bind_cores`).

The modes alternate round by round (`--rounds`), since other jobs share the machine. Per mode
it prints the median ms of a pass, the spread of passes (5th to 95th percentile) and, for two
processes, how far apart the two processes' medians were (slower / faster): a pipeline's stages
wait on the slower one, and a data-parallel step on the slower rank.

    .venv/bin/python scripts/core_contention_probe.py [--rounds 3] [--iterations 200] [--out F]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = """
import json, os, sys, time
core = int(sys.argv[1])
if core >= 0:
    os.sched_setaffinity(0, {core})
import torch
torch.set_num_threads(1)
torch.manual_seed(0)
weight = torch.randn(1024, 1024, requires_grad=True)
x = torch.randn(128, 1024)
times = []
for i in range(int(sys.argv[2]) + 20):
    start = time.perf_counter()
    out = torch.relu(x @ weight)
    out.sum().backward()
    weight.grad = None
    if i >= 20:
        times.append(time.perf_counter() - start)
print(json.dumps(times))
"""

MODES = {"alone": [0], "both": [-1, -1], "both, bound": [0, 1]}
"""Each mode's processes, by the core each is bound to (-1: not bound)."""


def run_mode(cores: list[int], iterations: int) -> list[list[float]]:
    """Each process's pass times in seconds, the processes started together."""
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(core), str(iterations)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        for core in cores
    ]
    return [json.loads(child.communicate()[0]) for child in children]


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    measured: dict[str, list[list[list[float]]]] = {mode: [] for mode in MODES}
    for round_number in range(args.rounds):
        for mode, cores in MODES.items():
            measured[mode].append(run_mode(cores, args.iterations))
            print(f"round {round_number + 1}: {mode}", file=sys.stderr)
    summary = {}
    for mode, rounds in measured.items():
        passes = [t * 1e3 for processes in rounds for times in processes for t in times]
        medians = [[statistics.median(times) for times in processes] for processes in rounds]
        summary[mode] = {
            "median_ms": statistics.median(passes),
            "p5_ms": percentile(passes, 5),
            "p95_ms": percentile(passes, 95),
            "slower_over_faster": [max(m) / min(m) for m in medians if len(m) > 1],
        }
    for mode, row in summary.items():
        apart = ", ".join(f"{ratio:.3f}" for ratio in row["slower_over_faster"])
        print(
            f"{mode:12s} median {row['median_ms']:6.2f} ms, passes {row['p5_ms']:.2f}-"
            f"{row['p95_ms']:.2f}" + (f", slower/faster process by round {apart}" if apart else "")
        )
    if args.out:
        args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, **summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
