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

Each m runs with the pipeline's sends over Gloo and through the toolkit's mailboxes in turn
(`deepspeed.send_recv`, `--send-recv`). Beside the measurement, each case replays the step's own
passes without hand-offs (`replayed_window`) and times each hand-off (`hand_off_delays`), which
splits the excess over the formula into stage imbalance, the passes' variation, and the
hand-offs. Finding (docs/bench/bubble.json, docs/bench/findings.md): over Gloo the hand-offs
were the larger part, a round trip per micro-batch that DeepSpeed's schedule order puts on the
critical path; through the mailboxes, sends first, they halve, and at 8 micro-batches what is
left is mostly the passes' variation on a shared CPU.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Sequence
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
DEFAULT_SEND_RECV = ("gloo", "shared_memory")
"""DeepSpeed's blocking sends over Gloo beside the toolkit's mailboxes, each m under both in
turn, so that the two are measured side by side in one run."""
TIMEOUT_S = 600


def case_spec(micro_batches: int, micro: int, send_recv: str) -> TrainSpec:
    data = merge(
        TrainSpec().to_dict(),
        {
            "backend": "deepspeed",
            "optimizer": {"name": "sgd", "momentum": 0.0},
            "pipeline": {"stages": STAGES, "partition": "parameters"},
            "batch": {"global": micro * micro_batches, "micro": micro, "accumulation": None},
            "launch": {"np": STAGES, "threads_per_rank": 1, "master_port": free_port()},
            "deepspeed": {"send_recv": send_recv},
        },
    )
    return TrainSpec.from_dict(data)


def _step_bubble(ranks: list[dict[str, Any]], index: int) -> dict[str, Any]:
    steps = [rank["steps"][index] for rank in ranks]
    window = max(s["last_backward_end"] for s in steps) - min(
        s["first_forward_start"] for s in steps
    )
    stage_bubbles = [1.0 - s["compute_s"] / window for s in steps]
    timelines = [[(kind, start, end) for kind, start, end in s["passes"]] for s in steps]
    replayed = replayed_window([[(kind, end - start) for kind, start, end in t] for t in timelines])
    return {
        "window_s": window,
        "step_s": max(s["step_s"] for s in steps),
        "stage_bubbles": stage_bubbles,
        "bubble": statistics.fmean(stage_bubbles),
        "replayed_bubble": statistics.fmean(1.0 - s["compute_s"] / replayed for s in steps),
        "hand_off_s": hand_off_delays(timelines),
        "stage_compute_s": [s["compute_s"] for s in steps],
    }


Pass = tuple[str, float, float]
"""A forward or backward pass of one stage: its kind, start and end on the host's clock."""


def _inputs(stages: int, stage: int, kind: str, micro: int) -> tuple[str, int, int] | None:
    """The pass of another stage whose output this one takes: micro-batch k's forward pass on
    stage s takes stage s-1's output, its backward pass the gradient of stage s+1's; None on
    the first stage's forward and the last stage's backward."""
    source = stage - 1 if kind == "ForwardPass" else stage + 1
    return (kind, source, micro) if 0 <= source < stages else None


def _micro_batches(passes: Sequence[tuple[Any, ...]]) -> list[int]:
    """Each pass's micro-batch: a stage's k-th forward (or backward) pass is micro-batch k's."""
    seen = {"ForwardPass": 0, "BackwardPass": 0}
    order = []
    for kind, *_ in passes:
        order.append(seen[kind])
        seen[kind] += 1
    return order


def replayed_window(stage_passes: list[list[tuple[str, float]]]) -> float:
    """The window the step's own passes would take with hand-offs that cost nothing.

    `stage_passes[s]` is stage s's forward and backward passes in the order it ran them, each
    with its measured seconds. The replay runs each stage's passes in that order, each as soon
    as the stage is free and its input exists (`_inputs`). What the measured window has beyond
    the replay is the hand-offs' (sending, receiving, waking up, the schedule's own work between
    passes); what the replay has beyond `predicted_from_stage_costs` is the passes' variation
    from one to the next, which the schedule's dependencies turn into waiting.
    """
    stages = len(stage_passes)
    micros = [_micro_batches(passes) for passes in stage_passes]
    ends: dict[tuple[str, int, int], float] = {}
    clock, position = [0.0] * stages, [0] * stages
    remaining = sum(len(passes) for passes in stage_passes)
    while remaining:
        progressed = False
        for stage, passes in enumerate(stage_passes):
            while position[stage] < len(passes):
                kind, seconds = passes[position[stage]]
                micro = micros[stage][position[stage]]
                source = _inputs(stages, stage, kind, micro)
                needed = 0.0 if source is None else ends.get(source)
                if needed is None:
                    break
                clock[stage] = max(clock[stage], needed) + seconds
                ends[(kind, stage, micro)] = clock[stage]
                position[stage] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise ValueError("the stages' passes wait on each other: not one pipeline step")
    return max(clock)


