"""`toolkit bench step`: the toolkit's training step against the engine's native script, on the
same model, data and launcher.

Each repetition launches both once, in an order that alternates from one repetition to the
next, so that neither always runs first while other jobs come and go. A launch's figure is the
median of rank 0's per-step times; toolkit / native is taken within each repetition (side by
side, on a machine shared with other jobs) and the reported ratio is the median of those.
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolkit.bench import report
from toolkit.bench.cases import CASES, StepCase, case_for
from toolkit.bench.launching import measure
from toolkit.parity.cases import merge
from toolkit.ports import free_port, free_port_range
from toolkit.spec import TrainSpec
from toolkit.spec.layout import resolve_layout
from toolkit.spec.sections import ParallelSpec

KINDS = ("native", "toolkit")


@dataclass
class CaseResult:
    name: str
    ms: dict[str, list[float]] = field(default_factory=lambda: {kind: [] for kind in KINDS})

    @property
    def ratios(self) -> list[float]:
        return [t / n for t, n in zip(self.ms["toolkit"], self.ms["native"], strict=True)]

    @property
    def ratio(self) -> float:
        return statistics.median(self.ratios)

    def row(self) -> list[str]:
        native, toolkit = (statistics.median(self.ms[kind]) for kind in KINDS)
        spread = f"{min(self.ratios):.3f}-{max(self.ratios):.3f}"
        return [
            self.name,
            report.milliseconds(native),
            report.milliseconds(toolkit),
            report.ratio(self.ratio),
            spread,
        ]


HEADER = ["case", "native ms", "toolkit ms", "toolkit / native", "per repetition"]


def case_spec(base: TrainSpec, case: StepCase) -> TrainSpec:
    """The user's spec with the case's engine and launcher (none for the user's own case) and
    the workload both sides run (toolkit.bench.workload), on free ports."""
    data = merge(base.to_dict(), case.spec)
    data_parallel = resolve_layout(ParallelSpec(**data["parallel"]), case.workload.ranks).data
    data = merge(data, case.workload.spec_fields(data_parallel))
    data["launch"]["master_port"] = free_port()
    data["tf"]["port"] = free_port_range(case.workload.ranks)
    return TrainSpec.from_dict(data)


def run_case(
    spec: TrainSpec, case: StepCase, *, reps: int, steps: int, warmup: int, workdir: Path
) -> CaseResult:
    result = CaseResult(case.name)
    for rep in range(reps):
        order = KINDS if rep % 2 == 0 else KINDS[::-1]
        for kind in order:
            launched = case_spec(spec, case)
            figure = measure(
                launched, kind, case.workload, workdir, steps=steps, warmup=warmup
            ).median_ms
            result.ms[kind].append(figure)
    return result


def run(
    spec: TrainSpec,
    *,
    every_engine: bool,
    cases: Sequence[str],
    reps: int,
    steps: int,
    warmup: int,
    out: Path,
) -> int:
    chosen = list(CASES) if every_engine else [case_for(spec)]
    if cases:
        chosen = [case for case in chosen if any(pattern in case.name for pattern in cases)]
    results: list[CaseResult] = []
    with tempfile.TemporaryDirectory(prefix="toolkit-bench-") as scratch:
        for case in chosen:
            print(f"bench step: {case.name} ({reps} repetitions)", flush=True)
            workdir = Path(scratch) / case.name.replace("/", "_")
            results.append(
                run_case(spec, case, reps=reps, steps=steps, warmup=warmup, workdir=workdir)
            )
    figures: dict[str, Any] = {
        "steps": steps,
        "warmup": warmup,
        "cases": [
            {"name": r.name, "ms": r.ms, "ratios": r.ratios, "ratio": r.ratio} for r in results
        ],
    }
    report.write(out, "step", figures, HEADER, [r.row() for r in results])
    return 0
