"""Start a rendered launch plan for real, under the supervisor. No engine imports.

`toolkit launch` and the parity harness both go through `execute`, so what the dry run prints
is what runs: the plan's argv lists and environments, never a shell string.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import psutil

from toolkit import engines
from toolkit.errors import ToolkitError
from toolkit.launch.executables import find_launcher
from toolkit.launch.machine_settings import for_this_machine
from toolkit.launch.outcome import LaunchResult
from toolkit.launch.remote import RemoteHosts, check_hosts
from toolkit.launch.supervisor import DEFAULT_STALL_SECONDS, LOOPBACK, run_launcher, run_local
from toolkit.rank_variables import SUPERVISOR_VARIABLES
from toolkit.render.launchers import LaunchContext, LaunchPlan, launch_plan
from toolkit.render.tf import rank_roles, survivable_ranks
from toolkit.spec import TrainSpec
from toolkit.spec.hosts import LOCAL_NAMES


def machine_context() -> LaunchContext:
    """The facts about this machine that the (pure) launch renderers need; the supervisor's
    variables are forwarded to every rank (`execute` always supervises)."""
    return LaunchContext(
        uid=os.getuid(),
        cpu_count=os.cpu_count() or 1,
        python=sys.executable,
        forward=SUPERVISOR_VARIABLES,
    )


def launch_plan_here(spec: TrainSpec, command: list[str]) -> LaunchPlan:
    """`spec`'s launch plan on this machine: its machine-dependent unset settings resolved
    (toolkit.launch.machine_settings) and this machine's facts given to the renderers."""
    return launch_plan(for_this_machine(spec), command, machine_context())


def execute(
    plan: LaunchPlan,
    spec: TrainSpec,
    *,
    timeout: float | None = None,
    stall_timeout: float | None = DEFAULT_STALL_SECONDS,
    echo: bool = True,
) -> LaunchResult:
    """Run the plan and supervise it until every rank ends, one fails or one stalls. A job on
    several hosts first checks that every host answers ssh and has the toolkit (one clear
    error otherwise), and at its end stops whatever it left on them."""
    remote = _remote_hosts(plan, spec)
    preempt_s = _preempt_s(spec)
    if remote is not None:
        check_hosts(remote.ssh, remote.hosts, remote.python)
    if plan.argv is None:  # the toolkit's own launcher: every rank has its own command
        return run_local(
            plan.ranks[0].argv or [],
            len(plan.ranks),
            env=os.environ,
            master_addr=spec.master_addr,
            master_port=spec.launch.master_port,
            rank_envs=[rank.env for rank in plan.ranks],
            roles=rank_roles(spec),
            survivable=survivable_ranks(spec),
            timeout=timeout,
            stall_timeout=stall_timeout,
            echo=echo,
            remote=remote,
            preempt_s=preempt_s,
        )
    executable = find_launcher(plan.argv[0])
    if executable is None:
        raise ToolkitError(
            f"launcher {plan.argv[0]!r} (launch.launcher={spec.launcher!r}) is not installed "
            "here: not beside this Python, not on PATH",
            "run `toolkit doctor` to see which launchers exist, or pick another launch.launcher",
        )
    for path, content in plan.files.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(content)
    return run_launcher(
        [executable, *plan.argv[1:]],
        env={**os.environ, **plan.env},
        timeout=timeout,
        stall_timeout=stall_timeout,
        echo=echo,
        heartbeat_host=LOOPBACK if remote is None else remote.heartbeat_host,
        remote=remote,
        exported=plan.env,
        preempt_s=preempt_s,
    )


def _preempt_s(spec: TrainSpec) -> float | None:
    """How long a signalled job may take to save and stop; None when a signal stops it as it
    is (no checkpoint.save_on_signal)."""
    return float(spec.checkpoint.preempt_s) if spec.checkpoint.save_on_signal else None


def _remote_hosts(plan: LaunchPlan, spec: TrainSpec) -> RemoteHosts | None:
    """The job's other hosts, None when every rank runs here or the launcher places ranks
    itself (srun: Slurm reaches its nodes, not ssh)."""
    if plan.launcher not in (*engines.HOST_ORDER_LAUNCHERS, *engines.SSH_STARTED):
        return None
    hosts = tuple(dict.fromkeys(r.host for r in plan.ranks if r.host not in LOCAL_NAMES))
    if not hosts:
        return None
    ordered = plan.launcher in engines.HOST_ORDER_LAUNCHERS
    return RemoteHosts(
        ssh=spec.launch.ssh,
        python=spec.launch.python or sys.executable,
        hosts=hosts,
        heartbeat_host=_heartbeat_host(spec.launch.interface),
        placement={rank.rank: rank.host for rank in plan.ranks} if ordered else {},
        run_on=plan.run_on,
        host_env=plan.host_env,
        env_file=Path(plan.env_file) if plan.env_file else None,
        cwd=Path.cwd(),
    )


def _heartbeat_host(interface: str | None) -> str:
    """How ranks on other hosts reach this machine: the address of the spec's interface, else
    this machine's name."""
    if interface is None:
        return socket.gethostname()
    for address in psutil.net_if_addrs().get(interface, []):
        if address.family == socket.AF_INET:
            return str(address.address)
    raise ToolkitError(
        f"launch.interface={interface!r}: this machine has no IPv4 address on it",
        "name an interface `ip -brief address` lists with an IPv4 address",
    )
