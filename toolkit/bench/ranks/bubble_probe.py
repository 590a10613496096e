"""The rank program of `toolkit bench bubble`: when each pipeline stage computes, step by step.

    python toolkit/bench/ranks/bubble_probe.py --spec S.json --layers 1024,...,1024 --out DIR

Runs the toolkit's DeepSpeed pipeline (`run.train_step`) and times every instruction of the
pipeline engine's schedule (ForwardPass, BackwardPass, SendActivation, RecvGrad, ...) on the
host's monotonic clock, which every process of one host shares. Each rank writes, per timed
step, the start and end of its first ForwardPass and last BackwardPass, the seconds it spent
in forward and backward passes (its compute), the seconds per instruction kind, and each
forward and backward pass in the order it ran with its start and end; toolkit.bench.bubble turns
them into the bubble, replays the passes without hand-offs, and times each hand-off.

The timing wraps the entries of the engine's `_INSTRUCTION_MAP` (the table its `_exec_schedule`
dispatches through) on this engine instance only: measurement, not a change to the step.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from toolkit.bench.native._torch_model import mlp
from toolkit.bench.ranks._toolkit_job import start_toolkit, synthetic

COMPUTE = ("ForwardPass", "BackwardPass")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spec", required=True)
    parser.add_argument("--layers", required=True)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", required=True)
    args, _ = parser.parse_known_args(argv)
    return args


def now() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


class InstructionClock:
    """Every instruction the pipeline engine executes, with its start and end."""

    def __init__(self) -> None:
        self.events: list[tuple[str, float, float]] = []

    def wrap(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def timed(engine: Any, **kwargs: Any) -> Any:
            start = now()
            try:
                return method(engine, **kwargs)
            finally:
                self.events.append((name, start, now()))

        return timed

    def install(self, engine: Any) -> None:
        # An instance attribute shadows the class's table for this engine only.
        engine._INSTRUCTION_MAP = {
            kind: self.wrap(kind.__name__, method)
            for kind, method in type(engine)._INSTRUCTION_MAP.items()
        }

    def step(self) -> dict[str, Any]:
        """The step just run, and a clean slate for the next."""
        events, self.events = self.events, []
        forwards = [e for e in events if e[0] == "ForwardPass"]
        backwards = [e for e in events if e[0] == "BackwardPass"]
        seconds: dict[str, float] = defaultdict(float)
        for name, start, end in events:
            seconds[name] += end - start
        return {
            "first_forward_start": forwards[0][1],
            "last_backward_end": backwards[-1][2],
            "compute_s": sum(seconds[name] for name in COMPUTE),
            "micro_batches": len(forwards),
            "seconds": dict(seconds),
            "passes": [event for event in events if event[0] in COMPUTE],
        }


def main() -> int:
    args = parse(sys.argv[1:])
    spec, run = start_toolkit(args.spec)
    widths = [int(w) for w in args.layers.split(",")]
    loader = run.loader(synthetic(widths, spec.batch_for(run.world_size).global_))
    torch.manual_seed(0)
    run.prepare(mlp(widths))
    clock = InstructionClock()
    clock.install(run.backend.engine)
    steps: list[dict[str, Any]] = []
    while len(steps) < args.warmup + args.steps:
        for micro_batches in loader:
            started = now()
            run.train_step(micro_batches, torch.nn.functional.cross_entropy)
            steps.append({"step_s": now() - started, **clock.step()})
            if len(steps) == args.warmup + args.steps:
                break
    record = {"rank": run.rank, "stage": run.backend.engine.stage_id, "steps": steps[args.warmup :]}
    Path(args.out, f"rank{run.rank}.json").write_text(json.dumps(record))
    run.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
