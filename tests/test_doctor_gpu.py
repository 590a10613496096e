"""`toolkit doctor`'s GPU section: nvidia-smi's answer read from text, a fake nvidia-smi on PATH
(listing GPUs, failing, hanging), CUDA_VISIBLE_DEVICES, and the real doctor on this machine."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import venv
from pathlib import Path

import pytest

from toolkit import gpu_facts
from toolkit.doctor.checks import DoctorReport, gpu_problems
from toolkit.doctor.format import format_report, gpu_lines
from toolkit.doctor.probe_protocol import GpuSupport, ProbeReport
from toolkit.gpu_facts import Gpu, GpuListing, admitted_gpus, list_gpus, parse_query

ROOT = Path(__file__).resolve().parent.parent
H200_LINES = (
    "0, GPU-4f1a2b3c-0000-1111-2222-333344445555, NVIDIA H200, 143771, 570.124.06\n"
    "1, GPU-9e8d7c6b-0000-1111-2222-333344445555, NVIDIA H200, 143771, 570.124.06\n"
)
MIXED = (
    Gpu(0, "GPU-aaaa", "NVIDIA A100-SXM4-80GB", 81920, "550.54.15"),
    Gpu(1, "GPU-bbbb", "NVIDIA A100-SXM4-40GB", 40960, "550.54.15"),
)
NO_GPU = GpuListing(reason="nvidia-smi not found")


def fake_smi(directory: Path, body: str) -> dict[str, str]:
    """An environment whose PATH finds only a fake `nvidia-smi` running the shell `body`."""
    smi = directory / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\n{body}\n")
    smi.chmod(0o755)
    return {"PATH": f"{directory}:/bin:/usr/bin"}


def test_query_asks_for_every_field_without_header_or_units() -> None:
    assert gpu_facts.query_argv("/usr/bin/nvidia-smi") == [
        "/usr/bin/nvidia-smi",
        "--query-gpu=index,uuid,name,memory.total,driver_version",
        "--format=csv,noheader,nounits",
    ]


def test_parse_reads_each_gpu_and_skips_what_is_not_a_record() -> None:
    odd = "2, GPU-x, NVIDIA GH200, 480GB, [N/A], 570.124.06\n"  # a comma in the name
    gpus = parse_query(H200_LINES + "\n" + odd + "No devices were found\n")
    assert [gpu.index for gpu in gpus] == [0, 1, 2]
    assert gpus[2].name == "NVIDIA GH200, 480GB"
    assert gpus[0] == Gpu(
        0, "GPU-4f1a2b3c-0000-1111-2222-333344445555", "NVIDIA H200", 143771, "570.124.06"
    )
    assert gpus[2].memory_mib is None
    assert parse_query("No devices were found\n") == ()


@pytest.mark.parametrize(
    ("visible", "indices"),
    [
        (None, [0, 1]),  # unset: every GPU
        ("1", [1]),
        ("GPU-bbbb", [1]),  # a UUID, whole
        ("GPU-b", [1]),  # ... or a prefix that fits one GPU
        ("GPU-", [0, 1]),  # a prefix that fits both: unknown, all count
        ("", []),  # hides them all
        ("1,-1,0", [1]),  # CUDA stops at the first entry that is not a device
        ("MIG-1234", [0, 1]),  # names no listed GPU: all count, the smallest is the bound
    ],
)
def test_cuda_visible_devices_picks_the_gpus_a_job_sees(
    visible: str | None, indices: list[int]
) -> None:
    environ = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"} | (
        {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    )
    assert [gpu.index for gpu in admitted_gpus(MIXED, environ)] == indices


def test_indices_count_every_gpu_where_cuda_may_order_them_otherwise() -> None:
    """CUDA's default order is fastest first, not nvidia-smi's PCI order: with unlike GPUs an
    index may mean either, so both count; alike GPUs make the order irrelevant."""
    assert len(admitted_gpus(MIXED, {"CUDA_VISIBLE_DEVICES": "1"})) == 2
    alike = parse_query(H200_LINES)
    assert [gpu.index for gpu in admitted_gpus(alike, {"CUDA_VISIBLE_DEVICES": "1"})] == [1]


def test_smallest_is_the_gpu_with_least_memory() -> None:
    assert gpu_facts.smallest(MIXED) == MIXED[1]
    assert gpu_facts.smallest(()) is None


def test_fake_nvidia_smi_is_asked_the_query_and_listed(tmp_path: Path) -> None:
    said = tmp_path / "argv"
    environ = fake_smi(tmp_path, f'echo "$@" > {said}\nprintf "{H200_LINES}"')
    listing = list_gpus(environ | {"CUDA_VISIBLE_DEVICES": "1"})
    assert said.read_text().split() == gpu_facts.query_argv("nvidia-smi")[1:]
    assert [gpu.name for gpu in listing.gpus] == ["NVIDIA H200", "NVIDIA H200"]
    assert [gpu.index for gpu in listing.admitted] == [1]
    assert listing.cuda_visible_devices == "1" and listing.reason == ""


def test_failing_nvidia_smi_says_why(tmp_path: Path) -> None:
    failed = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    listing = list_gpus(fake_smi(tmp_path, f'echo "{failed}"\nexit 9'))
    assert listing.gpus == ()
    assert listing.reason.endswith(f"exited 9: {failed}")


def test_hung_nvidia_smi_is_abandoned_after_its_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gpu_facts, "NVIDIA_SMI_TIMEOUT_S", 0.5)
    started = time.monotonic()
    listing = list_gpus(fake_smi(tmp_path, "exec sleep 60"))
    assert time.monotonic() - started < 5
    assert listing.gpus == () and listing.reason.endswith("did not answer in 0.5s")


def test_no_driver_is_no_gpu_visible(tmp_path: Path) -> None:
    assert list_gpus({"PATH": str(tmp_path)}).reason == "nvidia-smi not found"
    assert gpu_lines(NO_GPU, []) == ["GPUs: no GPU visible (nvidia-smi not found)"]


def test_section_lists_gpus_the_visible_ones_and_each_engines_own_line() -> None:
    listing = GpuListing(MIXED, "", "1", (MIXED[1],))
    torch = ProbeReport("torch", True, gpu=GpuSupport(True, 1, "CUDA 12.8 build; 1 GPU"))
    mpi = ProbeReport("mpi", True)
    assert gpu_lines(listing, [torch, mpi]) == [
        "GPUs: 2 listed by NVIDIA driver 550.54.15",
        "  GPU 0      NVIDIA A100-SXM4-80GB, 81,920 MiB",
        "  GPU 1      NVIDIA A100-SXM4-40GB, 40,960 MiB",
        "  CUDA_VISIBLE_DEVICES='1' (a job sees: GPU 1)",
        "  torch      CUDA 12.8 build; 1 GPU",
    ]
    hidden = GpuListing(MIXED, "", "", ())
    assert (
        gpu_lines(hidden, [])[0] == "GPUs: no GPU visible (CUDA_VISIBLE_DEVICES hides the 2 listed)"
    )


def test_gpus_an_engine_cannot_use_are_a_known_issue_never_an_error() -> None:
    cpu_build = ProbeReport("torch", True, gpu=GpuSupport(False, 0, "CPU-only build"))
    blind = ProbeReport("tensorflow", True, gpu=GpuSupport(True, 0, "CUDA 12.5 build"))
    counted = ProbeReport("horovod", True, gpu=GpuSupport(True, None, "built with CUDA"))
    assert gpu_problems(cpu_build, 0) == []  # no GPU: the CPU build is what this host needs
    (cpu_issue,) = gpu_problems(cpu_build, 2)
    assert not cpu_issue.blocking and "CPU-only build" in cpu_issue.message
    assert "TOOLKIT_DEVICE=cuda" in cpu_issue.fix
    (blind_issue,) = gpu_problems(blind, 1)
    assert not blind_issue.blocking and "sees none" in blind_issue.message
    assert gpu_problems(counted, 2) == []  # Horovod counts no GPUs before a job starts
    cpu_build.problems += [cpu_issue]
    report = DoctorReport("py", [cpu_build], gpus=GpuListing(MIXED, "", None, MIXED))
    assert report.ok and "known issue: this host shows 2 GPUs" in format_report(report)


def test_probe_report_round_trips_its_gpu_side() -> None:
    report = ProbeReport("torch", True, "2.13", gpu=GpuSupport(True, 2, "CUDA", {"nccl": "2.27"}))
    assert ProbeReport.from_json(report.to_json()) == report
    assert ProbeReport.from_json(ProbeReport("mpi", True).to_json()).gpu is None


def run_doctor(
    python: str, *args: str, path: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": path or os.environ["PATH"]}
    return subprocess.run(
        [python, "-m", "toolkit", "doctor", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this host has a driver")
def test_real_doctor_without_a_gpu_says_so_and_passes() -> None:
    done = run_doctor(sys.executable)
    assert done.returncode == 0, done.stdout + done.stderr
    section = done.stdout.split("GPUs: ", 1)[1].split("\n\n", 1)[0].splitlines()
    assert section[0] == "no GPU visible (nvidia-smi not found)"
    lines = {line.split()[0]: line for line in section[1:]}
    assert set(lines) == {"torch", "tensorflow", "deepspeed", "horovod"}
    assert all("CPU-only build" in line for line in lines.values()), section
    assert "known issue: this host shows" not in done.stdout


def test_doctor_without_engines_lists_the_gpus_of_a_fake_driver(tmp_path: Path) -> None:
    """The GPU section needs nothing but the standard library: a bare interpreter prints it."""
    env_dir = tmp_path / "bare-venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    fake_smi(tmp_path, f'printf "{H200_LINES}"')
    done = run_doctor(
        str(env_dir / "bin" / "python"), "--engine", "torch", path=f"{tmp_path}:/bin:/usr/bin"
    )
    assert done.returncode == 1  # torch is missing, as before; the GPUs change nothing
    assert "Traceback" not in done.stdout + done.stderr
    assert "GPUs: 2 listed by NVIDIA driver 570.124.06" in done.stdout
    assert "  GPU 1      NVIDIA H200, 143,771 MiB" in done.stdout
