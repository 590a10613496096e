"""Run a launcher, or N local ranks, and make sure one failing or stalled rank ends the job.

`run_launcher(argv)` runs a real launcher (mpirun, torchrun, deepspeed, horovodrun, srun) and
`run_local(argv, nprocs)` is the toolkit's own one-machine launcher: it starts `nprocs` copies
of argv, each with TOOLKIT_* variables that `toolkit.launch.environment` reads. Output is
echoed as it comes (toolkit.launch.output); each rank's last stderr lines are kept for the
report. How the launch ended maps to one exit-status convention (toolkit.launch.outcome).

The job ends, and every process of it is stopped (toolkit.launch.tree), when:
- a local rank, or the launcher, ends with a non-zero status;
- a rank reported a failed end and the launcher did not react within `grace` seconds, or a
  descendant died badly and stayed unreaped that long (a launcher that is not watching);
- a rank that has sent heartbeats goes silent for `stall_timeout` seconds
  (toolkit.launch.heartbeat: a SIGSTOPped or frozen rank);
- `timeout` seconds have passed, or the supervisor gets SIGTERM or SIGINT.

With `preempt_s` (the spec's checkpoint.save_on_signal), a SIGTERM or SIGUSR1 to the
supervisor is passed on to every rank on this machine as SIGUSR1 instead: the ranks save at
their next step boundary and exit with status 75 (toolkit.runtime.preemption), and the job
is stopped if they have not within `preempt_s` seconds.

What the launchers did here when one of 2 ranks was SIGKILLed mid-run (Open MPI 4.1.4, torch
2.13, DeepSpeed 0.19.8, Horovod 0.28.1): mpirun aborts the job about a second later
("mpirun noticed that process rank 1 ... exited on signal 9 (Killed)") and exits 137; torchrun
(--max-restarts 0) stops the other worker and exits 1 with a ChildFailedError naming the rank;
deepspeed polls once a second, terminates the rest and exits 247 (sys.exit(-9)), logging on
stdout; horovodrun --gloo stops the other rank and exits 1 ("Horovod detected that one or more
processes exited with non-zero status"). The report therefore names the rank from what the
ranks themselves said (heartbeats and their end reports), and falls back to the launcher's
words. A rank's exact status comes from its own end report, read from /proc as the rank
exits; where the rank's parent reaps it at once (horovodrun runs each rank under a shell that
waits for it) that read can lose the race, and the status is then the signal the launcher's
own status shows (mpirun's 137), or unknown (exit status 1). If the supervisor itself dies,
toolkit.launch.parent_death stops the job.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from toolkit.errors import ToolkitError
from toolkit.launch.job import LOOPBACK, Job
from toolkit.launch.outcome import LaunchResult
from toolkit.launch.remote import RemoteHosts
from toolkit.ports import free_port
from toolkit.rank_variables import (
    LOCAL_RANK_VARIABLES,
    TOOLKIT_LOCAL_RANK,
    TOOLKIT_MASTER_ADDR,
    TOOLKIT_MASTER_PORT,
    TOOLKIT_RANK,
    TOOLKIT_TAG_OUTPUT,
    TOOLKIT_WORLD_SIZE,
)

__all__ = [
    "DEFAULT_GRACE_SECONDS",
    "DEFAULT_STALL_SECONDS",
    "LOOPBACK",
    "run_launcher",
    "run_local",
]

DEFAULT_GRACE_SECONDS = 5.0
DEFAULT_STALL_SECONDS = 60.0


def run_launcher(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    stall_timeout: float | None = DEFAULT_STALL_SECONDS,
    grace: float = DEFAULT_GRACE_SECONDS,
    echo: bool = True,
    heartbeat_host: str = LOOPBACK,
    remote: RemoteHosts | None = None,
    exported: Mapping[str, str] | None = None,
    preempt_s: float | None = None,
) -> LaunchResult:
    """Run one launcher command (an argv list, never a shell string) and supervise its tree.
    TOOLKIT_* rank variables are removed from its environment: they come first in detection,
    so ranks of a launch started from inside a toolkit-launched rank would otherwise inherit
    the outer rank's identity. `heartbeat_host` is this machine's name as the ranks' hosts
    reach it (loopback when every rank runs here).

    With `remote` (a job on several hosts): the launcher runs once on each of `remote.run_on`
    (over ssh where the host is another one) with `exported` and the supervisor's variables,
    what the job leaves on the remote hosts is swept away at its end, and `remote.env_file`
    (when set) receives `exported` and the supervisor's variables for the launcher to export."""
    source = os.environ if env is None else env
    base = {k: v for k, v in source.items() if k not in LOCAL_RANK_VARIABLES}
    base.setdefault("PYTHONUNBUFFERED", "1")
    job = _job(timeout, stall_timeout, grace, echo, heartbeat_host, remote, preempt_s)
    supervisor = job.supervisor_env() | {TOOLKIT_TAG_OUTPUT: "1"}
    base |= supervisor
    forwarded = {**(exported or {}), **supervisor}
    with job.starting():
        if remote is not None and remote.run_on:
            for host in remote.run_on:
                label = f"{os.path.basename(argv[0])} on {host}"
                own = dict(remote.host_env.get(host, {}))
                command = remote.command(host, argv, forwarded | own)
                job.start(command, base | own, rank=None, label=label)
        else:
            if remote is not None and remote.env_file is not None:
                base[remote.env_variable] = str(remote.write_env_file(forwarded))
            job.start(argv, base, rank=None)
    return job.supervise()


