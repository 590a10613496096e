"""TrainSpec + command -> a Slurm batch script (text) that starts the job with the spec's launcher.

Pure. Every value that reaches the script is quoted with shlex.quote, so host names, paths and
script arguments stay data; tests run `bash -n` on the result. The allocation is the spec's hosts
(`--nodelist`, one task per slot) or one node, and each launcher runs inside it as a user would
run it there:

- srun and mpirun take the ranks' places from Slurm, so the command drops its own host list.
  `srun` needs `--cpus-per-task` again: since Slurm 22.05 it no longer inherits it from sbatch.
- torchrun runs once per node: `srun --ntasks-per-node=1` starts it on every node of the
  allocation, all meeting at the first node (c10d rendezvous, the job id as rendezvous id).
- horovodrun and the deepspeed launcher start every rank from the batch host themselves (over
  ssh or pdsh for other hosts), so they run once, with the command `toolkit launch` would run.
- local (the toolkit's own launcher, one machine) runs `python -m toolkit launch` with the spec,
  which the script writes next to the job's output first.

With checkpoint.save_on_signal the job is preemptible: `--signal=USR1@preempt_s` has Slurm
signal the job's steps that long before its time limit, `--requeue` lets Slurm requeue it
when it is preempted, and a job that ends with status 75 (every rank saved) requeues itself
with `scontrol requeue`, so that its next run resumes from the checkpoint. Slurm's signal
reaches the ranks under srun and `toolkit launch` under local, which passes it on; the other
launchers would not pass it on (torchrun and mpirun die of a SIGUSR1, horovodrun and the
deepspeed launcher run outside a job step), so they are refused. `launch.max_restarts` is
`toolkit launch`'s, so a batch script has it under the local launcher only.

For device cuda the allocation asks for `--gpus-per-node` (toolkit.render.layout.requested_gpus),
which every step inside it inherits, and a comment says how the ranks bind them and which
backend carries their collectives. cpu and auto ask for no GPU.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Sequence

from toolkit import engines
from toolkit.exit_status import PREEMPTED
from toolkit.render.launchers import LaunchContext, base_env, launch_plan
from toolkit.render.layout import (
    cluster_threads,
    device_summary,
    job_hosts,
    requested_gpus,
    uniform_slots,
)
from toolkit.spec import SpecError, TrainSpec

SPEC_COPY = '.toolkit/spec-"$SLURM_JOB_ID".json'
"""Where the script writes the spec for `toolkit launch` (relative to the submit directory)."""

_BATCH_CONTEXT = LaunchContext(uid=-1, cpu_count=1 << 20, python="python")
"""The renderers' machine facts inside a batch job: not root (no --allow-run-as-root), never
oversubscribed (Slurm gave one core per rank), and `python` from the job's PATH."""


def _program(spec: TrainSpec, command: list[str]) -> list[str]:
    python = spec.launch.python or "python"
    return [python, *command] if command[0].endswith(".py") else list(command)


def _srun(spec: TrainSpec, command: list[str]) -> list[str]:
    threads = cluster_threads(spec)
    return ["srun", f"--cpus-per-task={threads}", "--kill-on-bad-exit=1", *_program(spec, command)]


def _mpirun(spec: TrainSpec, command: list[str]) -> list[str]:
    argv = ["mpirun", "-np", str(spec.world_size), "--bind-to", "none", "--map-by", "slot"]
    for name in base_env(spec):
        argv += ["-x", name]
    return argv + _program(spec, command)


def _torchrun(spec: TrainSpec, command: list[str]) -> list[str]:
    nodes = len(job_hosts(spec))
    per_node = uniform_slots(spec) or 1
    argv = ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1"]
    argv += [f"--cpus-per-task={cluster_threads(spec) * per_node}", "--kill-on-bad-exit=1"]
    argv += ["torchrun", "--nnodes", str(nodes), "--nproc-per-node", str(per_node)]
    argv += ["--rdzv-backend", "c10d", "--rdzv-endpoint", "$MASTER_ADDR:$MASTER_PORT"]
    argv += ["--rdzv-id", "$SLURM_JOB_ID", "--max-restarts", "0"]
    if not command[0].endswith(".py"):
        argv.append("--no-python")
    return argv + command


def _as_planned(spec: TrainSpec, command: list[str]) -> list[str]:
    """The launcher command `toolkit launch` would run (horovodrun, deepspeed)."""
    argv = launch_plan(spec, command, _BATCH_CONTEXT).argv
    if argv is None:
        raise ValueError(f"the {spec.launcher} plan has no single command to run")
    return argv


def _local(spec: TrainSpec, command: list[str]) -> list[str]:
    return ["python", "-m", "toolkit", "launch", "--spec", SPEC_COPY, "--", *command]


