"""A model with BatchNorm trains to the weights and running statistics data parallelism
defines on every torch engine: rank 0's statistics, grown from its own samples, on every rank
(DDP broadcasts them from rank 0 before every forward; Horovod, DeepSpeed and FSDP keep each
rank's own, and the toolkit takes rank 0's before it evaluates or reads the weights:
toolkit.backends.torch_common.rank0_buffers).

Each engine's 2-rank run is held to DDP's: ranks agree, the weights and buffers are within the
fp32 parity tolerance, and the held-out loss run.evaluate gives is the same. By default DDP
against FSDP and Horovod; TOOLKIT_MATRIX=full adds ZeRO-2 and ZeRO-3.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.options import FULL_MATRIX
from tests.realrun import BIN, PYTHON, ROOT, run
from toolkit.parity.cases import TOLERANCE
from toolkit.parity.harness import weight_deviation

pytestmark = pytest.mark.multiproc

SCRIPT = str(ROOT / "tests" / "scripts" / "batchnorm_torch.py")
TORCHRUN = (str(BIN / "torchrun"), "--nproc_per_node", "2")
ENGINES = {
    "ddp": ("backend: ddp", TORCHRUN),
    "fsdp": ("backend: fsdp", TORCHRUN),
    "horovod": (
        "backend: horovod",
        (str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", PYTHON),
    ),
    "zero2": ("backend: deepspeed\nzero: {stage: 2}", (str(BIN / "deepspeed"), "--num_gpus", "2")),
    "zero3": ("backend: deepspeed\nzero: {stage: 3}", (str(BIN / "deepspeed"), "--num_gpus", "2")),
}
COMPARED = ["fsdp", "horovod", "zero2", "zero3"] if FULL_MATRIX else ["fsdp", "horovod"]


def train(tmp_path: Path, engine: str) -> tuple[dict[str, np.ndarray], float]:
    lines, launcher = ENGINES[engine]
    spec = tmp_path / f"{engine}.yaml"
    recipe = "batch: {global: 32, micro: 8}\noptimizer: {name: sgd, lr: 0.1, momentum: 0.9}"
    spec.write_text(f"{lines}\nseed: 5\n{recipe}\n")
    out = tmp_path / f"{engine}.npz"
    result = run([*launcher, SCRIPT, "--spec", str(spec), "--out", str(out)])
    assert result.returncode == 0, result.explain()
    reports = [r for r in result.reports if "weights_sha256" in r]
    assert sorted(r["rank"] for r in reports) == [0, 1], result.explain()
    assert len({r["weights_sha256"] for r in reports}) == 1, "ranks differ: " + result.explain()
    assert len({r["eval_loss"] for r in reports}) == 1, result.explain()
    with np.load(out) as saved:
        weights = {name: saved[name] for name in saved.files}
    return weights, float(reports[0]["eval_loss"])


@pytest.fixture(scope="module")
def ddp(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, np.ndarray], float]:
    return train(tmp_path_factory.mktemp("ddp"), "ddp")


@pytest.mark.parametrize("engine", COMPARED)
def test_batchnorm_statistics_and_weights_match_ddp(
    tmp_path: Path, engine: str, ddp: tuple[dict[str, np.ndarray], float]
) -> None:
    reference, reference_loss = ddp
    weights, loss = train(tmp_path, engine)
    assert set(weights) == set(reference)
    assert int(weights["1.num_batches_tracked"]) == int(reference["1.num_batches_tracked"]) > 0
    assert not np.allclose(reference["1.running_mean"], 0.0), "the statistics never moved"
    assert weight_deviation(weights, reference) <= TOLERANCE["fp32"]
    assert abs(loss - reference_loss) <= TOLERANCE["fp32"] * abs(reference_loss)
