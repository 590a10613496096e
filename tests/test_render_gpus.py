"""GPU jobs rendered from a spec with device cuda: each launcher's per-host process counts, the
cluster GPU requests (srun, sbatch, MPIJob), DeepSpeed's accelerator variable and the device
line, on one host and several; device cpu and auto render no GPU at all."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from toolkit.render.launchers import LaunchContext, LaunchPlan, launch_plan
from toolkit.render.layout import device_summary, gpus_per_host, requested_gpus
from toolkit.render.mpijob import GPU_RESOURCE, mpijob_manifest
from toolkit.render.slurm import sbatch_script
from toolkit.spec import TrainSpec

COMMAND = ["train.py", "--lr", "0.1"]
USER = LaunchContext(uid=1000, cpu_count=2, python="/venv/bin/python")
NCCL_LINE = "one GPU per rank (rank r binds cuda:<local rank>), NCCL"


def spec(backend: str, device: str = "cuda", **launch: Any) -> TrainSpec:
    data: dict[str, Any] = {"backend": backend, "device": device, "launch": launch}
    return TrainSpec.from_dict(data)


def plan(built: TrainSpec) -> LaunchPlan:
    return launch_plan(built, COMMAND, USER)


def argv(built: TrainSpec) -> list[str]:
    rendered = plan(built).argv
    assert rendered is not None
    return rendered


def after(words: list[str], option: str) -> str:
    return words[words.index(option) + 1]


# One host (np, or launch.gpus_per_host alone) and several hosts, for each launcher.
ONE_HOST: dict[str, Any] = {"np": 4}
ONLY_GPUS: dict[str, Any] = {"gpus_per_host": 4}
TWO_HOSTS: dict[str, Any] = {"hosts": ["n1:4", "n2:4"]}


@pytest.mark.parametrize("launch", [ONE_HOST, ONLY_GPUS], ids=["np", "gpus_per_host"])
def test_one_host_runs_one_rank_per_gpu(launch: dict[str, Any]) -> None:
    deepspeed = argv(spec("deepspeed", **launch))
    assert after(deepspeed, "--num_gpus") == "4"
    assert "--include" not in deepspeed and "--hostfile" not in deepspeed
    horovodrun = argv(spec("horovod", **launch))
    assert (after(horovodrun, "-np"), after(horovodrun, "-H")) == ("4", "localhost:4")
    torchrun = argv(spec("ddp", **launch))
    assert (after(torchrun, "--nnodes"), after(torchrun, "--nproc-per-node")) == ("1", "4")
    srun = argv(spec("ddp", launcher="srun", **launch))
    assert "--ntasks=4" in srun and "--gpus-per-node=4" in srun


def test_several_hosts_run_their_slots_one_rank_per_gpu() -> None:
    deepspeed = plan(spec("deepspeed", **TWO_HOSTS))
    assert deepspeed.argv is not None
    assert after(deepspeed.argv, "--num_gpus") == "4"
    assert after(deepspeed.argv, "--num_nodes") == "2"
    assert deepspeed.files[".toolkit/hostfile"] == "n1 slots=4\nn2 slots=4\n"
    assert deepspeed.env["DS_ACCELERATOR"] == "cuda"  # exported to every host (env_file)
    assert deepspeed.env_file is not None
    horovodrun = argv(spec("horovod", **TWO_HOSTS))
    assert (after(horovodrun, "-np"), after(horovodrun, "-H")) == ("8", "n1:4,n2:4")
    torchrun = argv(spec("ddp", **TWO_HOSTS))
    assert (after(torchrun, "--nnodes"), after(torchrun, "--nproc-per-node")) == ("2", "4")
    srun = argv(spec("ddp", launcher="srun", **TWO_HOSTS))
    assert {"--ntasks=8", "--nodes=2", "--ntasks-per-node=4", "--gpus-per-node=4"} <= set(srun)


def test_more_gpus_than_ranks_are_asked_for_but_do_not_move_ranks() -> None:
    """launch.gpus_per_host above a host's ranks: Slurm is asked for the GPUs, while the
    launchers keep one process per rank, so every host still runs its own slots."""
    launch: dict[str, Any] = {"hosts": ["n1:2", "n2:2"], "gpus_per_host": 8}
    assert gpus_per_host(spec("ddp", **launch)) == 8
    srun = argv(spec("ddp", launcher="srun", **launch))
    assert "--gpus-per-node=8" in srun and "--ntasks-per-node=2" in srun
    assert after(argv(spec("deepspeed", **launch)), "--num_gpus") == "2"
    assert after(argv(spec("horovod", **launch)), "-H") == "n1:2,n2:2"
    assert after(argv(spec("ddp", **launch)), "--nproc-per-node") == "2"


def test_unequal_hosts_ask_slurm_for_the_busiest_hosts_gpus() -> None:
    srun = argv(spec("ddp", launcher="srun", hosts=["n1:4", "n2:2"]))
    assert "--gpus-per-node=4" in srun
    assert not any(word.startswith("--ntasks-per-node") for word in srun)


@pytest.mark.parametrize(
    ("backend", "launch"),
    [
        ("deepspeed", ONE_HOST),
        ("deepspeed", TWO_HOSTS),
        ("horovod", TWO_HOSTS),
        ("ddp", ONE_HOST),
        ("ddp", TWO_HOSTS),
        ("ddp", {"launcher": "mpirun", "np": 2}),
        ("tf", {"np": 2}),
    ],
)
def test_cuda_changes_no_launcher_command_only_the_accelerator_variable(
    backend: str, launch: dict[str, Any]
) -> None:
    """The ranks per host are the GPUs per host, so a CUDA plan is the CPU plan's (argv, files,
    ranks), apart from DeepSpeed's DS_ACCELERATOR."""
    on_gpus, on_cpus = plan(spec(backend, **launch)), plan(spec(backend, "cpu", **launch))
    assert on_gpus.argv == on_cpus.argv
    assert on_gpus.files == on_cpus.files and on_gpus.ranks == on_cpus.ranks
    for gpu_env, cpu_env in [(on_gpus.env, on_cpus.env)] + [
        (a.env, b.env) for a, b in zip(on_gpus.ranks, on_cpus.ranks, strict=True)
    ]:
        gpu_env, cpu_env = dict(gpu_env), dict(cpu_env)
        assert gpu_env.pop("DS_ACCELERATOR", None) in (None, "cuda")
        assert cpu_env.pop("DS_ACCELERATOR", None) in (None, "cpu")
        assert gpu_env == cpu_env


