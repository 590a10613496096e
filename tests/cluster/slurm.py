"""A single-machine Slurm: munged, slurmctld and slurmd with their own key, socket, ports,
configuration, state and logs under one temporary directory.

This host (`hostname`) is the one node, with CPUs=4 whatever the machine has
(`SlurmdParameters=config_overrides`: a parameter-server job's chief, two workers and server
are 4 tasks), in one partition that lets four tasks share a core (`OverSubscribe=FORCE:4`), so
2-rank jobs start on a 2-core machine while other jobs run.
Client commands find this cluster through SLURM_CONF alone: the munge socket is named in
the configuration (`AuthInfo=socket=...`), so nothing system-wide is read or changed.
Completed jobs stay visible to `scontrol show job` for MinJobAge (no accounting database, so
no sacct): `wait_for_job` reads their final state there.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import re
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import psutil

from tests.cluster.processes import (
    Daemon,
    clean_env,
    free_port,
    marked_processes,
    program,
    terminate,
    wait_until,
)

PARTITION = "debug"
START_BOUND_S = 60.0
STOP_BOUND_S = 15.0
TERMINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "PREEMPTED",
    }
)

SLURM_CONF = """\
ClusterName=toolkit-test
SlurmctldHost={node}({address})
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
MpiDefault=none
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=600
KillWait=5
InactiveLimit=0
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
NodeName={node} NodeHostname={node} NodeAddr={address} CPUs=4 State=UNKNOWN
PartitionName={partition} Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""


@dataclass(frozen=True)
class SlurmCluster:
    """A running single-node Slurm. Run `srun`, `sbatch`, `squeue`, `salloc`, `scontrol`
    with `env()`; every command needs only SLURM_CONF to find it."""

    conf: Path
    node: str
    partition: str

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """`base` (default os.environ) without SLURM_* left over from an outer job, and with
        SLURM_CONF naming this cluster."""
        env = clean_env(os.environ if base is None else base, drop_prefixes=("SLURM_",))
        env["SLURM_CONF"] = str(self.conf)
        return env

    def job_state(self, job_id: str) -> str:
        shown = subprocess.run(
            ["scontrol", "-o", "show", "job", job_id],
            env=self.env(),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        found = re.search(r"\bJobState=(\S+)", shown)
        if found is None:
            raise RuntimeError(f"no JobState for job {job_id} in: {shown!r}")
        return found.group(1)

    def wait_for_job(self, job_id: str, *, bound_s: float) -> str:
        """The job's final state; past `bound_s` the job is cancelled and this fails."""
        deadline = time.monotonic() + bound_s
        while (state := self.job_state(job_id)) not in TERMINAL_STATES:
            if time.monotonic() > deadline:
                subprocess.run(["scancel", job_id], env=self.env(), check=False)
                raise RuntimeError(f"job {job_id} still {state} after {bound_s:.0f} s: cancelled")
            time.sleep(0.2)
        return state

    def node_state(self) -> str:
        done = subprocess.run(
            ["sinfo", "-h", "-N", "-n", self.node, "-o", "%T"],
            env=self.env(),
            capture_output=True,
            text=True,
            check=False,
        )
        return done.stdout.strip()

    def jobs(self) -> list[str]:
        """Ids of jobs not finished yet."""
        done = subprocess.run(
            ["squeue", "-h", "-o", "%i"], env=self.env(), capture_output=True, text=True
        )
        return done.stdout.split()


@contextmanager
def start_slurm_cluster(root: Path) -> Iterator[SlurmCluster]:
    """Start munged, slurmctld and slurmd under `root` and wait until the node is idle; on
    exit cancel every job, stop the daemons and kill any job step left behind. Raises
    ClusterUnavailable (one line) when slurm-wlm or munge is missing."""
    munged = program("munged", "munge")
    slurmctld = program("slurmctld", "slurmctld (slurm-wlm)")
    slurmd = program("slurmd", "slurmd (slurm-wlm)")
    for client in ("srun", "sbatch", "squeue", "scontrol", "sinfo", "scancel"):
        program(client, "slurm-client (slurm-wlm)")
    root.mkdir(parents=True, exist_ok=True)
    for directory in ("munge", "state", "spool"):
        (root / directory).mkdir(mode=0o755)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    munge_socket = root / "munge" / "munge.socket"
    node = socket.gethostname().split(".")[0]
    address = "127.0.0.1"
    ports = free_port([address]), free_port([address])
    conf = root / "slurm.conf"
    conf.write_text(
        SLURM_CONF.format(
            node=node,
            address=address,
            ctld_port=ports[0],
            slurmd_port=ports[1],
            user=getpass.getuser(),
            munge_socket=munge_socket,
            root=root,
            partition=PARTITION,
        )
    )
    cluster = SlurmCluster(conf=conf, node=node, partition=PARTITION)
    env = clean_env(os.environ, drop_prefixes=("SLURM_",))
    daemons: list[Daemon] = []
    try:
        munge_argv = [
            munged,
            "--foreground",
            "--force",
            f"--key-file={key}",
            f"--socket={munge_socket}",
            f"--pid-file={root / 'munge' / 'munged.pid'}",
            f"--log-file={root / 'munge' / 'munged.log'}",
            f"--seed-file={root / 'munge' / 'munged.seed'}",
        ]
        daemons.append(Daemon("munged", munge_argv, root / "munged.out", env))
        wait_until(munge_socket.exists, "munged socket", bound_s=START_BOUND_S, daemons=daemons)
        for name, binary in (("slurmctld", slurmctld), ("slurmd", slurmd)):
            argv = [binary, "-D", "-f", str(conf)]
            daemons.append(Daemon(name, argv, root / f"{name}.out", env))
        wait_until(
            partial(_idle, cluster),
            f"Slurm node {node} idle",
            bound_s=START_BOUND_S,
            daemons=daemons,
        )
        yield cluster
    finally:
        if daemons and all(daemon.alive() for daemon in daemons):
            subprocess.run(["scancel", f"--partition={PARTITION}"], env=cluster.env())
            # Steps still there after the bound are killed once the daemons are down.
            with contextlib.suppress(RuntimeError):
                wait_until(lambda: not cluster.jobs(), "jobs cancelled", bound_s=STOP_BOUND_S)
        for daemon in reversed(daemons):
            daemon.stop()
        terminate(_job_processes(conf))


def _job_processes(conf: Path) -> list[psutil.Process]:
    """Tasks of this cluster's jobs and the slurmstepd above them. Tasks are found by the
    SLURM_CONF they inherit from the submitting command; slurmstepd has an empty environment
    and is reparented to init, so it is found as a task's parent."""
    tasks = marked_processes("SLURM_CONF", str(conf))
    steps = []
    for task in tasks:
        try:
            parent = task.parent()
            if parent is not None and parent.name() == "slurmstepd":
                steps.append(parent)
        except psutil.Error:
            continue
    return [*steps, *tasks]


def _idle(cluster: SlurmCluster) -> bool:
    return cluster.node_state() == "idle"
