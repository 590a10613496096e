"""Every supported engine × launcher cell, for real: 2 CPU processes on 127.0.0.1.

The same example scripts run unchanged; only the launcher and the spec differ. Each cell checks
that training reduces the loss, reaches the stated held-out accuracy, and that every rank ends
with identical full weights.

By default a representative subset runs (SUBSET: every engine and every launcher at least
once, the pipeline and Horovod cells with specs that leave the world size and the controller
to the launcher; offload runs in the parity subset); `TOOLKIT_MATRIX=full` runs all the cells
(about 13 minutes on 2 cores) and the TF example under MirroredStrategy, whose parity case runs
by default. The parity subset, the stalled-rank tests and the soak run the
engines under `toolkit launch` too.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.options import FULL_MATRIX
from tests.realrun import (
    BIN,
    PYTHON,
    TF_EXAMPLE,
    TORCH_EXAMPLE,
    RunOutput,
    assert_trained,
    mpirun,
    run,
    spec,
)
from toolkit.checkpoint import open_checkpoint
from toolkit.report import weights_digest

pytestmark = pytest.mark.multiproc

EPOCHS = ["--epochs", "3"]
MIN_ACCURACY = "0.85"


TEST_SPECS = Path(__file__).parent / "specs"


def torch_args(name: str) -> list[str]:
    return [TORCH_EXAMPLE, "--spec", spec(name), *EPOCHS, "--min-accuracy", MIN_ACCURACY]


def launcher_decides(name: str) -> list[str]:
    """The example with a spec from tests/specs that leaves a launcher's choice to it."""
    path = str(TEST_SPECS / f"{name}.yaml")
    return [TORCH_EXAMPLE, "--spec", path, *EPOCHS, "--min-accuracy", MIN_ACCURACY]


def tf_args(name: str) -> list[str]:
    return [TF_EXAMPLE, "--spec", spec(name), *EPOCHS, "--min-accuracy", MIN_ACCURACY]


