"""`toolkit bench step --in-process`: the adapter's cost, step by step in the same processes.

One launch per repetition of ranks/inprocess_step.py under the case's launch plan; each launch
alternates the engine's documented step and the toolkit's train_step (and the A/A and
patched variants) for `steps` cycles. Every cycle is one ratio. The headline figure combines
the launches (`CaseResult.combined_launches`, stats.combine_launches): each launch's median
cycle ratio, weighed by how well its cycles pin it down, with an interval that widens as far
as the launches disagree beyond that.

With `resolve` set, a case keeps launching past `reps` until that interval of toolkit / native
lies within ±resolve of its figure (at least `MIN_LAUNCHES_TO_RESOLVE` launches, at most
`max_reps`): the issue asks whether the adapter costs 1%, and on a shared 2-core machine about
a thousand cycles resolve that, which a launch of a few hundred cycles each reaches faster than
many short launches (each launch pays its engine's start).

With the `floor` variant (--floor) each launch also alternates the physical floor's step
(native/_floor_parts.py), and toolkit / floor is taken over cycles and over launches. Its
interval came out no narrower than launch by launch (a floor step talks to no peer, a DDP step
does, so the cycle ratios spread wide), but the floor then runs beside the engine's own
threads: in a Horovod-over-MPI process its plain compute took 1.5-1.6 times as long as beside
DDP, which is how Horovod's spinning background thread was found (docs/bench/findings.md). So
for an engine whose threads take CPU while idle it is not the machine's floor; the
launch-by-launch floor is. A pipeline case has no in-process floor (each of its ranks holds one
stage), and runs without it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from toolkit.bench import stats
from toolkit.bench.cases import StepCase
from toolkit.bench.launching import failure, launch_with_spec
from toolkit.bench.step import (
    LAUNCH_TIMEOUT_S,
    CaseResult,
    StepBench,
    Variant,
    case_spec,
    pipeline_stages,
)

RANK_PROGRAM = str(Path(__file__).parent / "ranks" / "inprocess_step.py")
DEFAULT_PATCHES = ("global-loss",)


MIN_LAUNCHES_TO_RESOLVE = 5
"""Fewer launches tell too little of how far launches disagree (the between-launch variance of
stats.combine_launches) to trust an interval that has to be narrow."""


def resolved(result: CaseResult, within: float) -> bool:
    """Whether toolkit / native is known to ±`within` of its figure, over launches."""
    spread = result.combined_launches().get("toolkit")
    if spread is None or spread.n < MIN_LAUNCHES_TO_RESOLVE:
        return False
    return max(spread.median - spread.ci_low, spread.ci_high - spread.median) <= (
        within * spread.median
    )


class InProcessBench(StepBench):
    def __init__(
        self, *args: Any, resolve: float | None = None, max_reps: int = 0, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.resolve = resolve
        self.max_reps = max_reps

    def _more(self, result: CaseResult, rep: int, reps: int) -> bool:
        if rep < reps:
            return True
        if self.resolve is None or rep >= self.max_reps:
            return False
        return not resolved(result, self.resolve)

    def run_case(self, case: StepCase, variants: list[Variant], reps: int) -> CaseResult:
        has_floor = any(variant.kind == "floor" for variant in variants)
        if has_floor and (pipeline_stages(case.spec) > 1 or case.workload.micro_batches != 1):
            self.log(f"  {case.name}: no in-process floor for a pipeline; running without it")
            variants, has_floor = [v for v in variants if v.kind != "floor"], False
        labels = [variant.label for variant in variants]
        patches = [p for v in variants if v.extra[:1] == ("--patch",) for p in v.extra[1:]]
        result = CaseResult(case.name, case.spec, labels, figures={"median": {}, "cpu": {}})
        rep = 0
        while self._more(result, rep, reps):
            index, rep = rep, rep + 1
            self.launches += 1
            directory = self.work / f"launch{self.launches:03d}"
            directory.mkdir(parents=True)
            out = directory / "timings.json"
            spec = case_spec(self.user, case)
            args = case.workload.arguments(steps=self.steps, warmup=self.warmup)
            args += [word for name in patches for word in ("--patch", name)]
            args += ["--floor"] if has_floor else []
            outcome = launch_with_spec(
                spec, directory, RANK_PROGRAM, [*args, "--out", str(out)], timeout=LAUNCH_TIMEOUT_S
            )
            reason = failure(outcome, wrote=out.exists(), missing="no timings written")
            if reason:
                self.log(f"  {case.name} rep {index}: FAILED {reason.splitlines()[0]}")
                result.errors.append(f"rep {index}: {reason}")
                continue
            record = json.loads(out.read_text())
            for label in labels:
                result.extend(
                    label,
                    record["step_s"][label],
                    record["cpu_s"][label],
                    record.get("faults", {}).get(label, []),
                )
            result.launch_cycles.append(len(record["step_s"][labels[0]]))
            if has_floor:
                result.add_floor_parts(record)
            figures = result.to_json()
            combined = stats.Spread(**figures["combined_ratio_to_baseline"]["toolkit"])
            self.log(
                f"  {case.name} rep {index}: "
                + ", ".join(f"{label} {ms:.1f} ms" for label, ms in figures["median_ms"].items())
                + f"; toolkit / native over launches {combined.text()}"
            )
        return result
