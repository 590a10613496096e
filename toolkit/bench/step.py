"""`toolkit bench step`: the toolkit's step against the native step of the same engine.

For one case (an engine, its variant and launcher) each repetition starts every variant once,
through real launchers, in an order that rotates from one repetition to the next so that no
variant always runs first or last while other jobs come and go:

- `native`: the engine's own script (toolkit/bench/native) started by the toolkit's launch plan
  and given the toolkit's settings; or, with --vs-defaults, started by the launcher's bare
  command with the engine's defaults.
- `toolkit`: the same step through `toolkit.init`/`run.train_step`, the same plan.
- `native-again`: native once more, for the A/A noise floor (native / native in the same run).
- `toolkit+PATCH` (with --patch) and `native+FLAG` (with --candidate): one candidate cost each.
- `native@PATH=VALUE` and `toolkit@PATH=VALUE` (with --setting and --toolkit-setting): the
  native or the toolkit's step under another spec setting, to weigh a default side by side.
- `floor` (with --floor): the physical floor, every rank's compute alone with no engine, then
  its gradient bytes moved once at memory speed (toolkit/bench/native/_floor.py), under the same
  launcher; `toolkit / floor` is how far the toolkit's step is from what the machine allows.

A launch's figure is the median of its per-step times on rank 0; ratios are taken between
launches of the same repetition (see toolkit.bench.stats).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from toolkit.bench import stats
from toolkit.bench.bare import bare_launch, execute_bare
from toolkit.bench.cases import Native, StepCase, floor_for, floor_workload, native_for
from toolkit.bench.launching import failure, launch, launch_with_spec
from toolkit.errors import ToolkitError
from toolkit.parity.cases import merge
from toolkit.ports import free_port, free_port_range
from toolkit.render.layout import rendered_threads
from toolkit.spec import TrainSpec

TOOLKIT_RANK = str(Path(__file__).parent / "ranks" / "toolkit_step.py")
LAUNCH_TIMEOUT_S = 600


@dataclass(frozen=True, eq=False)
class Variant:
    label: str
    kind: str
    """native | defaults | toolkit | floor"""
    extra: tuple[str, ...] = ()
    """--patch NAME for toolkit, candidate flags for native."""
    setting: dict[str, Any] = field(default_factory=dict)
    """Spec fields over the case's (--setting or --toolkit-setting PATH=VALUE): the native
    script or the toolkit's step under another setting, to compare settings side by side."""


def _p10(values: list[float]) -> float:
    return float(np.percentile(values, 10))


FIGURES: dict[str, tuple[str, Callable[[list[float]], float]]] = {
    "median": ("step_s", stats.median),
    "p10": ("step_s", _p10),
    "cpu": ("cpu_s", stats.median),
}
"""A launch's figures, in ms per step: the median wall time (the headline), the 10th
percentile (the steps other jobs disturbed least, steadier on a loaded machine) and the median
CPU time of the process (blind to waiting for a core, and to sleeping on a peer)."""