def hand_off_delays(timelines: list[list[Pass]]) -> list[float]:
    """For each pass that takes another stage's output: how long after it could have started
    (its input's pass had ended, and so had the stage's own pass before it) it did start. The
    send, the receive, waking up and the schedule's own work between the two passes."""
    stages = len(timelines)
    ends = {
        (kind, stage, micro): end
        for stage, timeline in enumerate(timelines)
        for (kind, _, end), micro in zip(timeline, _micro_batches(timeline), strict=True)
    }
    delays = []
    for stage, timeline in enumerate(timelines):
        previous_end = -math.inf
        for (kind, start, end), micro in zip(timeline, _micro_batches(timeline), strict=True):
            source = _inputs(stages, stage, kind, micro)
            if source is not None:
                delays.append(start - max(ends[source], previous_end))
            previous_end = end
    return delays


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
    replayed = statistics.median(step["replayed_bubble"] for step in steps)
    delays = [delay for step in steps for delay in step["hand_off_s"]]
    formula = planned_bubble(len(ranks), micro_batches)
    return {
        "micro_batches": micro_batches,
        "stages": len(ranks),
        "formula": formula,
        "measured": measured,
        "difference": measured - formula,
        "predicted_from_stage_costs": predicted_from_stage_costs(median_compute, micro_batches),
        "replayed_without_hand_offs": replayed,
        "hand_off_ms": 1000 * statistics.median(delays) if delays else None,
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
    transports: tuple[str, ...] = DEFAULT_SEND_RECV,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    results, errors = [], []
    for count in micro_batch_counts:
        for transport in transports:
            spec = case_spec(count, micro, transport)
            directory = work / f"bubble-m{count}-{transport}"
            directory.mkdir(parents=True)
            args = ["--layers", ",".join(map(str, layers)), "--steps", str(steps)]
            log(f"pipeline {STAGES} stages x {count} micro-batches, sends over {transport}")
            outcome = launch_with_spec(
                spec, directory, PROBE, [*args, "--out", str(directory)], timeout=TIMEOUT_S
            )
            written = sorted(directory.glob("rank*.json"))
            reason = failure(
                outcome, wrote=len(written) == STAGES, missing=f"{len(written)} ranks wrote results"
            )
            if reason:
                log(f"  FAILED: {reason.splitlines()[0]}")
                errors.append(f"m={count} {transport}: {reason}")
                continue
            ranks = [json.loads(path.read_text()) for path in written]
            result = {"send_recv": transport, **summarize(ranks, count)}
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
        f"{'m':>3}{'sends':>15}{'formula':>9}{'measured':>10}{'diff':>8}{'stage costs':>13}"
        f"{'replay':>8}{'hand-off ms':>12}"
        f"{'stage bubbles':>16}{'ms/micro per stage':>22}{'window ms':>11}{'step ms':>9}",
    ]
    for case in data["cases"]:
        stages = " ".join(f"{b:.3f}" for b in case["stage_bubbles"])
        per_micro = " ".join(f"{t:.1f}" for t in case["stage_compute_per_micro_ms"])
        lines.append(
            f"{case['micro_batches']:3d}{case['send_recv']:>15}"
            f"{case['formula']:9.3f}{case['measured']:10.3f}"
            f"{case['difference']:+8.3f}{case['predicted_from_stage_costs']:13.3f}"
            f"{case['replayed_without_hand_offs']:8.3f}"
            f"{math.nan if case['hand_off_ms'] is None else case['hand_off_ms']:12.2f}"
            f"{stages:>16}"
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
    for transport, marker in (("gloo", "o"), ("shared_memory", "s")):
        mine = [c for c in cases if c["send_recv"] == transport]
        if mine:
            axis.plot(
                [c["micro_batches"] for c in mine],
                [c["measured"] for c in mine],
                marker,
                label=f"measured, sends over {transport} (mean of stages)",
            )
    axis.plot(
        counts,
        [c["predicted_from_stage_costs"] for c in cases],
        "x",
        label="predicted from stage costs",
    )
    axis.plot(
        counts,
        [c["replayed_without_hand_offs"] for c in cases],
        "+",
        label="the step's passes replayed without hand-offs",
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
