"""How every benchmark starts its rank programs: under the spec's own launcher, as a real job
(toolkit.render + toolkit.launch), quietly, with a time limit; and what a launch measured."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from toolkit.bench.cases import native_for
from toolkit.bench.workload import Workload
from toolkit.errors import ToolkitError
from toolkit.launch.runner import execute, launch_plan_here
from toolkit.spec import TrainSpec

RANKS = Path(__file__).parent / "ranks"
LAUNCH_TIMEOUT_S = 600


@dataclass(frozen=True)
class Measured:
    """One launch: rank 0's seconds per timed step, every rank's peak resident memory, and
    with a link the bytes rank 0's host sent over it per timed step."""

    step_s: list[float]
    global_batch: int
    peak_rss_bytes: list[int] = field(default_factory=list)
    sent_bytes_per_step: float | None = None

    @property
    def median_ms(self) -> float:
        return statistics.median(self.step_s) * 1e3

    @property
    def mean_ms(self) -> float:
        """The mean step: what a job with periodic work (local SGD's averages) takes per step,
        which the median leaves out."""
        return statistics.fmean(self.step_s) * 1e3

    @property
    def samples_per_s(self) -> float:
        return self.global_batch / statistics.median(self.step_s)


def launch_rank_program(spec: TrainSpec, command: list[str]) -> None:
    """`command` (a program and its arguments) as the spec's launcher runs it; a failed launch
    is a ToolkitError carrying the launch's report."""
    outcome = execute(launch_plan_here(spec, command), spec, timeout=LAUNCH_TIMEOUT_S, echo=False)
    if not outcome.ok:
        raise ToolkitError(f"a benchmark launch failed: {outcome.report()}", "see the output above")


def measure(
    spec: TrainSpec,
    kind: str,
    workload: Workload,
    workdir: Path,
    *,
    steps: int,
    warmup: int,
    model: str | None = None,
    link: str | None = None,
) -> Measured:
    """Launch the `toolkit` or `native` step of `spec` once and read what it wrote; `link`
    names the network interface whose sent bytes rank 0 counts."""
    workdir.mkdir(parents=True, exist_ok=True)
    out = workdir / f"{kind}.json"
    out.unlink(missing_ok=True)
    arguments = [*workload.arguments(steps=steps, warmup=warmup), "--out", str(out)]
    if link is not None:
        arguments += ["--link", link]
    if kind == "toolkit":
        spec_file = workdir / "spec.json"
        spec_file.write_text(json.dumps(spec.to_dict()))
        extra = ["--model", model] if model else []
        program = [str(RANKS / "toolkit_step.py"), "--spec", str(spec_file), *extra]
    else:
        native = native_for(spec)
        program = [str(native.path), *native.matched(spec, workdir)]
    launch_rank_program(spec, [*program, *arguments])
    if not out.is_file():
        raise ToolkitError(f"the {kind} launch ended without writing {out}", "see its output")
    record = json.loads(out.read_text())
    peaks = [
        json.loads(path.read_text())["peak_rss_bytes"]
        for path in sorted(workdir.glob(f"{kind}.rank*.json"))
    ]
    return Measured(
        record["step_s"], spec.batch_for().global_, peaks, record.get("sent_bytes_per_step")
    )
