"""`toolkit checkpoint import`: a native DeepSpeed checkpoint into the portable format.

Real: a plain DeepSpeed script (tests/scripts/deepspeed_native_checkpoint.py) trains N steps
with 2 CPU ranks under the `deepspeed` launcher, calling `engine.save_checkpoint` after step
k; the real `toolkit checkpoint import` converts it; then
(a) the imported fp32 weights equal the weights the native engine held at step k, and
(b) a NEW launch of a toolkit script (tests/scripts/resume_torch.py) with checkpoint.dir on
    the import resumes by itself and after N-k more steps matches the N native steps within
    the parity tolerance (Adam: the optimizer state matters).
By default ZeRO-2 -> DDP with 2 ranks (three launches); TOOLKIT_RESUME=full adds ZeRO 0, 1
and 3 continued under other toolkit engines and world sizes, SGD-momentum at ZeRO-0, and the
refusal of SGD's state under ZeRO-2.

Unit (no engine, `not multiproc`): the refusals, and the ZeRO-0 index -> name mapping on
files in DeepSpeed's ZeRO-0 layout written with torch.save.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.options import FULL_RESUME
from tests.realrun import BIN, PYTHON, ROOT, RunOutput, run
from toolkit.checkpoint import open_checkpoint, read_checkpoint
from toolkit.cli import main
from toolkit.errors import ToolkitError
from toolkit.parity.cases import TOLERANCE
from toolkit.parity.harness import weight_deviation
from toolkit.ports import free_port

# Imported here, at collection: importing DeepSpeed sets an environment variable, which the
# autouse fixture would take for a test's leak.
native_import = pytest.importorskip("toolkit.backends.deepspeed.native_import")
NATIVE = str(ROOT / "tests" / "scripts" / "deepspeed_native_checkpoint.py")
RESUME = str(ROOT / "tests" / "scripts" / "resume_torch.py")
STEPS, SAVE_AT = 7, 5
OPTIMIZERS = {
    "adam": "optimizer: {name: adam, lr: 0.01}",
    "sgd": "optimizer: {name: sgd, lr: 0.05, momentum: 0.9}",
}
ENGINES = {
    "ddp2": ("backend: ddp", [str(BIN / "torchrun"), "--nproc_per_node", "2"], 2),
    "ddp1": ("backend: ddp", [str(BIN / "torchrun"), "--nproc_per_node", "1"], 1),
    "horovod2": (
        "backend: horovod",
        [str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", PYTHON],
        2,
    ),
    "zero2": (
        "backend: deepspeed\nzero: {stage: 2}",
        [str(BIN / "deepspeed"), "--num_gpus", "2"],
        2,
    ),
}


def import_native(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "toolkit", "checkpoint", "import", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def weights(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as saved:
        return {name: saved[name] for name in saved.files}


def train_native(tmp: Path, stage: int, optimizer: str) -> Path:
    """N native steps with a save_checkpoint after step k; returns the save_dir."""
    config = tmp / "ds_config.json"
    config.write_text(
        json.dumps(
            {
                "train_batch_size": 64,
                "train_micro_batch_size_per_gpu": 16,
                "gradient_accumulation_steps": 2,
                "gradient_clipping": 0.0,
                "zero_optimization": {"stage": stage},
                # DeepSpeed refuses a torch optimizer other than Adam under ZeRO without it.
                "zero_allow_untested_optimizer": True,
            }
        )
    )
    launcher = [str(BIN / "deepspeed"), "--num_gpus", "2", "--master_port", str(free_port())]
    result = run(
        [
            *launcher,
            NATIVE,
            "--deepspeed",
            "--deepspeed_config",
            str(config),
            "--optimizer",
            optimizer,
            "--steps",
            str(STEPS),
            "--save-at",
            str(SAVE_AT),
            "--save",
            str(tmp / "native"),
            "--out-at-save",
            str(tmp / "native-at-save.npz"),
            "--out",
            str(tmp / "native-final.npz"),
        ]
    )
    assert result.returncode == 0, result.explain()
    return tmp / "native"


def resume(tmp: Path, engine: str, optimizer: str, checkpoints: Path) -> RunOutput:
    lines, launcher, _ = ENGINES[engine]
    spec = tmp / f"{engine}.yaml"
    spec.write_text(
        f"{lines}\nseed: 3\nbatch: {{global: 64, micro: 16}}\n{OPTIMIZERS[optimizer]}\n"
        f"checkpoint: {{dir: {checkpoints}}}\n"
    )
    out = tmp / "resumed.npz"
    result = run([*launcher, RESUME, "--spec", str(spec), "--steps", str(STEPS), "--out", str(out)])
    assert result.returncode == 0, result.explain()
    return result


def check_import_and_resume(tmp: Path, stage: int, engine: str, optimizer: str) -> None:
    native = train_native(tmp, stage, optimizer)
    imported = tmp / "imported"
    done = import_native(str(native), "--to", str(imported))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"ZeRO-{stage} checkpoint global_step{SAVE_AT}" in done.stdout, done.stdout
    # (a) the weights the native engine held, exactly
    state = read_checkpoint(imported)
    at_save = weights(tmp / "native-at-save.npz")
    assert state.step == SAVE_AT
    assert set(state.model) == set(at_save)
    for name, value in at_save.items():
        assert state.model[name].dtype == np.float32
        assert np.array_equal(state.model[name], value), f"{name} differs from the engine's"
    slots = {"adam": ("exp_avg", "exp_avg_sq"), "sgd": ("momentum_buffer",)}[optimizer]
    assert set(state.optimizer) == {f"{s}/{n}" for s in slots for n in at_save}
    manifest = open_checkpoint(imported).manifest
    assert (manifest.origin.backend, manifest.origin.framework) == ("deepspeed", "torch")
    assert manifest.origin.world_size == 2
    # (b) continued by a toolkit engine, it ends where N native steps ended
    result = resume(tmp, engine, optimizer, imported)
    _, _, ranks = ENGINES[engine]
    resumed = {r["rank"]: r["resumed_from"] for r in result.reports if "resumed_from" in r}
    assert resumed == dict.fromkeys(range(ranks), SAVE_AT), result.explain()
    assert "saved by deepspeed (torch) with 2 rank(s)" in result.output, result.explain()
    deviation = weight_deviation(weights(tmp / "resumed.npz"), weights(tmp / "native-final.npz"))
    assert deviation <= TOLERANCE["fp32"], deviation


CASES = [(2, "ddp2", "adam")]
if FULL_RESUME:
    CASES += [
        (0, "horovod2", "adam"),
        (0, "ddp1", "sgd"),
        (1, "zero2", "adam"),
        (3, "ddp1", "adam"),
    ]


@pytest.mark.multiproc
@pytest.mark.parametrize(("stage", "engine", "optimizer"), CASES, ids=str)
def test_a_native_deepspeed_checkpoint_imports_and_resumes_under_a_toolkit_engine(
    tmp_path: Path, stage: int, engine: str, optimizer: str
) -> None:
    check_import_and_resume(tmp_path, stage, engine, optimizer)


@pytest.mark.multiproc
@pytest.mark.skipif(not FULL_RESUME, reason="runs with TOOLKIT_RESUME=full")
def test_sgd_state_under_zero_is_refused_naming_it(tmp_path: Path) -> None:
    native = train_native(tmp_path, 2, "sgd")
    done = import_native(str(native), "--to", str(tmp_path / "imported"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "momentum_buffer" in done.stderr and "ZeRO-2" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "imported" / "latest").exists()


# -- unit: refusals and the ZeRO-0 layout, no engine -------------------------------------------


def ds_import(source: Path, target: Path, tag: str | None = None) -> Any:
    return native_import.import_checkpoint(source, target, tag=tag)


def write_zero0(root: Path, module: Any, optimizer: Any, *, tag: str = "global_step3") -> Path:
    """A checkpoint in DeepSpeed's ZeRO-0 layout (what _common_checkpoint_state holds)."""
    import torch

    (root / tag).mkdir(parents=True)
    (root / "latest").write_text(tag)
    torch.save(
        {
            "module": module.state_dict(),
            "buffer_names": [name for name, _ in module.named_buffers()],
            "optimizer": optimizer.state_dict() if optimizer is not None else None,
            "param_shapes": None,
            "shared_params": None,
            "lr_scheduler": None,
            "skipped_steps": 0,
            "global_steps": 3,
            "global_samples": 96,
            "dp_world_size": 2,
            "mp_world_size": 1,
            "ds_config": {"train_batch_size": 32},
            "ds_version": "0.19.8",
        },
        root / tag / "mp_rank_00_model_states.pt",
    )
    return root


