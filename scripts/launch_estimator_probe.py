"""Probe: which per-launch figure of an in-process step bench is the least noisy, read from the
step times the bench already recorded (docs/bench/step-in-process*.json; nothing is run).

An in-process launch alternates its variants step by step, and `toolkit bench step` takes each
launch's figure as the median over its cycles of the cycle ratio (variant / native, cycle i
pairing each variant's i-th step; toolkit.bench.step.CaseResult.launch_ratios). Two others are
possible from the same steps: the ratio of the two variants' median steps, and the geometric
mean of the cycle ratios. For each estimator this prints

- its spread across the launches of one case (the standard deviation of its log, averaged over
  cases), for native-again / native (the A/A) and for toolkit / native;
- over every A/A launch, the root mean square of its log (the A/A's true value is 1) and its mean
  (a bias of the order the variants run in would show here).

    .venv/bin/python scripts/launch_estimator_probe.py [docs/bench/step-in-process*.json ...]
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

Estimator = Callable[[np.ndarray, np.ndarray], float]
ESTIMATORS: dict[str, Estimator] = {
    "median of cycle ratios (the bench's)": lambda a, b: float(np.median(a / b)),
    "ratio of medians": lambda a, b: float(np.median(a) / np.median(b)),
    "geometric mean of cycle ratios": lambda a, b: float(np.exp(np.mean(np.log(a / b)))),
}


def launches(case: dict[str, Any], label: str) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """`label`'s and native's step times, launch by launch, of one case. The JSON keeps every
    cycle of every launch in order; a case whose launches were not all of one length cannot be
    cut into launches and gives nothing."""
    steps = case["ms"]["median"]
    count = ((case.get("launch_ratio_to_baseline") or {}).get(label) or {}).get("n", 0)
    if not count or label not in steps or len(steps["native"]) % count:
        return
    per_launch = len(steps["native"]) // count
    variant, native = np.asarray(steps[label]), np.asarray(steps["native"])
    for index in range(count):
        cut = slice(index * per_launch, (index + 1) * per_launch)
        a, b = variant[cut], native[cut]
        finite = np.isfinite(a) & np.isfinite(b)
        yield a[finite], b[finite]


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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
