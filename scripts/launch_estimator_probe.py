"""Probe: which figures of an in-process step bench are the least noisy, read from the step
times the bench already recorded (docs/bench/step-in-process*.json; nothing is run).

An in-process launch alternates its variants step by step, and `toolkit bench step` takes each
launch's figure as the median over its cycles of the cycle ratio (variant / native, cycle i
pairing each variant's i-th step). Two others are possible from the same steps: the ratio of
the two variants' median steps, and the geometric mean of the cycle ratios. For each estimator
this prints

- its spread across the launches of one case (the standard deviation of its log, averaged over
  cases), for native-again / native (the A/A) and for toolkit / native;
- over every A/A launch, the root mean square of its log (the A/A's true value is 1) and its mean
  (a bias of the order the variants run in would show here).

Then, for the cases of 5 launches or more, how launches differ and how to combine them:

- the launches' spread (standard deviation of their log figures) against the sampling error a
  launch's figure has from its own cycles (a bootstrap over them), root mean square over cases:
  equal when launches differ only by chance;
- for three intervals of a case's ratio, their mean half-width and how often an A/A interval
  leaves out 1 (about 5% for an honest 95% interval): the median of the launches' figures with
  a bootstrap over launches (the bench's until 2026-11-28), the median of all cycles with a
  bootstrap over cycles (blind to launches), and the launches combined as a random-effects
  meta-analysis (stats.combine_launches, the bench's since).

    .venv/bin/python scripts/launch_estimator_probe.py [docs/bench/step-in-process*.json ...]
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.bench import stats

Estimator = Callable[[np.ndarray, np.ndarray], float]
ESTIMATORS: dict[str, Estimator] = {
    "median of cycle ratios (the bench's)": lambda a, b: float(np.median(a / b)),
    "ratio of medians": lambda a, b: float(np.median(a) / np.median(b)),
    "geometric mean of cycle ratios": lambda a, b: float(np.exp(np.mean(np.log(a / b)))),
}


def launches(case: dict[str, Any], label: str) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """`label`'s and native's step times, launch by launch, of one case. The JSON keeps every
    cycle of every launch in order, and since 2026-11-28 how many each launch ran; before, a
    case whose launches were not all of one length cannot be cut into launches and gives
    nothing."""
    steps = case["ms"]["median"]
    if label not in steps:
        return
    cycles = case.get("launch_cycles")
    if not cycles:
        count = ((case.get("launch_ratio_to_baseline") or {}).get(label) or {}).get("n", 0)
        if not count or len(steps["native"]) % count:
            return
        cycles = [len(steps["native"]) // count] * count
    variant, native = np.asarray(steps[label]), np.asarray(steps["native"])
    start = 0
    for count in cycles:
        a, b = variant[start : start + count], native[start : start + count]
        start += count
        finite = np.isfinite(a) & np.isfinite(b)
        yield a[finite], b[finite]


INTERVALS: dict[str, Callable[[list[np.ndarray], np.random.Generator], tuple[float, float]]] = {
    "median of launches, bootstrap over launches": lambda logs, rng: stats.median_interval(
        np.asarray([np.median(launch) for launch in logs]), rng
    ),
    "median of all cycles, bootstrap over cycles": lambda logs, rng: stats.median_interval(
        np.concatenate(logs), rng
    ),
    "launches combined (random effects)": lambda logs, rng: tuple(
        np.log(getattr(stats.combine_launches([np.exp(launch) for launch in logs]), side))
        for side in ("ci_low", "ci_high")
    ),
}


def combining(cases: list[dict[str, Any]]) -> None:
    rng = np.random.default_rng(0)
    for label in ("native-again", "toolkit"):
        per_case = [[np.log(a / b) for a, b in launches(case, label)] for case in cases]
        per_case = [logs for logs in per_case if len(logs) >= 5]
        between = [np.std([np.median(launch) for launch in logs], ddof=1) for logs in per_case]
        within = [
            np.sqrt(np.mean([stats.median_variance(launch, rng) for launch in logs]))
            for logs in per_case
        ]
        print(
            f"{label} / native, {len(per_case)} cases of 5 launches or more: launches spread "
            f"{np.sqrt(np.mean(np.square(between))):.4f}, their cycles' sampling error "
            f"{np.sqrt(np.mean(np.square(within))):.4f} (rms over cases)"
        )
        for name, interval in INTERVALS.items():
            bounds = np.asarray([interval(logs, rng) for logs in per_case])
            half = float(np.mean(bounds[:, 1] - bounds[:, 0]) / 2)
            line = f"  {name}: mean half-width {half:.4f}"
            if label == "native-again":
                missed = float(np.mean((bounds[:, 0] > 0) | (bounds[:, 1] < 0)))
                line += f", A/A intervals leaving out 1: {missed:.0%}"
            print(line)


def main(argv: list[str]) -> int:
    paths = [Path(p) for p in argv] or sorted(Path("docs/bench").glob("step-in-process*.json"))
    cases = [case for path in paths for case in json.loads(path.read_text())["cases"]]
    for label in ("native-again", "toolkit"):
        print(f"{label} / native")
        for name, estimate in ESTIMATORS.items():
            spreads, every = [], []
            for case in cases:
                logs = [float(np.log(estimate(a, b))) for a, b in launches(case, label)]
                if len(logs) > 1:
                    spreads.append(float(np.std(logs, ddof=1)))
                every += logs
            line = (
                f"  {name}: spread across a case's launches {np.mean(spreads):.4f} "
                f"({len(spreads)} cases)"
            )
            if label == "native-again":
                every_log = np.asarray(every)
                rms = float(np.sqrt(np.mean(every_log**2)))
                line += (
                    f"; over {every_log.size} A/A launches, rms {rms:.4f}, "
                    f"mean {np.mean(every_log):+.4f}"
                )
            print(line)
    combining(cases)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
