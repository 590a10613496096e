"""`toolkit launch` on the GPUs of this machine: one rank per visible GPU when the spec fixes no
process count, more fixed ranks than GPUs refused in one line, and the device line of the dry
run; the GPU count is simulated (0, 2, 8), since these machines have none. `toolkit config`
states the device of a CUDA spec."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from toolkit.cli import main
from toolkit.commands.launch import (
    fitted_to_this_host,
    format_plan,
    naming_its_file,
    ranks_run_here,
)
from toolkit.errors import ToolkitError
from toolkit.launch.runner import launch_plan_here
from toolkit.spec import SpecError, TrainSpec, load_spec

NCCL_LINE = "one GPU per rank (rank r binds cuda:<local rank>), NCCL"


def spec(device: str = "cuda", backend: str = "ddp", **launch: Any) -> TrainSpec:
    return TrainSpec.from_dict({"backend": backend, "device": device, "launch": launch})


def gpus(count: int) -> Any:
    def visible(environ: Mapping[str, str]) -> int:
        return count

    return visible


def never(environ: Mapping[str, str]) -> int:
    raise AssertionError("the GPUs were counted where the ranks do not run here")


@pytest.mark.parametrize(
    ("launch", "environ", "here"),
    [
        ({}, {}, True),
        ({"np": 2}, {}, True),
        ({"hosts": ["localhost:2"]}, {}, True),
        ({"hosts": ["n1:2"]}, {}, False),
        ({"hosts": ["localhost:1", "n2:1"]}, {}, False),
        ({"launcher": "srun"}, {}, False),
        ({"launcher": "mpirun"}, {}, True),
        ({"launcher": "mpirun"}, {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "2"}, False),
        ({"launcher": "local"}, {"SLURM_JOB_ID": "7"}, True),
    ],
)
def test_ranks_run_here_unless_other_hosts_or_slurm_place_them(
    launch: dict[str, Any], environ: dict[str, str], here: bool
) -> None:
    assert ranks_run_here(spec("cpu", **launch), environ) is here


@pytest.mark.parametrize("device", ["cuda", "auto"])
@pytest.mark.parametrize("visible", [2, 8])
def test_np_defaults_to_the_visible_gpus(
    device: str, visible: int, capsys: pytest.CaptureFixture[str]
) -> None:
    fitted, here = fitted_to_this_host(spec(device), {}, gpus(visible))
    assert (fitted.launch.np, fitted.world_size, here) == (visible, visible, "cuda")
    assert fitted.device == device  # the ranks resolve auto themselves, to the same
    err = capsys.readouterr().err
    assert err == f"toolkit: device cuda: {visible} GPUs on this host, launch.np {visible}\n"


def test_one_gpu_is_one_rank(capsys: pytest.CaptureFixture[str]) -> None:
    fitted, _ = fitted_to_this_host(spec(), {}, gpus(1))
    assert fitted.launch.np == 1
    assert capsys.readouterr().err == "toolkit: device cuda: 1 GPU on this host, launch.np 1\n"


def test_the_np_default_reruns_every_rule() -> None:
    """A batch that does not divide among the visible GPUs is the batch contract's error."""
    data = {"device": "cuda", "batch": {"global": 6, "micro": 3}}
    assert TrainSpec.from_dict(data).world_size == 1
    with pytest.raises(SpecError, match="batch"):
        fitted_to_this_host(TrainSpec.from_dict(data), {}, gpus(4))


def test_auto_without_gpus_stays_on_the_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    original = spec("auto")
    fitted, here = fitted_to_this_host(original, {}, gpus(0))
    assert fitted is original and here == "cpu"
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "launch", [{}, {"np": 8}, {"hosts": ["n1:2", "n2:2"]}, {"launcher": "srun", "np": 2}]
)
def test_cpu_specs_never_count_this_hosts_gpus(launch: dict[str, Any]) -> None:
    cpu = spec("cpu", **launch)
    assert fitted_to_this_host(cpu, {}, never) == (cpu, None)


