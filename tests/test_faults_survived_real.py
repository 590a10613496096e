"""Faults a job survives: a lost rank restarts the job from its last checkpoint
(`launch.max_restarts`, toolkit.launch.restarts), and a signal saves a checkpoint before the
job stops (`checkpoint.save_on_signal`, toolkit.runtime.preemption). Either way the job ends
with the weights of the run that lost nothing.

Restarts: rank 1 SIGKILLs itself once, after step 5 of 7 (saves every 3 steps,
tests/resuming.py's plan); `toolkit launch` stops the job, starts it again, and the ranks
resume from step 3 by themselves. Preemption: a SIGTERM to `toolkit launch`, or a SIGUSR1 to
rank 1 alone, once step 3 is saved; every rank saves the next step, the job ends with status
75, and a new launch resumes from there. Same engine, same world size: the final weights are
bitwise equal. DDP under torchrun by default, with synchronous and with background saves
(`checkpoint.async`), and the fallback from a damaged `latest`; with TOOLKIT_FAULTS=full
Horovod, ZeRO-2 and TF MultiWorker too, and preemption with background saves.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil
import pytest

from tests.options import FULL_FAULTS
from tests.realrun import BIN, ROOT, RUN_TIMEOUT_S, RunOutput, rank_env, run
from tests.resuming import (
    EVERY,
    OPTIMIZERS,
    STEPS,
    TF_SCRIPT,
    TORCH_SCRIPT,
    assert_identical,
    weights,
)
from toolkit.launch.outcome import PREEMPTED

pytestmark = [pytest.mark.multiproc, pytest.mark.usefixtures("no_orphans")]

KILL_AT = 5


@dataclass(frozen=True)
class Engine:
    lines: str
    script: str = TORCH_SCRIPT
    saves: str = ""
    """More checkpoint settings."""


ENGINES = {
    "ddp": Engine("backend: ddp"),
    "ddp-async": Engine("backend: ddp", saves=", async: true"),
    "horovod": Engine("backend: horovod"),
    "zero2": Engine("backend: deepspeed\nzero: {stage: 2}"),
    "multiworker": Engine("backend: tf\ntf: {port: 23671}", TF_SCRIPT),
}
DEFAULT = ("ddp", "ddp-async")


def write_spec(where: Path, engine: Engine, checkpoints: Path) -> Path:
    """Every job here restarts and saves on a signal; neither changes a weight."""
    spec = where / f"{checkpoints.name}.yaml"
    spec.write_text(
        f"{engine.lines}\nseed: 3\nbatch: {{global: 64, micro: 16}}\n{OPTIMIZERS['adam']}\n"
        "schedule: {name: warmup_cosine, warmup_steps: 3, total_steps: 10}\n"
        f"checkpoint: {{dir: {checkpoints}, every_steps: {EVERY}, keep: 2, save_on_signal: true"
        f"{engine.saves}}}\n"
        "launch: {np: 2, max_restarts: 2}\n"
    )
    return spec


def command(engine: Engine, spec: Path, out: Path, *script_args: str) -> list[str]:
    argv = [str(BIN / "toolkit"), "launch", "--spec", str(spec), "--", engine.script]
    return [*argv, "--spec", str(spec), "--steps", str(STEPS), "--out", str(out), *script_args]


def launch(engine: Engine, spec: Path, out: Path, *script_args: str) -> RunOutput:
    result = run(command(engine, spec, out, *script_args))
    assert result.returncode == 0, result.explain()
    return result


_REFERENCES: dict[str, dict[str, np.ndarray]] = {}


@pytest.fixture
def uninterrupted(
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[[str], dict[str, np.ndarray]]:
    """The weights of an engine's run that lost nothing, trained once per session."""

    def weights_of(name: str) -> dict[str, np.ndarray]:
        if name not in _REFERENCES:
            where = tmp_path_factory.mktemp(f"{name}-uninterrupted")
            engine = ENGINES[name]
            spec = write_spec(where, engine, where / "checkpoints")
            launch(engine, spec, where / "weights.npz")
            _REFERENCES[name] = weights(where / "weights.npz")
        return _REFERENCES[name]

    return weights_of


def engines(default: tuple[str, ...]) -> list[object]:
    skip = pytest.mark.skip(reason="with TOOLKIT_FAULTS=full")
    return [
        pytest.param(name, marks=[] if name in default or FULL_FAULTS else skip) for name in ENGINES
    ]


