"""The resume tests' plan, shared by tests/test_resume_real.py (torch engines) and
tests/test_resume_tf_real.py (TensorFlow engines): N uninterrupted steps against k steps, a
stop, a NEW launch that resumes by itself from checkpoint.dir, and the remaining steps.

7 steps, a save every 3, the interrupted launch stops after step 5: the resumed launch repeats
steps 4 and 5 from the step-3 checkpoint, as a crashed job would, and crosses an epoch boundary
(4 steps per epoch). The scripts (tests/scripts/resume_torch.py, resume_tf.py) train a tiny MLP
with a warmup-cosine schedule.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tests.realrun import ROOT, RunOutput, run

STEPS, EVERY, STOP_AT = 7, 3, 5
OPTIMIZERS = {
    "adam": "optimizer: {name: adam, lr: 0.01}",
    "sgd": "optimizer: {name: sgd, lr: 0.05, momentum: 0.9}",
}
TORCH_SCRIPT = str(ROOT / "tests" / "scripts" / "resume_torch.py")
TF_SCRIPT = str(ROOT / "tests" / "scripts" / "resume_tf.py")


@dataclass(frozen=True)
class Setup:
    """An engine and world size: the spec lines that choose the engine, and its launcher."""

    backend: str
    engine_lines: str
    launcher: tuple[str, ...]
    ranks: int
    framework: str = "torch"

    @property
    def script(self) -> str:
        return TF_SCRIPT if self.framework == "tensorflow" else TORCH_SCRIPT


def write_spec(where: Path, name: str, setup: Setup, optimizer: str, checkpoints: Path) -> Path:
    spec = where / f"{name}-{optimizer}-{checkpoints.name}.yaml"
    spec.write_text(
        f"{setup.engine_lines}\nseed: 3\nbatch: {{global: 64, micro: 16}}\n"
        f"{OPTIMIZERS[optimizer]}\n"
        "schedule: {name: warmup_cosine, warmup_steps: 3, total_steps: 10}\n"
        f"checkpoint: {{dir: {checkpoints}, every_steps: {EVERY}, keep: 2}}\n"
    )
    return spec


def launch(setup: Setup, spec: Path, *args: str) -> RunOutput:
    return run([*setup.launcher, setup.script, "--spec", str(spec), "--steps", str(STEPS), *args])


def train(setup: Setup, spec: Path, *args: str) -> RunOutput:
    result = launch(setup, spec, *args)
    assert result.returncode == 0, result.explain()
    return result


def weights(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as saved:
        return {name: saved[name] for name in saved.files}


def uninterrupted(
    tmp: Path, setups: dict[str, Setup], name: str, optimizer: str
) -> dict[str, np.ndarray]:
    out = tmp / f"{name}-{optimizer}-uninterrupted.npz"
    spec = write_spec(tmp, name, setups[name], optimizer, tmp / "uninterrupted")
    train(setups[name], spec, "--out", str(out))
    return weights(out)


def interrupted_then_resumed(
    tmp: Path, setups: dict[str, Setup], first: str, second: str, optimizer: str
) -> tuple[dict[str, np.ndarray], RunOutput]:
    """`first` stops after STOP_AT steps; a new launch of `second` resumes and finishes."""
    checkpoints = tmp / "checkpoints"
    spec = write_spec(tmp, first, setups[first], optimizer, checkpoints)
    train(setups[first], spec, "--stop-at", str(STOP_AT))
    out = tmp / "resumed.npz"
    spec = write_spec(tmp, second, setups[second], optimizer, checkpoints)
    result = train(setups[second], spec, "--out", str(out))
    return weights(out), result


def assert_resumed(result: RunOutput, saved_by: Setup, ranks: int) -> None:
    """Every rank went on from the step-3 checkpoint, and rank 0 said so once, naming the
    engine, framework and world size that saved it."""
    resumed = {r["rank"]: r["resumed_from"] for r in result.reports if "resumed_from" in r}
    assert resumed == dict.fromkeys(range(ranks), EVERY), result.explain()
    assert result.output.count("toolkit: resuming from") == 1, result.explain()
    origin = f"{saved_by.backend} ({saved_by.framework}) with {saved_by.ranks} rank"
    assert f"at step {EVERY}, saved by {origin}" in result.output, result.explain()


def assert_identical(resumed: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> None:
    assert set(resumed) == set(reference)
    for name, value in reference.items():
        assert np.array_equal(resumed[name], value), f"{name} differs after resuming"
