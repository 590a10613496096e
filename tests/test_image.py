"""The CPU image, built with podman from a locally made Debian base, runs `toolkit doctor` and
2-rank jobs (DDP by the toolkit's launcher, Horovod by horovodrun) inside a container.

Skipped unless TOOLKIT_TEST_IMAGE=1: when the image is missing, the test builds it through
scripts/build_image.sh, which takes many minutes cold (installing podman and making the base
included); with the image present it runs only the script's checks inside the image.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = ROOT / "scripts" / "build_image.sh"
IMAGE = os.environ.get("TOOLKIT_IMAGE", "localhost/toolkit:cpu")

pytestmark = [
    pytest.mark.image,
    pytest.mark.skipif(
        os.environ.get("TOOLKIT_TEST_IMAGE") != "1",
        reason="image build and run: set TOOLKIT_TEST_IMAGE=1 (a cold build takes many minutes)",
    ),
]


def image_exists() -> bool:
    if shutil.which("podman") is None:
        return False
    return subprocess.run(["podman", "image", "exists", IMAGE], check=False).returncode == 0


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


@pytest.mark.timeout(3 * 3600)
def test_cpu_image_runs_doctor_and_two_rank_jobs() -> None:
    mode = "run" if image_exists() else "all"
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
    records = json_lines(result.stdout)
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
