"""`toolkit launch --spec FILE [--dry-run [--json]] [--timeout S] -- SCRIPT ARGS...`

Renders the spec's launcher plan (toolkit.render.launchers) and, unless --dry-run, runs it under
the supervisor (toolkit.launch.supervisor): the real launcher for horovodrun, mpirun, deepspeed,
torchrun and srun, or one process per rank for `local`. When any rank fails, every other rank is
stopped and the launch exits non-zero with that rank's last lines. The dry run prints the same
plan: the launcher's argv and environment and, per rank, what the launcher gives that rank.
Arguments are shown shell-quoted for reading only; the plan itself is argv lists end to end.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
from typing import Any

from toolkit.backends.registry import check_launcher
from toolkit.commands._output import add_spec
from toolkit.launch.runner import execute, machine_context
from toolkit.render.launchers import LaunchPlan, launch_plan
from toolkit.spec import load_spec


def _env_line(env: dict[str, str]) -> str:
    return " ".join(f"{name}={shlex.quote(value)}" for name, value in env.items())


def format_plan(plan: LaunchPlan) -> str:
    """The plan as lines for people."""
    lines = [f"launcher: {plan.launcher} ({len(plan.ranks)} ranks)"]
    if plan.argv is not None:
        lines.append(f"command: {shlex.join(plan.argv)}")
    if plan.env:
        lines.append(f"env: {_env_line(plan.env)}")
    for path, content in plan.files.items():
        lines.append(f"file {path}:")
        lines += [f"  {line}" for line in content.splitlines()]
    if plan.note:
        lines.append(f"note: {plan.note}")
    for rank in plan.ranks:
        lines.append(f"rank {rank.rank} on {rank.host}:")
        if rank.argv is not None:
            lines.append(f"  command: {shlex.join(rank.argv)}")
        lines.append(f"  env: {_env_line(rank.env)}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    check_launcher(spec.backend, spec.framework_name, spec.launcher)
    plan = launch_plan(spec, args.command, machine_context())
    if args.dry_run:
        print(json.dumps(dataclasses.asdict(plan), indent=2) if args.json else format_plan(plan))
        return 0
    result = execute(plan, spec, timeout=args.timeout)
    if not result.ok:
        print(f"toolkit launch: {result.report()}", file=sys.stderr)
    return result.returncode


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("launch", help="start a job under the spec's launcher")
    add_spec(parser)
    parser.add_argument("--dry-run", action="store_true", help="print the plan, start nothing")
    parser.add_argument("--json", action="store_true", help="with --dry-run: the plan as JSON")
    parser.add_argument(
        "--timeout", type=float, default=None, help="stop every rank after this many seconds"
    )
    parser.add_argument("command", nargs="*", metavar="-- SCRIPT ARGS", help="what each rank runs")
    parser.set_defaults(func=run)
