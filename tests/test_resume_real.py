"""Resume for real: N uninterrupted steps equal k steps, a stop, a NEW launch that resumes by
itself from checkpoint.dir, and the remaining steps.

Same engine and world size: identical fp32 weights. Another engine or world size: within the
parity tolerance (toolkit.parity). The plan and its steps are in tests/resuming.py.

By default two cases (ZeRO-3 on 2 ranks -> DDP on 1: sharded save, consolidated load, another
engine and world size; FSDP on 2 -> ZeRO-3 on 2), three launches each, for `make test`'s
time; TOOLKIT_RESUME=full adds the exact same-engine cases (DDP, FSDP, Horovod, ZeRO-2, ZeRO-3
and the pipeline engine, each with SGD-momentum and Adam) and more engine and world-size
changes (DDP -> ZeRO-2, DDP -> the pipeline engine, ZeRO-3 -> FSDP, FSDP -> DDP on 1 rank,
tensor parallel 2 -> DDP on 1 rank and back, the pipeline engine -> Horovod on 1 rank, ...).
fp16 resumes exactly with its loss scale under FSDP by default, and under DDP too with
TOOLKIT_RESUME=full.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.options import FULL_RESUME
from tests.realrun import BIN, PYTHON
from tests.resuming import (
    EVERY,
    OPTIMIZERS,
    Setup,
    assert_identical,
    assert_resumed,
    interrupted_then_resumed,
    train,
    uninterrupted,
    weights,
    write_spec,
)
from toolkit.checkpoint import open_checkpoint
from toolkit.parity.cases import TOLERANCE
from toolkit.parity.harness import weight_deviation

pytestmark = pytest.mark.multiproc


def torchrun(ranks: int) -> tuple[str, ...]:
    return (str(BIN / "torchrun"), "--nproc_per_node", str(ranks))


def horovodrun(ranks: int) -> tuple[str, ...]:
    return (str(BIN / "horovodrun"), "-np", str(ranks), "-H", f"localhost:{ranks}", "--gloo")


def deepspeed(ranks: int) -> tuple[str, ...]:
    return (str(BIN / "deepspeed"), "--num_gpus", str(ranks))


SETUPS = {
    "ddp2": Setup("ddp", "backend: ddp", torchrun(2), 2),
    "ddp1": Setup("ddp", "backend: ddp", torchrun(1), 1),
    "fsdp2": Setup("fsdp", "backend: fsdp", torchrun(2), 2),
    "fsdp_tp2": Setup(
        "fsdp",
        'backend: fsdp\nparallel: {tensor: 2, tensor_plan: {"0": colwise, "2": rowwise}}',
        torchrun(2),
        2,
    ),
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


SAME_ENGINE = [
    (s, o) for s in ("ddp2", "fsdp2", "horovod2", "zero2", "zero3", "pipeline2") for o in OPTIMIZERS
]


@pytest.mark.skipif(
    not FULL_RESUME, reason="exact same-engine resume runs with TOOLKIT_RESUME=full"
)
@pytest.mark.parametrize(("setup", "optimizer"), SAME_ENGINE, ids=lambda v: str(v))
def test_resume_under_the_same_engine_is_exact(tmp_path: Path, setup: str, optimizer: str) -> None:
    reference = uninterrupted(tmp_path, SETUPS, setup, optimizer)
    resumed, result = interrupted_then_resumed(tmp_path, SETUPS, setup, setup, optimizer)
    assert_resumed(result, SETUPS[setup], ranks=SETUPS[setup].ranks)
    assert_identical(resumed, reference)


ACROSS = (
    [
        ("zero3", "ddp1", "adam"),
        ("zero3", "horovod1", "sgd"),
        ("ddp2", "zero2", "adam"),
        ("horovod2", "zero2", "adam"),
        ("horovod2", "zero3", "sgd"),
        ("ddp2", "pipeline2", "adam"),
        ("pipeline2", "horovod1", "sgd"),
        ("zero3", "fsdp2", "adam"),
        ("ddp1", "fsdp2", "sgd"),
        ("fsdp2", "ddp1", "adam"),
        ("fsdp_tp2", "ddp1", "sgd"),
        ("ddp1", "fsdp_tp2", "adam"),
    ]
    if FULL_RESUME
    else [("zero3", "ddp1", "adam"), ("fsdp2", "zero3", "sgd")]
)


@pytest.mark.parametrize(("first", "second", "optimizer"), ACROSS, ids=lambda v: str(v))
def test_resume_under_another_engine_and_world_size_is_within_parity(
    tmp_path: Path, first: str, second: str, optimizer: str
) -> None:
    reference = uninterrupted(tmp_path, SETUPS, first, optimizer)
    resumed, result = interrupted_then_resumed(tmp_path, SETUPS, first, second, optimizer)
    assert_resumed(result, SETUPS[first], ranks=SETUPS[second].ranks)
    assert weight_deviation(resumed, reference) <= TOLERANCE["fp32"]


def test_fsdp_and_tensor_parallel_ranks_write_their_own_blocks(tmp_path: Path) -> None:
    """FSDP 2 x tensor parallel 2: every rank writes its DTensor blocks (FSDP's rows of the
    tensor-parallel columns or rows, one copy of the replicated bias), nothing gathered, and
    the blocks read back as the weights the run had."""
    setup = Setup("fsdp", SETUPS["fsdp_tp2"].engine_lines, torchrun(4), 4)
    checkpoints = tmp_path / "checkpoints"
    spec = write_spec(tmp_path, "fsdp_tp4", setup, "adam", checkpoints)
    train(setup, spec, "--stop-at", str(EVERY), "--out", str(tmp_path / "at-save.npz"))
    checkpoint = open_checkpoint(checkpoints)
    model_files = [record for record in checkpoint.manifest.files if record.section == "model"]
    assert sorted(record.rank for record in model_files) == [0, 1, 2, 3]
    assert all(entry.start is not None for record in model_files for entry in record.tensors)
    assert_identical(checkpoint.tensors("model"), weights(tmp_path / "at-save.npz"))
    optimizer_ranks = {r.rank for r in checkpoint.manifest.files if r.section == "optimizer"}
    assert optimizer_ranks == {0, 1, 2, 3}


FP16 = "precision: fp16\nloss_scaling: {initial_scale_power: 19, loss_scale_window: 2}"


@pytest.mark.parametrize("setup", ["ddp2", "fsdp2"] if FULL_RESUME else ["fsdp2"])
def test_fp16_resumes_with_its_loss_scale_and_skipped_steps(tmp_path: Path, setup: str) -> None:
    """fp16 whose loss scale overflows before the step-3 save: the checkpoint keeps the scale,
    the rule's counters and the skipped steps (which advanced no schedule), and the resumed run
    skips what the uninterrupted one skipped, to identical weights."""
    base = SETUPS[setup]
    scaled = {setup: Setup(base.backend, f"{base.engine_lines}\n{FP16}", base.launcher, 2)}
    reference = uninterrupted(tmp_path, scaled, setup, "sgd")
    resumed, result = interrupted_then_resumed(tmp_path, scaled, setup, setup, "sgd")
    assert_resumed(result, scaled[setup], ranks=2)
    last = open_checkpoint(tmp_path / "checkpoints").state()
    saved = last.extras["loss_scaler"]
    assert 0 < saved["skipped_steps"] < last.step, saved
    assert_identical(resumed, reference)
