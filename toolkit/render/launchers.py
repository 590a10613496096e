"""TrainSpec + a command -> what each launcher is run with: argv lists, env, files, per-rank env.

Pure functions: facts about the machine that change the command (the user id for
`--allow-run-as-root`, the core count for `--oversubscribe`, the interpreter) come in through
`LaunchContext`; nothing here reads the environment, touches files or starts anything. Commands
are argv lists from end to end, never shell strings, so a script argument like "a; rm -rf /"
stays one argv element and no host name or argument ever meets a shell here.

For launchers that spawn the ranks themselves (horovodrun, mpirun, deepspeed, torchrun, srun),
a plan holds the one launcher argv and, per rank, the variables that launcher gives the rank
(values only known at run time are shown as RUNTIME). For `local`, the toolkit's own launcher,
each rank has its own argv and full environment, including TF_CONFIG for tf.distribute.

Launcher notes:
- deepspeed: like native `deepspeed`, the script gets `--local_rank=N` appended (DeepSpeed's
  example scripts parse it and check it against LOCAL_RANK), unless `launch.pass_local_rank`
  is false (`--no_local_rank`: the script's argv stays its own, ranks read LOCAL_RANK). It runs
  `.py` scripts with its own interpreter, so `python X.py` is given to it as `X.py`. A hostfile
  is only passed for remote or several hosts: with any hostfile it takes the multi-node path
  and checks ssh even to localhost.
- torchrun: c10d rendezvous at master_addr:master_port; the same command runs on every host
  (`toolkit launch` starts it on each host over ssh: `LaunchPlan.run_on`).
- mpirun: `--bind-to none` (ranks share few cores), `-x NAME` forwards each variable the plan
  sets, `--allow-run-as-root` only for uid 0, `--oversubscribe` only when np exceeds the slots
  (the hosts' slots, or the cores without hosts).
- Several hosts: `launch.ssh` reaches each launcher in its own form (mpirun's plm_rsh_args,
  horovodrun's --ssh-port/--ssh-identity-file, pdsh's PDSH_SSH_ARGS_APPEND with the deepspeed
  launcher's --ssh_port), and `launch.interface` as mpirun's btl/oob_tcp_if_include,
  horovodrun's --network-interfaces and GLOO_SOCKET_IFNAME (torch's Gloo, DDP and DeepSpeed).
  Variables reach remote ranks by `-x` (mpirun), horovodrun's own export of its environment,
  or the file the deepspeed launcher exports to every host (`LaunchPlan.env_file`).
- device cuda (toolkit.render.layout): each rank binds `cuda:<local rank>`, so the per-host
  process counts (deepspeed's `--num_gpus`, horovodrun's `-H host:slots`, torchrun's
  `--nproc-per-node`) are the ranks per host, one GPU each; a larger `launch.gpus_per_host`
  leaves GPUs unused rather than moving ranks. `--num_gpus N` makes the deepspeed launcher give
  every host's ranks GPUs 0..N-1 (it sets CUDA_VISIBLE_DEVICES itself, ignoring one the user
  set); `--include` would name GPU ids, which the spec does not hold. srun asks Slurm for
  `--gpus-per-node`. DeepSpeed engines get DS_ACCELERATOR for cpu and cuda: DeepSpeed picks its
  accelerator when it is imported, before the backend could choose.

Longer than most modules on purpose: one plan builder per launcher, read top to bottom beside
the notes above, sharing the per-rank variable helpers; split, the notes and the builders they
explain would sit in different files.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

from toolkit import engines
from toolkit.rank_variables import (
    TOOLKIT_LOCAL_RANK,
    TOOLKIT_MASTER_ADDR,
    TOOLKIT_MASTER_PORT,
    TOOLKIT_RANK,
    TOOLKIT_WORLD_SIZE,
)
from toolkit.render import horovod
from toolkit.render.hostfile import hostfile
from toolkit.render.layout import (
    Slot,
    cluster_threads,
    job_hosts,
    rank_layout,
    rendered_threads,
    requested_gpus,
    uniform_slots,
)
from toolkit.spec import Host, SpecError, TrainSpec
from toolkit.spec.hosts import LOCAL_NAMES

RUNTIME = "<set at run time>"
"""Value of a rank variable that only the launcher knows once it runs."""


@dataclass(frozen=True, kw_only=True)
class LaunchContext:
    """Facts about the launching machine, injected so the renderers stay pure."""

    uid: int
    """User id of the launching process (0 = root)."""
    cpu_count: int
    """Cores on this machine: more ranks than this (without hosts) needs oversubscription."""
    python: str
    """Interpreter for .py scripts when the spec's launch.python is not set."""
    run_dir: str = ".toolkit"
    """Directory for generated files such as the deepspeed hostfile."""
    forward: tuple[str, ...] = ()
    """Variables the caller adds to the launcher's environment when it runs the plan (the
    supervisor's), which the launcher must carry to every rank, including remote ones."""


