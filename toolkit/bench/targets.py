"""Where the performance targets stand, read from the JSON `toolkit bench all` writes.

BENCHMARKS.md opens with the table this makes (`toolkit bench report`), so that a reader sees
each target, its figure and whether it holds before the thousand lines that explain them. Every
row names the file it was read from and the day that file's run began: `toolkit bench all`
writes them all in one run on one machine, where the rows compare, but each bench can also be
run alone and replace its own file.

A verdict weighs the figure's spread where the bench gives one (a 95% interval over launches,
toolkit.bench.stats: in-process, the launches combined; launch by launch, a bootstrap of the
median):

- met: the whole interval is on the target's side of the bound;
- median only: the median is, but the interval reaches across the bound, so the run does not
  tell the two apart;
- missed: the median is on the wrong side.

An allreduce's ratio pools its launches' block ratios as the in-process step pools its cycles
(toolkit.bench.allreduce.paired_ratios; before the nineteenth session, one launch's median
block ratio with a bootstrap interval, and before 2026-11-29 the ratio of the median blocks,
without one). A figure without an interval (one census of memory, a bubble's median over
steps) is met or missed. None of this is asserted in a test: the machine's speed is read,
never enforced.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from toolkit.bench import stats
from toolkit.bench.allreduce import SWEEPS, Sweep
from toolkit.engines import engine
from toolkit.units import MIB

MET = "met"
MEDIAN_ONLY = "median only"
MISSED = "missed"
NOT_RUN = "not run"

ADAPTER_BOUND = 1.01
ALLREDUCE_BOUND = 0.98
ALLREDUCE_SIZE = 64 * MIB
DEFAULTS_BOUND = 0.90
FLOOR_BOUND = 1.25
ZERO_STATE_TOLERANCE = 0.05
BUBBLE_TOLERANCE = 0.03
PLAN_TOLERANCE = 0.05
BUBBLE_TRANSPORT = "shared_memory"
"""The pipeline's hand-offs the toolkit uses where both stages share a host
(`deepspeed.send_recv: auto`); the bubble's target is read for them."""


@dataclass(frozen=True)
class Row:
    target: str
    subject: str
    figure: str
    verdict: str
    source: str


def verdict_at_most(spread: dict[str, Any], bound: float) -> str:
    """A ratio that should be at most `bound`, judged with its interval."""
    return _verdict_with_interval(spread["median"], spread["ci_high"], lambda v: v <= bound)


def verdict_at_least(value: float, bound: float) -> str:
    """A figure without an interval that should be at least `bound`."""
    if not math.isfinite(value):
        return NOT_RUN
    return MET if value >= bound else MISSED


def verdict_at_least_spread(spread: dict[str, Any], bound: float) -> str:
    """A ratio that should be at least `bound`, judged with its interval."""
    return _verdict_with_interval(spread["median"], spread["ci_low"], lambda v: v >= bound)


def _verdict_with_interval(median: float, far_end: float, inside: Callable[[float], bool]) -> str:
    """Missed when the median is outside the bound, met when the interval's end on the bound's
    side (`far_end`) is inside it too, else median only (the module's docstring)."""
    if not math.isfinite(median):
        return NOT_RUN
    if not inside(median):
        return MISSED
    return MET if inside(far_end) else MEDIAN_ONLY


def verdict_within(value: float, centre: float, tolerance: float) -> str:
    """A figure that should be within `tolerance` of `centre`."""
    if not math.isfinite(value):
        return NOT_RUN
    return MET if abs(value - centre) <= tolerance else MISSED


def spread_text(spread: dict[str, Any]) -> str:
    """A spread as the JSON holds it (stats.Spread.to_json), written as the bench writes it."""
    return stats.Spread(**spread).text()


def _over_launches(case: dict[str, Any], label: str) -> dict[str, Any] | None:
    """`label` / native over launches where the run kept them (in-process: launches, not
    pooled cycles, are the repetitions; combined with every cycle counted since 2026-11-28,
    before as the median of the launches' medians), else over repetitions."""
    for key in ("combined_ratio_to_baseline", "launch_ratio_to_baseline", "ratio_to_baseline"):
        found = (case.get(key) or {}).get(label)
        if found:
            return found
    return None


def adapter_rows(data: dict[str, Any], source: str) -> Iterator[Row]:
    target = f"toolkit / native step ≤ {ADAPTER_BOUND}"
    for case in data["cases"]:
        toolkit = _over_launches(case, "toolkit")
        if not toolkit:
            yield Row(target, case["case"], "-", NOT_RUN, source)
            continue
        again = _over_launches(case, "native-again")
        noise = f"; A/A {spread_text(again)}" if again else ""
        verdict = verdict_at_most(toolkit, ADAPTER_BOUND)
        yield Row(target, case["case"], spread_text(toolkit) + noise, verdict, source)


def defaults_rows(data: dict[str, Any], source: str) -> Iterator[Row]:
    target = f"toolkit / the engine's own defaults ≤ {DEFAULTS_BOUND:.2f} where they leave room"
    for case in data["cases"]:
        ratio = case.get("toolkit_over_defaults")
        if not ratio:
            yield Row(target, case["case"], "-", NOT_RUN, source)
            continue
        verdict = verdict_at_most(ratio, DEFAULTS_BOUND)
        yield Row(target, case["case"], spread_text(ratio), verdict, source)