def horovodrun(controller: str) -> list[str]:
    return [str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", f"--{controller}", PYTHON]


def toolkit_launch(name: str, script_args: Callable[[str], list[str]]) -> list[str]:
    return [str(BIN / "toolkit"), "launch", "--spec", spec(name), "--", *script_args(name)]


TORCHRUN = [str(BIN / "torchrun"), "--nproc_per_node", "2"]
DEEPSPEED = [str(BIN / "deepspeed"), "--num_gpus", "2"]

CELLS: dict[str, list[str]] = {
    # DDP, the reference
    "ddp-torchrun": [*TORCHRUN, *torch_args("ddp")],
    "ddp-mpirun": [*mpirun(), PYTHON, *torch_args("ddp")],
    "ddp-deepspeed": [*DEEPSPEED, *torch_args("ddp")],
    # FSDP2
    "fsdp-torchrun": [*TORCHRUN, *torch_args("fsdp")],
    "fsdp-mpirun": [*mpirun(), PYTHON, *torch_args("fsdp")],
    "fsdp-toolkit_launch_torchrun": toolkit_launch("fsdp", torch_args),
    # Horovod for torch
    "horovod-horovodrun_gloo": [*horovodrun("gloo"), *torch_args("horovod")],
    "horovod-horovodrun_mpi": [*horovodrun("mpi"), *torch_args("horovod")],
    "horovod-mpirun": [*mpirun(), PYTHON, *torch_args("horovod")],
    # DeepSpeed ZeRO 0-3 and the pipeline engine
    "zero0-deepspeed": [*DEEPSPEED, *torch_args("zero0")],
    "zero1-deepspeed": [*DEEPSPEED, *torch_args("zero1")],
    "zero2-deepspeed": [*DEEPSPEED, *torch_args("zero2")],
    "zero3-deepspeed": [*DEEPSPEED, *torch_args("zero3")],
    "pipeline-deepspeed": [*DEEPSPEED, *torch_args("pipeline")],
    "zero2_offload-deepspeed": [*DEEPSPEED, *torch_args("zero2_offload")],
    "zero3_offload-deepspeed": [*DEEPSPEED, *torch_args("zero3_offload")],
    "zero2-torchrun": [*TORCHRUN, *torch_args("zero2")],
    "zero3-mpirun": [*mpirun(), PYTHON, *torch_args("zero3")],
    # Specs without launch.np or horovod.controller: the launcher decides both
    "pipeline_ranks_from_launcher-deepspeed": [
        *DEEPSPEED,
        *launcher_decides("pipeline_ranks_from_launcher"),
    ],
    "horovod_controller_from_launcher-mpirun": [
        *mpirun(),
        PYTHON,
        *launcher_decides("horovod_controller_from_launcher"),
    ],
    "horovod_controller_from_launcher-horovodrun": [
        str(BIN / "horovodrun"),
        *("-np", "2", "-H", "localhost:2", PYTHON),
        *launcher_decides("horovod_controller_from_launcher"),
    ],
    "horovod_controller_from_machine-toolkit_launch_horovodrun": [
        *(
            str(BIN / "toolkit"),
            "launch",
            "--spec",
            str(TEST_SPECS / "horovod_controller_from_machine.yaml"),
        ),
        "--",
        *launcher_decides("horovod_controller_from_machine"),
    ],
    # TensorFlow: Horovod and tf.distribute
    "horovod_tf-horovodrun_gloo": [*horovodrun("gloo"), *tf_args("horovod_tf")],
    "horovod_tf-mpirun": [*mpirun(), PYTHON, *tf_args("horovod_tf")],
    "tf_multiworker-mpirun": [*mpirun(), PYTHON, *tf_args("tf_multiworker")],
    # `toolkit launch` runs whichever launcher the spec names, supervised
    "ddp-toolkit_launch_torchrun": toolkit_launch("ddp", torch_args),
    "ddp-toolkit_launch_local": toolkit_launch("ddp_local", torch_args),
    "horovod-toolkit_launch_horovodrun": toolkit_launch("horovod", torch_args),
    "horovod-toolkit_launch_mpirun": toolkit_launch("horovod_mpi", torch_args),
    "zero3-toolkit_launch_deepspeed": toolkit_launch("zero3", torch_args),
    "tf_multiworker-toolkit_launch_local": toolkit_launch("tf_multiworker", tf_args),
    "horovod_tf-toolkit_launch_horovodrun": toolkit_launch("horovod_tf", tf_args),
}

SUBSET = [
    "ddp-torchrun",
    "fsdp-mpirun",
    "horovod_controller_from_launcher-mpirun",
    "horovod_controller_from_machine-toolkit_launch_horovodrun",
    "zero3-mpirun",
    "pipeline_ranks_from_launcher-deepspeed",
    "horovod_tf-horovodrun_gloo",
    "tf_multiworker-toolkit_launch_local",
]
RUN = list(CELLS) if FULL_MATRIX else SUBSET


@pytest.mark.parametrize("cell", RUN)
def test_two_process_cell_trains_to_identical_weights(cell: str) -> None:
    assert_trained(run(CELLS[cell]), world_size=2, min_accuracy=float(MIN_ACCURACY))


@pytest.mark.skipif(
    not FULL_MATRIX,
    reason="TOOLKIT_MATRIX=full (the parity case tf-mirrored/in-process runs by default)",
)
def test_tf_mirrored_two_devices_in_one_process() -> None:
    result = run([PYTHON, *tf_args("tf_mirrored")])
    assert_trained(result, world_size=1, min_accuracy=float(MIN_ACCURACY))
    assert result.metrics["replicas"] == 2


REFUSED = {
    "horovod-under-torchrun": ([*TORCHRUN, *torch_args("horovod")], "torchrun", "horovodrun"),
    "ddp-under-horovodrun": ([*horovodrun("gloo"), *torch_args("ddp")], "horovodrun", "torchrun"),
    "tf-under-torchrun": ([*TORCHRUN, *tf_args("tf_multiworker")], "torchrun", "local"),
}
"""Cells the engine table refuses. By default only the first starts: the refusal is one check
(toolkit/backends/registry.py) whichever engine and launcher meet there."""
REFUSED_RUN = list(REFUSED) if FULL_MATRIX else list(REFUSED)[:1]


@pytest.mark.parametrize(
    ("argv", "launcher", "works_under"), [REFUSED[name] for name in REFUSED_RUN], ids=REFUSED_RUN
)
def test_unsupported_cell_is_refused_before_the_engine_starts(
    argv: list[str], launcher: str, works_under: str
) -> None:
    result = run(argv, timeout=180)
    assert result.returncode != 0
    assert f"this process was started by {launcher}: backend" in result.output, result.explain()
    assert works_under in result.output
    # One line from the script; torchrun itself still prints a traceback for a failed child.
    assert f'File "{argv[argv.index("--spec") - 1]}"' not in result.output, result.explain()


def test_zero3_checkpoint_holds_the_consolidated_weights(tmp_path: Path) -> None:
    """ZeRO-3 partitions the parameters; run.save must still give the full fp32 weights (each
    rank writes its partitions, the reader puts them together)."""
    target = tmp_path / "checkpoints"
    result = run([*DEEPSPEED, *torch_args("zero3"), "--save", str(target)])
    assert_trained(result, world_size=2, min_accuracy=float(MIN_ACCURACY))
    checkpoint = open_checkpoint(target)
    assert weights_digest(checkpoint.tensors("model")) == result.digests[0]
    assert checkpoint.manifest.origin.backend == "deepspeed"
    assert checkpoint.step == result.metrics["steps"]


def deepspeed_does_fp16_here() -> bool:
    """DeepSpeed's CPU accelerator does fp16 where oneDNN does (`is_fp16_supported` asks
    `torch.ops.mkldnn._is_mkldnn_fp16_supported`), which depends on the CPU: yes on one with
    AVX512-FP16 or AMX-FP16 (the Intel machine of 2026-11-25), no elsewhere (the AMD EPYC of
    2026-11-26). Where it is no, DeepSpeed 0.19.8 returns None, not False: the method falls
    off the end of its `try`."""
    probe = (
        "from deepspeed.accelerator import get_accelerator; "
        "print(int(bool(get_accelerator().is_fp16_supported())))"
    )
    done = subprocess.run([PYTHON, "-c", probe], capture_output=True, text=True, check=True)
    return done.stdout.split()[-1] == "1"


def precision_spec(tmp_path: Path, base: str, precision: str) -> str:
    spec_file = tmp_path / f"{base}_{precision}.yaml"
    spec_file.write_text(Path(spec(base)).read_text() + f"precision: {precision}\n")
    return str(spec_file)


def assert_one_clear_precision_error(result: RunOutput, precision: str, example: str) -> None:
    assert result.returncode != 0
    # A spec check names the value as written (precision=bf16), an engine's refusal its repr.
    said = (f"error: precision={precision!r}", f"error: spec error: precision={precision}:")
    assert any(line in result.output for line in said), result.explain()
    assert f'File "{example}"' not in result.output, result.explain()


def test_tf_fp16_trains_to_identical_weights(tmp_path: Path) -> None:
    """fp16 under TF MultiWorkerMirrored: Keras' mixed_float16 and LossScaleOptimizer on the
    spec's loss-scaling rule train the example as fp32 does, every rank to the same weights."""
    spec_file = precision_spec(tmp_path, "tf_multiworker", "fp16")
    result = run([*mpirun(), PYTHON, TF_EXAMPLE, "--spec", spec_file, *EPOCHS], timeout=300)
    assert_trained(result, world_size=2, min_accuracy=float(MIN_ACCURACY))


def test_tf_bf16_is_one_clear_error(tmp_path: Path) -> None:
    """bf16 under TF MultiWorkerMirrored: the TF engines run fp32 and fp16 (Keras'
    mixed_bfloat16 is not parity-checked), and spec check says so before TF starts."""
    argv = [
        *mpirun(),
        PYTHON,
        TF_EXAMPLE,
        "--spec",
        precision_spec(tmp_path, "tf_multiworker", "bf16"),
    ]
    result = run([*argv, *EPOCHS], timeout=180)
    assert_one_clear_precision_error(result, "bf16", TF_EXAMPLE)


def test_deepspeed_fp16_on_cpu_trains_where_the_cpu_has_it_else_is_one_clear_error(
    tmp_path: Path,
) -> None:
    spec_file = precision_spec(tmp_path, "zero0", "fp16")
    result = run([*DEEPSPEED, TORCH_EXAMPLE, "--spec", spec_file, *EPOCHS], timeout=180)
    if deepspeed_does_fp16_here():
        assert_trained(result, world_size=2, min_accuracy=float(MIN_ACCURACY))
    else:
        assert_one_clear_precision_error(result, "fp16", TORCH_EXAMPLE)
