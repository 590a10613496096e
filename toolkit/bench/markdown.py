"""BENCHMARKS.md from the JSON the benchmarks wrote (`toolkit bench report`).

The tables and figures come from docs/bench/*.json; the reading of them comes from
docs/bench/findings.md, written by whoever ran the measurements and copied in as is. Every
section names the command that produced it, the date and the load on the machine.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from pathlib import Path
from typing import Any

from toolkit.bench import record, targets
from toolkit.bench.allreduce import fitted
from toolkit.bench.allreduce_report import a_a_medians
from toolkit.units import MIB, size_label


def _f(value: Any, spec: str = ".3f") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec)


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _machine(data: dict[str, Any]) -> str:
    m = data["machine"]
    start = ", ".join(f"{x:.1f}" for x in m["load_average_start"])
    end = ", ".join(f"{x:.1f}" for x in m.get("load_average_end", []))
    # Runs before 2026-11-26 did not record the CPU; before 2026-11-28, the commit and minutes.
    cpu = f" ({m['cpu']})" if "cpu" in m else ""
    commit = f", toolkit {m['commit']}" if m.get("commit") else ""
    minutes = f" in {m['minutes']:g} min" if "minutes" in m else ""
    return (
        f"Run {m['date']}{minutes} on {m['cpus']} cores{cpu}{commit}; load average (1, 5, "
        f"15 min) {start} at the start, {end} at the end. Command: `{data['command']}`."
    )


def _ratio(spread: dict[str, Any] | None) -> str:
    if not spread:
        return "-"
    return (
        f"{_f(spread['median'])} [{_f(spread['ci_low'])}, {_f(spread['ci_high'])}] "
        f"({_f(spread['low'])}..{_f(spread['high'])})"
    )


def _over_toolkit(data: dict[str, Any], in_process: bool) -> list[str]:
    """The toolkit's patched and set variants against the toolkit's own step beside them
    (`over_toolkit`, recorded since 2026-11-28)."""
    labels: list[str] = []
    for case in data["cases"]:
        labels += [label for label in case.get("over_toolkit") or {} if label not in labels]
    if not labels:
        return []
    how = (
        "cycle by cycle, the launches combined as above"
        if in_process
        else "repetition by repetition"
    )
    head = ["case", *(f"{label} / toolkit" for label in labels)]
    rows = [
        [case["case"], *(_ratio((case.get("over_toolkit") or {}).get(label)) for label in labels)]
        for case in data["cases"]
    ]
    return [
        f"Each variant of the toolkit's step against the toolkit's own beside it ({how}):",
        "",
        *_table(head, rows),
        "",
    ]


def step_section(data: dict[str, Any], title: str, png: str) -> list[str]:
    labels: list[str] = []
    for case in data["cases"]:
        labels += [label for label in case["median_ms"] if label not in labels]
    head = ["case", *(f"{label} ms" for label in labels)]
    head += [f"{label} / native" for label in labels[1:]]
    others = [
        other
        for other in ("defaults", "floor")
        if any(case.get(f"toolkit_over_{other}") for case in data["cases"])
    ]
    head += [f"toolkit / {other}" for other in others]
    has_floor = "floor" in others
    head += ["floor compute + move ms"] if has_floor else []
    rows = []
    for case in data["cases"]:
        row = [case["case"], *(_f(case["median_ms"].get(label), ".1f") for label in labels)]
        row += [_ratio(case["ratio_to_baseline"].get(label)) for label in labels[1:]]
        row += [_ratio(case.get(f"toolkit_over_{other}")) for other in others]
        if has_floor:
            parts = case.get("floor_parts_ms") or {}
            row.append(f"{_f(parts.get('compute'), '.1f')} + {_f(parts.get('move'), '.1f')}")
        rows.append(row)
    lines = [f"### {title}", "", _machine(data), ""]
    in_process = data.get("kind") == "step-in-process"
    unit = "launches" if in_process else "repetitions"
    reps = f"{data['reps']} {unit}"
    if data.get("resolve"):
        reps = (
            f"{data['reps']} to {data['max_reps']} {unit} (until toolkit / native was known "
            f"to ±{data['resolve']:.1%} over launches)"
        )
    if in_process:
        figures = (
            "cycles (each variant's step once) per launch. ms: median over every cycle's step. "
            "Ratios: median over every cycle of the ratio of its two steps, [bootstrap 95% "
            "interval over cycles, blind to launches] (min..max)"
        )
    else:
        figures = (
            "steps per launch. ms: median over repetitions of each launch's median step. "
            "Ratios: median over repetitions of the ratio of two launches of the same "
            "repetition, [bootstrap 95% interval of that median] (min..max)"
        )
    lines.append(
        f"{reps} of {data['warmup']} untimed + {data['steps']} timed {figures}; "
        "`native-again / native` is the A/A noise floor."
    )
    lines += ["", *_table(head, rows), ""]
    for key, words in (
        (
            "p10_ratio_to_baseline",
            "each launch's 10th-percentile step (the steps other jobs disturbed least)",
        ),
        (
            "launch_ratio_to_baseline",
            "each launch's median cycle ratio, [interval over launches]: a launch can sit a "
            "percent or two off the next, which the interval over pooled cycles does not see",
        ),
        (
            "combined_ratio_to_baseline",
            "the launches combined, every cycle counted (each launch's median cycle ratio "
            "weighed by how well its cycles pin it down), [95% interval, wider as far as the "
            "launches disagree beyond their cycles' noise] (min..max of the launches)",
        ),
        (
            "cpu_ratio_to_baseline",
            "each launch's median CPU time per step (all the process's "
            "threads; blind to waiting for a core and to sleeping on a peer)",
        ),
    ):
        if not any(case.get(key) for case in data["cases"]):
            continue
        lines.append(f"The same ratios from {words}:")
        head = ["case", *(f"{x} / native" for x in labels[1:])]
        rows = [
            [case["case"], *(_ratio(case[key].get(label)) for label in labels[1:])]
            for case in data["cases"]
        ]
        floor_key = {
            "launch_ratio_to_baseline": "launch_toolkit_over_floor",
            "combined_ratio_to_baseline": "combined_toolkit_over_floor",
        }.get(key)
        if floor_key and has_floor:
            head.append("toolkit / floor")
            for row, case in zip(rows, data["cases"], strict=True):
                row.append(_ratio(case.get(floor_key)))
        lines += ["", *_table(head, rows), ""]
    lines += _over_toolkit(data, in_process)
    errors = [
        f"- {case['case']}: {e.splitlines()[0]}" for case in data["cases"] for e in case["errors"]
    ]
    if errors:
        lines += ["Failed launches:", *errors, ""]
    lines += [f"![{title}]({png})", ""]
    return lines


ALLREDUCE_TITLES = {
    "allreduce": "Allreduce bus bandwidth (GB/s)",
    "allreduce-resolve": "Allreduce at the target's size, launched again and again (GB/s)",
}


def allreduce_title(stem: str) -> str:
    return ALLREDUCE_TITLES.get(stem) or f"Allreduce bus bandwidth (GB/s): {stem}"


def _launches_sentence(data: dict[str, Any]) -> list[str]:
    """How many launches the ratios pool (runs since the nineteenth session record it)."""
    counts = sorted(set(data.get("launches", {}).values()))
    if not counts or counts == [1]:
        return []
    each = "-".join(map(str, (counts[0], counts[-1]) if len(counts) > 1 else counts))
    return [
        f"Each sweep launched {each} times, the sweeps in turns; every ratio pools the launches "
        "(each launch's median block ratio, weighted by how well its blocks fix it, the "
        "launches' disagreement added to the interval).",
        "",
    ]


def allreduce_section(data: dict[str, Any], title: str, png: str) -> list[str]:
    series = data["series"]
    sizes = series[0]["sizes"] if series else []

    fit = fitted(sizes)
    head = ["path", *(size_label(s) for s in sizes)]
    head += ["alpha (µs)", "beta (GB/s)"] if fit else []
    rows = [
        [
            s["label"],
            *(_f(bw, ".3f") for bw in s["busbw_gbs"]),
            *([_f(s["alpha_us"], ".0f"), _f(s["beta_busbw_gbs"], ".3f")] if fit else []),
        ]
        for s in series
    ]

    def ratio_rows(by_label: dict[str, dict[str, float]]) -> list[list[str]]:
        return [
            [label, *(_f(ratios.get(str(s)), ".3f") for s in sizes)]
            for label, ratios in by_label.items()
        ]

    lines = [f"### {title}", "", _machine(data), "", *_launches_sentence(data)]
    lines += [*_table(head, rows), ""]
    lines += [
        "Toolkit busbw / the raw path it goes through, same processes (`run.allreduce` returns "
        "a new tensor, `run.allreduce_` reduces in place as the raw torch and Horovod calls do):",
        "",
    ]
    toolkit_rows = ratio_rows(data["toolkit_over_raw_busbw"])
    lines += [*_table(["toolkit path", *(size_label(s) for s in sizes)], toolkit_rows), ""]
    a_a_rows = ratio_rows(a_a_medians(data))
    if a_a_rows:
        lines += [
            "A/A: each raw path against a second copy of itself in the same launch, the noise "
            "the rows above are read against:",
            "",
            *_table(["raw path", *(size_label(s) for s in sizes)], a_a_rows),
            "",
        ]
    lines += [f"![allreduce]({png})", ""]
    return lines


def memory_section(data: dict[str, Any]) -> list[str]:
    model = data["model"]
    head = [
        "case",
        "optimizer state: plan / measured (MiB)",
        "ratio",
        "model states plan / tensor census",
        "ratio",
        "plan total / resident Δ at the step's high points",
        "ratio",
        "highest reading",
        "resident Δ after steps",
        "ratio",
        "resident Δ peak",
        "ratio",
    ]
    rows = []
    for case in data["cases"]:
        o, t, r = case["optimizer_state"], case["tensors"], case["resident"]
        rows.append(
            [
                case["case"],
                f"{o['plan'] / MIB:.1f} / {o['measured'] / MIB:.1f}",
                _f(o["ratio"]),
                f"{t['plan_model_states'] / MIB:.1f} / {t['census'] / MIB:.1f}",
                _f(t["ratio"]),
                f"{r['plan_total'] / MIB:.1f} / {r['at_step_delta'] / MIB:.1f}",
                _f(r["ratio"]),
                case["measured"].get("at_step_where", "-"),
                f"{r['after_delta'] / MIB:.1f}",
                _f(r["after_ratio"]),
                f"{r['peak_delta'] / MIB:.1f}",
                _f(r["peak_ratio"]),
            ]
        )
    lines = ["### Memory: `toolkit plan` against real CPU runs", "", _machine(data), ""]
    lines.append(
        f"MLP {'-'.join(map(str, model['layers']))} ({model['parameters']:,} parameters), "
        f"micro-batch {model['micro']}, 2 ranks, rank 0; spec fields {data['spec']}."
    )
    lines += ["", *_table(head, rows), ""]
    return lines


def bubble_section(data: dict[str, Any], png: str) -> list[str]:
    model = data["model"]
    head = [
        "micro-batches m",
        "sends over",
        "(p-1)/(m+p-1)",
        "measured",
        "measured - formula",
        "predicted from stage costs",
        "replayed without hand-offs",
        "hand-off ms (median)",
        "bubble per stage",
        "ms per micro-batch per stage",
        "window ms",
        "step ms",
    ]
    rows = [
        [
            str(case["micro_batches"]),
            case["send_recv"],
            _f(case["formula"]),
            _f(case["measured"]),
            _f(case["difference"], "+.3f"),
            _f(case["predicted_from_stage_costs"]),
            _f(case["replayed_without_hand_offs"]),
            _f(case["hand_off_ms"], ".2f"),
            " / ".join(_f(b) for b in case["stage_bubbles"]),
            " / ".join(_f(t, ".1f") for t in case["stage_compute_per_micro_ms"]),
            _f(case["window_ms"], ".1f"),
            _f(case["step_ms"], ".1f"),
        ]
        for case in data["cases"]
    ]
    waits = ["RecvActivation", "RecvGrad", "SendActivation", "SendGrad"]
    wait_rows = [
        [str(case["micro_batches"]), case["send_recv"]]
        + [" / ".join(_f(ms, ".1f") for ms in case["instruction_ms"].get(w, [])) for w in waits]
        for case in data["cases"]
    ]
    lines = ["### Pipeline bubble: measured against `toolkit plan`", "", _machine(data), ""]
    lines.append(
        f"DeepSpeed's pipeline engine through the toolkit, {model['stages']} stages, MLP "
        f"{'-'.join(map(str, model['layers']))}, {model['micro']} samples per micro-batch, "
        f"median of {model['steps']} timed steps. The bubble is the idle share of the window "
        "from the first forward pass to the last backward pass, averaged over the stages."
    )
    lines += ["", *_table(head, rows), ""]
    lines += ["Milliseconds per step in the point-to-point instructions, stage 0 / 1:", ""]
    lines += [*_table(["m", "sends over", *waits], wait_rows), ""]
    lines += [f"![bubble]({png})", ""]
    for error in data["errors"]:
        lines.append(f"error: {error.splitlines()[0]}")
    return lines


STEP_TITLES = {
    "step-in-process": "Step: toolkit vs native in the same processes (the adapter's cost)",
    "step": "Step: toolkit vs native, launch by launch (and the engines' own defaults)",
    "step-vs-defaults": "Step: toolkit vs the engines' own defaults, launch by launch",
    "step-floor": "Step: toolkit vs the physical floor, launch by launch",
}
# A stem with one of these prefixes is shown after the fixed ones, titled "<words>: <rest>": a
# candidate's run, a setting's, or more engines measured in process in a run of their own.
STEP_PREFIXES = {
    "step-in-process-": "Step in the same processes, more engines",
    "step-floor-": "Step against the physical floor, more runs",
    "cand": "Candidate costs",
    "settings": "Settings",
}


def step_titles(names: Collection[str]) -> dict[str, str]:
    """Step JSON stems, of the JSON file `names` of a directory, in the order BENCHMARKS.md shows
    them, with their titles."""
    found = {stem: title for stem, title in STEP_TITLES.items() if f"{stem}.json" in names}
    for prefix, words in STEP_PREFIXES.items():
        for name in sorted(n for n in names if n.startswith(prefix)):
            stem = name.removesuffix(".json")
            found[stem] = f"{words}: {stem.removeprefix(prefix).strip('-')}"
    return found


def render(directory: Path, *, image_prefix: str) -> str:
    """The whole BENCHMARKS.md; sections for the JSON files that exist in `directory`."""
    lines = ["# Benchmarks", ""]
    lines.append(
        "Generated by `toolkit bench report` from the JSON in "
        f"`{image_prefix.rstrip('/')}/`; regenerate everything with `toolkit bench all` "
        "(see below). Do not edit by hand: the reading of the figures lives in "
        f"`{image_prefix.rstrip('/')}/findings.md`."
    )
    lines.append("")
    runs = {path.name: record.read_json(path) for path in sorted(directory.glob("*.json"))}
    lines += targets.section(runs)
    findings = directory / "findings.md"
    if findings.exists():
        lines += [findings.read_text().rstrip(), ""]
    lines += ["## Figures", ""]
    for stem, title in step_titles(runs.keys()).items():
        lines += step_section(runs[f"{stem}.json"], title, f"{image_prefix}{stem}.png")
    sweeps = [name for name in runs if runs[name].get("kind") == "allreduce"]
    for name in sorted(sweeps, key=lambda name: (name != "allreduce.json", name)):
        stem = name.removesuffix(".json")
        lines += allreduce_section(runs[name], allreduce_title(stem), f"{image_prefix}{stem}.png")
    for name in sorted(name for name in runs if name.startswith("memory")):
        lines += memory_section(runs[name])
    if "bubble.json" in runs:
        lines += bubble_section(runs["bubble.json"], f"{image_prefix}bubble.png")
    if (directory / "plan.txt").exists():
        lines += ["### `toolkit plan` for the memory model", "", "```"]
        lines += [(directory / "plan.txt").read_text().rstrip(), "```", ""]
    return "\n".join(lines) + "\n"
