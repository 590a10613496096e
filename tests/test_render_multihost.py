"""How `launch.ssh` and `launch.interface` reach each launcher on several hosts, how ssh commands
are built, and where a job takes its size inside a Slurm allocation (pure logic; the real jobs
are in tests/cluster/test_multihost_jobs.py and tests/cluster/test_slurm_jobs.py)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from toolkit.commands.launch import within_allocation
from toolkit.launch.remote import RemoteHosts, ssh_argv
from toolkit.launch.slurm import allocation_tasks
from toolkit.rank_variables import SUPERVISOR_VARIABLES, TOOLKIT_HOST
from toolkit.render.launchers import LaunchContext, LaunchPlan, launch_plan
from toolkit.spec import SpecError, TrainSpec
from toolkit.spec.sections import SshSpec

CTX = LaunchContext(uid=1000, cpu_count=2, python="/venv/bin/python", forward=SUPERVISOR_VARIABLES)
HOSTS = ["node1:1", "node2:1"]
SSH = {"port": 2222, "identity_file": "/keys/id", "config_file": "/keys/config"}
EVIL = "a; rm -rf / $(touch pwned)"


def plan(data: dict[str, Any], launch: dict[str, Any] | None = None) -> LaunchPlan:
    launch = {"hosts": HOSTS, "ssh": SSH, "interface": "eth1", **(launch or {})}
    spec = TrainSpec.from_dict({**data, "launch": {**data.get("launch", {}), **launch}})
    return launch_plan(spec, ["train.py", EVIL], CTX)


def after(argv: list[str] | None, option: str) -> str:
    assert argv is not None
    return argv[argv.index(option) + 1]


def test_mpirun_gets_the_ssh_options_the_interface_and_forwards_the_supervisor() -> None:
    result = plan({"backend": "ddp", "launch": {"launcher": "mpirun"}})
    argv = result.argv or []
    assert after(argv, "-H") == "node1:1,node2:1"
    assert "-F /keys/config -p 2222 -i /keys/id" in argv
    assert argv[argv.index("plm_rsh_args") - 1] == "--mca"
    assert after(argv, "btl_tcp_if_include") == "eth1"
    assert after(argv, "oob_tcp_if_include") == "eth1"
    forwarded = {argv[i + 1] for i, arg in enumerate(argv) if arg == "-x"}
    assert set(SUPERVISOR_VARIABLES) | {"GLOO_SOCKET_IFNAME"} <= forwarded
    assert result.env["GLOO_SOCKET_IFNAME"] == "eth1"


def test_mpirun_on_one_machine_gets_no_ssh_options() -> None:
    spec = TrainSpec.from_dict(
        {"backend": "ddp", "launch": {"launcher": "mpirun", "np": 2, "ssh": SSH}}
    )
    argv = launch_plan(spec, ["train.py"], CTX).argv or []
    assert "plm_rsh_args" not in argv


def test_horovodrun_gets_its_own_ssh_and_interface_flags() -> None:
    ssh = {"port": 2222, "identity_file": "/keys/id"}
    argv = plan({"backend": "horovod"}, {"ssh": ssh}).argv
    assert after(argv, "--ssh-port") == "2222"
    assert after(argv, "--ssh-identity-file") == "/keys/id"
    assert after(argv, "--network-interfaces") == "eth1"


def test_horovodrun_refuses_an_ssh_config_file_with_a_hint() -> None:
    with pytest.raises(SpecError) as caught:
        plan({"backend": "horovod"})
    message = str(caught.value)
    assert "launch.ssh.config_file" in message and "~/.ssh/config" in message


def test_deepspeed_gets_port_pdsh_arguments_and_an_env_file() -> None:
    result = plan({"backend": "deepspeed"})
    argv = result.argv or []
    assert after(argv, "--ssh_port") == "2222"
    assert result.env["PDSH_SSH_ARGS_APPEND"] == "-F /keys/config -i /keys/id"
    # its own check would run a bare `ssh -p PORT`; toolkit launch checks with the spec's ssh
    assert "--no_ssh_check" in argv
    assert result.env_file == ".toolkit/deepspeed_env"
    assert ".toolkit/hostfile" in result.files


def test_deepspeed_with_only_a_port_keeps_its_own_ssh_check() -> None:
    result = plan({"backend": "deepspeed"}, {"ssh": {"port": 2222}})
    assert "--no_ssh_check" not in (result.argv or [])
    assert "PDSH_SSH_ARGS_APPEND" not in result.env


def test_torchrun_runs_once_on_every_host() -> None:
    result = plan({"backend": "ddp"})
    assert result.run_on == ("node1", "node2")
    assert result.argv is not None and result.argv[0] == "torchrun"


def test_the_local_launcher_places_ranks_on_their_hosts() -> None:
    result = plan({"backend": "tf"})
    assert [rank.host for rank in result.ranks] == ["node1", "node2"]
    workers = {rank.env["TF_CONFIG"] for rank in result.ranks}
    assert len(workers) == 2 and all("node1:12345" in text for text in workers)
    assert all("node2:12346" in text for text in workers)


def test_ssh_argv_keeps_the_remote_command_an_argv() -> None:
    ssh = SshSpec(port=2222, identity_file="/keys/id")
    argv = ssh_argv(ssh, "node2", ["/venv/bin/python", "train.py", EVIL], {"A": "x y"})
    assert argv[:5] == ["ssh", "-p", "2222", "-i", "/keys/id"]
    assert "BatchMode=yes" in argv
    assert argv[-2] == "node2"
    assert shlex.split(argv[-1]) == ["env", "A=x y", "/venv/bin/python", "train.py", EVIL]


def test_remote_hosts_run_here_without_ssh_and_name_the_host_there() -> None:
    remote = RemoteHosts(
        ssh=SshSpec(), python="/venv/bin/python", hosts=("node2",), heartbeat_host="node0"
    )
    assert remote.command("localhost", ["prog"], {"A": "1"}) == ["prog"]
    command = shlex.split(remote.command("node2", ["prog"], {"A": "1"})[-1])
    assert command == ["env", "A=1", f"{TOOLKIT_HOST}=node2", "prog"]


def test_remote_commands_start_in_the_directory_of_the_job() -> None:
    remote = RemoteHosts(
        ssh=SshSpec(),
        python="/venv/bin/python",
        hosts=("node2",),
        heartbeat_host="node0",
        cwd=Path("/work/my project"),
    )
    command = shlex.split(remote.command("node2", ["prog", "hvd_examples/x.py"], {"A": "1"})[-1])
    assert command[:4] == ["cd", "/work/my project", "&&", "exec"]
    assert command[4:] == ["env", "A=1", f"{TOOLKIT_HOST}=node2", "prog", "hvd_examples/x.py"]
    assert remote.command("localhost", ["prog"], {}) == ["prog"]


@pytest.mark.parametrize(
    ("environ", "tasks"),
    [
        ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4"}, 4),
        ({"SLURM_JOB_ID": "7", "SLURM_NPROCS": "3"}, 3),
        ({"SLURM_JOB_ID": "7"}, None),
        ({"SLURM_NTASKS": "4"}, None),
        ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "²"}, None),
        ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "0"}, None),
    ],
)
def test_allocation_tasks(environ: dict[str, str], tasks: int | None) -> None:
    assert allocation_tasks(environ) == tasks


def test_a_spec_without_np_takes_the_allocation_under_srun_and_mpirun_only() -> None:
    inside = {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4"}
    srun = TrainSpec.from_dict({"backend": "ddp", "launch": {"launcher": "srun"}})
    assert within_allocation(srun, inside).world_size == 4
    fixed = TrainSpec.from_dict({"backend": "ddp", "launch": {"launcher": "srun", "np": 2}})
    assert within_allocation(fixed, inside).world_size == 2
    torchrun = TrainSpec.from_dict({"backend": "ddp", "launch": {"launcher": "torchrun"}})
    assert within_allocation(torchrun, inside).world_size == 1
    assert within_allocation(srun, {}).world_size == 1