def _framework(case: dict[str, Any]) -> str:
    spec = case["spec"]
    return engine(spec["backend"], spec.get("framework")).framework


def floor_rows(data: dict[str, Any], source: str) -> Iterator[Row]:
    """The best case of each framework against its physical floor, by the median."""
    best: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for case in data["cases"]:
        ratio = (
            case.get("combined_toolkit_over_floor")
            or case.get("launch_toolkit_over_floor")
            or case.get("toolkit_over_floor")
        )
        if not ratio or not math.isfinite(ratio["median"]):
            continue
        framework = _framework(case)
        if framework not in best or ratio["median"] < best[framework][1]["median"]:
            best[framework] = (case, ratio)
    for framework, (case, ratio) in sorted(best.items()):
        yield Row(
            f"best {framework} choice / physical floor ≤ {FLOOR_BOUND}",
            case["case"],
            spread_text(ratio),
            verdict_at_most(ratio, FLOOR_BOUND),
            source,
        )


def allreduce_subject(sweep: Sweep) -> str:
    """The toolkit path whose ratio the target reads for `sweep`: the one that matches the raw
    call, in place where the sweep has one."""
    return sweep.series.get("toolkit-inplace") or sweep.series["toolkit"]


def allreduce_rows(data: dict[str, Any], source: str) -> Iterator[Row]:
    """Each launcher's toolkit path that matches its raw call (`allreduce_subject`)."""
    target = f"toolkit / raw allreduce busbw at {ALLREDUCE_SIZE // MIB} MiB ≥ {ALLREDUCE_BOUND}"
    ratios = data["toolkit_over_raw_busbw"]
    spreads = data.get("toolkit_over_raw_spread", {})  # since the sixteenth session
    again_spreads = data.get("raw_again_over_raw_spread", {})  # since the seventeenth session
    for sweep in SWEEPS:
        label = allreduce_subject(sweep)
        spread = spreads.get(label, {}).get(str(ALLREDUCE_SIZE))
        if spread:
            again = again_spreads.get(sweep.series[sweep.reference], {}).get(str(ALLREDUCE_SIZE))
            noise = f"; A/A {spread_text(again)}" if again else ""
            verdict = verdict_at_least_spread(spread, ALLREDUCE_BOUND)
            yield Row(target, label, spread_text(spread) + noise, verdict, source)
            continue
        value = ratios.get(label, {}).get(str(ALLREDUCE_SIZE), math.nan)
        yield Row(target, label, f"{value:.3f}", verdict_at_least(value, ALLREDUCE_BOUND), source)


def memory_rows(data: dict[str, Any], source: str) -> Iterator[Row]:
    state = f"ZeRO optimizer-state bytes per rank within {ZERO_STATE_TOLERANCE:.0%} of the formula"
    plan = f"`toolkit plan` within {PLAN_TOLERANCE:.0%} of measured memory"
    for case in data["cases"]:
        measured = case["optimizer_state"]["ratio"]
        verdict = verdict_within(measured, 1.0, ZERO_STATE_TOLERANCE)
        yield Row(state, case["case"], f"measured / formula {measured:.3f}", verdict, source)
    for case in data["cases"]:
        measured = case["resident"]["ratio"]
        verdict = verdict_within(measured, 1.0, PLAN_TOLERANCE)
        yield Row(plan, case["case"], f"measured / plan {measured:.3f}", verdict, source)


def bubble_rows(data: dict[str, Any], source: str) -> Iterator[Row]:
    target = f"pipeline bubble within {BUBBLE_TOLERANCE} of (p-1)/(m+p-1)"
    for case in data["cases"]:
        if case.get("send_recv", BUBBLE_TRANSPORT) != BUBBLE_TRANSPORT:
            continue
        subject = f"{case['stages']} stages, m = {case['micro_batches']}"
        figure = f"{case['measured']:.3f} against {case['formula']:.3f} ({case['difference']:+.3f})"
        verdict = verdict_within(case["measured"], case["formula"], BUBBLE_TOLERANCE)
        yield Row(target, subject, figure, verdict, source)


READERS: tuple[tuple[str, Callable[[dict[str, Any], str], Iterator[Row]]], ...] = (
    ("step-in-process.json", adapter_rows),
    ("allreduce.json", allreduce_rows),
    ("step-vs-defaults.json", defaults_rows),
    ("step-floor.json", floor_rows),
    ("memory.json", memory_rows),
    ("bubble.json", bubble_rows),
)
"""Each file `toolkit bench all` writes, and what its targets are."""


RESOLVING_RUN = "step-in-process-resolve.json"
"""Where `toolkit bench all` launches on, until they resolve, the adapter's cases that its
first in-process run left short of met (toolkit.bench.runs.resolve_run). When it is newer than
step-in-process.json, each of its cases with the same workload replaces that case's row."""