@pytest.mark.parametrize("name", engines(DEFAULT))
def test_a_killed_rank_restarts_the_job_which_ends_with_the_uninterrupted_weights(
    tmp_path: Path, name: str, uninterrupted: Callable[[str], dict[str, np.ndarray]]
) -> None:
    engine = ENGINES[name]
    reference = uninterrupted(name)
    spec = write_spec(tmp_path, engine, tmp_path / "checkpoints")
    marker = tmp_path / "killed"
    crash = ("--kill-at", str(KILL_AT), "--kill-once", str(marker))
    result = launch(engine, spec, tmp_path / "restarted.npz", *crash)
    assert marker.exists(), result.explain()
    restarts = [line for line in result.output.splitlines() if "toolkit launch: restart" in line]
    assert len(restarts) == 1, result.explain()
    assert "restart 1 of 2 after" in restarts[0], result.explain()
    assert f"continuing from step {EVERY} (" in restarts[0], result.explain()
    assert "rank 1 on host" in result.output, result.explain()
    assert_identical(weights(tmp_path / "restarted.npz"), reference)
    if name == "ddp":
        a_damaged_latest_is_passed_over(engine, spec, tmp_path, reference)


def a_damaged_latest_is_passed_over(
    engine: Engine, spec: Path, tmp: Path, reference: dict[str, np.ndarray]
) -> None:
    """The restarted run saved steps 3 and 6; with step 6's weights truncated, a new launch
    of the same 7 steps resumes from step 3, says why, and ends with the same weights."""
    model = tmp / "checkpoints" / "step-000006" / "model-rank0-of-2.safetensors"
    model.write_bytes(model.read_bytes()[:-16])
    result = launch(engine, spec, tmp / "after-damage.npz")
    assert "toolkit: not resuming from step-000006: " in result.output, result.explain()
    assert "(truncated or replaced)" in result.output, result.explain()
    assert f"at step {EVERY}, saved by ddp" in result.output, result.explain()
    assert_identical(weights(tmp / "after-damage.npz"), reference)


def rank_process(launch: subprocess.Popen[str], rank: int, script: str) -> psutil.Process:
    """The process of `rank` among the launch's descendants (the one running the script,
    with its launcher's rank variable)."""
    for process in psutil.Process(launch.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if script in process.cmdline() and process.environ().get("RANK") == str(rank):
                return process
    raise AssertionError(f"no process of rank {rank} found")


def wait_for(path: Path, launch: subprocess.Popen[str], seconds: float = 180) -> None:
    end = time.monotonic() + seconds
    while not path.exists():
        assert launch.poll() is None, "the job ended before its first save"
        assert time.monotonic() < end, f"{path} did not appear within {seconds:g} s"
        time.sleep(0.05)


SIGNALLED = [
    pytest.param("ddp", "launch"),
    pytest.param("ddp", "rank 1"),
    *(
        pytest.param(name, "launch", marks=pytest.mark.skip(reason="with TOOLKIT_FAULTS=full"))
        if not FULL_FAULTS
        else pytest.param(name, "launch")
        for name in ENGINES
        if name != "ddp"
    ),
]


@pytest.mark.parametrize(("name", "target"), SIGNALLED)
def test_a_signal_saves_every_rank_then_a_new_launch_resumes_exactly(
    tmp_path: Path, name: str, target: str, uninterrupted: Callable[[str], dict[str, np.ndarray]]
) -> None:
    engine = ENGINES[name]
    reference = uninterrupted(name)
    checkpoints = tmp_path / "checkpoints"
    spec = write_spec(tmp_path, engine, checkpoints)
    argv = command(engine, spec, tmp_path / "preempted.npz", "--step-seconds", "1")
    with subprocess.Popen(
        argv,
        cwd=ROOT,
        env=rank_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        stdin=subprocess.DEVNULL,
    ) as job:
        try:
            wait_for(checkpoints / f"step-{EVERY:06d}" / "manifest.json.sha256", job)
            if target == "launch":
                job.send_signal(signal.SIGTERM)
            else:
                rank_process(job, 1, engine.script).send_signal(signal.SIGUSR1)
            output, _ = job.communicate(timeout=RUN_TIMEOUT_S)
        finally:
            if job.poll() is None:
                job.kill()
    explain = f"exit {job.returncode}\n{output}"
    assert job.returncode == PREEMPTED, explain
    saved = (checkpoints / "latest").read_text().strip()
    step = int(saved.removeprefix("step-"))
    assert EVERY < step < STEPS, explain
    why = "SIGUSR1" if target == "launch" else "another rank's signal"  # what rank 0 got
    assert f"toolkit: preempted ({why}): saved step {step} to " in output, explain
    assert not (tmp_path / "preempted.npz").exists()  # the script stopped at the save
    result = launch(engine, spec, tmp_path / "resumed.npz")
    assert f"at step {step}, saved by" in result.output, result.explain()
    assert_identical(weights(tmp_path / "resumed.npz"), reference)