@dataclass(frozen=True, kw_only=True)
class RankPlan:
    """One rank: where it runs and what the launcher gives it."""

    rank: int
    """Global rank."""
    host: str
    """Host the rank runs on."""
    env: dict[str, str]
    """Variables the launcher sets for this rank (all of its extra environment for local)."""
    argv: list[str] | None = None
    """The rank's own command, for the local launcher; None when a launcher spawns it."""


@dataclass(frozen=True, kw_only=True)
class LaunchPlan:
    """Everything needed to start a job; executed elsewhere (toolkit.launch)."""

    launcher: str
    """Which launcher."""
    argv: list[str] | None
    """The launcher command; None for local (see each rank's argv)."""
    env: dict[str, str]
    """Variables added to the launcher's environment (and forwarded to every rank)."""
    ranks: list[RankPlan]
    """Per rank, in rank order."""
    files: dict[str, str] = field(default_factory=dict)
    """Files to write before launching: path -> content."""
    note: str | None = None
    """Anything the user must do by hand, e.g. run the command on every host."""
    run_on: tuple[str, ...] = ()
    """Hosts on which `argv` itself runs, once each (torchrun on several hosts; `toolkit
    launch` starts it there over ssh); empty = once, on this machine."""
    host_env: dict[str, dict[str, str]] = field(default_factory=dict)
    """Variables added on one host of `run_on` only: host -> NAME -> value."""
    env_file: str | None = None
    """A file of NAME=VALUE lines the launcher exports on every host (the deepspeed launcher's
    DS_ENV_FILE): the runner writes `env` and the forwarded variables into it."""


Builder = Callable[[TrainSpec, list[str], LaunchContext], LaunchPlan]


def program(spec: TrainSpec, command: Sequence[str], ctx: LaunchContext) -> list[str]:
    """The per-rank command: `python script.py args` for .py scripts, else the command as is."""
    if not command:
        raise SpecError.single("command", list(command), "must name a script to run")
    if command[0].endswith(".py"):
        return [spec.launch.python or ctx.python, *command]
    return list(command)


def base_env(spec: TrainSpec, *, threads: int | None = None) -> dict[str, str]:
    """Variables every rank gets from the toolkit: threads (`threads`, else
    `rendered_threads`), Horovod settings, DeepSpeed's accelerator, the network interface for
    torch's Gloo, launch.env (last, so it can override any of them)."""
    env = {"OMP_NUM_THREADS": str(rendered_threads(spec) if threads is None else threads)}
    job_env = _engine(spec).job_env
    if job_env is not None:
        env.update(_resolve(job_env)(spec))
    env.update(accelerator_env(spec))
    if spec.launch.interface is not None:
        env["GLOO_SOCKET_IFNAME"] = spec.launch.interface
    env.update(spec.launch.env)
    return env


def accelerator_env(spec: TrainSpec) -> dict[str, str]:
    """DS_ACCELERATOR for engines built on DeepSpeed (the table's `deepspeed_settings`) when
    the spec names the device: DeepSpeed fixes its accelerator at import, so the rank is told
    before the backend imports it. Nothing for auto: DeepSpeed then detects it as the toolkit
    resolves auto (CUDA where torch sees a GPU), and the backend checks the two agree."""
    if spec.device == "auto" or not _engine(spec).deepspeed_settings:
        return {}
    return {"DS_ACCELERATOR": spec.device}