@pytest.mark.parametrize("device", ["cpu", "auto"])
@pytest.mark.parametrize("launch", [ONE_HOST, TWO_HOSTS, {"hosts": ["n1:4", "n2:2"]}])
def test_cpu_and_auto_render_no_gpu_request(device: str, launch: dict[str, Any]) -> None:
    built = spec("ddp", device, launcher="srun", **launch)
    assert requested_gpus(built) is None
    assert not any("gpu" in word for word in argv(built))
    assert "gpu" not in sbatch_script(built, COMMAND)


@pytest.mark.parametrize("device", ["cpu", "auto"])
@pytest.mark.parametrize("launch", [ONE_HOST, TWO_HOSTS])
def test_cpu_and_auto_mpijobs_ask_for_no_gpu(device: str, launch: dict[str, Any]) -> None:
    data = {"backend": "horovod", "horovod": {"controller": "mpi"}, "device": device}
    built = TrainSpec.from_dict({**data, "launch": {**launch, "launcher": "mpirun"}})
    replicas = mpijob_manifest(built, COMMAND)["spec"]["mpiReplicaSpecs"]
    for role in ("Launcher", "Worker"):
        assert "resources" not in replicas[role]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize(("device", "expected"), [("cpu", "cpu"), ("cuda", "cuda"), ("auto", None)])
def test_deepspeed_ranks_are_told_the_accelerator(device: str, expected: str | None) -> None:
    for launch in ({"np": 2}, {"launcher": "local", "np": 2}, {"launcher": "torchrun", "np": 2}):
        rendered = plan(spec("deepspeed", device, **launch))
        # The local launcher gives each rank all of its variables; the others, the launcher.
        local = rendered.argv is None
        for env in [rank.env for rank in rendered.ranks] if local else [rendered.env]:
            assert env.get("DS_ACCELERATOR") == expected, (launch, env)


def test_only_deepspeed_engines_get_the_accelerator_and_launch_env_wins() -> None:
    for backend in ("ddp", "horovod", "tf"):
        assert "DS_ACCELERATOR" not in plan(spec(backend, np=2)).env
    overridden = plan(spec("deepspeed", np=2, env={"DS_ACCELERATOR": "cpu"}))
    assert overridden.env["DS_ACCELERATOR"] == "cpu"


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
@pytest.mark.parametrize("launcher", ["srun", "torchrun", "deepspeed", "mpirun"])
def test_sbatch_asks_for_gpus_per_node(tmp_path: Path, launcher: str) -> None:
    backend = "deepspeed" if launcher == "deepspeed" else "ddp"
    script = sbatch_script(spec(backend, launcher=launcher, **TWO_HOSTS), COMMAND)
    path = tmp_path / "job.sh"
    path.write_text(script)
    done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = script.splitlines()
    assert "#SBATCH --gpus-per-node=4" in lines and "#SBATCH --ntasks-per-node=4" in lines
    assert "#SBATCH --nodes=2" in lines and "#SBATCH --ntasks=8" in lines
    comment = f"# device: cuda, 4 GPUs per host, {NCCL_LINE}"
    assert comment in lines
    assert lines.index(comment) == max(i for i, line in enumerate(lines) if "#SBATCH" in line) + 1
    assert ("export DS_ACCELERATOR=cuda" in lines) == (backend == "deepspeed")


