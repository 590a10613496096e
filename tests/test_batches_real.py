"""Real jobs shapes under every engine, 2 ranks through `toolkit launch` and the real launchers.

- torch: a model that takes a dict batch and returns its own loss (its output layer tied to its
  embedding, plus an integer buffer), read from a map-style torch Dataset by 2 DataLoader
  workers per rank, trains under DDP, Horovod and DeepSpeed ZeRO-1 / ZeRO-3 (and ZeRO-3 with
  parameters and optimizer offloaded to the CPU) to the weights of a
  single-process torch loop (1e-5); evaluation sums equal the single-process sums;
  full_state_dict has the model's own state_dict keys (the tied name included, the integer
  buffer in its dtype) and loads back with strict=True.
- the pipeline engine trains (features, labels) pairs from a Dataset, evaluates through
  eval_batch, and refuses a dict micro-batch with one clear error.
- TensorFlow: a Keras model with dict inputs fed by a shuffled tf.data pipeline trains under
  MultiWorkerMirrored (local launcher), Horovod TF and MirroredStrategy (one process, two
  replicas) to the weights of a single-process Keras loop, with the same evaluation sums.

By default DDP, ZeRO-3 and MultiWorkerMirrored run (the engines with the most to get wrong:
sharded parameters, tf.data sharding); `TOOLKIT_MATRIX=full` runs every engine named above.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.options import FULL_MATRIX
from tests.realrun import BIN, PYTHON, ROOT, RunOutput, run
from toolkit.ports import free_port

pytestmark = pytest.mark.multiproc

TORCH_ENGINES = ["ddp", "horovod", "zero1", "zero3", "zero3_offload"] if FULL_MATRIX else ["zero3"]
TF_ENGINES = ["tf_multiworker", "horovod_tf", "tf_mirrored"] if FULL_MATRIX else ["tf_multiworker"]

TORCH_SCRIPT = str(ROOT / "tests" / "scripts" / "structured_torch.py")
TF_SCRIPT = str(ROOT / "tests" / "scripts" / "structured_tf.py")
TOLERANCE = 1e-5
# step_loss global: the per-step losses are compared with the one-process reference's.
COMMON = """seed: 7
step_loss: global
batch: {global: 16, micro: 4}
optimizer: {name: adamw, lr: 0.01, betas: [0.9, 0.999], eps: 1.0e-8, weight_decay: 0.01}
"""
ENGINES = {
    "ddp": "backend: ddp\nlaunch: {launcher: torchrun, np: 2}\n",
    "horovod": "backend: horovod\nhorovod: {controller: gloo}\n"
    "launch: {launcher: horovodrun, np: 2}\n",
    "zero1": "backend: deepspeed\nzero: {stage: 1}\nlaunch: {launcher: deepspeed, np: 2, "
    "master_port: PORT}\n",
    "zero3": "backend: deepspeed\nzero: {stage: 3}\nlaunch: {launcher: deepspeed, np: 2, "
    "master_port: PORT}\n",
    "zero3_offload": "backend: deepspeed\nzero: {stage: 3, offload_optimizer: cpu, "
    "offload_params: cpu}\nlaunch: {launcher: deepspeed, np: 2, master_port: PORT}\n",
    "pipeline": "backend: deepspeed\npipeline: {stages: 2}\nlaunch: {launcher: deepspeed, "
    "np: 2, master_port: PORT}\n",
    "tf_multiworker": "backend: tf\ntf: {port: PORT}\nlaunch: {launcher: local, np: 2}\n",
    "horovod_tf": "backend: horovod\nframework: tensorflow\nhorovod: {controller: gloo}\n"
    "launch: {launcher: horovodrun, np: 2}\n",
    # one process, two replicas: each micro-batch is split between them
    "tf_mirrored": "backend: tf\ntf: {local_devices: 2}\nlaunch: {launcher: local, np: 1}\n",
}


def write_spec(directory: Path, engine: str) -> Path:
    path = directory / f"{engine}.yaml"
    path.write_text(COMMON + ENGINES[engine].replace("PORT", str(free_port())))
    return path


def launch(spec: Path, script_args: list[str]) -> RunOutput:
    argv = [str(BIN / "toolkit"), "launch", "--spec", str(spec), "--", *script_args]
    return run(argv, timeout=360)


def read(directory: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    with np.load(directory / "weights.npz", allow_pickle=False) as archive:
        weights = {name: archive[name] for name in archive.files}
    return weights, json.loads((directory / "report.json").read_text())


def reference(directory: Path, script: str, model: str) -> tuple[dict, dict]:
    out = directory / f"reference-{model}"
    result = run(
        [PYTHON, script, "--reference", "--spec", str(write_spec(directory, "ddp")), "--out",
         str(out), "--model", model],
        timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.explain()
    return read(out)


@pytest.fixture(scope="module")
def torch_references(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict, dict]]:
    directory = tmp_path_factory.mktemp("torch-reference")
    return {model: reference(directory, TORCH_SCRIPT, model) for model in ("dict", "pairs")}


def deviation(weights: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> float:
    """The worst tensor's max |w - w_ref| / max |w_ref|."""
    return max(
        float(np.abs(weights[n] - expected[n]).max() / max(np.abs(expected[n]).max(), 1e-12))
        for n in expected
    )


