"""Checkpoints to and from PyTorch's distributed checkpoint format (`toolkit checkpoint export
--to dcp`, `import --from dcp`), held to torch's own DCP reader: what the toolkit writes,
`torch.distributed.checkpoint.load` reads back value for value, and a DCP checkpoint that torch
wrote in get_state_dict's layout imports to the same weights and optimizer state."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp

from toolkit.checkpoint import CheckpointState, Origin, open_checkpoint, write_checkpoint
from toolkit.cli import main

WEIGHTS = {
    "fc.weight": np.arange(12, dtype=np.float32).reshape(3, 4),
    "fc.bias": np.ones(3, dtype=np.float32),
    "norm.num_batches_tracked": np.asarray(7, dtype=np.int64),
}
SLOTS = {
    "exp_avg/fc.weight": np.full((3, 4), 0.25, dtype=np.float32),
    "exp_avg_sq/fc.weight": np.full((3, 4), 0.5, dtype=np.float32),
    "exp_avg/fc.bias": np.full(3, 0.125, dtype=np.float32),
    "exp_avg_sq/fc.bias": np.full(3, 2.0, dtype=np.float32),
}


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    state = CheckpointState(step=9, model=WEIGHTS, optimizer=SLOTS, scalars={"step": 9})
    write_checkpoint(tmp_path / "ckpt", state, origin=Origin(backend="fsdp", framework="torch"))
    return tmp_path / "ckpt"


def _empty_like_saved() -> dict[str, object]:
    """Preallocated tensors of the saved shapes: what dcp.load fills in place."""
    slots: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in SLOTS.items():
        slot, name = key.split("/", 1)
        slots.setdefault(name, {"step": torch.tensor(0.0)})[slot] = torch.zeros(value.shape)
    model = {
        name: torch.zeros(v.shape, dtype=torch.from_numpy(v).dtype) for name, v in WEIGHTS.items()
    }
    return {"model": model, "optimizer": {"state": slots}}


def test_an_export_is_what_torchs_dcp_load_reads(
    saved: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "dcp"
    assert main(["checkpoint", "export", str(saved), "--to", "dcp", "--out", str(out)]) == 0
    assert "wrote 9 tensors of step 9" in capsys.readouterr().out
    target = _empty_like_saved()
    dcp.load(target, checkpoint_id=str(out), no_dist=True)
    model, state = target["model"], target["optimizer"]["state"]  # type: ignore[index]
    for name, value in WEIGHTS.items():
        np.testing.assert_array_equal(model[name].numpy(), value)
    for key, value in SLOTS.items():
        slot, name = key.split("/", 1)
        np.testing.assert_array_equal(state[name][slot].numpy(), value)
        assert float(state[name]["step"]) == 9.0


def test_a_dcp_checkpoint_imports_to_the_same_state(
    saved: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, back = tmp_path / "dcp", tmp_path / "back"
    main(["checkpoint", "export", str(saved), "--to", "dcp", "--out", str(out)])
    assert main(["checkpoint", "import", str(out), "--from", "dcp", "--to", str(back)]) == 0
    assert "(step 9): 3 weights, 4 optimizer tensors" in capsys.readouterr().out
    imported = open_checkpoint(back)
    assert imported.step == 9
    model = imported.tensors("model")
    assert set(model) == set(WEIGHTS)
    for name, value in WEIGHTS.items():
        np.testing.assert_array_equal(model[name], value)
        assert model[name].dtype == value.dtype
    assert {k: v.tolist() for k, v in imported.tensors("optimizer").items()} == {
        k: v.tolist() for k, v in SLOTS.items()
    }
    assert imported.manifest.scalars == {"step": 9}


def test_a_dcp_checkpoint_with_weights_only_at_the_top_imports_at_step_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, back = tmp_path / "plain", tmp_path / "back"
    dcp.save({"w": torch.ones(2, 2)}, checkpoint_id=str(source), no_dist=True)
    assert main(["checkpoint", "import", str(source), "--from", "dcp", "--to", str(back)]) == 0
    imported = open_checkpoint(back)
    assert imported.step == 0 and list(imported.tensors("model")) == ["w"]
    assert not imported.tensors("optimizer")


def test_what_is_no_dcp_checkpoint_or_a_used_target_is_one_line_and_exit_2(
    saved: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        ["checkpoint", "import", str(tmp_path), "--from", "dcp", "--to", str(tmp_path / "x")]
    )
    assert code == 2
    assert "not a PyTorch distributed checkpoint" in capsys.readouterr().err
    out = tmp_path / "dcp"
    main(["checkpoint", "export", str(saved), "--to", "dcp", "--out", str(out)])
    capsys.readouterr()
    assert main(["checkpoint", "export", str(saved), "--to", "dcp", "--out", str(out)]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert main(["checkpoint", "import", str(out), "--from", "dcp", "--to", str(saved)]) == 2
    assert "already holds checkpoints" in capsys.readouterr().err