COMMANDS: dict[str, Callable[[TrainSpec, list[str]], list[str]]] = {
    "srun": _srun,
    "mpirun": _mpirun,
    "torchrun": _torchrun,
    "horovodrun": _as_planned,
    "deepspeed": _as_planned,
    "local": _local,
}
"""Launcher -> the command the batch script runs inside its allocation."""

_EXPANDED = ("$MASTER_ADDR:$MASTER_PORT", "$SLURM_JOB_ID")
"""Words left for bash to expand (double-quoted); every other word is single-quoted."""


def _quote(word: str) -> str:
    if word == SPEC_COPY:  # already quoted where it must be
        return word
    return f'"{word}"' if word in _EXPANDED else shlex.quote(word)


def sbatch_script(spec: TrainSpec, command: Sequence[str]) -> str:
    """The batch script for `sbatch`, running the spec's launcher inside the allocation."""
    if not command:
        raise SpecError.single("command", [], "must name a script to run", hint="-- SCRIPT ARGS")
    hosts = job_hosts(spec)
    options = [
        f"--job-name={spec.launch.job_name}",
        f"--nodes={len(hosts)}",
        f"--ntasks={spec.world_size}",
        f"--cpus-per-task={cluster_threads(spec)}",
        f"--time={spec.launch.time_limit}",
    ]
    per_node = uniform_slots(spec)
    if per_node is not None:
        options.append(f"--ntasks-per-node={per_node}")
    gpus = requested_gpus(spec)
    if gpus is not None:
        options.append(f"--gpus-per-node={gpus}")
    if spec.hosts:
        options.append("--nodelist=" + ",".join(host.name for host in spec.hosts))
    if spec.launch.partition:
        options.append(f"--partition={spec.launch.partition}")
    if spec.launch.max_restarts and spec.launcher != engines.SELF_LAUNCHER:
        raise SpecError.single(
            "launch.max_restarts",
            spec.launch.max_restarts,
            f"0 under launch.launcher {spec.launcher} in a batch script: restarts are "
            "`toolkit launch`'s, and the script runs the launcher itself",
            hint="use launch.launcher local (the script then runs toolkit launch), or "
            "checkpoint.save_on_signal with Slurm's requeue",
        )
    preemptible = spec.checkpoint.save_on_signal
    if preemptible:
        _refuse_unsignalled(spec)
        options += [f"--signal=USR1@{spec.checkpoint.preempt_s}", "--requeue"]
    lines = ["#!/bin/bash", *(f"#SBATCH {shlex.quote(option)}" for option in options)]
    if gpus is not None:
        lines.append(f"# {device_summary(spec)}")
    lines += ["", "set -euo pipefail", ""]
    for name, value in base_env(spec, threads=cluster_threads(spec)).items():
        lines.append(f"export {name}={shlex.quote(value)}")
    lines.append('MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"')
    lines.append("export MASTER_ADDR")
    lines.append(f"export MASTER_PORT={shlex.quote(str(spec.launch.master_port))}")
    # Open MPI (mpirun, and horovodrun --mpi under it) refuses to start as root unless told;
    # who runs the job is only known when it runs.
    lines.append('if [ "$(id -u)" = 0 ]; then')
    lines.append("  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
    lines.append("fi")
    argv = COMMANDS[spec.launcher](spec, list(command))
    if SPEC_COPY in argv:
        lines += ["mkdir -p .toolkit", f"cat > {SPEC_COPY} <<'TOOLKIT_SPEC'"]
        lines += [json.dumps(spec.to_dict()), "TOOLKIT_SPEC"]
    for path, content in launch_plan(spec, list(command), _BATCH_CONTEXT).files.items():
        lines += [f"mkdir -p {shlex.quote(path.rpartition('/')[0] or '.')}"]
        lines += [
            f"cat > {shlex.quote(path)} <<'TOOLKIT_FILE'",
            content.rstrip("\n"),
            "TOOLKIT_FILE",
        ]
    run = " ".join(_quote(word) for word in argv)
    if not preemptible:
        return "\n".join([*lines, "", run, ""])
    lines += ["", "status=0", f"{run} || status=$?"]
    lines.append(f'if [ "$status" = {PREEMPTED} ]; then  # preempted: every rank saved; run again')
    lines += ['  scontrol requeue "$SLURM_JOB_ID"', "fi", 'exit "$status"', ""]
    return "\n".join(lines)


def _refuse_unsignalled(spec: TrainSpec) -> None:
    if spec.launcher not in engines.SLURM_SIGNALLED:
        raise SpecError.single(
            "checkpoint.save_on_signal",
            True,
            f"false under launch.launcher {spec.launcher} in a batch script: Slurm's signal "
            "would not reach the ranks through it",
            hint="use launch.launcher srun or local, or set checkpoint.save_on_signal: false",
        )