class Tied:
    """A model with a buffer and a tied weight, trained 3 steps by a torch optimizer."""

    def __init__(self, optimizer: str) -> None:
        import torch

        torch.manual_seed(0)
        self.module = torch.nn.Sequential(
            torch.nn.Embedding(6, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 6)
        )
        self.module[2].weight = self.module[0].weight
        params = self.module.parameters()
        self.optimizer = (
            torch.optim.SGD(params, lr=0.1, momentum=0.9)
            if optimizer == "sgd"
            else torch.optim.Adam(params, lr=0.01)
        )
        for _ in range(3):
            loss = self.module(torch.tensor([0, 1, 2, 3])).square().mean()
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_zero0_optimizer_state_is_named_by_the_modules_parameter_order(
    tmp_path: Path, optimizer: str
) -> None:
    model = Tied(optimizer)
    source = write_zero0(tmp_path / "ds", model.module, model.optimizer)
    done = ds_import(source, tmp_path / "out")
    state = read_checkpoint(done.path)
    assert done.stage == 0 and state.step == 3
    assert set(state.model) == set(model.module.state_dict())  # buffers, both tied names
    slots = {"adam": ("exp_avg", "exp_avg_sq"), "sgd": ("momentum_buffer",)}[optimizer]
    parameters = dict(model.module.named_parameters())  # the tied weight once, first name
    assert set(state.optimizer) == {f"{s}/{n}" for s in slots for n in parameters}
    for name, parameter in parameters.items():
        for slot in slots:
            expected = model.optimizer.state[parameter][slot].numpy()
            assert np.array_equal(state.optimizer[f"{slot}/{name}"], expected)
    assert state.scalars == ({"step": 3} if optimizer == "adam" else {})
    assert state.extras["data"] == {"epoch": 0, "samples": 96}


