"""Launcher commands: argv lists and env, checked with the launchers' own argument parsers."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from toolkit.render.launchers import RUNTIME, LaunchContext, LaunchPlan, launch_plan
from toolkit.spec import SpecError, TrainSpec

# Engines set environment variables when imported: import them before the leak fixture runs.
try:
    import deepspeed.launcher.runner as ds_runner
except ImportError:  # the check below skips
    ds_runner = None  # type: ignore[assignment]
try:
    import torch.distributed.run as torch_run
except ImportError:  # the check below skips
    torch_run = None  # type: ignore[assignment]
try:
    import horovod.runner.launch as hvd_launch
except ImportError:  # the check below skips
    hvd_launch = None  # type: ignore[assignment]

EVIL = "a; rm -rf / $(touch pwned) `id` | cat > x"
COMMAND = ["train.py", "--lr", "0.1", EVIL]
ROOT = LaunchContext(uid=0, cpu_count=2, python="/venv/bin/python")
USER = LaunchContext(uid=1000, cpu_count=2, python="/venv/bin/python")


def plan(
    data: dict[str, Any], ctx: LaunchContext = USER, command: list[str] = COMMAND
) -> LaunchPlan:
    return launch_plan(TrainSpec.from_dict(data), command, ctx)


LAUNCHERS: dict[str, dict[str, Any]] = {
    "horovodrun": {"backend": "horovod", "launch": {"np": 2}},
    "mpirun": {
        "backend": "horovod",
        "horovod": {"controller": "mpi"},
        "launch": {"launcher": "mpirun", "np": 2},
    },
    "deepspeed": {"backend": "deepspeed", "launch": {"np": 2}},
    "torchrun": {"backend": "ddp", "launch": {"np": 2}},
    "srun": {"backend": "ddp", "launch": {"launcher": "srun", "np": 2}},
    "local": {"backend": "tf", "launch": {"np": 2}},
}


@pytest.mark.parametrize("name", list(LAUNCHERS))
def test_script_arguments_stay_one_argv_element(name: str) -> None:
    result = plan(LAUNCHERS[name])
    assert result.launcher == name
    argvs = [result.argv] if result.argv is not None else [rank.argv for rank in result.ranks]
    for argv in argvs:
        assert argv is not None and all(isinstance(arg, str) for arg in argv)
        assert argv[-4:] == COMMAND  # unchanged, in order, the evil one a single element
    assert len(result.ranks) == 2
    assert [rank.rank for rank in result.ranks] == [0, 1]


def test_mpirun_root_oversubscribe_binding_and_env_forwarding() -> None:
    data = {"backend": "ddp", "launch": {"launcher": "mpirun", "np": 4, "env": {"FOO": "1"}}}
    as_root = plan(data, ROOT).argv
    assert as_root is not None
    assert as_root[:2] == ["mpirun", "--allow-run-as-root"]
    assert "--oversubscribe" in as_root  # 4 ranks, 2 cores
    assert as_root[as_root.index("--bind-to") + 1] == "none"
    assert as_root[as_root.index("FOO") - 1] == "-x"
    as_user = plan({**data, "launch": {**data["launch"], "np": 2}}).argv
    assert as_user is not None
    assert "--allow-run-as-root" not in as_user and "--oversubscribe" not in as_user
    hosts = plan({"backend": "ddp", "launch": {"launcher": "mpirun", "hosts": ["n1:2", "n2:2"]}})
    assert hosts.argv is not None and hosts.argv[hosts.argv.index("-H") + 1] == "n1:2,n2:2"
    ranks = [rank.env for rank in hosts.ranks]
    assert [env["OMPI_COMM_WORLD_LOCAL_RANK"] for env in ranks] == ["0", "1", "0", "1"]
    assert [rank.host for rank in hosts.ranks] == ["n1", "n1", "n2", "n2"]


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI is not installed")
def test_mpirun_accepts_the_argv() -> None:
    ctx = LaunchContext(uid=os.getuid(), cpu_count=os.cpu_count() or 1, python="unused")
    result = plan({"launch": {"launcher": "mpirun", "np": 2}}, ctx, ["/bin/echo", EVIL])
    assert result.argv is not None
    env = {**os.environ, **result.env}
    done = subprocess.run(result.argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [EVIL, EVIL]


def test_horovodrun_argv_parses_with_horovods_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    launch = hvd_launch or pytest.skip("horovod is not installed")
    for controller in ("gloo", "mpi"):
        data = {
            "backend": "horovod",
            "horovod": {"controller": controller},
            "launch": {"hosts": ["n1:2", "n2:2"], "np": 3},
        }
        result = plan(data)
        assert result.argv is not None
        monkeypatch.setattr("sys.argv", result.argv)
        args = launch.parse_args()
        assert (args.num_proc, args.hosts) == (3, "n1:2,n2:2")
        assert args.use_gloo == (controller == "gloo") and args.use_mpi == (controller == "mpi")
        assert args.command == ["/venv/bin/python", *COMMAND]
    gloo = plan({"backend": "horovod", "launch": {"hosts": ["n1:2", "n2:1"]}})
    envs = [rank.env for rank in gloo.ranks]
    assert [e["HOROVOD_CROSS_RANK"] for e in envs] == ["0", "0", "1"]
    assert [e["HOROVOD_CROSS_SIZE"] for e in envs] == ["2", "1", "2"]
    assert envs[0]["HOROVOD_GLOO_RENDEZVOUS_PORT"] == RUNTIME


def test_deepspeed_launcher_argv_and_hostfile(tmp_path: Path) -> None:
    runner = ds_runner or pytest.skip("deepspeed is not installed")
    single = plan({"backend": "deepspeed", "launch": {"np": 2}})
    assert single.files == {}
    assert single.argv is not None
    args = runner.parse_args(single.argv[1:])
    # Like native deepspeed, the script gets --local_rank=N unless the spec opts out.
    assert (args.num_gpus, args.master_addr, args.no_local_rank) == (2, "127.0.0.1", False)
    assert [args.user_script, *args.user_args] == COMMAND
    opted_out = plan({"backend": "deepspeed", "launch": {"np": 2, "pass_local_rank": False}})
    assert opted_out.argv is not None and runner.parse_args(opted_out.argv[1:]).no_local_rank

    # `python X.py` is run as native deepspeed runs X.py: its interpreter, --local_rank after X.py.
    spelled_out = plan(
        {"backend": "deepspeed", "launch": {"np": 2}}, command=["/v/python3", *COMMAND]
    )
    assert spelled_out.argv is not None
    args = runner.parse_args(spelled_out.argv[1:])
    assert (args.no_python, args.no_local_rank, [args.user_script, *args.user_args]) == (
        False, False, COMMAND
    )  # fmt: skip
    # Other interpreter commands: --local_rank would land among the interpreter's options.
    module = plan({"backend": "deepspeed", "launch": {"np": 2}}, command=["python", "-m", "m"])
    assert module.argv is not None
    args = runner.parse_args(module.argv[1:])
    assert (args.no_python, args.no_local_rank, args.user_script) == (True, True, "python")

    multi = plan({"backend": "deepspeed", "launch": {"hosts": ["node1:4", "node-2.lan:4"]}})
    assert multi.argv is not None
    args = runner.parse_args(multi.argv[1:])
    assert (args.num_nodes, args.num_gpus, args.launcher) == (2, 4, "pdsh")
    assert args.master_addr == "node1"
    ((path, content),) = multi.files.items()
    assert args.hostfile == path
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(content)
    assert dict(runner.fetch_hostfile(str(hostfile))) == {"node1": 4, "node-2.lan": 4}
    ranks = [rank.env for rank in multi.ranks]
    assert [env["RANK"] for env in ranks] == [str(i) for i in range(8)]
    assert ranks[5]["LOCAL_RANK"] == "1" and ranks[5]["CROSS_RANK"] == "1"


def test_torchrun_argv_parses_with_torchs_parser() -> None:
    run = torch_run or pytest.skip("torch is not installed")
    result = plan({"backend": "ddp", "launch": {"hosts": ["n1:2", "n2:2"], "master_port": 1234}})
    assert result.argv is not None and result.note is not None
    args = run.parse_args(result.argv[1:])
    assert (args.nnodes, args.nproc_per_node, args.rdzv_backend) == ("2", "2", "c10d")
    assert args.rdzv_endpoint == "n1:1234"
    assert [args.training_script, *args.training_script_args] == COMMAND
    assert [rank.env["GROUP_RANK"] for rank in result.ranks] == ["0", "0", "1", "1"]


def test_srun_argv() -> None:
    result = plan({"launch": {"launcher": "srun", "hosts": ["n1:2", "n2:2"], "partition": "gpu"}})
    assert result.argv is not None
    assert result.argv[:5] == [
        "srun",
        "--ntasks=4",
        "--nodes=2",
        "--ntasks-per-node=2",
        "--nodelist=n1,n2",
    ]
    assert "--kill-on-bad-exit=1" in result.argv and "--partition=gpu" in result.argv
    assert [rank.env["SLURM_NODEID"] for rank in result.ranks] == ["0", "0", "1", "1"]


def test_local_gives_each_rank_its_argv_env_and_tf_config() -> None:
    result = plan({"backend": "tf", "launch": {"np": 2, "python": "python3"}})
    assert result.argv is None
    for index, rank in enumerate(result.ranks):
        assert rank.argv == ["python3", *COMMAND]
        assert rank.env["TOOLKIT_RANK"] == str(index)
        assert f'"index":{index}' in rank.env["TF_CONFIG"]


def test_a_command_is_required() -> None:
    with pytest.raises(SpecError, match="command"):
        plan(LAUNCHERS["torchrun"], command=[])
