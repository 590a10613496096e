"""Both images, built with podman from a locally made Debian base, run `toolkit doctor` and 2-rank
jobs (DDP by the toolkit's launcher, Horovod by horovodrun) inside a container: the CPU image, and
the CUDA image on this machine's CPU, where its doctor must say that no GPU is visible and still
pass.

Skipped unless TOOLKIT_TEST_IMAGE=1: when an image is missing, its test builds it through
scripts/build_image.sh, which takes many minutes cold (installing podman and making the base
included; the CUDA image downloads several GB and compiles Horovod and DeepSpeed's GPU ops); with
the image present it runs only the script's checks inside the image.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = ROOT / "scripts" / "build_image.sh"
CPU_IMAGE = os.environ.get("TOOLKIT_IMAGE", "localhost/toolkit:cpu")
CUDA_IMAGE = os.environ.get("TOOLKIT_CUDA_IMAGE", "localhost/toolkit:cuda")

pytestmark = [
    pytest.mark.image,
    pytest.mark.skipif(
        os.environ.get("TOOLKIT_TEST_IMAGE") != "1",
        reason="image build and run: set TOOLKIT_TEST_IMAGE=1 (a cold build takes many minutes)",
    ),
]


def image_exists(image: str) -> bool:
    if shutil.which("podman") is None:
        return False
    return subprocess.run(["podman", "image", "exists", image], check=False).returncode == 0


def json_lines(output: str) -> list[dict[str, object]]:
    records = []
    for line in output.splitlines():
        start = line.find('{"')  # after a launcher's rank prefix, if any
        if start < 0:
            continue
        try:
            records.append(json.loads(line[start:]))
        except json.JSONDecodeError:
            continue
    return records


def build_and_check(build_mode: str, run_mode: str, image: str) -> str:
    """build_image.sh's output: it builds the image when missing, else only runs the checks."""
    mode = run_mode if image_exists(image) else build_mode
    result = subprocess.run(
        ["bash", str(BUILD_SCRIPT), mode],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )
    tail = "\n".join(result.stdout.splitlines()[-60:])
    assert result.returncode == 0, f"build_image.sh {mode} failed:\n{tail}"
    return result.stdout


def assert_two_rank_jobs(output: str) -> None:
    tail = "\n".join(output.splitlines()[-60:])
    records = json_lines(output)
    summaries = [record for record in records if "world_size" in record]
    # one summary per job: DDP under the toolkit's launcher, Horovod under horovodrun
    jobs = {(summary["backend"], summary["world_size"]) for summary in summaries}
    assert jobs == {("ddp", 2), ("horovod", 2)}, tail
    digests = [record["weights_sha256"] for record in records if "weights_sha256" in record]
    assert len(digests) == 4, tail  # both ranks of both jobs, one job after the other
    # the ranks of each job end with the same weights ...
    assert digests[0] == digests[1] and digests[2] == digests[3], tail
    # ... and both engines with the same model: same seed, data split and optimizer
    checksums = [float(summary["weights_checksum"]) for summary in summaries]
    assert checksums[0] == pytest.approx(checksums[1], rel=1e-5), summaries


def doctor_section(output: str) -> str:
    """The doctor step's output, from its step line to the next step's."""
    step = re.search(r"^==> \[image\] .*: toolkit doctor$", output, flags=re.MULTILINE)
    assert step, output[-3000:]
    end = output.find("==> [image]", step.end())
    return output[step.end() : end if end >= 0 else len(output)]


@pytest.mark.timeout(3 * 3600)
def test_cpu_image_runs_doctor_and_two_rank_jobs() -> None:
    output = build_and_check("all", "run", CPU_IMAGE)
    assert_two_rank_jobs(output)


@pytest.mark.timeout(4 * 3600)
def test_cuda_image_says_no_gpu_and_runs_two_rank_jobs_on_the_cpu() -> None:
    output = build_and_check("cuda", "cuda-run", CUDA_IMAGE)
    doctor = doctor_section(output)
    assert "no GPU visible" in doctor, doctor
    engines = {line.split()[0]: line for line in doctor.splitlines() if line[:1].isalpha()}
    # the engines' CUDA builds, not the CPU ones: torch with CUDA, Horovod with NCCL, DeepSpeed
    # with its GPU ops compiled in, TensorFlow built with CUDA
    assert "+cpu" not in engines["torch"] and "cuda no" not in engines["torch"], doctor
    assert "NCCL" in engines["horovod"], doctor
    assert "fused_adam" in engines["deepspeed"], doctor
    assert "built_with_cuda yes" in engines["tensorflow"], doctor
    assert_two_rank_jobs(output)
