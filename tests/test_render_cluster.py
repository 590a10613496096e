"""Cluster artifacts: the Slurm batch script passes `bash -n`, the MPIJob has what v2beta1
requires, and the hostfile is in the deepspeed launcher's format."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from toolkit.render.hostfile import hostfile
from toolkit.render.mpijob import mpijob_manifest
from toolkit.render.slurm import sbatch_script
from toolkit.spec import SpecError, TrainSpec

# Engines set environment variables when imported: import them before the leak fixture runs.
try:
    import deepspeed.launcher.runner as ds_runner
except ImportError:  # the check below skips
    ds_runner = None  # type: ignore[assignment]

EVIL = "a; rm -rf / $(touch pwned) `id` 'quoted' \"double\""
COMMAND = ["train.py", "--note", EVIL]


def spec(**launch: object) -> TrainSpec:
    return TrainSpec.from_dict({"backend": "ddp", "launch": launch})


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
@pytest.mark.parametrize(
    "launch",
    [
        {"launcher": "srun", "np": 2},
        {"launcher": "srun", "hosts": ["n1:2", "n2:1"], "partition": "gpu", "env": {"X": EVIL}},
        {"launcher": "mpirun", "hosts": ["n1:4", "n2:4"], "time_limit": "1-00:00:00"},
    ],
)
def test_sbatch_script_passes_bash_n(tmp_path: Path, launch: dict[str, object]) -> None:
    script = sbatch_script(spec(**launch), COMMAND)
    path = tmp_path / "job.sh"
    path.write_text(script)
    done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert script.startswith("#!/bin/bash\n#SBATCH --job-name=toolkit-train\n")
    # Running the command line through bash's own word splitting gives back the argv.
    last = script.rstrip().splitlines()[-1]
    echoed = subprocess.run(
        ["bash", "-c", 'f() { printf "%s\\n" "$@"; }; f ' + last],
        capture_output=True,
        text=True,
    )
    assert echoed.stdout.splitlines()[-3:] == COMMAND


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
@pytest.mark.parametrize(
    "data",
    [
        {"backend": "ddp", "launch": {"launcher": "torchrun", "hosts": ["n1:2", "n2:2"]}},
        {"backend": "deepspeed", "launch": {"launcher": "deepspeed", "np": 2}},
        {"backend": "deepspeed", "launch": {"launcher": "deepspeed", "hosts": ["n1:1", "n2:1"]}},
        {"backend": "horovod", "launch": {"launcher": "horovodrun", "np": 2}},
        {"backend": "tf", "launch": {"launcher": "local", "np": 2}},
    ],
    ids=lambda data: f"{data['backend']}-{data['launch']['launcher']}",
)
def test_sbatch_runs_every_launcher_inside_the_allocation(
    tmp_path: Path, data: dict[str, object]
) -> None:
    script = sbatch_script(TrainSpec.from_dict(data), COMMAND)
    path = tmp_path / "job.sh"
    path.write_text(script)
    done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    last = script.rstrip().splitlines()[-1]
    assert last.split()[0] in {"srun", "horovodrun", "deepspeed", "python"}, last
    assert last.endswith(shlex.join(COMMAND)), last


def test_sbatch_torchrun_starts_one_agent_per_node() -> None:
    spec = TrainSpec.from_dict(
        {"backend": "ddp", "launch": {"launcher": "torchrun", "hosts": ["n1:2", "n2:2"]}}
    )
    last = sbatch_script(spec, COMMAND).rstrip().splitlines()[-1]
    assert last.startswith("srun --nodes=2 --ntasks=2 --ntasks-per-node=1 ")
    assert '--rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT"' in last


def test_mpijob_has_the_v2beta1_fields() -> None:
    data = {
        "backend": "horovod",
        "horovod": {"controller": "mpi"},
        "launch": {
            "launcher": "mpirun",
            "hosts": ["a:4", "b:4"],
            "image": "reg/toolkit:1",
            "job_name": "mnist-hvd",
        },
    }
    manifest = yaml.safe_load(yaml.safe_dump(mpijob_manifest(TrainSpec.from_dict(data), COMMAND)))
    assert manifest["apiVersion"] == "kubeflow.org/v2beta1"
    assert manifest["kind"] == "MPIJob"
    assert manifest["metadata"]["name"] == "mnist-hvd"
    job = manifest["spec"]
    assert job["slotsPerWorker"] == 4
    assert job["runPolicy"]["cleanPodPolicy"] in {"Running", "All", "None"}
    assert job["mpiImplementation"] == "OpenMPI"
    replicas = job["mpiReplicaSpecs"]
    assert (replicas["Launcher"]["replicas"], replicas["Worker"]["replicas"]) == (1, 2)
    for role in ("Launcher", "Worker"):
        (container,) = replicas[role]["template"]["spec"]["containers"]
        assert container["image"] == "reg/toolkit:1" and container["name"]
        assert container["command"]
    launcher = replicas["Launcher"]["template"]["spec"]["containers"][0]
    assert launcher["command"] == ["mpirun"]
    assert launcher["args"][-3:] == COMMAND
    assert launcher["args"][launcher["args"].index("-np") + 1] == "8"


def test_mpijob_needs_mpirun_and_equal_slots() -> None:
    with pytest.raises(SpecError, match=r"launch\.launcher"):
        mpijob_manifest(spec(np=2), COMMAND)
    with pytest.raises(SpecError, match=r"launch\.hosts"):
        mpijob_manifest(spec(launcher="mpirun", hosts=["a:1", "b:2"]), COMMAND)


def test_hostfile_parses_with_deepspeeds_parser(tmp_path: Path) -> None:
    runner = ds_runner or pytest.skip("deepspeed is not installed")
    text = hostfile(
        TrainSpec.from_dict({"backend": "deepspeed", "launch": {"hosts": ["w-0:4", "10.0.0.2:2"]}})
    )
    assert text == "w-0 slots=4\n10.0.0.2 slots=2\n"
    path = tmp_path / "hostfile"
    path.write_text(text)
    assert dict(runner.fetch_hostfile(str(path))) == {"w-0": 4, "10.0.0.2": 2}
    assert hostfile(TrainSpec.from_dict({"launch": {"np": 2}})) == "localhost slots=2\n"


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
@pytest.mark.parametrize(("status", "requeued"), [(75, True), (0, False), (1, False)])
def test_a_preemptible_batch_script_asks_for_the_signal_and_requeues_a_preempted_job(
    tmp_path: Path, status: int, requeued: bool
) -> None:
    """The script runs under bash with `srun` and `scontrol` stand-ins: a job step that ends
    with 75 (every rank saved) requeues the job, any other status is the script's own."""
    data = {
        "backend": "ddp",
        "checkpoint": {"dir": "ckpt", "save_on_signal": True, "preempt_s": 90},
        "launch": {"launcher": "srun", "np": 2},
    }
    script = sbatch_script(TrainSpec.from_dict(data), COMMAND)
    assert "#SBATCH --signal=USR1@90\n#SBATCH --requeue\n" in script
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "scontrol.calls"
    (bin_dir / "srun").write_text(f"#!/bin/bash\nexit {status}\n")
    (bin_dir / "scontrol").write_text(
        f'#!/bin/bash\nif [ "$1" = show ]; then echo n1; else echo "$@" >> {calls}; fi\n'
    )
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    path = tmp_path / "job.sh"
    path.write_text(script)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n1"}
    done = subprocess.run(["bash", str(path)], capture_output=True, text=True, env=env)
    assert done.returncode == status, done.stderr
    assert (calls.read_text() if calls.exists() else "") == ("requeue 42\n" if requeued else "")


def test_a_batch_script_refuses_to_save_on_a_signal_that_would_not_reach_the_ranks() -> None:
    data = {
        "backend": "ddp",
        "checkpoint": {"dir": "ckpt", "save_on_signal": True},
        "launch": {"launcher": "torchrun", "np": 2},
    }
    with pytest.raises(SpecError, match=r"checkpoint\.save_on_signal.*launcher srun or local"):
        sbatch_script(TrainSpec.from_dict(data), COMMAND)


def test_a_batch_script_has_restarts_only_where_toolkit_launch_runs_the_job() -> None:
    def script(launcher: str) -> str:
        launch = {"max_restarts": 2, "np": 2, "launcher": launcher}
        data = {"backend": "ddp", "checkpoint": {"dir": "ckpt"}, "launch": launch}
        return sbatch_script(TrainSpec.from_dict(data), COMMAND)

    with pytest.raises(SpecError, match=r"launch\.max_restarts.*launcher torchrun"):
        script("torchrun")
    assert " -m toolkit launch " in script("local")
