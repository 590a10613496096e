"""`toolkit checkpoint inspect|export`: what a checkpoint holds, weights for inference, and one
line with exit status 2 for anything wrong."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import safetensors

from toolkit.checkpoint import CheckpointState, Origin, begin_save, commit_save, write_checkpoint
from toolkit.cli import main

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("torch", "deepspeed", "horovod", "tensorflow", "keras", "mpi4py")
WEIGHTS = {
    "transformer.h.0.attn.c_attn.weight": np.arange(24, dtype=np.float32).reshape(4, 6),
    "transformer.h.0.attn.c_attn.bias": np.ones(6, dtype=np.float32),
    "lm_head.weight": np.full((3, 4), 0.5, dtype=np.float32),
}


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    """A checkpoint as two ZeRO ranks would save it: whole weights, sharded optimizer state."""
    root = tmp_path / "ckpt"
    for rank in range(2):
        pending = begin_save(root, 40, rank=rank, ranks=2)
        if rank == 0:
            pending.write("model", WEIGHTS, whole=True)
        names = sorted(WEIGHTS)[rank::2]
        pending.write("optimizer", {f"exp_avg/{name}": WEIGHTS[name] for name in names})
        pending.finish()
    origin = Origin(backend="deepspeed", framework="torch", world_size=2)
    commit_save(root, 40, ranks=2, origin=origin, scalars={"step": 40}, extras={"epoch": 2})
    return root


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_inspect_says_engine_step_world_size_and_contents(
    checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(["checkpoint", "inspect", str(checkpoint)], capsys)
    assert code == 0
    assert "step-000040: step 40, deepspeed/torch, world size 2" in out
    assert "model: 3 tensors, 42 elements" in out and "(3 F32)" in out
    assert "optimizer: 3 tensors, 42 elements" in out and "in 2 file(s)" in out
    assert "extras: epoch" in out


def test_inspect_json_verified(checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["checkpoint", "inspect", str(checkpoint), "--json", "--verify"], capsys)
    report = json.loads(out)
    assert code == 0 and report["verified"] is True
    assert (report["step"], report["backend"], report["world_size"]) == (40, "deepspeed", 2)
    assert report["sections"]["model"]["elements"] == sum(w.size for w in WEIGHTS.values())
    assert report["sections"]["optimizer"]["files"] == [
        "optimizer-rank0-of-2.safetensors",
        "optimizer-rank1-of-2.safetensors",
    ]


def test_export_safetensors_is_what_from_pretrained_reads(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_file = tmp_path / "model.safetensors"
    argv = ["checkpoint", "export", str(checkpoint), "--to", "safetensors", "--out", str(out_file)]
    code, out, _ = run(argv, capsys)
    assert code == 0 and "wrote 3 tensors of step 40" in out
    # transformers' from_pretrained refuses a model.safetensors whose metadata lacks format=pt.
    with safetensors.safe_open(str(out_file), framework="numpy") as stream:
        assert stream.metadata() == {"format": "pt"}
        exported = {name: stream.get_tensor(name) for name in stream.keys()}  # noqa: SIM118
    assert sorted(exported) == sorted(WEIGHTS)
    for name, weight in WEIGHTS.items():
        np.testing.assert_array_equal(exported[name], weight)


def test_export_torch_loads_with_weights_only(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch = pytest.importorskip("torch")
    out_file = tmp_path / "weights.pt"
    argv = ["checkpoint", "export", str(checkpoint), "--to", "torch", "--out", str(out_file)]
    assert run(argv, capsys)[0] == 0
    loaded = torch.load(out_file, weights_only=True)
    assert sorted(loaded) == sorted(WEIGHTS)
    for name, weight in WEIGHTS.items():
        assert torch.equal(loaded[name], torch.from_numpy(weight))


def damaged(checkpoint: Path) -> Path:
    target = checkpoint / "step-000040" / "optimizer-rank1-of-2.safetensors"
    content = bytearray(target.read_bytes())
    content[-1] ^= 0x10
    target.write_bytes(bytes(content))
    return checkpoint


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["inspect", "{tmp}/missing"], "missing: does not exist"),
        (["inspect", "{tmp}/ckpt/step-000040/model.safetensors"], "is a file, not a checkpoint"),
        (["inspect", "{tmp}"], "holds no checkpoint"),
        (["inspect", "{damaged}", "--verify"], "optimizer-rank1-of-2.safetensors: checksum"),
        (["export", "{damaged}", "--to", "safetensors", "--out", "{tmp}/m"], None),
        (["export", "{tmp}/ckpt", "--to", "torch", "--out", "{tmp}/no/m"], "does not exist"),
    ],
)
def test_errors_are_one_line_and_exit_2(
    checkpoint: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str | None,
) -> None:
    """Export of damaged optimizer state still works: it reads only the model files."""
    values = {"tmp": str(tmp_path), "damaged": str(damaged(checkpoint))}
    code, _, err = run(["checkpoint", *(arg.format(**values) for arg in argv)], capsys)
    if message is None:
        assert code == 0, err
        return
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("toolkit: error: ") and message in err, err


def test_the_command_imports_no_engine(checkpoint: Path, tmp_path: Path) -> None:
    out_file = tmp_path / "m.safetensors"
    code = (
        "import sys\n"
        "from toolkit.cli import main\n"
        f"assert main(['checkpoint', 'inspect', {str(checkpoint)!r}, '--verify']) == 0\n"
        f"assert main(['checkpoint', 'export', {str(checkpoint)!r}, '--to', 'safetensors',"
        f" '--out', {str(out_file)!r}]) == 0\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {ENGINES!r}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_a_checkpoint_written_in_one_process_inspects_the_same(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_checkpoint(tmp_path, CheckpointState(step=1, model=WEIGHTS))
    code, out, _ = run(["checkpoint", "inspect", str(tmp_path / "step-000001")], capsys)
    assert code == 0 and "step 1, unknown engine, world size 1" in out
