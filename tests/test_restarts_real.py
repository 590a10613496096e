"""A job that loses a rank restarts from its last checkpoint and ends with the weights of the
run that lost nothing (`launch.max_restarts`, toolkit.launch.restarts).

Rank 1 SIGKILLs itself once, after step 5 of 7 (saves every 3 steps, tests/resuming.py's
plan); `toolkit launch` stops the job, starts it again, and the ranks resume from step 3 by
themselves. Same engine, same world size: the final weights are bitwise equal. DDP under
torchrun by default, which also holds the fallback from a damaged `latest`; with
TOOLKIT_FAULTS=full Horovod, ZeRO-2 and TF MultiWorker too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.options import FULL_FAULTS
from tests.realrun import BIN, RunOutput, run
from tests.resuming import (
    EVERY,
    OPTIMIZERS,
    STEPS,
    TF_SCRIPT,
    TORCH_SCRIPT,
    assert_identical,
    weights,
)

pytestmark = [pytest.mark.multiproc, pytest.mark.usefixtures("no_orphans")]

KILL_AT = 5


@dataclass(frozen=True)
class Engine:
    lines: str
    script: str = TORCH_SCRIPT


ENGINES = {
    "ddp": Engine("backend: ddp"),
    "horovod": Engine("backend: horovod"),
    "zero2": Engine("backend: deepspeed\nzero: {stage: 2}"),
    "multiworker": Engine("backend: tf\ntf: {port: 23671}", TF_SCRIPT),
}
DEFAULT = ("ddp",)


def write_spec(where: Path, engine: Engine, checkpoints: Path) -> Path:
    spec = where / f"{checkpoints.name}.yaml"
    spec.write_text(
        f"{engine.lines}\nseed: 3\nbatch: {{global: 64, micro: 16}}\n{OPTIMIZERS['adam']}\n"
        "schedule: {name: warmup_cosine, warmup_steps: 3, total_steps: 10}\n"
        f"checkpoint: {{dir: {checkpoints}, every_steps: {EVERY}, keep: 2}}\n"
        "launch: {np: 2, max_restarts: 2}\n"
    )
    return spec


def launch(engine: Engine, spec: Path, out: Path, *script_args: str) -> RunOutput:
    command = [str(BIN / "toolkit"), "launch", "--spec", str(spec), "--", engine.script]
    command += ["--spec", str(spec), "--steps", str(STEPS), "--out", str(out), *script_args]
    result = run(command)
    assert result.returncode == 0, result.explain()
    return result


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(
            name,
            marks=[]
            if name in DEFAULT or FULL_FAULTS
            else pytest.mark.skip(reason="with TOOLKIT_FAULTS=full"),
        )
        for name in ENGINES
    ],
)
def test_a_killed_rank_restarts_the_job_which_ends_with_the_uninterrupted_weights(
    tmp_path: Path, name: str
) -> None:
    engine = ENGINES[name]
    reference = tmp_path / "reference.npz"
    launch(engine, write_spec(tmp_path, engine, tmp_path / "uninterrupted"), reference)
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
    assert_identical(weights(tmp_path / "restarted.npz"), weights(reference))
    if name == "ddp":
        a_damaged_latest_is_passed_over(engine, spec, tmp_path, weights(reference))


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
