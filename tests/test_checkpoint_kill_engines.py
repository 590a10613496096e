"""A rank of a real engine job killed (SIGKILL) in the middle of a periodic save: the job ends,
`latest` stays on a complete checkpoint, a new launch resumes from it by itself, and once it
has saved no leftover of the killed save remains.

The job is `toolkit launch` of tests/scripts/resume_torch.py, saving every step with a model
wide enough that a save takes a while. The test watches the checkpoint directory and kills the
chosen rank as soon as a save's staging directory (`.incomplete-step-N`) appears after the first
commit, so the kill lands while that rank writes its share; the other rank is then waiting for
it at the save's barrier, and the staging directory is left behind, which the test checks (so
the kill is known to have hit a save, not a step).

By default DDP with rank 1 killed (every rank writes its own random generator states) with
synchronous saves (rank 0 then waits at the save's barrier in vain), and DDP with rank 0 killed
with background saves (checkpoint.async: the kill lands while rank 0's writer thread writes the
weights, before it can commit; rank 1's part is too small to be caught: it is written, and rank
0 would commit without waiting for rank 1 again);
TOOLKIT_FAULTS=full adds ZeRO-2 with rank 1 and with rank 0 killed (each rank writes its own
optimizer partition there).
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.options import FULL_FAULTS
from tests.realrun import BIN, PYTHON, ROOT, json_objects, rank_env
from toolkit.checkpoint import latest, read_checkpoint
from toolkit.ports import free_port

pytestmark = pytest.mark.multiproc

SCRIPT = str(ROOT / "tests" / "scripts" / "resume_torch.py")
HIDDEN = "131072"
"""About 1.7 M parameters: 20 MB of weights and Adam state per save, so a save takes long
enough to be caught in the middle."""
JOB_BOUND_S = 300
LEFTOVER_PREFIXES = (".incomplete-", ".old-", ".latest.")
CASES = {
    "zero2-rank1": (
        "backend: deepspeed\nzero: {stage: 2}\nlaunch: {launcher: deepspeed, np: 2}",
        1,
    ),
    "zero2-rank0": (
        "backend: deepspeed\nzero: {stage: 2}\nlaunch: {launcher: deepspeed, np: 2}",
        0,
    ),
    "ddp-rank1": ("backend: ddp\nlaunch: {launcher: torchrun, np: 2}", 1),
    "ddp-rank0-async": ("backend: ddp\nlaunch: {launcher: torchrun, np: 2}", 0),
}
RUN = list(CASES) if FULL_FAULTS else ["ddp-rank1", "ddp-rank0-async"]


def write_spec(where: Path, engine_lines: str, checkpoints: Path, case: str) -> Path:
    """`-async` cases write their saves in the background (checkpoint.async)."""
    background = ", async: true" if case.endswith("-async") else ""
    spec = where / "spec.yaml"
    spec.write_text(
        f"{engine_lines}\nseed: 3\nbatch: {{global: 32, micro: 16}}\n"
        "optimizer: {name: adam, lr: 0.001}\n"
        f"checkpoint: {{dir: {checkpoints}, every_steps: 1, keep: 2{background}}}\n"
    )
    return spec


def launch(spec: Path, steps: int, log: Path) -> subprocess.Popen[bytes]:
    argv = [str(BIN / "toolkit"), "launch", "--spec", str(spec), "--timeout", str(JOB_BOUND_S)]
    script = [PYTHON, SCRIPT, "--spec", str(spec), "--steps", str(steps), "--hidden", HIDDEN]
    with log.open("wb") as sink:
        return subprocess.Popen(
            [*argv, "--", *script],
            cwd=ROOT,
            env={**rank_env(), "MASTER_PORT": str(free_port())},
            stdout=sink,
            stderr=subprocess.STDOUT,
        )


def staging_after_first_commit(checkpoints: Path, job: subprocess.Popen[bytes]) -> Path:
    """The first save's staging directory that appears once a checkpoint is committed."""
    deadline = time.monotonic() + JOB_BOUND_S
    while time.monotonic() < deadline and job.poll() is None:
        if (checkpoints / "latest").exists():
            staging = sorted(checkpoints.glob(".incomplete-step-*"))
            if staging:
                return staging[-1]
        time.sleep(0.001)
    raise AssertionError("no save started after the first commit")


def rank_process(spec: Path, rank: int, job: subprocess.Popen[bytes]) -> psutil.Process:
    """The training process of `rank` in the job started with `spec`, found before the watch
    starts so that the kill follows the staging directory's appearance at once."""
    deadline = time.monotonic() + JOB_BOUND_S
    while time.monotonic() < deadline and job.poll() is None:
        for process in psutil.process_iter(["cmdline"]):
            command = process.info["cmdline"] or []
            try:
                if str(spec) in command and SCRIPT in command and _rank_of(process) == str(rank):
                    return process
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        time.sleep(0.05)
    raise AssertionError(f"rank {rank} of the job is not running")


def _rank_of(process: psutil.Process) -> str | None:
    return process.environ().get("RANK")


def leftovers(checkpoints: Path) -> list[str]:
    return sorted(p.name for p in checkpoints.iterdir() if p.name.startswith(LEFTOVER_PREFIXES))


@pytest.mark.parametrize("case", RUN)
def test_a_rank_killed_while_saving_leaves_latest_complete_and_the_next_save_cleans_up(
    tmp_path: Path, case: str
) -> None:
    engine_lines, victim = CASES[case]
    checkpoints = tmp_path / "checkpoints"
    spec = write_spec(tmp_path, engine_lines, checkpoints, case)
    job = launch(spec, steps=1000, log=tmp_path / "killed.log")
    try:
        victim_process = rank_process(spec, victim, job)
        staging = staging_after_first_commit(checkpoints, job)
        victim_process.send_signal(signal.SIGKILL)
        status = job.wait(timeout=JOB_BOUND_S)
    finally:
        if job.poll() is None:
            job.kill()
    killed_log = (tmp_path / "killed.log").read_text(errors="replace")
    assert status != 0, killed_log[-3000:]
    assert staging.name in leftovers(checkpoints), "the kill did not land inside a save"
    committed = latest(checkpoints)
    assert committed is not None and committed.name < staging.name.removeprefix(".incomplete-")
    saved = read_checkpoint(committed)  # every file's checksum verified
    assert saved.model and saved.optimizer

    resumed_log = tmp_path / "resumed.log"
    again = launch(spec, steps=saved.step + 2, log=resumed_log)
    assert again.wait(timeout=JOB_BOUND_S) == 0, resumed_log.read_text()[-3000:]
    reports = [r for r in json_objects(resumed_log.read_text()) if "resumed_from" in r]
    assert {r["rank"]: r["resumed_from"] for r in reports} == {0: saved.step, 1: saved.step}
    assert leftovers(checkpoints) == []
    assert latest(checkpoints) is not None and read_checkpoint(checkpoints).step == saved.step + 2
