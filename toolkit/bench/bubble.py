"""`toolkit bench bubble`: the pipeline bubble DeepSpeed's pipeline engine has, against the plan's.

`toolkit plan` gives the bubble, the share of a step a stage sits idle, as (p-1)/(m+p-1) for p
stages and m micro-batches (toolkit.plan.communication.bubble). Here real 2-stage runs through
the toolkit's DeepSpeed pipeline measure it (ranks/bubble_probe.py times every instruction):

- the pipeline's window of one step runs from the first ForwardPass on any stage to the last
  BackwardPass on any stage (both ranks on one host, one monotonic clock); what comes after
  (ReduceGrads, OptimizerStep) does not depend on m and is not the pipeline's;
- a stage's bubble is 1 - (its seconds in forward and backward passes) / window: waiting for a
  neighbour, sending and receiving, and loading micro-batches all count as idle;
- the step's bubble is the stages' mean; each case reports the median over the timed steps.

The formula assumes stages of equal cost and free, instant hand-offs. The bench MLP is a stack
of equal square layers behind a wider first one: stage 0's first layer computes no input
gradient, and the extra width gives that work back, so both stages cost the same per
micro-batch (measured, `stage_compute_per_micro_ms`). `predicted_from_stage_costs` still takes
each stage's measured cost (window ≈ Σ t_s + (m-1)·max t_s), so that what is left between it and
the measurement is the hand-offs' doing, not imbalance.

Finding (docs/bench/bubble.json, docs/bench/findings.md): DeepSpeed's pipeline sends and
receives with blocking `dist.send`/`dist.recv` (deepspeed/runtime/pipe/p2p.py; `async_op` is
refused), so every hand-off is a rendezvous: the stage that finishes first waits for the other
(seen in the timeline as SendGrad blocked while the first stage still runs a forward pass). Each
steady-state cycle then lasts as long as the slower stage's cycle of that moment, and on a shared
CPU machine a pass varies by ±20%: the measured bubble sits 0.02-0.03 above the formula for 2 to
4 micro-batches and 0.05 at 8 (the AMD machine; 0.05-0.08 from 2 on the Intel one), while the
stage costs alone predict 0.00-0.01. Pinning each stage to a core of its own changed nothing.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from toolkit.bench.launching import failure, launch_with_spec
from toolkit.parity.cases import merge
from toolkit.plan.communication import bubble as planned_bubble
from toolkit.ports import free_port
from toolkit.spec import TrainSpec

PROBE = str(Path(__file__).parent / "ranks" / "bubble_probe.py")
STAGES = 2
DEFAULT_MICRO_BATCHES = (1, 2, 4, 8)
DEFAULT_LAYERS = (1536,) + (1024,) * 8
"""Eight layers, four per stage; the first is wider (see the module's docstring)."""
DEFAULT_MICRO = 128
DEFAULT_STEPS = 10
TIMEOUT_S = 600


def case_spec(micro_batches: int, micro: int) -> TrainSpec:
    data = merge(
        TrainSpec().to_dict(),
        {
            "backend": "deepspeed",
            "optimizer": {"name": "sgd", "momentum": 0.0},
            "pipeline": {"stages": STAGES, "partition": "parameters"},
            "batch": {"global": micro * micro_batches, "micro": micro, "accumulation": None},
            "launch": {"np": STAGES, "threads_per_rank": 1, "master_port": free_port()},
        },
    )
    return TrainSpec.from_dict(data)


def _step_bubble(ranks: list[dict[str, Any]], index: int) -> dict[str, Any]:
    steps = [rank["steps"][index] for rank in ranks]
    window = max(s["last_backward_end"] for s in steps) - min(
        s["first_forward_start"] for s in steps
    )
    stage_bubbles = [1.0 - s["compute_s"] / window for s in steps]
    return {
        "window_s": window,
        "step_s": max(s["step_s"] for s in steps),
        "stage_bubbles": stage_bubbles,
        "bubble": statistics.fmean(stage_bubbles),
        "stage_compute_s": [s["compute_s"] for s in steps],
    }


def predicted_from_stage_costs(stage_seconds: list[float], micro_batches: int) -> float:
    """The bubble the stages' own measured costs predict, averaged over the stages.

    With t_s a stage's compute per micro-batch, a pipeline's window is at least Σ t_s (the first
    micro-batch through every stage) plus (m-1)·max t_s (the slowest stage sets the pace), and
    stage s is busy m·t_s of it. With equal t_s this is (p-1)/(m+p-1).
    """
    per_micro = [seconds / micro_batches for seconds in stage_seconds]
    window = sum(per_micro) + (micro_batches - 1) * max(per_micro)
    return statistics.fmean(1.0 - micro_batches * t / window for t in per_micro)


def summarize(ranks: list[dict[str, Any]], micro_batches: int) -> dict[str, Any]:
    ranks = sorted(ranks, key=lambda rank: rank["stage"])
    steps = [_step_bubble(ranks, i) for i in range(len(ranks[0]["steps"]))]
    median_compute = [
        statistics.median(step["stage_compute_s"][s] for step in steps) for s in range(len(ranks))
    ]
    instructions = sorted(
        {name for rank in ranks for step in rank["steps"] for name in step["seconds"]}
    )
    measured = statistics.median(step["bubble"] for step in steps)
    formula = planned_bubble(len(ranks), micro_batches)
    return {
        "micro_batches": micro_batches,
        "stages": len(ranks),
        "formula": formula,
        "measured": measured,
        "difference": measured - formula,
        "predicted_from_stage_costs": predicted_from_stage_costs(median_compute, micro_batches),
        "stage_bubbles": [
            statistics.median(step["stage_bubbles"][s] for step in steps) for s in range(len(ranks))
        ],
        "stage_compute_per_micro_ms": [1000 * c / micro_batches for c in median_compute],
        "window_ms": 1000 * statistics.median(step["window_s"] for step in steps),
        "step_ms": 1000 * statistics.median(step["step_s"] for step in steps),
        "instruction_ms": {
            name: [
                1000 * statistics.median(step["seconds"].get(name, 0.0) for step in rank["steps"])
                for rank in ranks
            ]
            for name in instructions
        },
        "steps": steps,
    }


def run_bubble(
    work: Path,
    *,
    micro_batch_counts: tuple[int, ...] = DEFAULT_MICRO_BATCHES,
    layers: tuple[int, ...] = DEFAULT_LAYERS,
    micro: int = DEFAULT_MICRO,
    steps: int = DEFAULT_STEPS,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    results, errors = [], []
    for count in micro_batch_counts:
        spec = case_spec(count, micro)
        directory = work / f"bubble-m{count}"
        directory.mkdir(parents=True)
        args = ["--layers", ",".join(map(str, layers)), "--steps", str(steps)]
        log(f"pipeline {STAGES} stages x {count} micro-batches: measuring")
        outcome = launch_with_spec(
            spec, directory, PROBE, [*args, "--out", str(directory)], timeout=TIMEOUT_S
        )
        written = sorted(directory.glob("rank*.json"))
        reason = failure(
            outcome, wrote=len(written) == STAGES, missing=f"{len(written)} ranks wrote results"
        )
        if reason:
            log(f"  FAILED: {reason.splitlines()[0]}")
            errors.append(f"m={count}: {reason}")
            continue
        ranks = [json.loads(path.read_text()) for path in written]
        result = summarize(ranks, count)
        log(f"  bubble {result['measured']:.3f} (formula {result['formula']:.3f})")
        results.append(result)
    return {
        "model": {"layers": list(layers), "micro": micro, "stages": STAGES, "steps": steps},
        "cases": results,
        "errors": errors,
    }


def table(data: dict[str, Any]) -> str:
    model = data["model"]
    lines = [
        f"DeepSpeed pipeline, {model['stages']} stages, MLP {'-'.join(map(str, model['layers']))}, "
        f"micro-batch {model['micro']}, "
        f"median of {model['steps']} steps",
        f"{'m':>3}{'formula':>9}{'measured':>10}{'diff':>8}{'stage costs':>13}"
        f"{'stage bubbles':>16}{'ms/micro per stage':>22}{'window ms':>11}{'step ms':>9}",
    ]
    for case in data["cases"]:
        stages = " ".join(f"{b:.3f}" for b in case["stage_bubbles"])
        per_micro = " ".join(f"{t:.1f}" for t in case["stage_compute_per_micro_ms"])
        lines.append(
            f"{case['micro_batches']:3d}{case['formula']:9.3f}{case['measured']:10.3f}"
            f"{case['difference']:+8.3f}{case['predicted_from_stage_costs']:13.3f}{stages:>16}"
            f"{per_micro:>22}{case['window_ms']:11.1f}{case['step_ms']:9.1f}"
        )
    for error in data["errors"]:
        lines.append(f"error: {error.splitlines()[0]}")
    return "\n".join(lines)


def plot(data: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = data["cases"]
    fig, axis = plt.subplots(figsize=(7, 4.5))
    counts = [c["micro_batches"] for c in cases]
    dense = list(range(1, max(counts, default=1) + 1))
    stages = data["model"]["stages"]
    axis.plot(dense, [planned_bubble(stages, m) for m in dense], "-", label="(p-1)/(m+p-1)")
    axis.plot(counts, [c["measured"] for c in cases], "o", label="measured (mean of stages)")
    axis.plot(
        counts,
        [c["predicted_from_stage_costs"] for c in cases],
        "x",
        label="predicted from stage costs",
    )
    axis.set_xscale("log", base=2)
    axis.set_xlabel("micro-batches per step (m)")
    axis.set_ylabel("bubble: idle share of the pipeline window")
    axis.set_title(f"DeepSpeed pipeline bubble, {stages} stages")
    axis.grid(True, alpha=0.3)
    axis.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