def test_an_optimizer_not_built_from_all_parameters_is_refused(tmp_path: Path) -> None:
    import torch

    model = Tied("adam")
    partial = torch.optim.Adam(list(model.module.parameters())[:1], lr=0.01)
    source = write_zero0(tmp_path / "ds", model.module, partial)
    with pytest.raises(ToolkitError, match="optimizer holds 1 parameters, the module 4"):
        ds_import(source, tmp_path / "out")


def test_optimizer_state_of_another_shape_is_refused_naming_it(tmp_path: Path) -> None:
    import torch

    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    optimizer.state[model.weight]["odd"] = torch.zeros(7)
    source = write_zero0(tmp_path / "ds", model, optimizer)
    with pytest.raises(ToolkitError, match="optimizer state 'odd' of 'weight'"):
        ds_import(source, tmp_path / "out")


def test_not_a_directory_no_checkpoint_and_a_missing_tag_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ToolkitError, match="is not a directory"):
        ds_import(tmp_path / "nowhere", tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ToolkitError, match=r"is not a DeepSpeed checkpoint \(no 'latest'"):
        ds_import(tmp_path / "empty", tmp_path / "out")
    model = Tied("adam")
    source = write_zero0(tmp_path / "ds", model.module, model.optimizer)
    with pytest.raises(ToolkitError, match=r"no checkpoint tag 'global_step9'.*global_step3"):
        ds_import(source, tmp_path / "out", tag="global_step9")
    assert not (tmp_path / "out").exists()