def _job(
    timeout: float | None,
    stall_timeout: float | None,
    grace: float,
    echo: bool,
    heartbeat_host: str,
    remote: RemoteHosts | None,
    preempt_s: float | None,
) -> Job:
    if remote is None:
        return Job(timeout, stall_timeout, grace, echo, heartbeat_host, preempt_s=preempt_s)
    return Job(
        timeout,
        stall_timeout,
        grace,
        echo,
        heartbeat_host,
        placement=remote.placement,
        on_teardown=remote.reap,
        preempt_s=preempt_s,
    )


def run_local(
    argv: Sequence[str],
    nprocs: int,
    *,
    env: Mapping[str, str] | None = None,
    master_addr: str = LOOPBACK,
    master_port: int | None = None,
    rank_envs: Sequence[Mapping[str, str]] | None = None,
    roles: Mapping[int, str] | None = None,
    survivable: Mapping[int, str] | None = None,
    timeout: float | None = None,
    stall_timeout: float | None = DEFAULT_STALL_SECONDS,
    grace: float = DEFAULT_GRACE_SECONDS,
    echo: bool = True,
    remote: RemoteHosts | None = None,
    preempt_s: float | None = None,
) -> LaunchResult:
    """Start `nprocs` copies of argv on this machine, rank i with TOOLKIT_RANK=i etc., and
    supervise them. `rank_envs[i]`, when given, adds rank i's own variables (TF_CONFIG).
    `roles` names ranks by role in reports; `survivable` holds the ranks whose failure the job
    outlives, each with why (toolkit.launch.job).
    PYTHONUNBUFFERED=1 is set unless given, so that output arrives as it is written and the
    stderr tail of a killed rank is not lost in its buffer. With `remote`, a rank placed on
    another host runs there over ssh with its own variables and the supervisor's."""
    if nprocs < 1:
        raise ToolkitError(f"nprocs={nprocs}: must be at least 1.", "start one or more ranks")
    port = free_port(master_addr) if master_port is None else master_port
    base = {k: v for k, v in (os.environ if env is None else env).items()}
    base.setdefault("PYTHONUNBUFFERED", "1")
    base.pop(TOOLKIT_TAG_OUTPUT, None)  # each local rank has pipes of its own
    heartbeat_host = LOOPBACK if remote is None else remote.heartbeat_host
    job = _job(timeout, stall_timeout, grace, echo, heartbeat_host, remote, preempt_s)
    job.roles, job.survivable = dict(roles or {}), dict(survivable or {})
    with job.starting():
        for rank in range(nprocs):
            own = dict(rank_envs[rank]) if rank_envs else {}
            own.setdefault(TOOLKIT_LOCAL_RANK, str(rank))
            own |= {
                TOOLKIT_RANK: str(rank),
                TOOLKIT_WORLD_SIZE: str(nprocs),
                TOOLKIT_MASTER_ADDR: master_addr,
                TOOLKIT_MASTER_PORT: str(port),
                **job.supervisor_env(),
            }
            host = None if remote is None else remote.placement.get(rank)
            if host is not None and remote is not None and remote.is_remote(host):
                remote_env = {"PYTHONUNBUFFERED": "1", **own}
                job.start(remote.command(host, argv, remote_env), base, rank=rank)
            else:
                job.start(argv, base | own, rank=rank)
    return job.supervise()
