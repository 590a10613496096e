"""`toolkit plan` on CUDA: each row's memory on one GPU against the GPU's capacity (--gpu-memory,
the smallest visible GPU, or unknown), and CPU plans as they were."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolkit.cli import main
from toolkit.gpu_facts import Gpu, GpuListing
from toolkit.plan import gpu
from toolkit.plan import memory as mem
from toolkit.plan.table import PlanRow
from toolkit.units import MIB

GIB = float(1 << 30)
MIXED = (
    Gpu(0, "GPU-aaaa", "NVIDIA A100-SXM4-80GB", 81920, "550.54.15"),
    Gpu(1, "GPU-bbbb", "NVIDIA A100-SXM4-40GB", 40960, "550.54.15"),
)
# 2e9 fp32 AdamW parameters on 2 ranks: a replicated engine holds at least 16 bytes each
# (32 GB), ZeRO-3 with everything offloaded only its buckets and one gathered layer.
PARAMS = ["--params", str(2 * 10**9), "--largest-layer", str(10**7)]


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch) -> list[GpuListing]:
    """What the (mocked) driver lists; starts with none, as on this machine."""
    listed = [GpuListing(reason="nvidia-smi not found")]
    monkeypatch.setattr(gpu, "list_gpus", lambda environ: listed[0])
    return listed


def write_spec(tmp_path: Path, device: str) -> str:
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        f"backend: deepspeed\ndevice: {device}\noptimizer: {{name: adamw}}\n"
        "batch: {global: 8, micro: 4}\nlaunch: {np: 2}\n"
    )
    return str(spec)


def plan(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["plan", *argv]) == 0
    return capsys.readouterr().out


def gpu_rows(table: str) -> dict[str, str]:
    """The per-GPU block's rows, by engine row name."""
    block = table.split("\nper GPU", 1)[1].split("\n\n")[1].splitlines()[1:]
    return {line[:38].strip(): line for line in block}


def test_capacity_is_the_option_else_the_smallest_visible_gpu_else_unknown(
    driver: list[GpuListing],
) -> None:
    given = gpu.capacity_for("cpu", 80.0, {})
    assert given == gpu.Capacity(80 * GIB, "--gpu-memory 80")
    assert gpu.capacity_for("cuda", None, {}) == gpu.Capacity(None, "nvidia-smi not found")
    assert gpu.capacity_for("auto", None, {}) is None  # auto without a GPU trains on the CPU
    driver[0] = GpuListing(MIXED, "", None, MIXED)
    found = gpu.capacity_for("auto", None, {})
    assert found is not None and found.bytes == 40960 * MIB
    assert "GPU 1, NVIDIA A100-SXM4-40GB, nvidia-smi" in found.source


def test_a_cpu_spec_never_asks_the_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(environ: object) -> GpuListing:
        raise AssertionError("nvidia-smi asked for a CPU plan")

    monkeypatch.setattr(gpu, "list_gpus", refuse)
    assert gpu.capacity_for("cpu", None, {}) is None


def test_per_gpu_is_the_device_share_and_headroom_what_is_left() -> None:
    """Offloaded state lives on the host; what is never held together is left out once."""
    memory = mem.Memory(
        device={"parameters": 4 * GIB, "gradients": 2 * GIB, "buffers": 1 * GIB},
        host={"optimizer": 16 * GIB},
        activations=3 * GIB,
        never_together=1 * GIB,
    )
    row = PlanRow("deepspeed zero-2 offload opt", memory, bytes_per_step=0.0)
    (fit,) = gpu.fits([row], gpu.Capacity(8 * GIB, "--gpu-memory 8"))
    assert fit.per_gpu == memory.device_total == 9 * GIB
    assert fit.headroom == -1 * GIB and fit.fits is False and fit.activations_counted
    (unknown,) = gpu.fits([row], gpu.Capacity(None, "nvidia-smi not found"))
    assert unknown.headroom is None and unknown.fits is None


def test_plan_cli_compares_every_row_with_the_given_gpu_memory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], driver: list[GpuListing]
) -> None:
    spec = write_spec(tmp_path, "cuda")
    data = json.loads(plan(capsys, "--spec", spec, *PARAMS, "--gpu-memory", "24", "--json"))
    block = data["gpu"]
    assert block["capacity_bytes"] == 24 * GIB and block["capacity_source"] == "--gpu-memory 24"
    assert [row["name"] for row in block["rows"]] == [row["name"] for row in data["rows"]]
    for planned, fit in zip(data["rows"], block["rows"], strict=True):
        memory = planned["memory"]
        per_gpu = memory["total"] - sum(memory["host"].values())
        assert fit["per_gpu_bytes"] == pytest.approx(per_gpu)
        assert fit["headroom_bytes"] == pytest.approx(24 * GIB - per_gpu)
        assert fit["fits"] == (per_gpu <= 24 * GIB)
        assert fit["activations_counted"] is False  # --params: the model is not measured
    verdicts = {row["name"]: row["fits"] for row in block["rows"]}
    assert verdicts["ddp+torch"] is False
    assert verdicts["deepspeed zero-3 offload opt+params"] is True

    table = plan(capsys, "--spec", spec, *PARAMS, "--gpu-memory", "24")
    assert "per GPU against 24.0 GiB (24,576 MiB): --gpu-memory 24" in table
    rows = gpu_rows(table)
    assert list(rows) == list(verdicts)
    assert rows["deepspeed zero-3 offload opt+params"].endswith("  yes")
    assert rows["ddp+torch"].endswith("  NO") and " -" in rows["ddp+torch"]
    assert gpu.COUNTED in table and gpu.NO_ACTIVATIONS in table


def test_cuda_spec_without_a_visible_gpu_says_the_capacity_is_unknown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], driver: list[GpuListing]
) -> None:
    table = plan(capsys, "--spec", write_spec(tmp_path, "cuda"), *PARAMS)
    assert "per GPU, capacity unknown (nvidia-smi not found; give --gpu-memory GiB)" in table
    assert all(line.endswith("  unknown") for line in gpu_rows(table).values())


def test_cuda_spec_takes_the_smallest_gpu_the_driver_lists(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], driver: list[GpuListing]
) -> None:
    driver[0] = GpuListing(MIXED, "", None, MIXED)
    data = json.loads(plan(capsys, "--spec", write_spec(tmp_path, "cuda"), *PARAMS, "--json"))
    assert data["gpu"]["capacity_bytes"] == 40960 * MIB


@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_cpu_plans_are_unchanged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], driver: list[GpuListing], device: str
) -> None:
    spec = write_spec(tmp_path, device)
    assert "per GPU" not in plan(capsys, "--spec", spec, *PARAMS)
    assert "gpu" not in json.loads(plan(capsys, "--spec", spec, *PARAMS, "--json"))


@pytest.mark.parametrize("value", ["0", "-8", "nan", "inf", "lots"])
def test_gpu_memory_must_be_a_positive_number_of_gib(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["plan", "--spec", write_spec(tmp_path, "cuda"), *PARAMS, "--gpu-memory", value])
    assert stopped.value.code == 2
    assert "--gpu-memory" in capsys.readouterr().err
