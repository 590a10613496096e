"""TrainSpec + command -> a Slurm batch script (text) that starts the job with srun or mpirun.

Pure. Every value that reaches the script is quoted with shlex.quote, so host names, paths and
script arguments stay data; tests run `bash -n` on the result. Inside an allocation the ranks'
places come from Slurm, so hosts become `--nodelist` and the command drops its own host list.
`srun` needs `--cpus-per-task` again: since Slurm 22.05 it no longer inherits it from sbatch.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from toolkit.render.launchers import base_env
from toolkit.render.layout import job_hosts, uniform_slots
from toolkit.spec import SpecError, TrainSpec

SUPPORTED = ("srun", "mpirun")


def _command(spec: TrainSpec, program: list[str]) -> list[str]:
    if spec.launcher == "srun":
        threads = spec.launch.threads_per_rank
        return ["srun", f"--cpus-per-task={threads}", "--kill-on-bad-exit=1", *program]
    argv = ["mpirun", "-np", str(spec.world_size), "--bind-to", "none", "--map-by", "slot"]
    for name in base_env(spec):
        argv += ["-x", name]
    return argv + program


def sbatch_script(spec: TrainSpec, command: Sequence[str]) -> str:
    """The batch script for `sbatch`; SpecError for launchers Slurm cannot start this way."""
    if spec.launcher not in SUPPORTED:
        raise SpecError.single(
            "launch.launcher",
            spec.launcher,
            "a Slurm batch script starts ranks with srun or mpirun",
            hint="set launch.launcher: srun",
        )
    if not command:
        raise SpecError.single("command", [], "must name a script to run")
    hosts = job_hosts(spec)
    python = spec.launch.python or "python"
    program = [python, *command] if command[0].endswith(".py") else list(command)
    options = [
        f"--job-name={spec.launch.job_name}",
        f"--nodes={len(hosts)}",
        f"--ntasks={spec.world_size}",
        f"--cpus-per-task={spec.launch.threads_per_rank}",
        f"--time={spec.launch.time_limit}",
    ]
    per_node = uniform_slots(spec)
    if per_node is not None:
        options.append(f"--ntasks-per-node={per_node}")
    if spec.hosts:
        options.append("--nodelist=" + ",".join(host.name for host in spec.hosts))
    if spec.launch.partition:
        options.append(f"--partition={spec.launch.partition}")
    lines = ["#!/bin/bash", *(f"#SBATCH {shlex.quote(option)}" for option in options)]
    lines += ["", "set -euo pipefail", ""]
    for name, value in base_env(spec).items():
        lines.append(f"export {name}={shlex.quote(value)}")
    lines.append('MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"')
    lines.append("export MASTER_ADDR")
    lines.append(f"export MASTER_PORT={shlex.quote(str(spec.launch.master_port))}")
    lines += ["", shlex.join(_command(spec, program)), ""]
    return "\n".join(lines)
