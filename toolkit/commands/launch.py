"""`toolkit launch --spec FILE [--dry-run [--json]] [--timeout S] [--stall-timeout S] -- SCRIPT`

Renders the spec's launcher plan (toolkit.render.launchers) and, unless --dry-run, runs it under
the supervisor (toolkit.launch.supervisor): the real launcher for horovodrun, mpirun, deepspeed,
torchrun and srun, or one process per rank for `local`. When any rank fails or stalls, every
other rank is stopped and the launch exits with the status of one convention for every launcher
(toolkit.launch.outcome, also in `--help`), naming the rank that failed first, its host and its
last lines. The dry run prints the same plan: the launcher's argv and environment and, per
rank, what the launcher gives that rank. Arguments are shown shell-quoted for reading only; the
plan itself is argv lists end to end.

When the ranks run on this machine (`ranks_run_here`), the spec's device is resolved against the
GPUs it shows (toolkit.device): under CUDA a spec that fixes no process count gets one rank per
visible GPU (said on stderr), and one that fixes more ranks than GPUs is refused before anything
starts. The dry run does the same, so that what it prints is what runs, and adds one line on the
device, its binding and the collective backend (toolkit.render.layout.device_summary).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shlex
import sys
from collections.abc import Callable, Mapping
from typing import Any

from toolkit import engines
from toolkit.backends.registry import check_launcher
from toolkit.checkpoint import newest_verified
from toolkit.commands._output import add_spec
from toolkit.device import Device, check_gpus_for_ranks, resolve_device
from toolkit.errors import ToolkitError
from toolkit.gpu_facts import visible_gpus
from toolkit.launch.elastic import shrinking
from toolkit.launch.heartbeat import INTERVAL
from toolkit.launch.outcome import EXIT_STATUS_HELP, LaunchResult
from toolkit.launch.restarts import CannotRestart, say, with_restarts
from toolkit.launch.runner import execute, launch_plan_here
from toolkit.launch.slurm import allocation_tasks
from toolkit.launch.supervisor import DEFAULT_STALL_SECONDS
from toolkit.rank_variables import TOOLKIT_SPEC
from toolkit.render.launchers import LaunchPlan
from toolkit.render.layout import device_summary
from toolkit.spec import TrainSpec, load_spec
from toolkit.spec.hosts import LOCAL_NAMES


def _env_line(env: dict[str, str]) -> str:
    return " ".join(f"{name}={shlex.quote(value)}" for name, value in env.items())


def format_plan(plan: LaunchPlan, device: str | None = None, layout: str | None = None) -> str:
    """The plan as lines for people; `device`, a device summary, and `layout`, the parallel
    layout, follow the launcher line."""
    lines = [f"launcher: {plan.launcher} ({len(plan.ranks)} ranks)"]
    if device is not None:
        lines.append(device)
    if layout is not None:
        lines.append(f"layout: {layout}")
    if plan.argv is not None:
        lines.append(f"command: {shlex.join(plan.argv)}")
    if plan.env:
        lines.append(f"env: {_env_line(plan.env)}")
    for path, content in plan.files.items():
        lines.append(f"file {path}:")
        lines += [f"  {line}" for line in content.splitlines()]
    if plan.run_on:
        lines.append(f"runs on: {', '.join(plan.run_on)}")
    for host, env in plan.host_env.items():
        lines.append(f"env on {host}: {_env_line(env)}")
    if plan.env_file:
        lines.append(f"env file (the launcher exports it to every host): {plan.env_file}")
    if plan.note:
        lines.append(f"note: {plan.note}")
    for rank in plan.ranks:
        lines.append(f"rank {rank.rank} on {rank.host}:")
        if rank.argv is not None:
            lines.append(f"  command: {shlex.join(rank.argv)}")
        lines.append(f"  env: {_env_line(rank.env)}")
    return "\n".join(lines)


def seconds(option: str, text: str | None, minimum: float = 0.0) -> float | None:
    """A duration option's value: a finite number of seconds above `minimum`, or None if
    not given."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= minimum:
        allowed = f"more than {minimum:g}" if minimum else "a positive finite number of"
        raise ToolkitError(
            f"{option}={text!r}: must be {allowed} seconds.",
            f"write e.g. {option} 600, or leave {option} out",
        )
    return value


def within_allocation(spec: TrainSpec, environ: Mapping[str, str]) -> TrainSpec:
    """Inside a Slurm allocation, a spec that fixes no process count under srun or mpirun
    runs as many ranks as the allocation has tasks, as `srun script` and `mpirun script` do
    there (said on stderr); otherwise the spec as it is."""
    tasks = allocation_tasks(environ)
    if tasks is None or spec.fixed_world_size is not None:
        return spec
    if spec.launcher not in engines.ALLOCATION_LAUNCHERS:
        return spec
    print(f"toolkit launch: np {tasks} from the Slurm allocation (SLURM_NTASKS)", file=sys.stderr)
    data = spec.to_dict()
    data["launch"]["np"] = tasks
    return TrainSpec.from_dict(data)


def ranks_run_here(spec: TrainSpec, environ: Mapping[str, str]) -> bool:
    """Whether this machine runs every rank: the spec names no other host, and Slurm places
    none of them (srun's tasks, and inside an allocation the ranks of a launcher that fills
    it); a launcher outside an allocation places them as the plan does (on this machine)."""
    if len(spec.hosts) > 1 or any(host.name not in LOCAL_NAMES for host in spec.hosts):
        return False
    if spec.launcher not in engines.ALLOCATION_LAUNCHERS:
        return True
    return "SLURM_JOB_ID" not in environ and spec.launcher in engines.HOST_ORDER_LAUNCHERS


