"""`toolkit bench step` output: the text table, the JSON and the PNG."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np


def _fmt(value: float, spec: str) -> str:
    return "-" if not math.isfinite(value) else format(value, spec)


def table(data: dict[str, Any]) -> str:
    """One line per case and variant: median ms, ratio to the baseline with its spread, and
    rank 0's minor page faults per step ("-" in JSON written before they were counted)."""
    lines = [
        f"{'case':32} {'variant':26} {'ms/step':>8} {'/ baseline':>10} "
        f"{'95% CI (bootstrap)':>20} {'min..max':>14} {'p10 ms':>8} {'p10 ratio':>10}"
        f" {'cpu ratio':>10} {'faults':>8}"
    ]
    for case in data["cases"]:
        baseline = case["baseline"]
        for label, ms in case["median_ms"].items():
            ratio = case["ratio_to_baseline"].get(label)
            if ratio is None:
                cells = f"{'1':>10} {'':>20} {'':>14}"
            else:
                ci = f"[{_fmt(ratio['ci_low'], '.3f')}, {_fmt(ratio['ci_high'], '.3f')}]"
                span = f"{_fmt(ratio['low'], '.3f')}..{_fmt(ratio['high'], '.3f')}"
                cells = f"{_fmt(ratio['median'], '.3f'):>10} {ci:>20} {span:>14}"
            name = case["case"] if label == baseline else ""
            fast = case["ms"].get("p10", {}).get(label, [])
            fast_ratio = case["p10_ratio_to_baseline"].get(label)
            cpu_ratio = case["cpu_ratio_to_baseline"].get(label)
            p10 = _fmt(float(np.nanmedian(fast)) if fast else math.nan, ".1f")
            p10_ratio = _fmt(fast_ratio["median"], ".3f") if fast_ratio else ""
            cpu = _fmt(cpu_ratio["median"], ".3f") if cpu_ratio else ""
            faults = _fmt(case.get("faults_per_step", {}).get(label, math.nan), ".0f")
            lines.append(
                f"{name:32} {label:26} {_fmt(ms, '.1f'):>8} {cells} {p10:>8} {p10_ratio:>10}"
                f" {cpu:>10} {faults:>8}"
            )
        for key, words in (
            ("toolkit_over_defaults", "toolkit / defaults"),
            ("toolkit_over_floor", "toolkit / floor"),
            ("launch_toolkit_over_floor", "toolkit / floor, launches"),
            ("combined_toolkit_over_floor", "toolkit / floor, launches"),
        ):
            over = case.get(key)
            if not over:
                continue
            ci = f"[{_fmt(over['ci_low'], '.3f')}, {_fmt(over['ci_high'], '.3f')}]"
            span = f"{_fmt(over['low'], '.3f')}..{_fmt(over['high'], '.3f')}"
            lines.append(
                f"{'':32} {words:26} {'':>8} {_fmt(over['median'], '.3f'):>10} {ci:>20} {span:>14}"
            )
        parts = case.get("floor_parts_ms")
        if parts:
            lines.append(
                f"{'':32} {'floor = compute + move':26} "
                f"{_fmt(parts['compute'], '.1f')} + {_fmt(parts['move'], '.1f')} ms"
            )
        for error in case["errors"]:
            lines.append(f"{'':32} error: {error.splitlines()[0]}")
    return "\n".join(lines)


def plot(data: dict[str, Any], path: Path) -> Path:
    """Ratio to the baseline per case: each variant's median with its min..max, the A/A one
    (the baseline's second launch) in grey, and 1.0 marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = data["cases"]
    labels = [label for label in cases[0]["ratio_to_baseline"]] if cases else []
    fig, ax = plt.subplots(figsize=(8, 0.6 * max(len(cases), 1) * max(len(labels), 1) / 2 + 1.5))
    offsets = {label: (i - (len(labels) - 1) / 2) * 0.18 for i, label in enumerate(labels)}
    # One colour per variant on every row; tab10's grey (C7) is kept for the A/A variant.
    palette = [f"C{i}" for i in range(10) if i != 7]
    colours = {label: palette[i % len(palette)] for i, label in enumerate(labels)}
    for row, case in enumerate(cases):
        for label, ratio in case["ratio_to_baseline"].items():
            if not math.isfinite(ratio["median"]):
                continue
            grey = label.endswith("-again")
            ax.errorbar(
                ratio["median"],
                row + offsets.get(label, 0.0),
                xerr=[[ratio["median"] - ratio["low"]], [ratio["high"] - ratio["median"]]],
                fmt="o",
                color="grey" if grey else colours.get(label),
                label=label if row == 0 else None,
                capsize=3,
            )
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(cases)), [case["case"] for case in cases])
    ax.invert_yaxis()
    baseline = cases[0]["baseline"] if cases else "baseline"
    ax.set_xlabel(f"ms per step / {baseline} ms per step (median, min..max over repetitions)")
    ax.set_title(f"toolkit bench step, {data['machine']['date'][:10]}, {data['reps']} reps")
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