def test_sbatch_on_one_node_asks_for_its_ranks_gpus() -> None:
    lines = sbatch_script(spec("ddp", launcher="srun", np=2), COMMAND).splitlines()
    assert "#SBATCH --gpus-per-node=2" in lines and "#SBATCH --nodes=1" in lines
    lines = sbatch_script(spec("ddp", launcher="srun", gpus_per_host=8), COMMAND).splitlines()
    assert "#SBATCH --gpus-per-node=8" in lines and "#SBATCH --ntasks=8" in lines


@pytest.mark.parametrize("launch", [{"np": 2}, {"hosts": ["node-a:4", "node-b:4"]}])
def test_mpijob_workers_ask_for_their_gpus(launch: dict[str, Any]) -> None:
    from tests.test_mpijob_schema import assert_valid  # skips without jsonschema

    data = {"backend": "horovod", "horovod": {"controller": "mpi"}, "device": "cuda"}
    built = TrainSpec.from_dict({**data, "launch": {**launch, "launcher": "mpirun"}})
    manifest = mpijob_manifest(built, COMMAND)
    assert_valid(manifest)
    per_worker = 2 if "np" in launch else 4
    replicas = manifest["spec"]["mpiReplicaSpecs"]
    worker = replicas["Worker"]["template"]["spec"]["containers"][0]
    launcher = replicas["Launcher"]["template"]["spec"]["containers"][0]
    assert worker["resources"] == {"limits": {GPU_RESOURCE: per_worker}}
    assert "resources" not in launcher
    assert manifest["spec"]["slotsPerWorker"] == per_worker
    assert replicas["Worker"]["replicas"] == (1 if "np" in launch else 2)


def test_mpijob_asks_for_gpus_per_host_beyond_the_slots() -> None:
    data = {"backend": "horovod", "horovod": {"controller": "mpi"}, "device": "cuda"}
    launch = {"launcher": "mpirun", "hosts": ["a:2", "b:2"], "gpus_per_host": 8}
    manifest = mpijob_manifest(TrainSpec.from_dict({**data, "launch": launch}), COMMAND)
    worker = manifest["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert worker["resources"]["limits"][GPU_RESOURCE] == 8
    assert manifest["spec"]["slotsPerWorker"] == 2


@pytest.mark.parametrize(
    ("data", "line"),
    [
        ({"backend": "ddp", "launch": {"np": 4}}, f"device: cuda, 4 GPUs per host, {NCCL_LINE}"),
        (
            {"backend": "deepspeed", "launch": {"hosts": ["a:8", "b:8"]}},
            f"device: cuda, 8 GPUs per host, {NCCL_LINE}",
        ),
        (
            {"backend": "horovod", "launch": {"np": 1}},
            "device: cuda, 1 GPU per host, one GPU per rank (rank r binds cuda:<local rank>), "
            "Horovod's NCCL operations where Horovod was built with them",
        ),
        (
            {"backend": "tf", "tf": {"communication": "nccl"}, "launch": {"np": 2}},
            "device: cuda, 2 GPUs per host, one GPU per rank (rank r binds cuda:<local rank>), "
            "tf.communication nccl",
        ),
        (
            {"backend": "tf", "tf": {"local_devices": 2}, "launch": {"np": 1}},
            "device: cuda, 2 GPUs per host, one process, its 2 replicas on cuda:0..1, "
            "tf.communication ring",
        ),
    ],
    ids=["ddp", "deepspeed", "horovod", "tf", "tf-mirrored"],
)
def test_device_summary_names_binding_and_backend(data: dict[str, Any], line: str) -> None:
    assert device_summary(TrainSpec.from_dict({**data, "device": "cuda"})) == line


def test_device_summary_for_cpu_and_auto() -> None:
    assert device_summary(spec("ddp", "cpu", np=2)) == "device: cpu"
    auto = spec("ddp", "auto", np=2)
    assert device_summary(auto) == (
        "device: auto (each rank: cuda where its host shows a GPU, else cpu)"
    )
    assert device_summary(auto, "cpu") == "device: auto (cpu on this host: no GPU visible)"
    assert device_summary(auto, "cuda") == (
        f"device: auto (cuda on this host), 2 GPUs per host, {NCCL_LINE}"
    )
