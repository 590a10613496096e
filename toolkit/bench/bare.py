"""The launch command each launcher's own documentation gives for N processes on this machine,
with none of the toolkit's settings: what `toolkit bench step --vs-defaults` starts the native
script with.

What the toolkit's plan adds and these leave out: OMP_NUM_THREADS and the other variables of
`toolkit.render.launchers.base_env` (Horovod's fusion, cycle time and cache among them), the
horovodrun tuning flags, and mpirun's `--bind-to none --map-by slot`. What stays is what picks
the variant (the process count, Horovod's controller), a free rendezvous port (jobs share this
machine), and for the toolkit's local launcher, which TensorFlow needs as it has no launcher of
its own, each worker's TF_CONFIG.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from toolkit.errors import ToolkitError
from toolkit.launch.executables import find_launcher
from toolkit.launch.machine_settings import for_this_machine
from toolkit.launch.runner import launch_plan_here
from toolkit.launch.supervisor import LaunchResult, run_launcher, run_local
from toolkit.render.launchers import base_env
from toolkit.spec import TrainSpec


@dataclass(frozen=True)
class BareLaunch:
    argv: list[str] | None
    """The launcher command; None for the local launcher (each rank runs `program`)."""
    program: list[str]
    rank_envs: list[dict[str, str]]
    """Per-rank variables, for the local launcher only."""


def _python(script: str, args: list[str]) -> list[str]:
    return [sys.executable, script, *args]


def _torchrun(spec: TrainSpec, script: str, args: list[str]) -> BareLaunch:
    argv = ["torchrun", "--nproc-per-node", str(spec.world_size)]
    argv += ["--master-port", str(spec.launch.master_port), script, *args]
    return BareLaunch(argv, [], [])


def _horovodrun(spec: TrainSpec, script: str, args: list[str]) -> BareLaunch:
    n = str(spec.world_size)
    argv = ["horovodrun", "-np", n, "-H", f"localhost:{n}", f"--{spec.horovod.controller}"]
    return BareLaunch([*argv, *_python(script, args)], [], [])


def _mpirun(spec: TrainSpec, script: str, args: list[str]) -> BareLaunch:
    argv = ["mpirun"]
    if os.getuid() == 0:
        argv.append("--allow-run-as-root")
    argv += ["-np", str(spec.world_size)]
    if spec.world_size > (os.cpu_count() or 1):
        argv.append("--oversubscribe")
    return BareLaunch([*argv, *_python(script, args)], [], [])


def _deepspeed(spec: TrainSpec, script: str, args: list[str]) -> BareLaunch:
    argv = ["deepspeed", "--num_gpus", str(spec.world_size)]
    argv += ["--master_port", str(spec.launch.master_port), script, *args]
    return BareLaunch(argv, [], [])


def _local(spec: TrainSpec, script: str, args: list[str]) -> BareLaunch:
    program = _python(script, args)
    plan = launch_plan_here(spec, program)
    toolkit_settings = base_env(spec)
    rank_envs = [
        {name: value for name, value in rank.env.items() if name not in toolkit_settings}
        for rank in plan.ranks
    ]
    return BareLaunch(None, program, rank_envs)


BARE: dict[str, Callable[[TrainSpec, str, list[str]], BareLaunch]] = {
    "torchrun": _torchrun,
    "horovodrun": _horovodrun,
    "mpirun": _mpirun,
    "deepspeed": _deepspeed,
    "local": _local,
}


def bare_launch(spec: TrainSpec, script: str, args: list[str]) -> BareLaunch:
    builder = BARE.get(spec.launcher)
    if builder is None:
        raise ToolkitError(
            f"launch.launcher={spec.launcher!r}: the bench has no bare command for it "
            f"(it has {', '.join(BARE)})",
            "run --vs-defaults with one of those launchers",
        )
    return builder(for_this_machine(spec), script, args)


def clean_environment(spec: TrainSpec, env: Mapping[str, str]) -> dict[str, str]:
    """`env` without the variables the toolkit would set (so none leaks in from outside)."""
    toolkit_settings = base_env(spec)
    return {name: value for name, value in env.items() if name not in toolkit_settings}


def execute_bare(spec: TrainSpec, launch: BareLaunch, *, timeout: float | None) -> LaunchResult:
    env = clean_environment(spec, os.environ)
    if launch.argv is None:
        return run_local(
            launch.program,
            len(launch.rank_envs),
            env=env,
            master_addr=spec.master_addr,
            master_port=spec.launch.master_port,
            rank_envs=launch.rank_envs,
            timeout=timeout,
            echo=False,
        )
    executable = find_launcher(launch.argv[0])
    if executable is None:
        raise ToolkitError(
            f"launcher {launch.argv[0]!r} is not installed here", "run `toolkit doctor`"
        )
    return run_launcher([executable, *launch.argv[1:]], env=env, timeout=timeout, echo=False)