def _engine(spec: TrainSpec) -> engines.Engine:
    return engines.engine(spec.backend, spec.framework_name)


def _resolve(target: str) -> Callable[[TrainSpec], Any]:
    """The renderer a "module:function" entry of the engine table names."""
    module_name, _, name = target.partition(":")
    function: Callable[[TrainSpec], Any] = getattr(importlib.import_module(module_name), name)
    return function


def _torch_env(spec: TrainSpec, slot: Slot) -> dict[str, str]:
    return {
        "RANK": str(slot.rank),
        "LOCAL_RANK": str(slot.local_rank),
        "WORLD_SIZE": str(spec.world_size),
        "LOCAL_WORLD_SIZE": str(slot.local_size),
        "MASTER_ADDR": spec.master_addr,
        "MASTER_PORT": str(spec.launch.master_port),
    }


def _ompi_env(spec: TrainSpec, slot: Slot) -> dict[str, str]:
    return {
        "OMPI_COMM_WORLD_RANK": str(slot.rank),
        "OMPI_COMM_WORLD_SIZE": str(spec.world_size),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(slot.local_rank),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(slot.local_size),
        "OMPI_COMM_WORLD_NODE_RANK": str(slot.node),
    }


def _ranks(spec: TrainSpec, env_of: Callable[[Slot], dict[str, str]]) -> list[RankPlan]:
    return [RankPlan(rank=s.rank, host=s.host, env=env_of(s)) for s in rank_layout(spec)]


def _is_local(spec: TrainSpec) -> bool:
    return all(host.name in LOCAL_NAMES for host in spec.hosts) and len(spec.hosts) <= 1


def _mpirun_remote_options(spec: TrainSpec) -> list[str]:
    """Open MPI's options for reaching other hosts (its ssh) and its TCP interface."""
    options: list[str] = []
    ssh = spec.launch.ssh.options()
    if ssh:  # one element: Open MPI splits it at spaces (the spec refuses paths with spaces)
        options += ["--mca", "plm_rsh_args", " ".join(ssh)]
    interface = spec.launch.interface
    if interface is not None:
        options += ["--mca", "btl_tcp_if_include", interface]
        options += ["--mca", "oob_tcp_if_include", interface]
    return options


def mpirun(spec: TrainSpec, command: list[str], ctx: LaunchContext) -> LaunchPlan:
    """Open MPI's mpirun."""
    env = base_env(spec)
    capacity = sum(h.slots for h in spec.hosts) if spec.hosts else ctx.cpu_count
    argv = ["mpirun"]
    if ctx.uid == 0:
        argv.append("--allow-run-as-root")
    argv += ["-np", str(spec.world_size)]
    if spec.hosts:
        argv += ["-H", ",".join(host.entry() for host in spec.hosts)]
    if spec.world_size > capacity:
        argv.append("--oversubscribe")
    argv += ["--bind-to", "none", "--map-by", "slot"]
    if not _is_local(spec):
        argv += _mpirun_remote_options(spec)
    for name in [*env, *ctx.forward]:
        argv += ["-x", name]
    argv += program(spec, command, ctx)
    return LaunchPlan(
        launcher="mpirun", argv=argv, env=env, ranks=_ranks(spec, lambda s: _ompi_env(spec, s))
    )


def _cross_nodes(layout: list[Slot]) -> dict[int, list[int]]:
    """Local rank -> the nodes having it: Horovod's cross communicator joins those ranks."""
    nodes: dict[int, list[int]] = {}
    for slot in layout:
        nodes.setdefault(slot.local_rank, []).append(slot.node)
    return {local_rank: sorted(set(found)) for local_rank, found in nodes.items()}


