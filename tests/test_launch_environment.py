"""Launcher detection from injected environments: what each launcher sets, nested launchers,
explicit choice, and values that contradict each other."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.errors import ToolkitError
from toolkit.launch.environment import (
    DETECTORS,
    LaunchEnvironment,
    detect_environment,
    split_local_rank_arg,
)
from toolkit.launch.slurm import expand_hostlist

ROOT = Path(__file__).resolve().parent.parent

# What each launcher put in rank 1 of a 2-process job on one machine (trimmed to what matters;
# see toolkit/launch/environment.py for where these were observed).
HOROVOD_GLOO = {
    "HOROVOD_RANK": "1",
    "HOROVOD_SIZE": "2",
    "HOROVOD_LOCAL_RANK": "1",
    "HOROVOD_LOCAL_SIZE": "2",
    "HOROVOD_CROSS_RANK": "0",
    "HOROVOD_CROSS_SIZE": "1",
    "HOROVOD_HOSTNAME": "localhost",
    "HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.5",
    "HOROVOD_GLOO_RENDEZVOUS_PORT": "41000",
    "HOROVOD_CONTROLLER": "gloo",
}
OPEN_MPI = {
    "OMPI_COMM_WORLD_RANK": "1",
    "OMPI_COMM_WORLD_SIZE": "2",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "OMPI_COMM_WORLD_NODE_RANK": "1",  # not the node index: the rank on this node
}
HYDRA = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}
DEEPSPEED = {
    "RANK": "1",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "2",
    "LOCAL_SIZE": "2",
    "CROSS_RANK": "0",
    "CROSS_SIZE": "1",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
}
TORCHRUN = {
    "RANK": "1",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "2",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "0",
    "GROUP_WORLD_SIZE": "1",
    "MASTER_ADDR": "localhost",
    "MASTER_PORT": "40257",
    "TORCHELASTIC_RUN_ID": "5bad64f6",
    "TORCHELASTIC_RESTART_COUNT": "0",
}
# Task 3 of 4 (2 per node) of `srun -N2 --ntasks-per-node=2`.
SRUN = {
    "SLURM_JOB_ID": "1234",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "3",
    "SLURM_NTASKS": "4",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_TASKS_PER_NODE": "2(x2)",
    "SLURM_STEP_NODELIST": "gpu[07-08]",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
}
# The batch step of `sbatch -N2 --ntasks=4`: the script itself, one process, not an srun task.
SBATCH_BATCH_STEP = {
    "SLURM_JOB_ID": "1234",
    "SLURM_PROCID": "0",
    "SLURM_NTASKS": "4",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_TASKS_PER_NODE": "2(x2)",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
}
# What an `srun ... torchrun` worker inherits from its node's srun task: the node, not itself.
SRUN_NODE_TASK = SRUN | {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0"}
TF_CONFIG_LOCAL = {
    "TF_CONFIG": json.dumps(
        {
            "cluster": {"worker": ["127.0.0.1:12345", "127.0.0.1:12346"]},
            "task": {"type": "worker", "index": 1},
        }
    )
}
TOOLKIT_LOCAL = {
    "TOOLKIT_RANK": "1",
    "TOOLKIT_WORLD_SIZE": "2",
    "TOOLKIT_LOCAL_RANK": "1",
    "TOOLKIT_MASTER_ADDR": "127.0.0.1",
    "TOOLKIT_MASTER_PORT": "29611",
}


def env_(
    launcher: str,
    rank: int = 1,
    local_rank: int = 1,
    world: int = 2,
    *,
    local_world_size: int = 2,
    node_rank: int = 0,
    master_addr: str | None = None,
    master_port: int | None = None,
    hosts: tuple[str, ...] = (),
) -> LaunchEnvironment:
    """The expected LaunchEnvironment, with the 2-processes-on-one-machine defaults."""
    return LaunchEnvironment(
        launcher,
        rank,
        local_rank,
        world,
        local_world_size,
        node_rank,
        master_addr,
        master_port,
        hosts,
    )


DETECTION_CASES = [
    ("nothing", {}, [], env_("single", 0, 0, 1, local_world_size=1)),
    (
        "toolkit local",
        TOOLKIT_LOCAL,
        [],
        env_("local", master_addr="127.0.0.1", master_port=29611),
    ),
    (
        "horovodrun gloo",
        HOROVOD_GLOO,
        [],
        env_("horovodrun", master_addr="10.0.0.5", master_port=41000),
    ),
    (
        "horovodrun gloo inherits an outer job's RANK and SLURM_*",
        SBATCH_BATCH_STEP | {"RANK": "5", "WORLD_SIZE": "8"} | HOROVOD_GLOO,
        [],
        env_("horovodrun", master_addr="10.0.0.5", master_port=41000),
    ),
    ("mpirun (Open MPI), also horovodrun --mpi", OPEN_MPI, [], env_("openmpi")),
    (
        "Open MPI across 2 nodes: node index derived from rank and local size",
        {
            "OMPI_COMM_WORLD_RANK": "3",
            "OMPI_COMM_WORLD_SIZE": "4",
            "OMPI_COMM_WORLD_LOCAL_RANK": "1",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        },
        [],
        env_("openmpi", 3, 1, 4, node_rank=1),
    ),
    (
        "mpirun inside an sbatch script wins over the batch step's SLURM_*",
        SBATCH_BATCH_STEP | OPEN_MPI,
        [],
        env_("openmpi"),
    ),
    (
        "mpirun with exported MASTER_ADDR/PORT",
        OPEN_MPI | {"MASTER_ADDR": "node1", "MASTER_PORT": "29400"},
        [],
        env_("openmpi", master_addr="node1", master_port=29400),
    ),
    ("MPICH / Intel MPI hydra", HYDRA, [], env_("mpich")),
    (
        "deepspeed launcher",
        DEEPSPEED,
        ["train.py", "--local_rank=1", "--lr", "0.1"],
        env_("deepspeed", master_addr="127.0.0.1", master_port=29500),
    ),
    (
        "deepspeed --no_local_rank",
        DEEPSPEED,
        ["train.py"],
        env_("deepspeed", master_addr="127.0.0.1", master_port=29500),
    ),
    ("torchrun", TORCHRUN, [], env_("torchrun", master_addr="localhost", master_port=40257)),
    (
        "srun torchrun: the worker, not the node's srun task",
        SRUN_NODE_TASK | TORCHRUN,
        [],
        env_("torchrun", master_addr="localhost", master_port=40257),
    ),
    (
        "mpirun torchrun (one agent per node)",
        OPEN_MPI | TORCHRUN,
        [],
        env_("torchrun", master_addr="localhost", master_port=40257),
    ),
    (
        "deepspeed launch.py started under srun",
        SRUN_NODE_TASK | DEEPSPEED,
        ["train.py", "--local_rank=1"],
        env_("deepspeed", master_addr="127.0.0.1", master_port=29500),
    ),
    (
        "srun task",
        SRUN,
        [],
        env_("srun", 3, 1, 4, node_rank=1, master_addr="gpu07", hosts=("gpu07", "gpu08")),
    ),
    (
        "srun --mpi=pmi2 sets PMI_RANK but no hydra local rank",
        SRUN | {"PMI_RANK": "3", "PMI_SIZE": "4"},
        [],
        env_("srun", 3, 1, 4, node_rank=1, master_addr="gpu07", hosts=("gpu07", "gpu08")),
    ),
    (
        "srun with --ntasks-per-node only",
        {k: v for k, v in SRUN.items() if "TASKS_PER_NODE" not in k}
        | {"SLURM_NTASKS_PER_NODE": "2"},
        [],
        env_("srun", 3, 1, 4, node_rank=1, master_addr="gpu07", hosts=("gpu07", "gpu08")),
    ),
    (
        "sbatch batch step: python run directly in the script is one process",
        SBATCH_BATCH_STEP,
        [],
        env_("single", 0, 0, 1, local_world_size=1),
    ),
    (
        "Slurm pseudo-step (batch/extern/interactive ids) is not an srun task",
        SBATCH_BATCH_STEP | {"SLURM_STEP_ID": "4294967291"},
        [],
        env_("single", 0, 0, 1, local_world_size=1),
    ),
    (
        "TF_CONFIG, two workers on one machine",
        TF_CONFIG_LOCAL,
        [],
        env_(
            "tf_config",
            master_addr="127.0.0.1",
            master_port=12345,
            hosts=("127.0.0.1:12345", "127.0.0.1:12346"),
        ),
    ),
    (
        "TF_CONFIG with a chief, one process per host",
        {
            "TF_CONFIG": json.dumps(
                {
                    "cluster": {"chief": ["c:2222"], "worker": ["w0:2222", "w1:2222"]},
                    "task": {"type": "worker", "index": 1},
                }
            )
        },
        [],
        env_(
            "tf_config",
            2,
            0,
            3,
            local_world_size=1,
            node_rank=2,
            master_addr="c",
            master_port=2222,
            hosts=("c:2222", "w0:2222", "w1:2222"),
        ),
    ),
    (
        "TF_CONFIG of a parameter server: chief, workers, then the parameter servers",
        {
            "TF_CONFIG": json.dumps(
                {
                    "cluster": {"chief": ["c:2222"], "worker": ["w0:2222"], "ps": ["p0:2222"]},
                    "task": {"type": "ps", "index": 0},
                }
            )
        },
        [],
        env_(
            "tf_config",
            2,
            0,
            3,
            local_world_size=1,
            node_rank=2,
            master_addr="c",
            master_port=2222,
            hosts=("c:2222", "w0:2222", "p0:2222"),
        ),
    ),
    (
        "TF_CONFIG inside an srun step: TensorFlow reads TF_CONFIG",
        SRUN | TF_CONFIG_LOCAL,
        [],
        env_(
            "tf_config",
            master_addr="127.0.0.1",
            master_port=12345,
            hosts=("127.0.0.1:12345", "127.0.0.1:12346"),
        ),
    ),
    (
        "a TF_CONFIG left in the shell does not beat torchrun",
        TF_CONFIG_LOCAL | TORCHRUN,
        [],
        env_("torchrun", master_addr="localhost", master_port=40257),
    ),
    (
        "bare RANK/WORLD_SIZE (Kubeflow PyTorchJob): one process per pod",
        {"RANK": "2", "WORLD_SIZE": "4", "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456"},
        [],
        env_(
            "torch_env",
            2,
            0,
            4,
            local_world_size=1,
            node_rank=2,
            master_addr="job-master-0",
            master_port=23456,
        ),
    ),
]


@pytest.mark.parametrize(
    ("env", "argv", "expected"),
    [case[1:] for case in DETECTION_CASES],
    ids=[case[0] for case in DETECTION_CASES],
)
def test_detects(env: dict[str, str], argv: list[str], expected: LaunchEnvironment) -> None:
    assert detect_environment(env, argv) == expected


EXPLICIT_CASES = [
    ("horovodrun --mpi is mpirun underneath", "horovodrun", OPEN_MPI, "openmpi"),
    ("horovodrun --gloo", "horovodrun", HOROVOD_GLOO | OPEN_MPI, "horovodrun"),
    ("deepspeed --launcher openmpi runs the script under mpirun", "deepspeed", OPEN_MPI, "openmpi"),
    ("deepspeed --launcher slurm runs the script under srun", "deepspeed", SRUN, "srun"),
    ("named launcher wins over detection order", "srun", SRUN | OPEN_MPI, "srun"),
    (
        "naming skips deepspeed's no-TORCHELASTIC rule",
        "deepspeed",
        TORCHRUN | DEEPSPEED,
        "deepspeed",
    ),
    (
        "naming skips srun's pseudo-step rule",
        "srun",
        SRUN | {"SLURM_STEP_ID": "4294967291"},
        "srun",
    ),
    ("single ignores every variable", "single", TORCHRUN, "single"),
    ("mpirun covers hydra", "mpirun", HYDRA, "mpich"),
]


@pytest.mark.parametrize(
    ("launcher", "env", "detected"),
    [case[1:] for case in EXPLICIT_CASES],
    ids=[case[0] for case in EXPLICIT_CASES],
)
def test_named_launcher(launcher: str, env: dict[str, str], detected: str) -> None:
    assert detect_environment(env, [], launcher=launcher).launcher == detected


ERROR_CASES = [
    ("non-integer", HOROVOD_GLOO | {"HOROVOD_RANK": "one"}, [], None, "HOROVOD_RANK='one'"),
    ("negative", OPEN_MPI | {"OMPI_COMM_WORLD_RANK": "-1"}, [], None, "OMPI_COMM_WORLD_RANK='-1'"),
    (
        "rank not below world size",
        OPEN_MPI | {"OMPI_COMM_WORLD_RANK": "2"},
        [],
        None,
        "OMPI_COMM_WORLD_RANK=2 is not below OMPI_COMM_WORLD_SIZE=2",
    ),
    (
        "local rank not below local size",
        TORCHRUN | {"LOCAL_RANK": "2"},
        [],
        None,
        "LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2",
    ),
    ("empty world", TORCHRUN | {"WORLD_SIZE": "0", "RANK": "0"}, [], None, "WORLD_SIZE=0"),
    (
        "more local processes than processes",
        HYDRA | {"MPI_LOCALNRANKS": "3"},
        [],
        None,
        "MPI_LOCALNRANKS=3 is outside 1..PMI_SIZE=2",
    ),
    ("port out of range", TORCHRUN | {"MASTER_PORT": "70000"}, [], None, "MASTER_PORT='70000'"),
    (
        "--local_rank disagrees with LOCAL_RANK",
        DEEPSPEED,
        ["train.py", "--local_rank=0"],
        None,
        "--local_rank=0 in the script's arguments disagrees with LOCAL_RANK=1",
    ),
    ("TF_CONFIG not JSON", {"TF_CONFIG": "{cluster"}, [], None, "TF_CONFIG is not valid JSON"),
    (
        "TF_CONFIG without task type",
        {"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"index": 0}})},
        [],
        None,
        "task.type=None",
    ),
    (
        "TF_CONFIG worker index out of range",
        {
            "TF_CONFIG": json.dumps(
                {"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 1}}
            )
        },
        [],
        None,
        "task.index=1 is not an index into cluster.worker (1 entries)",
    ),
    (
        "TF_CONFIG evaluator",
        {
            "TF_CONFIG": json.dumps(
                {
                    "cluster": {"evaluator": ["a:1"], "worker": ["b:1"]},
                    "task": {"type": "evaluator", "index": 0},
                }
            )
        },
        [],
        None,
        "task.type='evaluator' is not supported",
    ),
    (
        "TF_CONFIG address without port",
        {
            "TF_CONFIG": json.dumps(
                {"cluster": {"worker": ["a"]}, "task": {"type": "worker", "index": 0}}
            )
        },
        [],
        None,
        "entry 'a' is not host:port",
    ),
    (
        "Slurm tasks-per-node malformed",
        SRUN | {"SLURM_STEP_TASKS_PER_NODE": "two"},
        [],
        None,
        "SLURM_STEP_TASKS_PER_NODE='two'",
    ),
    (
        "Slurm node list malformed",
        SRUN | {"SLURM_STEP_NODELIST": "gpu[07-"},
        [],
        None,
        "SLURM_STEP_NODELIST='gpu[07-'",
    ),
    (
        "Slurm without any tasks-per-node variable",
        {k: v for k, v in SRUN.items() if "TASKS_PER_NODE" not in k},
        [],
        None,
        "number of tasks on this node is unknown",
    ),
    (
        "named launcher absent",
        {},
        [],
        "torchrun",
        "lacks its variables (torchrun: TORCHELASTIC_RUN_ID, RANK, LOCAL_RANK, WORLD_SIZE, "
        "LOCAL_WORLD_SIZE, GROUP_RANK)",
    ),
    (
        "named srun in an sbatch batch step",
        SBATCH_BATCH_STEP,
        [],
        "srun",
        "(srun: SLURM_STEP_ID)",
    ),
    (
        "named launcher with several environments lists each",
        {},
        [],
        "mpirun",
        "openmpi: OMPI_COMM_WORLD_RANK",
    ),
    ("unknown launcher", {}, [], "pdsh", "launcher 'pdsh' is unknown: allowed are"),
]


@pytest.mark.parametrize(
    ("env", "argv", "launcher", "message"),
    [case[1:] for case in ERROR_CASES],
    ids=[case[0] for case in ERROR_CASES],
)
def test_rejects(env: dict[str, str], argv: list[str], launcher: str | None, message: str) -> None:
    with pytest.raises(ToolkitError) as raised:
        detect_environment(env, argv, launcher=launcher)
    assert message in raised.value.message
    assert raised.value.hint, "every user-facing error carries a hint"


LOCAL_RANK_CASES = [
    (["train.py", "--local_rank=1", "--lr", "3"], ["train.py", "--lr", "3"], 1),
    (["train.py", "--local_rank", "0", "--lr", "3"], ["train.py", "--lr", "3"], 0),
    (["train.py", "--local-rank=2"], ["train.py"], 2),
    (["train.py", "--lr", "3"], ["train.py", "--lr", "3"], None),
    (["train.py", "--local_rank=1", "--local_rank=1"], ["train.py", "--local_rank=1"], 1),
    (["train.py", "--local_ranks=1"], ["train.py", "--local_ranks=1"], None),
]


@pytest.mark.parametrize(("argv", "rest", "value"), LOCAL_RANK_CASES)
def test_split_local_rank_arg(argv: list[str], rest: list[str], value: int | None) -> None:
    original = list(argv)
    assert split_local_rank_arg(argv) == (rest, value)
    assert argv == original, "the caller's list is left alone"


@pytest.mark.parametrize("argv", [["t.py", "--local_rank"], ["t.py", "--local_rank=x"]])
def test_split_local_rank_arg_rejects(argv: list[str]) -> None:
    with pytest.raises(ToolkitError, match="--local_rank needs a non-negative integer"):
        split_local_rank_arg(argv)


HOSTLIST_CASES = [
    ("node1", ("node1",)),
    ("node1,node2", ("node1", "node2")),
    ("gpu[01-03,07],cpu1", ("gpu01", "gpu02", "gpu03", "gpu07", "cpu1")),
    ("r[1-2]-n[8-9]", ("r1-n8", "r1-n9", "r2-n8", "r2-n9")),
    ("n[098-101]", ("n098", "n099", "n100", "n101")),
]


@pytest.mark.parametrize(("text", "hosts"), HOSTLIST_CASES)
def test_expand_hostlist(text: str, hosts: tuple[str, ...]) -> None:
    assert expand_hostlist(text) == hosts


BAD_HOSTLISTS = ["", "a,,b", "n[1-", "n[1-]", "n]1[", "n[3-1]", "n[a-b]", "n[[1]]", "n[]"]


@pytest.mark.parametrize("text", BAD_HOSTLISTS)
def test_expand_hostlist_rejects(text: str) -> None:
    with pytest.raises(ToolkitError, match="SLURM_JOB_NODELIST"):
        expand_hostlist(text)


def test_detection_order_ends_with_the_single_process_fallback() -> None:
    assert DETECTORS[-1].name == "single"
    assert len({d.name for d in DETECTORS}) == len(DETECTORS)


def test_launch_layer_imports_no_engine() -> None:
    code = (
        "import sys, toolkit.launch, toolkit.launch.probe; "
        "engines = {'torch', 'tensorflow', 'horovod', 'deepspeed', 'mpi4py'}; "
        "print(sorted(engines & set(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def run_probe(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "toolkit.launch.probe", *args]
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)} | env
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)


def test_probe_prints_one_json_line() -> None:
    done = run_probe(OPEN_MPI)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == dataclasses.asdict(env_("openmpi")) | {"hosts": []}


def test_probe_with_named_launcher_reports_missing_variables() -> None:
    done = run_probe({}, "--launcher", "deepspeed")
    assert done.returncode == 2
    assert done.stderr.startswith("toolkit.launch.probe: error: launcher 'deepspeed' was named")
    assert "HINT:" in done.stderr
