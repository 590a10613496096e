"""Start a rendered launch plan for real, under the supervisor. No engine imports.

`toolkit launch` and the parity harness both go through `execute`, so what the dry run prints
is what runs: the plan's argv lists and environments, never a shell string.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from toolkit.errors import ToolkitError
from toolkit.launch.executables import find_launcher
from toolkit.launch.outcome import LaunchResult
from toolkit.launch.supervisor import DEFAULT_STALL_SECONDS, LOOPBACK, run_launcher, run_local
from toolkit.render.launchers import LaunchContext, LaunchPlan
from toolkit.spec import TrainSpec
from toolkit.spec.hosts import LOCAL_NAMES


def machine_context() -> LaunchContext:
    """The facts about this machine that the (pure) launch renderers need."""
    return LaunchContext(uid=os.getuid(), cpu_count=os.cpu_count() or 1, python=sys.executable)


def execute(
    plan: LaunchPlan,
    spec: TrainSpec,
    *,
    timeout: float | None = None,
    stall_timeout: float | None = DEFAULT_STALL_SECONDS,
    echo: bool = True,
) -> LaunchResult:
    """Run the plan and supervise it until every rank ends, one fails or one stalls."""
    if plan.argv is None:  # the toolkit's own launcher: every rank has its own command
        return run_local(
            plan.ranks[0].argv or [],
            len(plan.ranks),
            env=os.environ,
            master_addr=spec.master_addr,
            master_port=spec.launch.master_port,
            rank_envs=[rank.env for rank in plan.ranks],
            timeout=timeout,
            stall_timeout=stall_timeout,
            echo=echo,
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
        heartbeat_host=_heartbeat_host(plan),
    )


def _heartbeat_host(plan: LaunchPlan) -> str:
    """How the ranks reach this machine: loopback when they all run here, else its name."""
    if all(rank.host in LOCAL_NAMES for rank in plan.ranks):
        return LOOPBACK
    return socket.gethostname()