@pytest.mark.parametrize(
    ("launch", "environ"),
    [
        ({"hosts": ["n1:2", "n2:2"]}, {}),
        ({"launcher": "srun"}, {}),
        ({"launcher": "mpirun"}, {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4"}),
    ],
)
def test_cuda_ranks_placed_elsewhere_are_left_to_their_hosts(
    launch: dict[str, Any], environ: dict[str, str]
) -> None:
    remote = spec("cuda", **launch)
    assert fitted_to_this_host(remote, environ, never) == (remote, None)


@pytest.mark.parametrize(
    ("launch", "visible", "ranks"),
    [
        ({"np": 4}, 2, 4),
        ({"gpus_per_host": 8}, 2, 8),
        ({"hosts": ["localhost:3"]}, 2, 3),
        ({"np": 2}, 0, None),
    ],
)
def test_more_ranks_than_gpus_are_refused(
    launch: dict[str, Any], visible: int, ranks: int | None
) -> None:
    with pytest.raises(ToolkitError) as caught:
        fitted_to_this_host(spec(**launch), {}, gpus(visible))
    line = caught.value.one_line()
    if ranks is None:
        assert line.startswith("device: cuda, but this host shows no GPU"), line
    else:
        assert line.startswith(f"device cuda: {ranks} ranks on this host, which shows 2 GPUs")


def test_fixed_ranks_within_the_gpus_run_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    fixed = spec(np=2)
    assert fitted_to_this_host(fixed, {}, gpus(8)) == (fixed, "cuda")
    auto = spec("auto", np=4)
    with pytest.raises(ToolkitError, match="4 ranks on this host"):
        fitted_to_this_host(auto, {}, gpus(2))  # auto binds GPUs where there are any
    assert capsys.readouterr().err == ""


def test_a_mirrored_process_keeps_its_replicas() -> None:
    mirrored = TrainSpec.from_dict({"backend": "tf", "device": "cuda", "tf": {"local_devices": 2}})
    assert fitted_to_this_host(mirrored, {}, gpus(8)) == (mirrored, "cuda")


# The CLI, in process, with the GPU count simulated.


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "train.yaml"
    path.write_text(text)
    return str(path)


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def visible(monkeypatch: pytest.MonkeyPatch) -> Any:
    def simulate(count: int) -> None:
        monkeypatch.setattr("toolkit.commands.launch.visible_gpus", gpus(count))

    return simulate


def test_dry_run_on_eight_gpus(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], visible: Any
) -> None:
    visible(8)
    path = write(tmp_path, "backend: deepspeed\ndevice: cuda\n")
    code, out, err = cli(capsys, "launch", "--spec", path, "--dry-run", "--", "t.py")
    assert code == 0, err
    assert err == "toolkit: device cuda: 8 GPUs on this host, launch.np 8\n"
    lines = out.splitlines()
    assert lines[:3] == [
        "launcher: deepspeed (8 ranks)",
        f"device: cuda, 8 GPUs per host, {NCCL_LINE}",
        "layout: data 8",
    ]
    command = lines[3].split()
    assert command[command.index("--num_gpus") + 1] == "8"
    assert "DS_ACCELERATOR=cuda" in lines[4]
    assert "rank 7 on localhost:" in lines


def test_dry_run_json_carries_the_device(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], visible: Any
) -> None:
    visible(2)
    path = write(tmp_path, "backend: horovod\ndevice: auto\n")
    code, out, _ = cli(capsys, "launch", "--spec", path, "--dry-run", "--json", "--", "t.py")
    assert code == 0
    plan = json.loads(out)
    assert plan["argv"][:5] == ["horovodrun", "-np", "2", "-H", "localhost:2"]
    assert plan["device"] == (
        "device: auto (cuda on this host), 2 GPUs per host, one GPU per rank (rank r binds "
        "cuda:<local rank>), Horovod's NCCL operations where Horovod was built with them"
    )