def _horovod_gloo_env(spec: TrainSpec, slot: Slot, cross: dict[int, list[int]]) -> dict[str, str]:
    hosts = job_hosts(spec)
    peers = cross[slot.local_rank]
    return {
        "HOROVOD_RANK": str(slot.rank),
        "HOROVOD_SIZE": str(spec.world_size),
        "HOROVOD_LOCAL_RANK": str(slot.local_rank),
        "HOROVOD_LOCAL_SIZE": str(slot.local_size),
        "HOROVOD_CROSS_RANK": str(peers.index(slot.node)),
        "HOROVOD_CROSS_SIZE": str(len(peers)),
        "HOROVOD_HOSTNAME": hosts[slot.node].name,
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": RUNTIME,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": RUNTIME,
    }


def _horovodrun_remote_options(spec: TrainSpec) -> list[str]:
    """horovodrun's ssh and interface options (it exports its whole environment itself)."""
    if _is_local(spec):
        return []
    ssh, options = spec.launch.ssh, []
    if ssh.config_file is not None:
        raise SpecError.single(
            "launch.ssh.config_file",
            ssh.config_file,
            "horovodrun has no option for an ssh configuration file",
            hint="put its settings in ~/.ssh/config, or use launch.ssh.port and identity_file",
        )
    if ssh.port is not None:
        options += ["--ssh-port", str(ssh.port)]
    if ssh.identity_file is not None:
        options += ["--ssh-identity-file", ssh.identity_file]
    if spec.launch.interface is not None:
        options += ["--network-interfaces", spec.launch.interface]
    return options


def horovodrun(spec: TrainSpec, command: list[str], ctx: LaunchContext) -> LaunchPlan:
    """Horovod's horovodrun, with the Gloo or MPI controller (it adds the MPI root flag)."""
    hosts = ",".join(host.entry() for host in job_hosts(spec))
    argv = ["horovodrun", "-np", str(spec.world_size), "-H", hosts]
    argv += horovod.horovodrun_flags(spec) + _horovodrun_remote_options(spec)
    argv += program(spec, command, ctx)
    if spec.horovod.controller == "gloo":
        cross = _cross_nodes(rank_layout(spec))
        ranks = _ranks(spec, lambda s: _horovod_gloo_env(spec, s, cross))
    else:
        ranks = _ranks(spec, lambda s: _ompi_env(spec, s))
    env = base_env(spec)
    return LaunchPlan(launcher="horovodrun", argv=argv, env=env, ranks=ranks)


def _is_python(program: str) -> bool:
    return re.fullmatch(r"python[0-9.]*", PurePath(program).name) is not None


def _as_deepspeed_runs_it(command: list[str]) -> list[str]:
    """`python X.py ARGS` becomes `X.py ARGS`, the form native `deepspeed` takes: DeepSpeed runs a
    .py script with its own interpreter and puts `--local_rank=N` after the script. Other
    commands stay; with `--no_python` DeepSpeed would put `--local_rank` right after the
    program, which for `python -m mod` or `python -c` is the interpreter's own options, so an
    interpreter-first command is started with `--no_local_rank` (LOCAL_RANK is still set)."""
    if len(command) >= 2 and _is_python(command[0]) and command[1].endswith(".py"):
        return command[1:]
    return command


def _deepspeed_remote_options(spec: TrainSpec, env: dict[str, str]) -> list[str]:
    """The deepspeed launcher's ssh options; `env` gets pdsh's. Its own ssh check runs a bare
    `ssh -p PORT HOST hostname` that knows no identity or config file, so with those it is
    skipped: `toolkit launch` checks every host with the spec's settings before starting."""
    ssh, options = spec.launch.ssh, []
    if ssh.port is not None:
        options += ["--ssh_port", str(ssh.port)]
    pdsh_args = ["-F", ssh.config_file] if ssh.config_file else []
    if ssh.identity_file:
        pdsh_args += ["-i", ssh.identity_file]
    if pdsh_args:
        env["PDSH_SSH_ARGS_APPEND"] = " ".join(pdsh_args)
        options.append("--no_ssh_check")
    return options


