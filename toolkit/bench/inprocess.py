"""`toolkit bench step --in-process`: the adapter's cost, step by step in the same processes.

One launch per repetition of ranks/inprocess_step.py under the case's launch plan; each launch
alternates the engine's documented step and the toolkit's train_step (and the A/A and
patched variants) for `steps` cycles. Every cycle is one ratio: the figures are the medians
over all cycles of all launches, with bootstrap intervals over cycles.
"""

from __future__ import annotations

import json
from pathlib import Path

from toolkit.bench.cases import StepCase
from toolkit.bench.launching import failure, launch_with_spec
from toolkit.bench.step import LAUNCH_TIMEOUT_S, CaseResult, StepBench, Variant, case_spec

RANK_PROGRAM = str(Path(__file__).parent / "ranks" / "inprocess_step.py")
DEFAULT_PATCHES = ("global-loss",)


class InProcessBench(StepBench):
    def run_case(self, case: StepCase, variants: list[Variant], reps: int) -> CaseResult:
        labels = [variant.label for variant in variants]
        patches = [p for v in variants if v.extra[:1] == ("--patch",) for p in v.extra[1:]]
        result = CaseResult(case.name, case.spec, labels, figures={"median": {}, "cpu": {}})
        for rep in range(reps):
            self.launches += 1
            directory = self.work / f"launch{self.launches:03d}"
            directory.mkdir(parents=True)
            out = directory / "timings.json"
            spec = case_spec(self.user, case)
            args = case.workload.arguments(steps=self.steps, warmup=self.warmup)
            args += [word for name in patches for word in ("--patch", name)]
            outcome = launch_with_spec(
                spec, directory, RANK_PROGRAM, [*args, "--out", str(out)], timeout=LAUNCH_TIMEOUT_S
            )
            reason = failure(outcome, wrote=out.exists(), missing="no timings written")
            if reason:
                self.log(f"  {case.name} rep {rep}: FAILED {reason.splitlines()[0]}")
                result.errors.append(f"rep {rep}: {reason}")
                continue
            record = json.loads(out.read_text())
            for label in labels:
                result.extend(label, record["step_s"][label], record["cpu_s"][label])
            medians = result.to_json()["median_ms"]
            self.log(
                f"  {case.name} rep {rep}: "
                + ", ".join(f"{label} {ms:.1f} ms" for label, ms in medians.items())
            )
        return result