def fitted_to_this_host(
    spec: TrainSpec, environ: Mapping[str, str], gpus: Callable[[Mapping[str, str]], int]
) -> tuple[TrainSpec, Device | None]:
    """The spec for ranks on this machine, whose `gpus(environ)` GPUs they would see, and the
    device it resolves to there (None for device cpu or ranks elsewhere). Under CUDA a spec
    that fixes no process count gets one rank per GPU (said on stderr); more fixed ranks than
    GPUs are refused. A one-process job's replicas (MirroredStrategy) are left to the spec."""
    if spec.device == "cpu" or not ranks_run_here(spec, environ):
        return spec, None
    visible = gpus(environ)
    device = resolve_device(spec.device, visible)
    if device == "cpu" or spec.replicas_per_process() > 1:
        return spec, device
    if spec.fixed_world_size is not None:
        check_gpus_for_ranks(spec.fixed_world_size, visible)
        return spec, device
    plural = "" if visible == 1 else "s"
    print(
        f"toolkit: device cuda: {visible} GPU{plural} on this host, launch.np {visible}",
        file=sys.stderr,
    )
    data = spec.to_dict()
    data["launch"]["np"] = visible
    return TrainSpec.from_dict(data), device


def naming_its_file(spec: TrainSpec, path: str) -> TrainSpec:
    """`spec` with TOOLKIT_SPEC in launch.env: every rank's `toolkit.load_spec()` then reads
    the file the job was launched with (a variable the user set there wins)."""
    data = spec.to_dict()
    data["launch"]["env"].setdefault(TOOLKIT_SPEC, os.path.abspath(path))
    return TrainSpec.from_dict(data)


def resume_point(directory: str | None) -> str:
    """Where a restarted job continues, as its ranks will find it (toolkit.runtime.resume)."""
    if directory is None:
        return "step 0 (no checkpoint.dir)"
    try:
        newest = newest_verified(directory)
    except ToolkitError as error:
        return f"nowhere: {error.message}"
    if newest.checkpoint is None:
        return f"step 0 (no checkpoint in {directory} yet)"
    return f"step {newest.checkpoint.step} ({newest.checkpoint.path})"


def run(args: argparse.Namespace) -> int:
    timeout = seconds("--timeout", args.timeout)
    # Ranks beat once a second: a shorter stall timeout would stop healthy jobs.
    stall_timeout = seconds("--stall-timeout", args.stall_timeout, minimum=2 * INTERVAL)
    spec = within_allocation(load_spec(args.spec), os.environ)
    check_launcher(spec.backend, spec.framework_name, spec.launcher)
    spec, here = fitted_to_this_host(spec, os.environ, visible_gpus)
    spec = naming_its_file(spec, args.spec)
    plan = launch_plan_here(spec, args.command)
    if args.dry_run:
        device = device_summary(spec, here)
        ranks = len(plan.ranks)  # MirroredStrategy's replicas count, as in the batch contract
        layout = spec.layout_for(ranks * spec.replicas_per_process(ranks)).describe()
        if args.json:
            described = {**dataclasses.asdict(plan), "device": device, "layout": layout}
            print(json.dumps(described, indent=2))
        else:
            print(format_plan(plan, device, layout))
        return 0
    if stall_timeout is None:
        stall_timeout = spec.timeouts.stall_s
    restart_spec = (
        (lambda: spec)
        if spec.launch.min_np is None
        else shrinking(spec, spec.launch.python or sys.executable, say)
    )

    def start(restart: int) -> LaunchResult:
        """The first start, or a restart; a restart that cannot begin (a host gone, without
        launch.min_np) ends the job with the failure before it."""
        current = restart_spec() if restart else spec
        current_plan = plan if current is spec else launch_plan_here(current, args.command)
        try:
            return execute(current_plan, current, timeout=timeout, stall_timeout=stall_timeout)
        except ToolkitError as error:
            if not restart:
                raise
            raise CannotRestart(error.message) from None

    result = with_restarts(
        start, spec.launch.max_restarts, lambda: resume_point(spec.checkpoint.dir)
    )
    if not result.ok:
        print(f"toolkit launch: {result.report()}", file=sys.stderr)
    return result.returncode


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "launch",
        help="start a job under the spec's launcher",
        epilog=EXIT_STATUS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_spec(parser)
    parser.add_argument("--dry-run", action="store_true", help="print the plan, start nothing")
    parser.add_argument("--json", action="store_true", help="with --dry-run: the plan as JSON")
    parser.add_argument(
        "--timeout", metavar="SECONDS", help="stop every rank after this many seconds"
    )
    parser.add_argument(
        "--stall-timeout",
        metavar="SECONDS",
        help="stop the job when a rank sends no heartbeat for this long (ranks beat from "
        "toolkit.init every second; default: the spec's timeouts.stall_s, "
        f"{DEFAULT_STALL_SECONDS:g} unless set)",
    )
    parser.add_argument("command", nargs="*", metavar="-- SCRIPT ARGS", help="what each rank runs")
    parser.set_defaults(func=run)