def deepspeed(spec: TrainSpec, command: list[str], ctx: LaunchContext) -> LaunchPlan:
    """The deepspeed launcher (pdsh/openmpi/mvapich/slurm underneath for several hosts)."""
    argv = ["deepspeed"]
    files: dict[str, str] = {}
    env = base_env(spec)
    env_file = None
    hosts = job_hosts(spec)
    if not _is_local(spec):
        path = f"{ctx.run_dir}/hostfile"
        files[path] = hostfile(spec)
        argv += ["--hostfile", path, "--launcher", spec.launch.multinode_launcher]
        argv += ["--num_nodes", str(len(hosts))]
        argv += _deepspeed_remote_options(spec, env)
        env_file = f"{ctx.run_dir}/deepspeed_env"
    per_node = uniform_slots(spec)
    if per_node is not None:
        argv += ["--num_gpus", str(per_node)]
    argv += ["--master_addr", spec.master_addr, "--master_port", str(spec.launch.master_port)]
    command = _as_deepspeed_runs_it(command)
    interpreter_first = bool(command) and _is_python(command[0])
    if not spec.launch.pass_local_rank or interpreter_first:
        argv.append("--no_local_rank")
    if not command or not command[0].endswith(".py"):
        argv.append("--no_python")
    argv += list(command)

    def env_of(slot: Slot) -> dict[str, str]:
        env = _torch_env(spec, slot)
        del env["LOCAL_WORLD_SIZE"]
        env["LOCAL_SIZE"] = str(slot.local_size)
        env["CROSS_RANK"] = str(slot.node)
        env["CROSS_SIZE"] = str(len(hosts))
        return env

    return LaunchPlan(
        launcher="deepspeed",
        argv=argv,
        env=env,
        ranks=_ranks(spec, env_of),
        files=files,
        env_file=env_file,
    )


def torchrun(spec: TrainSpec, command: list[str], ctx: LaunchContext) -> LaunchPlan:
    """PyTorch's torchrun with c10d rendezvous; several hosts run the same command each."""
    hosts = job_hosts(spec)
    per_node = uniform_slots(spec)
    if per_node is None:  # validation requires equal slots; kept as an error, not an assert
        raise SpecError.single("launch.hosts", spec.launch.hosts, "torchrun needs equal slots")
    argv = ["torchrun", "--nnodes", str(len(hosts)), "--nproc-per-node", str(per_node)]
    argv += ["--rdzv-backend", "c10d"]
    argv += ["--rdzv-endpoint", f"{spec.master_addr}:{spec.launch.master_port}"]
    argv += ["--rdzv-id", spec.launch.job_name, "--max-restarts", "0"]
    if not command or not command[0].endswith(".py"):
        argv.append("--no-python")
    argv += list(command)

    def env_of(slot: Slot) -> dict[str, str]:
        env = _torch_env(spec, slot)
        env.update(GROUP_RANK=str(slot.node), MASTER_ADDR=RUNTIME, MASTER_PORT=RUNTIME)
        return env

    several = len(hosts) > 1
    note = None
    if several:
        note = f"the same command on each of the {len(hosts)} hosts (toolkit launch runs it there "
        note += "over ssh)"
    return LaunchPlan(
        launcher="torchrun",
        argv=argv,
        env=base_env(spec),
        ranks=_ranks(spec, env_of),
        note=note,
        run_on=tuple(host.name for host in hosts) if several else (),
        host_env=_agent_env(hosts, spec.master_addr) if several else {},
    )


def _agent_env(hosts: Sequence[Host], master_addr: str) -> dict[str, dict[str, str]]:
    """Tell each torchrun agent whether it hosts the rendezvous store (the first host, at
    `master_addr`) and the address the others reach it by. Left to itself, torchrun guesses
    both from the machine's hostname: it hosts the store only when the endpoint matches the
    hostname or its addresses, which misses an address on a second network (its own docs say
    so; then no agent hosts it and all wait until the rendezvous times out), and it publishes
    its fully qualified name for the ranks' process group, which may not resolve to that
    network either. PET_RDZV_CONF and PET_LOCAL_ADDR are torchrun's environment forms of
    --rdzv-conf and --local-addr."""
    first = hosts[0].name

    def agent(host: Host) -> dict[str, str]:
        is_host = host.name == first
        address = master_addr if is_host else host.name
        return {"PET_RDZV_CONF": f"is_host={int(is_host)}", "PET_LOCAL_ADDR": address}

    return {host.name: agent(host) for host in hosts}