def test_a_tag_directory_itself_is_accepted_and_no_target_is_mixed(tmp_path: Path) -> None:
    model = Tied("sgd")
    source = write_zero0(tmp_path / "ds", model.module, model.optimizer)
    (source / "latest").unlink()
    done = ds_import(source / "global_step3", tmp_path / "out")
    assert done.tag == "global_step3" and done.state.step == 3
    with pytest.raises(ToolkitError, match=r"already holds checkpoints \(latest step-000003"):
        ds_import(source / "global_step3", tmp_path / "out")


def test_pipeline_engine_checkpoints_are_refused(tmp_path: Path) -> None:
    model = Tied("adam")
    source = write_zero0(tmp_path / "ds", model.module, model.optimizer)
    (source / "global_step3" / "layer_01-model_00-model_states.pt").write_bytes(b"")
    with pytest.raises(ToolkitError, match="pipeline engine"):
        ds_import(source, tmp_path / "out")


def test_tensor_parallel_and_half_precision_zero0_are_refused(tmp_path: Path) -> None:
    import torch

    model = Tied("adam")
    source = write_zero0(tmp_path / "ds", model.module.half(), None)
    with pytest.raises(ToolkitError, match=r"ZeRO-0 weights in torch.float16"):
        ds_import(source, tmp_path / "out")
    file = source / "global_step3" / "mp_rank_00_model_states.pt"
    saved = torch.load(file, weights_only=True)
    torch.save({**saved, "mp_world_size": 2}, file)
    with pytest.raises(ToolkitError, match="mp_world_size 2"):
        ds_import(source, tmp_path / "out")


class Hostile:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


def test_a_file_with_foreign_python_objects_is_refused_without_running_it(
    tmp_path: Path,
) -> None:
    import torch

    marker = tmp_path / "ran"
    (tmp_path / "ds" / "global_step1").mkdir(parents=True)
    (tmp_path / "ds" / "latest").write_text("global_step1")
    file = tmp_path / "ds" / "global_step1" / "mp_rank_00_model_states.pt"
    torch.save({"module": {}, "payload": Hostile(marker)}, file)
    with pytest.raises(ToolkitError, match=r"refused.*import only checkpoints you trust"):
        ds_import(tmp_path / "ds", tmp_path / "out")
    assert not marker.exists()


def test_a_damaged_file_is_one_error_naming_it(tmp_path: Path) -> None:
    model = Tied("adam")
    source = write_zero0(tmp_path / "ds", model.module, model.optimizer)
    file = source / "global_step3" / "mp_rank_00_model_states.pt"
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    with pytest.raises(ToolkitError, match=r"mp_rank_00_model_states\.pt: is not a readable torch"):
        ds_import(source, tmp_path / "out")


def test_the_cli_prints_one_line_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty").mkdir()
    assert main(["checkpoint", "import", str(tmp_path / "empty"), "--to", str(tmp_path)]) == 2
    printed = capsys.readouterr().err
    assert printed.count("\n") == 1 and "not a DeepSpeed checkpoint" in printed


def test_the_cli_imports_and_inspect_shows_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = Tied("adam")
    source = write_zero0(tmp_path / "ds", model.module, model.optimizer)
    assert main(["checkpoint", "import", str(source), "--to", str(tmp_path / "out")]) == 0
    assert "ZeRO-0 checkpoint global_step3 (2 ranks, step 3)" in capsys.readouterr().out
    assert main(["checkpoint", "inspect", str(tmp_path / "out")]) == 0
    assert "step 3, deepspeed/torch, world size 2" in capsys.readouterr().out
