"""A team's FSDP2 checkpoint to DeepSpeed and back, for real: a plain FSDP2 script (no toolkit,
tests/scripts/plain_fsdp2.py) saves with `torch.distributed.checkpoint.save` on 2 ranks;
`toolkit checkpoint import --from dcp` brings it over with the same weights and Adam state;
ZeRO-3 on 2 ranks resumes it within parity of DDP on 1 rank resuming the same import; and
`toolkit checkpoint export --to dcp` of ZeRO-3's own checkpoint is what the plain script's
`torch.distributed.checkpoint.load` reads into its sharded model, value for value."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.realrun import BIN, ROOT, run
from tests.resuming import Setup, launch, weights, write_spec
from toolkit.checkpoint import latest, open_checkpoint
from toolkit.cli import main
from toolkit.parity.cases import TOLERANCE
from toolkit.parity.harness import weight_deviation

pytestmark = pytest.mark.multiproc

PLAIN = str(ROOT / "tests" / "scripts" / "plain_fsdp2.py")
TORCHRUN = str(BIN / "torchrun")
PLAIN_STEPS = 3
ZERO3 = Setup(
    "deepspeed",
    "backend: deepspeed\nzero: {stage: 3}",
    (str(BIN / "deepspeed"), "--num_gpus", "2"),
    2,
)
DDP1 = Setup("ddp", "backend: ddp", (TORCHRUN, "--nproc_per_node", "1"), 1)


def plain(mode: str, directory: Path, out: Path, *args: str) -> dict[str, np.ndarray]:
    result = run(
        [TORCHRUN, "--nproc_per_node", "2", PLAIN, mode, str(directory), "--out", str(out), *args]
    )
    assert result.returncode == 0, result.explain()
    return weights(out)


def resume(tmp_path: Path, name: str, setup: Setup, checkpoints: Path) -> dict[str, np.ndarray]:
    """`setup` resumes the imported checkpoint in `checkpoints` (Adam, as the plain job)."""
    spec = write_spec(tmp_path, name, setup, "adam", checkpoints)
    out = tmp_path / f"{name}.npz"
    result = launch(setup, spec, "--out", str(out))
    assert result.returncode == 0, result.explain()
    resumed = {r["rank"]: r["resumed_from"] for r in result.reports if "resumed_from" in r}
    assert resumed == dict.fromkeys(range(setup.ranks), PLAIN_STEPS), result.explain()
    return weights(out)


def test_a_plain_fsdp2_checkpoint_resumes_under_zero3_and_comes_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = plain(
        "save", tmp_path / "from-fsdp2", tmp_path / "plain.npz", "--steps", str(PLAIN_STEPS)
    )
    imported = tmp_path / "zero3"
    argv = [
        "checkpoint",
        "import",
        str(tmp_path / "from-fsdp2"),
        "--from",
        "dcp",
        "--to",
        str(imported),
    ]
    assert main(argv) == 0, capsys.readouterr().err
    checkpoint = open_checkpoint(imported)
    assert checkpoint.manifest.step == PLAIN_STEPS
    model, optimizer = checkpoint.tensors("model"), checkpoint.tensors("optimizer")
    for name, value in saved.items():
        if name.startswith("step/"):
            assert checkpoint.manifest.scalars["step"] == int(value), name
        else:
            np.testing.assert_array_equal(optimizer[name] if "/" in name else model[name], value)

    shutil.copytree(imported, tmp_path / "ddp1")
    zero3 = resume(tmp_path, "zero3", ZERO3, imported)
    ddp1 = resume(tmp_path, "ddp1", DDP1, tmp_path / "ddp1")
    assert weight_deviation(zero3, ddp1) <= TOLERANCE["fp32"]

    exported = tmp_path / "to-fsdp2"
    newest = latest(imported)
    assert newest is not None and newest.name != f"step-{PLAIN_STEPS:06d}"  # ZeRO-3's own save
    assert main(["checkpoint", "export", str(newest), "--to", "dcp", "--out", str(exported)]) == 0
    loaded = plain("load", exported, tmp_path / "loaded.npz")
    expected = open_checkpoint(newest).tensors("model")
    assert set(loaded) == set(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(loaded[name], value)
