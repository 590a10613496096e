"""Resume for real under the TensorFlow engines: N uninterrupted steps equal k steps, a stop, a
NEW launch that resumes by itself from checkpoint.dir, and the remaining steps.

The twin of tests/test_resume_real.py (the same plan, tests/resuming.py), with
tests/scripts/resume_tf.py: a tiny Keras MLP, a warmup-cosine schedule, Adam or SGD-momentum.
Same engine and world size: identical fp32 weights. Another TF engine or world size: within the
parity tolerance (toolkit.parity).

By default one case, Horovod TF on 2 ranks (horovodrun --gloo) -> TF MultiWorkerMirrored on 2
ranks (mpirun), three launches: it covers both TF backends, one saving and the other
restoring, which the same-engine cases cannot, and a checkpoint moving between engines is
what the format is for. TOOLKIT_RESUME=full adds the exact same-engine cases for the three
engines, more moves (to MirroredStrategy in one process) and a torch engine's checkpoint,
which a TF engine refuses naming what differs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.options import FULL_RESUME
from tests.realrun import BIN, PYTHON, mpirun
from tests.resuming import (
    OPTIMIZERS,
    STOP_AT,
    Setup,
    assert_identical,
    assert_resumed,
    interrupted_then_resumed,
    launch,
    train,
    uninterrupted,
    write_spec,
)
from toolkit.checkpoint import open_checkpoint
from toolkit.parity.cases import TOLERANCE
from toolkit.parity.harness import weight_deviation

pytestmark = pytest.mark.multiproc

TF = "tensorflow"
HOROVODRUN = (str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", PYTHON)
SETUPS = {
    "horovod_tf2": Setup("horovod", "backend: horovod\nframework: tensorflow", HOROVODRUN, 2, TF),
    "multiworker2": Setup("tf", "backend: tf\ntf: {port: 23651}", (*mpirun(), PYTHON), 2, TF),
    "mirrored1": Setup(
        "tf",
        "backend: tf\ntf: {local_devices: 2}\nlaunch: {launcher: local, np: 1}",
        (PYTHON,),
        1,
        TF,
    ),
    "ddp1": Setup("ddp", "backend: ddp", (str(BIN / "torchrun"), "--nproc_per_node", "1"), 1),
}


SAME_ENGINE = [(s, o) for s in ("horovod_tf2", "multiworker2", "mirrored1") for o in OPTIMIZERS]


@pytest.mark.skipif(
    not FULL_RESUME, reason="exact same-engine resume runs with TOOLKIT_RESUME=full"
)
@pytest.mark.parametrize(("setup", "optimizer"), SAME_ENGINE, ids=lambda v: str(v))
def test_resume_under_the_same_tf_engine_is_exact(
    tmp_path: Path, setup: str, optimizer: str
) -> None:
    reference = uninterrupted(tmp_path, SETUPS, setup, optimizer)
    resumed, result = interrupted_then_resumed(tmp_path, SETUPS, setup, setup, optimizer)
    assert_resumed(result, SETUPS[setup], ranks=SETUPS[setup].ranks)
    assert_identical(resumed, reference)


ACROSS = [("horovod_tf2", "multiworker2", "adam")]
if FULL_RESUME:
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
    reference = uninterrupted(tmp_path, SETUPS, first, optimizer)
    resumed, result = interrupted_then_resumed(tmp_path, SETUPS, first, second, optimizer)
    assert_resumed(result, SETUPS[first], ranks=SETUPS[second].ranks)
    deviation = weight_deviation(resumed, reference)
    print(f"{first} -> {second} ({optimizer}): max relative weight deviation {deviation:.3g}")
    assert deviation <= TOLERANCE["fp32"]


@pytest.mark.skipif(not FULL_RESUME, reason="runs with TOOLKIT_RESUME=full")
def test_a_torch_engines_checkpoint_is_refused_by_a_tf_engine(tmp_path: Path) -> None:
    """Torch names weights by state_dict ("0.weight", [out, in]), Keras by path: one error that
    says so, before a step is trained."""
    checkpoints = tmp_path / "checkpoints"
    ddp, mirrored = SETUPS["ddp1"], SETUPS["mirrored1"]
    train(ddp, write_spec(tmp_path, "ddp1", ddp, "adam", checkpoints), "--stop-at", str(STOP_AT))
    result = launch(mirrored, write_spec(tmp_path, "mirrored1", mirrored, "adam", checkpoints))
    assert result.returncode != 0, result.explain()
    assert "the checkpoint's weights do not fit this Keras model" in result.output, result.explain()
    assert "unexpected ['0.bias', '0.weight', '2.bias', '2.weight']" in result.output
    assert not [r for r in result.reports if "resumed_from" in r], result.explain()


def test_fp16_resumes_with_its_loss_scale_and_skipped_steps(tmp_path: Path) -> None:
    """Keras' LossScaleOptimizer on the spec's rule: a run whose scale overflows before the
    step-3 save resumes with the scale, the rule's counters and the skipped steps, to the
    uninterrupted run's weights."""
    base = SETUPS["multiworker2"]
    fp16 = "precision: fp16\nloss_scaling: {initial_scale_power: 19, loss_scale_window: 2}"
    scaled = {"fp16": Setup(base.backend, f"{base.engine_lines}\n{fp16}", base.launcher, 2, TF)}
    reference = uninterrupted(tmp_path, scaled, "fp16", "sgd")
    resumed, result = interrupted_then_resumed(tmp_path, scaled, "fp16", "fp16", "sgd")
    assert_resumed(result, scaled["fp16"], ranks=2)
    last = open_checkpoint(tmp_path / "checkpoints").state()
    saved = last.extras["loss_scaler"]
    assert 0 < saved["skipped_steps"] < last.step, saved
    assert_identical(resumed, reference)