@dataclass
class CaseResult:
    name: str
    spec: dict[str, Any]
    variants: list[str]
    figures: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    """figure -> variant -> that figure of each repetition's launch (NaN when it failed)."""
    loader_ms: list[float] = field(default_factory=list)
    floor_parts_ms: dict[str, list[float]] = field(default_factory=dict)
    """The floor's median compute and move per launch (`compute`, `move`)."""
    settings: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    launch_cycles: list[int] = field(default_factory=list)
    """In-process: the cycles each launch added, in order (empty for launch-by-launch runs)."""
    faults: dict[str, list[float]] = field(default_factory=dict)
    """variant -> rank 0's minor page faults per step: each launch's median (in-process: each
    step's)."""

    def __post_init__(self) -> None:
        names = self.figures or FIGURES
        self.figures = {name: {label: [] for label in self.variants} for name in names}

    @property
    def baseline(self) -> str:
        return self.variants[0]

    def add(self, label: str, record: dict[str, Any]) -> None:
        """One launch's figures of one variant (a repetition)."""
        for name in self.figures:
            key, figure = FIGURES[name]
            values = record.get(key) or []
            self.figures[name][label].append(figure(values) * 1e3 if values else float("nan"))
        self.faults.setdefault(label, []).append(stats.median(record.get("faults") or []))

    def extend(
        self, label: str, wall_s: list[float], cpu_s: list[float], faults: list[int]
    ) -> None:
        """Step-by-step figures (in-process: one repetition per cycle)."""
        self.figures["median"][label] += [seconds * 1e3 for seconds in wall_s]
        self.figures["cpu"][label] += [seconds * 1e3 for seconds in cpu_s]
        self.faults.setdefault(label, []).extend(float(count) for count in faults)

    @property
    def measured(self) -> bool:
        """Whether any launch of any variant gave a step time."""
        return any(math.isfinite(ms) for times in self.figures["median"].values() for ms in times)

    def ratios(self, figure: str, over: str | None = None) -> dict[str, stats.Spread]:
        ms = self.figures[figure]
        base = ms[over or self.baseline]
        return {label: stats.spread(stats.ratios(ms[label], base)) for label in self.variants[1:]}

    def launch_cycle_ratios(self, label: str, over: str | None = None) -> list[list[float]]:
        """In-process: `label` / `over` (the baseline unless named) cycle by cycle, one list
        per launch."""
        ms = self.figures["median"]
        cycles = stats.ratios(ms[label], ms[over or self.baseline])
        found, start = [], 0
        for count in self.launch_cycles:
            found.append(cycles[start : start + count])
            start += count
        return found

    def combined_launches(self) -> dict[str, stats.Spread]:
        """In-process: each variant / the baseline over the launches, every launch's cycles
        counted (stats.combine_launches): the interval widens only as far as the launches
        disagree beyond their own cycles' noise."""
        if not self.launch_cycles:
            return {}
        return {
            label: stats.combine_launches(self.launch_cycle_ratios(label))
            for label in self.variants[1:]
        }

    def over_toolkit(self) -> dict[str, dict[str, Any]]:
        """Each variant of the toolkit's step (a patch or a toolkit setting) / the toolkit's own
        step beside it: what the variant changes (in-process: cycle by cycle, combined over
        launches as toolkit / native is; otherwise repetition by repetition)."""
        found = {}
        for label in self.variants:
            if not label.startswith(TOOLKIT_VARIANTS):
                continue
            if self.launch_cycles:
                cycles = self.launch_cycle_ratios(label, over="toolkit")
                spread = stats.combine_launches(cycles)
            else:
                spread = self.ratios("median", over="toolkit")[label]
            found[label] = spread.to_json()
        return found

    def add_floor_parts(self, record: dict[str, Any]) -> None:
        for part in ("compute", "move"):
            seconds = record.get(f"{part}_s") or [math.nan]
            self.floor_parts_ms.setdefault(part, []).append(stats.median(seconds) * 1e3)

    def toolkit_over(self, label: str) -> dict[str, Any] | None:
        """toolkit / `label` launch by launch (in-process: cycle by cycle), when that variant
        ran."""
        if label not in self.variants:
            return None
        return self.ratios("median", over=label)["toolkit"].to_json()

    def combined_toolkit_over(self, label: str) -> dict[str, Any] | None:
        """In-process: toolkit / `label` combined over launches, when that variant ran."""
        if label not in self.variants or not self.launch_cycles:
            return None
        return stats.combine_launches(self.launch_cycle_ratios("toolkit", over=label)).to_json()

    def to_json(self) -> dict[str, Any]:
        return {
            "case": self.name,
            "spec": self.spec,
            "baseline": self.baseline,
            "ms": self.figures,
            "median_ms": {label: stats.median(ms) for label, ms in self.figures["median"].items()},
            "ratio_to_baseline": {k: v.to_json() for k, v in self.ratios("median").items()},
            "p10_ratio_to_baseline": (
                {k: v.to_json() for k, v in self.ratios("p10").items()}
                if "p10" in self.figures
                else {}
            ),
            "cpu_ratio_to_baseline": {k: v.to_json() for k, v in self.ratios("cpu").items()},
            "launch_cycles": self.launch_cycles,
            "combined_ratio_to_baseline": {
                k: v.to_json() for k, v in self.combined_launches().items()
            },
            "over_toolkit": self.over_toolkit(),
            "toolkit_over_defaults": self.toolkit_over("defaults"),
            "toolkit_over_floor": self.toolkit_over("floor"),
            "combined_toolkit_over_floor": self.combined_toolkit_over("floor"),
            "floor_parts_ms": {part: stats.median(ms) for part, ms in self.floor_parts_ms.items()},
            "toolkit_loader_ms": stats.median(self.loader_ms),
            "faults_per_step": {
                label: stats.median(self.faults.get(label, [])) for label in self.variants
            },
            "settings": self.settings,
            "errors": self.errors,
        }


TOOLKIT_VARIANTS = ("toolkit+", "toolkit@")
"""How the labels of the toolkit's patched (--patch) and set (--toolkit-setting) variants begin."""


def variants_for(
    *,
    vs_defaults: bool,
    patches: list[str],
    candidates: list[str],
    settings: Sequence[str] = (),
    toolkit_settings: Sequence[str] = (),
    floor: bool = False,
) -> list[Variant]:
    """native first (every ratio's denominator), toolkit, native again (A/A); with vs_defaults
    the engine at its own defaults too, with floor the physical floor; then one variant per
    patch, candidate flag, native setting and toolkit setting."""
    found = [Variant("native", "native"), Variant("toolkit", "toolkit")]
    found.append(Variant("native-again", "native"))
    if vs_defaults:
        found.append(Variant("defaults", "defaults"))
    if floor:
        found.append(Variant("floor", "floor"))
    found += [Variant(f"toolkit+{p}", "toolkit", ("--patch", p)) for p in patches]
    found += [Variant(f"native+{flag.lstrip('-')}", "native", (flag,)) for flag in candidates]
    found += [Variant(f"native@{text}", "native", (), parse_setting(text)) for text in settings]
    found += [
        Variant(f"toolkit@{text}", "toolkit", (), parse_setting(text)) for text in toolkit_settings
    ]
    return found