def assert_matches(
    result: RunOutput, out: Path, expected: tuple[dict, dict], *, ranks: int = 2
) -> dict[str, Any]:
    assert result.returncode == 0, result.explain()
    assert sorted(result.digests) == list(range(ranks)), result.explain()
    assert len(set(result.digests.values())) == 1, f"ranks differ: {result.digests}"
    weights, report = read(out)
    ref_weights, ref_report = expected
    # the unwrapped model's own keys (state_dict() for torch, Keras paths), in its order
    assert report["keys"] == report["expected_keys"] == ref_report["keys"]
    assert deviation(weights, ref_weights) <= TOLERANCE, result.explain()
    assert np.allclose(report["losses"], ref_report["losses"], rtol=TOLERANCE, atol=0)
    for when in ("first_epoch", "metrics"):  # evaluated mid-training, and at the end
        metrics, ref_metrics = report[when], ref_report[when]
        assert metrics["count"] == ref_metrics["count"] == 32
        assert metrics["correct"] == ref_metrics["correct"]
        assert metrics["loss_sum"] == pytest.approx(ref_metrics["loss_sum"], rel=TOLERANCE)
    return report


@pytest.mark.parametrize("engine", TORCH_ENGINES)
def test_dict_batches_from_a_dataset_with_workers_train_like_one_process(
    engine: str, tmp_path: Path, torch_references: dict[str, tuple[dict, dict]]
) -> None:
    out = tmp_path / "out"
    spec = write_spec(tmp_path, engine)
    args = [TORCH_SCRIPT, "--spec", str(spec), "--out", str(out), "--model", "dict"]
    result = launch(spec, [*args, "--workers", "2"])
    report = assert_matches(result, out, torch_references["dict"])
    # tied lm_head-style weight present, integer buffer kept as integers (strict load ran)
    assert "head.weight" in report["keys"] and report["dtypes"]["token_ids"] == "int64"
    # the default metric of a loss-returning model: its loss weighed by samples
    assert report["own_loss"]["loss_sum"] == pytest.approx(report["metrics"]["loss_sum"])


def test_pipeline_trains_pairs_evaluates_through_eval_batch_and_refuses_a_dict(
    tmp_path: Path, torch_references: dict[str, tuple[dict, dict]]
) -> None:
    out = tmp_path / "out"
    spec = write_spec(tmp_path, "pipeline")
    args = [TORCH_SCRIPT, "--spec", str(spec), "--out", str(out), "--model", "pairs"]
    result = launch(spec, [*args, "--workers", "2"])
    report = assert_matches(result, out, torch_references["pairs"])
    refusal = report["refusal"]
    assert refusal.startswith("the pipeline engine (parallel.pipeline=2) takes (inputs, labels)")
    assert "got a mapping with keys ['features', 'labels', 'tokens']" in refusal
    assert "HINT:" in refusal


@pytest.fixture(scope="module")
def tf_reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict]:
    return reference(tmp_path_factory.mktemp("tf-reference"), TF_SCRIPT, "dict")


@pytest.mark.parametrize("engine", TF_ENGINES)
def test_tf_data_pipeline_with_dict_inputs_trains_like_one_process(
    engine: str, tmp_path: Path, tf_reference: tuple[dict, dict]
) -> None:
    out = tmp_path / "out"
    spec = write_spec(tmp_path, engine)
    result = launch(spec, [TF_SCRIPT, "--spec", str(spec), "--out", str(out), "--model", "dict"])
    assert_matches(result, out, tf_reference, ranks=1 if engine == "tf_mirrored" else 2)
