"""Resume for real: N uninterrupted steps equal k steps, a stop, a NEW launch that resumes by
itself from checkpoint.dir, and the remaining steps.

Same engine and world size: identical fp32 weights. Another engine or world size: within the
parity tolerance (toolkit.parity). The script (tests/scripts/resume_torch.py) trains a tiny
MLP with a warmup-cosine schedule; it saves every 3 steps and the interrupted launch stops
after step 5, so the resumed launch repeats steps 4 and 5 from the step-3 checkpoint, as a
crashed job would, and crosses an epoch boundary (4 steps per epoch).

By default one case (ZeRO-3 on 2 ranks -> DDP on 1: sharded save, consolidated load, another
engine and world size), three launches, for `make test`'s time; TOOLKIT_RESUME=full adds the
exact same-engine cases (DDP, Horovod, ZeRO-2, ZeRO-3 and the pipeline engine, each with
SGD-momentum and Adam) and more engine and world-size changes (DDP -> ZeRO-2, DDP -> the
pipeline engine, the pipeline engine -> Horovod on 1 rank, ...).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.realrun import BIN, PYTHON, ROOT, RunOutput, run
from toolkit.parity.cases import TOLERANCE
from toolkit.parity.harness import weight_deviation

pytestmark = pytest.mark.multiproc

FULL = os.environ.get("TOOLKIT_RESUME") == "full"
SCRIPT = str(ROOT / "tests" / "scripts" / "resume_torch.py")
STEPS, EVERY, STOP_AT = 7, 3, 5
OPTIMIZERS = {
    "adam": "optimizer: {name: adam, lr: 0.01}",
    "sgd": "optimizer: {name: sgd, lr: 0.05, momentum: 0.9}",
}


@dataclass(frozen=True)
class Setup:
    """An engine and world size: the spec lines that choose the engine, and its launcher."""

    backend: str
    engine_lines: str
    launcher: tuple[str, ...]
    ranks: int


def torchrun(ranks: int) -> tuple[str, ...]:
    return (str(BIN / "torchrun"), "--nproc_per_node", str(ranks))


def horovodrun(ranks: int) -> tuple[str, ...]:
    return (str(BIN / "horovodrun"), "-np", str(ranks), "-H", f"localhost:{ranks}", "--gloo")


def deepspeed(ranks: int) -> tuple[str, ...]:
    return (str(BIN / "deepspeed"), "--num_gpus", str(ranks))


SETUPS = {
    "ddp2": Setup("ddp", "backend: ddp", torchrun(2), 2),
    "ddp1": Setup("ddp", "backend: ddp", torchrun(1), 1),
    "horovod2": Setup("horovod", "backend: horovod", (*horovodrun(2), PYTHON), 2),
    "horovod1": Setup("horovod", "backend: horovod", (*horovodrun(1), PYTHON), 1),
    "zero2": Setup("deepspeed", "backend: deepspeed\nzero: {stage: 2}", deepspeed(2), 2),
    "zero3": Setup("deepspeed", "backend: deepspeed\nzero: {stage: 3}", deepspeed(2), 2),
    "pipeline2": Setup(
        "deepspeed",
        "backend: deepspeed\npipeline: {stages: 2, partition: parameters}",
        deepspeed(2),
        2,
    ),
}


def write_spec(where: Path, setup: str, optimizer: str, checkpoints: Path) -> Path:
    spec = where / f"{setup}-{optimizer}-{checkpoints.name}.yaml"
    spec.write_text(
        f"{SETUPS[setup].engine_lines}\nseed: 3\nbatch: {{global: 64, micro: 16}}\n"
        f"{OPTIMIZERS[optimizer]}\n"
        "schedule: {name: warmup_cosine, warmup_steps: 3, total_steps: 10}\n"
        f"checkpoint: {{dir: {checkpoints}, every_steps: {EVERY}, keep: 2}}\n"
    )
    return spec


def train(setup: str, spec: Path, *args: str) -> RunOutput:
    result = run(
        [*SETUPS[setup].launcher, SCRIPT, "--spec", str(spec), "--steps", str(STEPS), *args]
    )
    assert result.returncode == 0, result.explain()
    return result


def weights(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as saved:
        return {name: saved[name] for name in saved.files}


def uninterrupted(tmp: Path, setup: str, optimizer: str) -> dict[str, np.ndarray]:
    out = tmp / f"{setup}-{optimizer}-uninterrupted.npz"
    train(setup, write_spec(tmp, setup, optimizer, tmp / "uninterrupted"), "--out", str(out))
    return weights(out)


def interrupted_then_resumed(
    tmp: Path, first: str, second: str, optimizer: str
) -> tuple[dict[str, np.ndarray], RunOutput]:
    """`first` stops after STOP_AT steps; a new launch of `second` resumes and finishes."""
    checkpoints = tmp / "checkpoints"
    train(first, write_spec(tmp, first, optimizer, checkpoints), "--stop-at", str(STOP_AT))
    out = tmp / "resumed.npz"
    result = train(second, write_spec(tmp, second, optimizer, checkpoints), "--out", str(out))
    return weights(out), result


def assert_resumed(result: RunOutput, saved_by: str, ranks: int) -> None:
    """Every rank went on from the step-3 checkpoint, and rank 0 said so once."""
    resumed = {r["rank"]: r["resumed_from"] for r in result.reports if "resumed_from" in r}
    assert resumed == dict.fromkeys(range(ranks), EVERY), result.explain()
    assert result.output.count("toolkit: resuming from") == 1, result.explain()
    assert f"at step {EVERY}, saved by {saved_by} (torch)" in result.output, result.explain()


SAME_ENGINE = [
    (s, o) for s in ("ddp2", "horovod2", "zero2", "zero3", "pipeline2") for o in OPTIMIZERS
]


@pytest.mark.skipif(not FULL, reason="exact same-engine resume runs with TOOLKIT_RESUME=full")
@pytest.mark.parametrize(("setup", "optimizer"), SAME_ENGINE, ids=lambda v: str(v))
def test_resume_under_the_same_engine_is_exact(tmp_path: Path, setup: str, optimizer: str) -> None:
    reference = uninterrupted(tmp_path, setup, optimizer)
    resumed, result = interrupted_then_resumed(tmp_path, setup, setup, optimizer)
    assert_resumed(result, SETUPS[setup].backend, ranks=SETUPS[setup].ranks)
    for name, value in reference.items():
        assert np.array_equal(resumed[name], value), f"{name} differs after resuming"
    assert set(resumed) == set(reference)


ACROSS = (
    [
        ("zero3", "ddp1", "adam"),
        ("zero3", "horovod1", "sgd"),
        ("ddp2", "zero2", "adam"),
        ("horovod2", "zero3", "sgd"),
        ("ddp2", "pipeline2", "adam"),
        ("pipeline2", "horovod1", "sgd"),
    ]
    if FULL
    else [("zero3", "ddp1", "adam")]
)


@pytest.mark.parametrize(("first", "second", "optimizer"), ACROSS, ids=lambda v: str(v))
def test_resume_under_another_engine_and_world_size_is_within_parity(
    tmp_path: Path, first: str, second: str, optimizer: str
) -> None:
    reference = uninterrupted(tmp_path, first, optimizer)
    resumed, result = interrupted_then_resumed(tmp_path, first, second, optimizer)
    assert_resumed(result, SETUPS[first].backend, ranks=SETUPS[second].ranks)
    assert weight_deviation(resumed, reference) <= TOLERANCE["fp32"]
