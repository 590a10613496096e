"""The spec's `device`: its resolution against a host's GPUs, the one-GPU-per-rank refusal, the
GPU counts a launching host reads, and the spec rules around them (pure logic: no GPU here)."""

from __future__ import annotations

from typing import Any

import pytest

from toolkit import device, gpu_facts
from toolkit.errors import ToolkitError
from toolkit.spec import SpecError, TrainSpec


@pytest.mark.parametrize(
    ("setting", "visible", "chosen"),
    [
        ("auto", 0, "cpu"),
        ("auto", 1, "cuda"),
        ("auto", 8, "cuda"),
        ("cpu", 0, "cpu"),
        ("cpu", 8, "cpu"),
        ("cuda", 2, "cuda"),
    ],
)
def test_the_setting_resolves_against_the_gpus_a_host_shows(
    setting: Any, visible: int, chosen: str
) -> None:
    assert device.resolve_device(setting, visible) == chosen


def test_cuda_without_a_gpu_is_refused_with_a_hint() -> None:
    with pytest.raises(ToolkitError) as caught:
        device.resolve_device("cuda", 0)
    assert "shows no GPU" in str(caught.value)
    assert "device: auto" in (caught.value.hint or "")


def test_more_local_ranks_than_gpus_is_refused_naming_both_counts() -> None:
    device.check_gpus_for_ranks(4, 4)
    device.check_gpus_for_ranks(1, 8)
    with pytest.raises(ToolkitError) as caught:
        device.check_gpus_for_ranks(3, 2, "node7")
    assert "3 ranks on node7, which shows 2 GPUs" in str(caught.value)
    assert "at most 2 ranks per host" in (caught.value.hint or "")


def test_the_process_group_backend_follows_the_device() -> None:
    assert device.process_group_backend("cuda") == "nccl"
    assert device.process_group_backend("cpu") == "gloo"


@pytest.mark.parametrize(
    ("listed", "count"),
    [("0,1,2", 3), ("3", 1), ("", 0), ("-1", 0), ("0,-1,2", 1), ("GPU-5a1b,GPU-77c2", 2)],
)
def test_cuda_visible_devices_counts_up_to_the_first_entry_that_is_no_device(
    listed: str, count: int
) -> None:
    assert device.cuda_visible_count({"CUDA_VISIBLE_DEVICES": listed}) == count


def test_without_cuda_visible_devices_every_gpu_is_visible(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    listed = gpu_facts.GpuListing(
        gpus=tuple(
            gpu_facts.Gpu(index, f"GPU-{index}", "NVIDIA H200", 143771, "570") for index in range(8)
        )
    )
    monkeypatch.setattr(gpu_facts, "list_gpus", lambda environ: listed)
    assert device.cuda_visible_count({}) is None
    assert gpu_facts.visible_gpus({}) == 8
    assert gpu_facts.visible_gpus({"CUDA_VISIBLE_DEVICES": "0,1"}) == 2
    assert gpu_facts.visible_gpus({"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7,8,9"}) == 8


def test_a_host_without_a_driver_shows_no_gpu() -> None:
    # This machine has no nvidia-smi: the probe answers 0, never fails.
    assert gpu_facts.visible_gpus({"PATH": "/usr/bin:/bin"}) == 0


def test_auto_says_once_on_rank_0_which_device_it_chose(capsys: pytest.CaptureFixture[str]) -> None:
    device.announce("auto", "cpu", 0, rank=0)
    device.announce("auto", "cpu", 0, rank=1)
    device.announce("cpu", "cpu", 0, rank=0)
    device.announce("auto", "cuda", 4, rank=0)
    assert capsys.readouterr().err.splitlines() == [
        "toolkit: device auto: cpu (no GPU visible)",
        "toolkit: device auto: cuda (4 GPUs visible)",
    ]


def _issue_paths(data: dict[str, Any]) -> list[str]:
    with pytest.raises(SpecError) as caught:
        TrainSpec.from_dict(data)
    return [issue.path for issue in caught.value.issues]


def test_the_device_defaults_to_auto_and_round_trips() -> None:
    assert TrainSpec.from_dict({}).device == "auto"
    spec = TrainSpec.from_dict({"device": "cuda", "launch": {"gpus_per_host": 8}})
    assert TrainSpec.from_dict(spec.to_dict()) == spec
    assert _issue_paths({"device": "gpu"}) == ["device"]


def test_gpus_per_host_sets_the_ranks_of_one_host() -> None:
    spec = TrainSpec.from_dict(
        {"device": "cuda", "batch": {"global": 64}, "launch": {"gpus_per_host": 8}}
    )
    assert spec.world_size == 8
    assert spec.batch_for().micro == 8


def test_gpus_per_host_needs_device_cuda() -> None:
    assert _issue_paths({"device": "cpu", "launch": {"gpus_per_host": 2}}) == [
        "launch.gpus_per_host"
    ]
    assert _issue_paths({"launch": {"gpus_per_host": 2}}) == ["launch.gpus_per_host"]


def test_more_ranks_than_gpus_per_host_is_refused() -> None:
    assert _issue_paths({"device": "cuda", "launch": {"np": 4, "gpus_per_host": 2}}) == [
        "launch.np"
    ]
    crowded = {"device": "cuda", "launch": {"hosts": ["a:4", "b:4"], "gpus_per_host": 2}}
    assert _issue_paths(crowded) == ["launch.gpus_per_host"]
    several = {"device": "cuda", "launch": {"np": 4, "hosts": ["a:2", "b:2"], "gpus_per_host": 2}}
    assert TrainSpec.from_dict(several).world_size == 4


def test_tf_nccl_is_refused_on_the_cpu_only() -> None:
    assert _issue_paths({"backend": "tf", "device": "cpu", "tf": {"communication": "nccl"}}) == [
        "tf.communication"
    ]
    for setting in ("auto", "cuda"):
        spec = TrainSpec.from_dict(
            {"backend": "tf", "device": setting, "tf": {"communication": "nccl"}}
        )
        assert spec.tf.communication == "nccl"
