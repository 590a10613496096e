"""`toolkit doctor [--engine NAME ...] [--json]`: exit 0 only when every asked engine works."""

from __future__ import annotations

import argparse
import json
from typing import Any

from toolkit.doctor import ENGINES, run_doctor
from toolkit.doctor.checks import ALIASES
from toolkit.doctor.format import format_report


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "doctor", help="check that the engines and launchers are installed and work together"
    )
    parser.add_argument(
        "--engine",
        action="append",
        default=[],
        choices=sorted([*ENGINES, *ALIASES]),
        help="check only this engine (repeatable); default: all",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON report")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    report = run_doctor(args.engine)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(format_report(report))
    return 0 if report.ok else 1
