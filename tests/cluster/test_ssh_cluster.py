"""The ssh test hosts are real: ssh, mpirun with a hostfile and pdsh reach 127.0.0.2 and
127.0.0.3 through the private sshds, each process knows which host it is on, and nothing is
left running on a host afterwards."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.sshd import SshCluster
from tests.realrun import json_objects

PROBE = str(Path(__file__).with_name("probe_rank.py"))
ROOT_FLAGS = ["--allow-run-as-root"] if os.getuid() == 0 else []
RUN_BOUND_S = 60
# Keep Open MPI's own traffic on loopback, as a test of loopback "hosts" needs it to be.
LOOPBACK_ONLY = ["--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo"]

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.multiproc,
    pytest.mark.usefixtures("no_orphans", "no_ssh_leftovers"),
]

SHOW = """
import json, os, socket, sys
print(json.dumps({
    "hostname": socket.gethostname(),
    "host": os.environ.get("TOOLKIT_TEST_SSH_HOST"),
    "server": os.environ.get("SSH_CONNECTION", "").split()[2:3],
    "argv": sys.argv[1:],
    "env": {k: v for k, v in os.environ.items() if k.startswith(("LC_TOOLKIT", "TOOLKIT_X"))},
}))
"""


def run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        argv,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=RUN_BOUND_S,
        check=False,
    )
    assert done.returncode == 0, f"{argv}\nexit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def one_report(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    reports = json_objects(done.stdout)
    assert len(reports) == 1, done.stdout + done.stderr
    return reports[0]


@pytest.mark.parametrize("host", ["127.0.0.2", "127.0.0.3"])
def test_ssh_runs_python_on_each_host(ssh_cluster: SshCluster, host: str) -> None:
    awkward = "two words; echo injected $(id) 'q'"
    done = run(
        ssh_cluster.ssh_argv(host, [sys.executable, "-c", SHOW, awkward, "--flag"]),
        os.environ.copy(),
    )
    report = one_report(done)
    assert report["host"] == host
    assert report["server"] == [host]
    assert report["hostname"] == socket.gethostname()
    assert report["argv"] == [awkward, "--flag"]
    assert run(ssh_cluster.ssh_argv(host, ["hostname"]), os.environ.copy()).stdout.strip() == (
        socket.gethostname()
    )


def test_hosts_see_only_the_variables_a_stock_sshd_accepts(ssh_cluster: SshCluster) -> None:
    """LANG and LC_* travel with ssh (SendEnv/AcceptEnv, as on Debian); anything else must be
    put in the remote command, which is what mpirun, horovodrun and deepspeed do."""
    env = os.environ | {"LC_TOOLKIT_TEST": "sent", "TOOLKIT_X_LOCAL": "stays here"}
    command = ["env", "TOOLKIT_X_GIVEN=in the command", sys.executable, "-c", SHOW]
    report = one_report(run(ssh_cluster.ssh_argv("127.0.0.3", command), env))
    assert report["env"] == {"LC_TOOLKIT_TEST": "sent", "TOOLKIT_X_GIVEN": "in the command"}


def test_plain_ssh_from_path_reaches_the_hosts(ssh_cluster: SshCluster) -> None:
    """What launchers that run `ssh HOST ...` without our options get: the wrapper's config."""
    for host in ssh_cluster.hosts:
        done = run(["ssh", host, "echo $TOOLKIT_TEST_SSH_HOST"], ssh_cluster.env())
        assert done.stdout.strip() == host


def test_killing_the_ssh_client_leaves_the_remote_command_running(
    ssh_cluster: SshCluster,
) -> None:
    """Without a terminal, a remote command outlives its ssh client: a launcher that only
    kills its local ssh processes leaves ranks behind. `processes(host)` finds them."""
    client = subprocess.Popen(
        ssh_cluster.ssh_argv("127.0.0.2", ["sleep", "120"]), stdin=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + RUN_BOUND_S
        while not ssh_cluster.processes("127.0.0.2") and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        client.kill()
        client.wait()
    time.sleep(1)  # give a (wrongly) dying session the chance to take its command with it
    left = ssh_cluster.processes("127.0.0.2")
    assert [p.cmdline() for p in left] == [["sleep", "120"]]
    assert ssh_cluster.processes("127.0.0.3") == []
    for process in left:
        process.kill()


def test_mpirun_hostfile_puts_one_rank_on_each_host(
    ssh_cluster: SshCluster, tmp_path: Path
) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"{host} slots=1\n" for host in ssh_cluster.hosts))
    argv = ["mpirun", *ROOT_FLAGS, "-np", "2", "--hostfile", str(hostfile)]
    argv += [*ssh_cluster.mpirun_mca(), *LOOPBACK_ONLY, sys.executable, PROBE]
    reports = json_objects(run(argv, os.environ.copy()).stdout)
    placed = {int(r["env"]["OMPI_COMM_WORLD_RANK"]): r["host"] for r in reports}
    assert placed == {0: "127.0.0.2", 1: "127.0.0.3"}
    assert {r["env"]["OMPI_COMM_WORLD_SIZE"] for r in reports} == {"2"}


@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None, reason="mpi4py not installed")
def test_mpi_allreduce_between_hosts(ssh_cluster: SshCluster) -> None:
    """Ranks on two hosts talk over TCP (Open MPI never uses shared memory between nodes)."""
    program = (
        "import json, os; from mpi4py import MPI; c = MPI.COMM_WORLD; "
        "print(json.dumps({'rank': c.rank, 'sum': c.allreduce(c.rank + 1), "
        "'host': os.environ['TOOLKIT_TEST_SSH_HOST']}))"
    )
    argv = ["mpirun", *ROOT_FLAGS, "-np", "2", "-H", ",".join(ssh_cluster.hosts)]
    argv += [*ssh_cluster.mpirun_mca(), *LOOPBACK_ONLY, "--mca", "btl", "tcp,self"]
    reports = json_objects(run([*argv, sys.executable, "-c", program], os.environ.copy()).stdout)
    assert sorted((r["rank"], r["host"], r["sum"]) for r in reports) == [
        (0, "127.0.0.2", 3),
        (1, "127.0.0.3", 3),
    ]


@pytest.mark.skipif(shutil.which("pdsh") is None, reason="pdsh not installed")
def test_pdsh_reaches_every_host(ssh_cluster: SshCluster) -> None:
    """The deepspeed launcher's default transport, pointed at the sshds by environment."""
    hosts = ",".join(ssh_cluster.hosts)
    env = os.environ | ssh_cluster.pdsh_env()
    done = run(["pdsh", "-S", "-w", hosts, sys.executable, PROBE, "%n"], env)
    by_prefix = {}
    for line in done.stdout.splitlines():
        prefix, _, rest = line.partition(": ")
        by_prefix[prefix] = json.loads(rest)
    assert {p: (r["host"], r["argv"]) for p, r in by_prefix.items()} == {
        "127.0.0.2": ("127.0.0.2", ["0"]),
        "127.0.0.3": ("127.0.0.3", ["1"]),
    }