def test_refusal_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], visible: Any
) -> None:
    visible(2)
    path = write(tmp_path, "device: cuda\nlaunch: {np: 4}\n")
    for extra in (["--dry-run"], []):
        code, out, err = cli(capsys, "launch", "--spec", path, *extra, "--", "t.py")
        assert (code, out) == (2, "")
        assert err.count("\n") == 1
        assert err.startswith("toolkit: error: device cuda: 4 ranks on this host, which shows 2")
        assert "HINT:" in err


def test_cuda_without_a_gpu_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], visible: Any
) -> None:
    visible(0)
    path = write(tmp_path, "device: cuda\n")
    code, out, err = cli(capsys, "launch", "--spec", path, "--dry-run", "--", "t.py")
    assert (code, out) == (2, "")
    assert err.startswith("toolkit: error: device: cuda, but this host shows no GPU")


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("backend: ddp\nlaunch: {np: 2}\n", "device: auto (cpu on this host: no GPU visible)"),
        ("backend: deepspeed\ndevice: cpu\nlaunch: {np: 2}\n", "device: cpu"),
        (
            "backend: ddp\nlaunch: {hosts: ['n1:2', 'n2:2']}\n",
            "device: auto (each rank: cuda where its host shows a GPU, else cpu)",
        ),
    ],
)
def test_cpu_dry_run_is_the_plan_a_device_line_and_the_layout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], visible: Any, text: str, line: str
) -> None:
    visible(0)
    path = write(tmp_path, text)
    code, out, err = cli(capsys, "launch", "--spec", path, "--dry-run", "--", "t.py")
    assert (code, err) == (0, "")
    printed = out.splitlines()
    assert printed.pop(1) == line
    plan = launch_plan_here(naming_its_file(load_spec(path), path), ["t.py"])
    assert printed.pop(1) == f"layout: data {len(plan.ranks)}"
    assert printed == format_plan(plan).splitlines()


def test_config_states_the_device_of_a_cuda_spec(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(
        tmp_path,
        "backend: horovod\nhorovod: {controller: mpi}\ndevice: cuda\n"
        "launch: {launcher: mpirun, hosts: ['a:4', 'b:4']}\n",
    )
    code, out, _ = cli(capsys, "config", "mpijob", "--spec", path, "--", "t.py")
    assert code == 0
    first = out.splitlines()[0]
    assert first == (
        "# device: cuda, 4 GPUs per host, one GPU per rank (rank r binds cuda:<local rank>), "
        "Horovod's NCCL operations where Horovod was built with them"
    )
    manifest = yaml.safe_load(out)
    worker = manifest["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == 4
    code, out, _ = cli(capsys, "config", "sbatch", "--spec", path, "--", "t.py")
    assert code == 0 and "#SBATCH --gpus-per-node=4" in out.splitlines()
    ds = write(tmp_path, "backend: deepspeed\ndevice: cuda\nlaunch: {np: 2}\n")
    code, out, err = cli(capsys, "config", "deepspeed", "--spec", ds)
    assert code == 0 and json.loads(out)["train_batch_size"] > 0
    assert err == f"toolkit: device cuda: {NCCL_LINE}\n"


def test_config_of_a_cpu_spec_says_nothing_of_devices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(
        tmp_path, "backend: horovod\nhorovod: {controller: mpi}\nlaunch: {launcher: mpirun}\n"
    )
    code, out, err = cli(capsys, "config", "mpijob", "--spec", path, "--", "t.py")
    assert code == 0 and err == "" and not out.startswith("#")
    ds = write(tmp_path, "backend: deepspeed\nlaunch: {np: 2}\n")
    code, out, err = cli(capsys, "config", "deepspeed", "--spec", ds)
    assert (code, err) == (0, "")
