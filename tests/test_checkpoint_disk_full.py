"""A disk that fills up during a save, for real: `checkpoint.dir` is a 1 MiB tmpfs that holds one
checkpoint of the job (672 KiB) but not two. The save of step 2 fails on a rank with ENOSPC;
every rank learns of it, nothing saved before is lost (`latest` stays on step 1, which
verifies), and the job stops with status 74 and the error in one line (`save_failure: stop`, a
synchronous save) or says so and trains to the end (`save_failure: continue`, a background
save).

Needs root to mount the tmpfs; skips with the reason elsewhere.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.realrun import BIN, ROOT, run
from toolkit.checkpoint import latest, read_checkpoint
from toolkit.exit_status import SAVE_FAILED

pytestmark = [pytest.mark.multiproc, pytest.mark.usefixtures("no_orphans")]

SCRIPT = str(ROOT / "tests" / "scripts" / "resume_torch.py")
HIDDEN = "4096"
"""Weights and Adam state of 53 k parameters: 672 KiB per checkpoint."""
TMPFS_SIZE = "1m"
STEPS = 4


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip() or 'needs root'}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "--lazy", str(mount_point)], check=False)


def write_spec(where: Path, checkpoints: Path, options: str) -> Path:
    spec = where / "spec.yaml"
    spec.write_text(
        "backend: ddp\nseed: 3\nbatch: {global: 32, micro: 16}\n"
        "optimizer: {name: adam, lr: 0.001}\nlaunch: {np: 2}\n"
        f"checkpoint: {{dir: {checkpoints}, every_steps: 1, keep: 0, {options}}}\n"
    )
    return spec


def train(spec: Path) -> tuple[int, str]:
    argv = [str(BIN / "toolkit"), "launch", "--spec", str(spec), "--"]
    script = [SCRIPT, "--spec", str(spec), "--steps", str(STEPS), "--hidden", HIDDEN]
    result = run([*argv, *script])
    return result.returncode, result.output


def assert_step_1_is_kept(checkpoints: Path, output: str) -> None:
    committed = latest(checkpoints)
    assert committed is not None and committed.name == "step-000001", output[-3000:]
    assert read_checkpoint(checkpoints).step == 1  # every file's checksum verified
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest", "step-000001"]


def said_about_step_2(output: str, disk: Path) -> list[str]:
    """The ranks' own lines about step 2's save (`toolkit launch` tags them "[rank N]"); the
    launcher's final report may quote the failed rank's last lines again, untagged."""
    said = f"could not save step 2 to {disk}: "
    return [line for line in output.splitlines() if line.startswith("[rank") and said in line]


def test_a_full_disk_stops_the_job_in_one_line_and_keeps_the_last_checkpoint(
    tmp_path: Path, small_disk: Path
) -> None:
    status, output = train(write_spec(tmp_path, small_disk, "save_failure: stop"))
    assert status == SAVE_FAILED, output[-3000:]
    (line,) = said_about_step_2(output, small_disk)
    assert "No space left on device" in line and line.endswith(
        f"stopping with status {SAVE_FAILED}"
    )
    ranks_said = [line for line in output.splitlines() if line.startswith("[rank")]
    assert not [line for line in ranks_said if "Traceback" in line], output[-3000:]
    assert_step_1_is_kept(small_disk, output)


def test_with_continue_a_background_save_that_fills_the_disk_is_reported_and_training_ends(
    tmp_path: Path, small_disk: Path
) -> None:
    options = "async: true, save_failure: continue"
    status, output = train(write_spec(tmp_path, small_disk, options))
    assert status == 0, output[-3000:]
    assert f'"step": {STEPS}' in output, output[-3000:]
    (line,) = said_about_step_2(output, small_disk)
    assert "No space left on device" in line and line.endswith("training goes on"), line
    assert_step_1_is_kept(small_disk, output)
