"""`toolkit launch --spec FILE --dry-run [--json] -- SCRIPT ARGS...`: show how the job starts.

With --dry-run it prints the launcher's argv and environment and, per rank, what the launcher
gives that rank (for `local`, each rank's own argv and environment, TF_CONFIG included).
Arguments are shown shell-quoted for reading only; the plan itself is argv lists. Real launching
is not wired yet: without --dry-run the spec is still validated, then a ToolkitError says so.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import sys
from typing import Any

from toolkit.commands._output import add_spec
from toolkit.errors import ToolkitError
from toolkit.render.launchers import LaunchContext, LaunchPlan, launch_plan
from toolkit.spec import load_spec


def machine_context() -> LaunchContext:
    """The facts about this machine that the (pure) launch renderers need."""
    return LaunchContext(uid=os.getuid(), cpu_count=os.cpu_count() or 1, python=sys.executable)


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
    plan = launch_plan(spec, args.command, machine_context())
    if not args.dry_run:
        raise ToolkitError(
            "toolkit launch: real launching is not wired yet",
            hint="use --dry-run to see the commands, and run them yourself",
        )
    if args.json:
        print(json.dumps(dataclasses.asdict(plan), indent=2))
    else:
        print(format_plan(plan))
    return 0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("launch", help="start a job (for now: --dry-run only)")
    add_spec(parser)
    parser.add_argument("--dry-run", action="store_true", help="print the plan, start nothing")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument("command", nargs="*", metavar="-- SCRIPT ARGS", help="what each rank runs")
    parser.set_defaults(func=run)