def srun(spec: TrainSpec, command: list[str], ctx: LaunchContext) -> LaunchPlan:
    """Slurm's srun: one task per rank, the job killed when any task fails."""
    hosts = job_hosts(spec)
    argv = ["srun", f"--ntasks={spec.world_size}", f"--nodes={len(hosts)}"]
    per_node = uniform_slots(spec)
    if per_node is not None:
        argv.append(f"--ntasks-per-node={per_node}")
    gpus = requested_gpus(spec)
    if gpus is not None:
        argv.append(f"--gpus-per-node={gpus}")
    if spec.hosts:
        argv.append("--nodelist=" + ",".join(host.name for host in spec.hosts))
    argv += [f"--cpus-per-task={cluster_threads(spec)}", "--kill-on-bad-exit=1"]
    if spec.launch.partition:
        argv.append(f"--partition={spec.launch.partition}")
    argv += program(spec, command, ctx)
    nodelist = ",".join(host.name for host in spec.hosts) if spec.hosts else RUNTIME

    tasks_per_node = ",".join(str(host.slots) for host in hosts)

    def env_of(slot: Slot) -> dict[str, str]:
        return {
            "SLURM_STEP_ID": RUNTIME,
            "SLURM_STEP_TASKS_PER_NODE": tasks_per_node,
            "SLURM_PROCID": str(slot.rank),
            "SLURM_NTASKS": str(spec.world_size),
            "SLURM_LOCALID": str(slot.local_rank),
            "SLURM_NODEID": str(slot.node),
            "SLURM_JOB_NODELIST": nodelist,
        }

    env = base_env(spec, threads=cluster_threads(spec))
    return LaunchPlan(launcher="srun", argv=argv, env=env, ranks=_ranks(spec, env_of))


def local(spec: TrainSpec, command: list[str], ctx: LaunchContext) -> LaunchPlan:
    """The toolkit's own launcher: one process per rank on this machine, each fully described.

    Ranks get the TOOLKIT_* variables (which `toolkit.launch.environment` reads first) and, for
    TensorFlow, their TF_CONFIG; the engines derive RANK, MASTER_ADDR, ... from those.
    """
    argv = program(spec, command, ctx)
    local_rank_env = _engine(spec).local_rank_env
    extra: list[dict[str, str]] = _resolve(local_rank_env)(spec) if local_rank_env else []
    ranks = []
    shared = base_env(spec)
    for slot in rank_layout(spec):
        env = {
            **shared,
            TOOLKIT_RANK: str(slot.rank),
            TOOLKIT_LOCAL_RANK: str(slot.local_rank),
            TOOLKIT_WORLD_SIZE: str(spec.world_size),
            TOOLKIT_MASTER_ADDR: spec.master_addr,
            TOOLKIT_MASTER_PORT: str(spec.launch.master_port),
        }
        if extra:
            env.update(extra[slot.rank])
        ranks.append(RankPlan(rank=slot.rank, host=slot.host, env=env, argv=list(argv)))
    return LaunchPlan(launcher="local", argv=None, env={}, ranks=ranks)


BUILDERS: dict[str, Builder] = {
    "horovodrun": horovodrun,
    "mpirun": mpirun,
    "deepspeed": deepspeed,
    "torchrun": torchrun,
    "srun": srun,
    "local": local,
}
"""Launcher name -> plan builder; a new launcher is one function and one entry."""


def launch_plan(spec: TrainSpec, command: Sequence[str], ctx: LaunchContext) -> LaunchPlan:
    """The plan for running `command` (script and its arguments) under the spec's launcher."""
    if not command:
        raise SpecError.single("command", [], "must name a script to run", hint="-- SCRIPT ARGS")
    return BUILDERS[spec.launcher](spec, list(command), ctx)