def parse_setting(text: str) -> dict[str, Any]:
    """ "horovod.cycle_time_ms=0.1" -> {"horovod": {"cycle_time_ms": 0.1}} (YAML values)."""
    path, separator, value = text.partition("=")
    if not separator or not path or any(not part for part in path.split(".")):
        raise ToolkitError(
            f"--setting {text!r}: expected PATH=VALUE", "e.g. --setting horovod.cycle_time_ms=0.1"
        )
    data: dict[str, Any] = {}
    node = data
    *parents, leaf = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = yaml.safe_load(value)
    return data


def case_spec(user: TrainSpec, case: StepCase, setting: dict[str, Any] | None = None) -> TrainSpec:
    """The user's spec, the case's engine, a variant's setting, the workload pinned, fresh
    ports, this machine."""
    data = merge(user.to_dict(), case.spec, setting or {})
    data = merge(data, case.workload.spec_fields(case.workload.ranks // pipeline_stages(data)))
    data = merge(
        data,
        {
            "launch": {"hosts": [], "hostfile": None, "master_port": free_port()},
            "tf": {"port": free_port_range(case.workload.ranks)},
        },
    )
    return TrainSpec.from_dict(data)


def pipeline_stages(data: dict[str, Any]) -> int:
    """The pipeline stages a spec's data asks for (1 without a pipeline)."""
    return int(data.get("pipeline", {}).get("stages") or 1)


class StepBench:
    """Runs cases of one user spec; every launch gets its own directory under `work`."""

    def __init__(
        self,
        work: Path,
        user: TrainSpec,
        *,
        steps: int,
        warmup: int,
        log: Callable[[str], None] = print,
    ) -> None:
        self.work = work
        self.user = user
        self.steps = steps
        self.warmup = warmup
        self.log = log
        self.launches = 0

    def run(self, cases: list[StepCase], variants: list[Variant], reps: int) -> list[CaseResult]:
        results = []
        for case in cases:
            self.log(f"{case.name}: {reps} repetitions of {', '.join(v.label for v in variants)}")
            results.append(self.run_case(case, variants, reps))
        return results

    def run_case(self, case: StepCase, variants: list[Variant], reps: int) -> CaseResult:
        native = native_for(case_spec(self.user, case))
        result = CaseResult(case.name, case.spec, [v.label for v in variants])
        for rep in range(reps):
            shift = rep % len(variants)
            for variant in variants[shift:] + variants[:shift]:
                record = self._launch(case, native, variant, rep)
                result.add(variant.label, record)
                if "error" in record:
                    result.errors.append(f"rep {rep} {variant.label}: {record['error']}")
                    continue
                if variant.label == "toolkit":
                    result.loader_ms.append(stats.median(record.get("loader_s", [])) * 1e3)
                if variant.kind == "floor":
                    result.add_floor_parts(record)
                result.settings.setdefault(variant.label, record.get("settings", {}))
        return result

    def _launch(self, case: StepCase, native: Native, variant: Variant, rep: int) -> dict[str, Any]:
        self.launches += 1
        directory = self.work / f"launch{self.launches:03d}"
        directory.mkdir(parents=True)
        out = directory / "timings.json"
        # Fresh ports for every launch: back-to-back jobs on one port can meet the last's socket.
        spec = case_spec(self.user, case, variant.setting)
        args = [*case.workload.arguments(steps=self.steps, warmup=self.warmup), "--out", str(out)]
        if variant.kind == "toolkit":
            outcome = launch_with_spec(
                spec, directory, TOOLKIT_RANK, [*args, *variant.extra], timeout=LAUNCH_TIMEOUT_S
            )
        elif variant.kind == "native":
            command = [str(native.path), *args, *native.matched(spec, directory), *variant.extra]
            outcome = launch(spec, command, timeout=LAUNCH_TIMEOUT_S)
        elif variant.kind == "floor":
            share = floor_workload(case.workload, case.workload.ranks // spec.pipeline.stages)
            command = [str(floor_for(spec)), *share.arguments(steps=self.steps, warmup=self.warmup)]
            command += ["--out", str(out), "--threads", str(rendered_threads(spec))]
            outcome = launch(spec, command, timeout=LAUNCH_TIMEOUT_S)
        else:
            extra = [*native.defaults(spec, directory), *variant.extra]
            bare = bare_launch(spec, str(native.path), [*args, *extra])
            outcome = execute_bare(spec, bare, timeout=LAUNCH_TIMEOUT_S)
        reason = failure(outcome, wrote=out.exists(), missing="no timings written")
        if reason:
            self.log(f"  {case.name} rep {rep} {variant.label}: FAILED {reason.splitlines()[0]}")
            return {"error": reason}
        record: dict[str, Any] = json.loads(out.read_text())
        ms = stats.median(record["step_s"]) * 1e3
        faults = stats.median(record.get("faults") or [])
        self.log(f"  {case.name} rep {rep} {variant.label}: {ms:.1f} ms/step, {faults:.0f} faults")
        return record


def log_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