ALLREDUCE_RESOLVING_RUN = "allreduce-resolve.json"
"""Where `toolkit bench all` launches the allreduce sweeps its size sweep left short of met
again and again at ALLREDUCE_SIZE alone (toolkit.bench.runs.resolve_allreduce_run): one launch
resolves that ratio to about ±5% here, and a sweep of every size launched that often would take
hours. When it is newer than allreduce.json and ran as many ranks, its rows replace that file's."""


FLOOR_RESOLVING_RUN = "step-floor-resolve.json"
"""Where `toolkit bench all` launches on the best choices its floor run left short of met, with
more repetitions (toolkit.bench.runs.resolve_floor_run). When it is newer than step-floor.json,
its rows of the same cases and workload replace that file's."""


def _same_workloads(headline: dict[str, Any], resolving: dict[str, Any]) -> dict[str, Any]:
    same = {
        case
        for case, workload in resolving["workloads"].items()
        if headline["workloads"].get(case) == workload
    }
    return {"cases": [case for case in resolving["cases"] if case["case"] in same]}


def _same_ranks(headline: dict[str, Any], resolving: dict[str, Any]) -> dict[str, Any]:
    return resolving if resolving["ranks"] == headline["ranks"] else {"toolkit_over_raw_busbw": {}}


@dataclass(frozen=True)
class ResolvingRun:
    """A run that launches on where a headline file's run left targets short of met."""

    name: str
    headline: str
    read: Callable[[dict[str, Any], str], Iterator[Row]]
    comparable: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]
    """(headline, resolving) -> the part of the resolving run measured as the headline was."""


RESOLVING_RUNS = (
    ResolvingRun(RESOLVING_RUN, "step-in-process.json", adapter_rows, _same_workloads),
    ResolvingRun(FLOOR_RESOLVING_RUN, "step-floor.json", floor_rows, _same_workloads),
    ResolvingRun(ALLREDUCE_RESOLVING_RUN, "allreduce.json", allreduce_rows, _same_ranks),
)


def _source(runs: dict[str, dict[str, Any]], name: str) -> str:
    return f"`{name}`, {_date(runs[name])}"


def _date(data: dict[str, Any]) -> str:
    return str(data["machine"]["date"])[:10]


def _resolved_rows(runs: dict[str, dict[str, Any]]) -> tuple[dict[tuple[str, str], Row], list[str]]:
    """The measured rows of the RESOLVING_RUNS that replace their headline file's, by (target,
    subject), and the names of the files they came from: each run at least as new as its
    headline, only where it measured what the headline did."""
    replacing: dict[tuple[str, str], Row] = {}
    used: list[str] = []
    for run in RESOLVING_RUNS:
        headline, resolving = runs.get(run.headline), runs.get(run.name)
        if not headline or not resolving:
            continue
        if str(resolving["machine"]["date"]) < str(headline["machine"]["date"]):
            continue
        found = run.read(run.comparable(headline, resolving), _source(runs, run.name))
        measured = {(row.target, row.subject): row for row in found if row.verdict != NOT_RUN}
        replacing.update(measured)
        used += [run.name] if measured else []
    return replacing, used


def rows(runs: dict[str, dict[str, Any]]) -> list[Row]:
    """The targets' rows from `runs` (file name -> its JSON) of READERS' files, each row's
    source named with the day its run began: files of different runs may stand side by side.
    A newer run of RESOLVING_RUNS replaces the rows it measured."""
    return _rows(runs, _resolved_rows(runs)[0])


def _rows(runs: dict[str, dict[str, Any]], replacing: dict[tuple[str, str], Row]) -> list[Row]:
    return [
        replacing.get((row.target, row.subject), row)
        for name, read in READERS
        if name in runs
        for row in read(runs[name], _source(runs, name))
    ]


def section(runs: dict[str, dict[str, Any]]) -> list[str]:
    """The Markdown of the targets table from `runs` (a JSON file's name -> its contents, as
    `toolkit bench report` read them), or nothing when none of READERS' files is among them."""
    replacing, resolving = _resolved_rows(runs)
    found = _rows(runs, replacing)
    if not found:
        return []
    read = [name for name, _ in READERS if name in runs] + resolving
    dates = sorted({_date(runs[name]) for name in read})
    counts = {
        verdict: sum(row.verdict == verdict for row in found)
        for verdict in (MET, MEDIAN_ONLY, MISSED, NOT_RUN)
    }
    lines = ["## Targets", ""]
    lines.append(
        f"Read from the files `toolkit bench all` writes (run {', '.join(dates)}): "
        + ", ".join(f"{count} {verdict}" for verdict, count in counts.items() if count)
        + ". Met: the whole 95% interval is inside the bound; median only: the median is, "
        "its interval is not; missed: the median is outside. Figures with no interval are met "
        "or missed. Why each figure is what it is: the findings below."
    )
    lines += ["", "| target | case | figure | verdict | from, run on |", "|---|---|---|---|---|"]
    for row in found:
        verdict = row.verdict if row.verdict == MET else f"**{row.verdict}**"
        lines.append(f"| {row.target} | {row.subject} | {row.figure} | {verdict} | {row.source} |")
    return [*lines, ""]
