"""The device a run trains on, for real: `device: auto` says its choice once, and checkpoints
move between GPUs and CPUs (the plan of tests/resuming.py: k steps, a stop, a new launch that
resumes by itself and finishes).

On a machine without a GPU only the first test runs; the `gpu` tests skip (no GPU visible).
Where one GPU is visible, DDP and DeepSpeed ZeRO-1 and ZeRO-3 train on cuda:0 and their
checkpoints resume on the CPU, and CPU checkpoints on the GPU, within the fp32 parity tolerance
of the run that never stopped (GPU and CPU kernels add in different orders, so not to the bit).
Horovod is left out: its GPU path needs a Horovod built with CUDA (`toolkit doctor`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.realrun import BIN
from tests.resuming import (
    Setup,
    assert_resumed,
    interrupted_then_resumed,
    train,
    uninterrupted,
    write_spec,
)
from toolkit.parity.cases import TOLERANCE
from toolkit.parity.harness import weight_deviation

pytestmark = pytest.mark.multiproc

NO_GPU = not torch.cuda.is_available()


def _setups(device: str) -> dict[str, Setup]:
    torchrun = (str(BIN / "torchrun"), "--nproc_per_node", "1")
    deepspeed = (str(BIN / "deepspeed"), "--num_gpus", "1")
    line = f"device: {device}\n"
    return {
        f"ddp-{device}": Setup("ddp", line + "backend: ddp", torchrun, 1),
        f"zero1-{device}": Setup(
            "deepspeed", line + "backend: deepspeed\nzero: {stage: 1}", deepspeed, 1
        ),
        f"zero3-{device}": Setup(
            "deepspeed", line + "backend: deepspeed\nzero: {stage: 3}", deepspeed, 1
        ),
    }


SETUPS = {**_setups("auto"), **_setups("cuda"), **_setups("cpu")}


@pytest.mark.skipif(not NO_GPU, reason="a GPU is visible: auto chooses it")
def test_auto_trains_on_the_cpu_without_a_gpu_and_says_so_once(tmp_path: Path) -> None:
    setup = SETUPS["ddp-auto"]
    spec = write_spec(tmp_path, "ddp-auto", setup, "adam", tmp_path / "checkpoints")
    result = train(setup, spec, "--stop-at", "1")
    assert result.output.count("toolkit: device auto: cpu (no GPU visible)") == 1, result.explain()


@pytest.mark.gpu
@pytest.mark.skipif(NO_GPU, reason="no GPU visible")
@pytest.mark.parametrize("engine", ["ddp", "zero1", "zero3"])
@pytest.mark.parametrize(("first", "second"), [("cuda", "cpu"), ("cpu", "cuda")])
def test_a_checkpoint_moves_between_the_gpu_and_the_cpu(
    tmp_path: Path, engine: str, first: str, second: str
) -> None:
    saver, resumer = f"{engine}-{first}", f"{engine}-{second}"
    reference = uninterrupted(tmp_path, SETUPS, saver, "adam")
    resumed, result = interrupted_then_resumed(tmp_path, SETUPS, saver, resumer, "adam")
    assert_resumed(result, SETUPS[saver], ranks=1)
    assert weight_deviation(resumed, reference) <= TOLERANCE["fp32"]
