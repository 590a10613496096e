"""`toolkit parity [--cases PATTERN ...] [--out DIR] [--steps N] [--list]`

Runs every parity case the installed engines allow (a subset with --cases: any case whose name
contains one of the patterns), shows progress, prints a table, writes parity.json and PNG plots
to DIR, and exits 1 when any case fails.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from toolkit.errors import ToolkitError


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "parity", help="prove every engine trains the same model to the same weights"
    )
    parser.add_argument(
        "--cases",
        nargs="*",
        default=[],
        metavar="PATTERN",
        help="only cases whose name contains a pattern",
    )
    parser.add_argument("--out", default="reports/parity", help="where the JSON and plots go")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per case")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from toolkit.parity.cases import STEPS, all_cases, select
    from toolkit.parity.harness import Harness, Outcome
    from toolkit.parity.report import table, write_json, write_plots

    cases = select(all_cases(), args.cases)
    if not cases:
        raise ToolkitError(f"no parity case matches {args.cases}", "run `toolkit parity --list`")
    if args.list:
        print("\n".join(case.name for case in cases))
        return 0
    steps = STEPS if args.steps is None else args.steps
    if steps < 1:
        raise ToolkitError(f"--steps={steps}: must be at least 1", f"use the default, {STEPS}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory(prefix="toolkit-parity-") as work,
        tqdm(total=len(cases), desc="parity", unit="case") as bar,
    ):

        def done(outcome: Outcome) -> None:
            bar.set_postfix_str(f"{outcome.case.name}: {outcome.status}")
            bar.update(1)

        outcomes = Harness(Path(work), steps=steps).run(cases, on_done=done)
    print(table(outcomes))
    write_json(outcomes, out / "parity.json", steps=steps)
    plots = write_plots(outcomes, out)
    print(f"wrote {out / 'parity.json'}" + "".join(f", {path}" for path in plots))
    return 0 if all(o.status == "pass" for o in outcomes) else 1
