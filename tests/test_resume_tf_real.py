"""Resume for real under the TensorFlow engines: N uninterrupted steps equal k steps, a stop, a
NEW launch that resumes by itself from checkpoint.dir, and the remaining steps.

The twin of tests/test_resume_real.py (same plan: 7 steps, saves every 3, the interrupted
launch stops after step 5, so the resumed launch repeats steps 4 and 5 from the step-3
checkpoint and crosses an epoch boundary), with tests/scripts/resume_tf.py: a tiny Keras MLP,
a warmup-cosine schedule, Adam or SGD-momentum. Same engine and world size: identical fp32
weights. Another TF engine or world size: within the parity tolerance (toolkit.parity).

By default one case, Horovod TF on 2 ranks (horovodrun --gloo) -> TF MultiWorkerMirrored on 2
ranks (mpirun), three launches: it covers both TF backends, one saving and the other
restoring, which the same-engine cases cannot, and a checkpoint moving between engines is
what the format is for. TOOLKIT_RESUME=full adds the exact same-engine cases for the three
engines, more moves (to MirroredStrategy in one process) and a torch engine's checkpoint,
which a TF engine refuses naming what differs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.realrun import BIN, PYTHON, ROOT, RunOutput, mpirun, run
from toolkit.parity.cases import TOLERANCE
from toolkit.parity.harness import weight_deviation

pytestmark = pytest.mark.multiproc

FULL = os.environ.get("TOOLKIT_RESUME") == "full"
SCRIPT = str(ROOT / "tests" / "scripts" / "resume_tf.py")
TORCH_SCRIPT = str(ROOT / "tests" / "scripts" / "resume_torch.py")
STEPS, EVERY, STOP_AT = 7, 3, 5
OPTIMIZERS = {
    "adam": "optimizer: {name: adam, lr: 0.01}",
    "sgd": "optimizer: {name: sgd, lr: 0.05, momentum: 0.9}",
}


@dataclass(frozen=True)
class Setup:
    """An engine and world size: the spec lines that choose the engine, and its launcher."""

    backend: str
    framework: str
    engine_lines: str
    launcher: tuple[str, ...]
    ranks: int


HOROVODRUN = (str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", PYTHON)
SETUPS = {
    "horovod_tf2": Setup(
        "horovod", "tensorflow", "backend: horovod\nframework: tensorflow", HOROVODRUN, 2
    ),
    "multiworker2": Setup(
        "tf", "tensorflow", "backend: tf\ntf: {port: 23651}", (*mpirun(), PYTHON), 2
    ),
    "mirrored1": Setup(
        "tf",
        "tensorflow",
        "backend: tf\ntf: {local_devices: 2}\nlaunch: {launcher: local, np: 1}",
        (PYTHON,),
        1,
    ),
    "ddp1": Setup(
        "ddp", "torch", "backend: ddp", (str(BIN / "torchrun"), "--nproc_per_node", "1"), 1
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


def launch(setup: str, spec: Path, *args: str) -> RunOutput:
    script = SCRIPT if SETUPS[setup].framework == "tensorflow" else TORCH_SCRIPT
    return run([*SETUPS[setup].launcher, script, "--spec", str(spec), "--steps", str(STEPS), *args])


def train(setup: str, spec: Path, *args: str) -> RunOutput:
    result = launch(setup, spec, *args)
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


def assert_resumed(result: RunOutput, first: str, ranks: int) -> None:
    """Every rank went on from the step-3 checkpoint, and rank 0 said so once."""
    resumed = {r["rank"]: r["resumed_from"] for r in result.reports if "resumed_from" in r}
    assert resumed == dict.fromkeys(range(ranks), EVERY), result.explain()
    assert result.output.count("toolkit: resuming from") == 1, result.explain()
    saved_by = f"saved by {SETUPS[first].backend} (tensorflow) with {SETUPS[first].ranks} rank"
    assert f"at step {EVERY}, {saved_by}" in result.output, result.explain()


SAME_ENGINE = [(s, o) for s in ("horovod_tf2", "multiworker2", "mirrored1") for o in OPTIMIZERS]


@pytest.mark.skipif(not FULL, reason="exact same-engine resume runs with TOOLKIT_RESUME=full")
@pytest.mark.parametrize(("setup", "optimizer"), SAME_ENGINE, ids=lambda v: str(v))
def test_resume_under_the_same_tf_engine_is_exact(
    tmp_path: Path, setup: str, optimizer: str
) -> None:
    reference = uninterrupted(tmp_path, setup, optimizer)
    resumed, result = interrupted_then_resumed(tmp_path, setup, setup, optimizer)
    assert_resumed(result, setup, ranks=SETUPS[setup].ranks)
    assert set(resumed) == set(reference)
    for name, value in reference.items():
        assert np.array_equal(resumed[name], value), f"{name} differs after resuming"


ACROSS = [("horovod_tf2", "multiworker2", "adam")]
if FULL:
    ACROSS += [
        ("horovod_tf2", "multiworker2", "sgd"),
        ("multiworker2", "mirrored1", "sgd"),
        ("multiworker2", "horovod_tf2", "adam"),
        ("mirrored1", "horovod_tf2", "adam"),
    ]


@pytest.mark.parametrize(("first", "second", "optimizer"), ACROSS, ids=lambda v: str(v))
def test_resume_under_another_tf_engine_is_within_parity(
    tmp_path: Path, first: str, second: str, optimizer: str
) -> None:
    reference = uninterrupted(tmp_path, first, optimizer)
    resumed, result = interrupted_then_resumed(tmp_path, first, second, optimizer)
    assert_resumed(result, first, ranks=SETUPS[second].ranks)
    deviation = weight_deviation(resumed, reference)
    print(f"{first} -> {second} ({optimizer}): max relative weight deviation {deviation:.3g}")
    assert deviation <= TOLERANCE["fp32"]


@pytest.mark.skipif(not FULL, reason="runs with TOOLKIT_RESUME=full")
def test_a_torch_engines_checkpoint_is_refused_by_a_tf_engine(tmp_path: Path) -> None:
    """Torch names weights by state_dict ("0.weight", [out, in]), Keras by path: one error that
    says so, before a step is trained."""
    checkpoints = tmp_path / "checkpoints"
    train("ddp1", write_spec(tmp_path, "ddp1", "adam", checkpoints), "--stop-at", str(STOP_AT))
    result = launch("mirrored1", write_spec(tmp_path, "mirrored1", "adam", checkpoints))
    assert result.returncode != 0, result.explain()
    assert "the checkpoint's weights do not fit this Keras model" in result.output, result.explain()
    assert "unexpected ['0.bias', '0.weight', '2.bias', '2.weight']" in result.output
    assert not [r for r in result.reports if "resumed_from" in r], result.explain()
