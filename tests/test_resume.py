"""Resume logic that needs no engine: data position, host generators, the spec's checkpoint
section and which checkpoint a run continues from. Real engines: tests/test_resume_real.py."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from toolkit.checkpoint import CheckpointState, Origin, write_checkpoint
from toolkit.errors import ToolkitError
from toolkit.runtime.resume import (
    DataPosition,
    announce,
    checkpoint_to_resume,
    host_rng_arrays,
    restore_host_rng,
)
from toolkit.spec import SpecError, TrainSpec


def spec(**checkpoint: object) -> TrainSpec:
    return TrainSpec.model_validate({"backend": "ddp", "checkpoint": checkpoint})


def test_data_position_round_trips_and_follows_a_different_global_batch() -> None:
    saved = DataPosition(epoch=2, steps=3).to_json(global_batch=64)
    assert saved == {"epoch": 2, "steps": 3, "samples": 192}
    assert DataPosition.from_extras({"data": saved}, 64) == DataPosition(2, 3)
    # 192 samples seen: with global batch 128 the first step not yet fully seen is step 2.
    assert DataPosition.from_extras({"data": saved}, 128) == DataPosition(2, 2)
    assert DataPosition.from_extras({}, 64) == DataPosition()


def test_host_generators_continue_where_they_were_saved() -> None:
    np.random.seed(5)
    random.seed(5)
    np.random.normal()  # leaves a cached gaussian in numpy's state
    random.gauss(0, 1)
    state = CheckpointState(step=1, model={}, arrays=host_rng_arrays(rank=1))
    expected = (np.random.rand(3).tolist(), random.random(), random.gauss(0, 1))
    np.random.seed(0)
    random.seed(0)
    restore_host_rng(state, rank=1)
    assert (np.random.rand(3).tolist(), random.random(), random.gauss(0, 1)) == expected


def test_a_rank_the_saving_run_did_not_have_keeps_its_seeded_generators() -> None:
    state = CheckpointState(step=1, model={}, arrays=host_rng_arrays(rank=0))
    np.random.seed(9)
    expected = np.random.rand()
    np.random.seed(9)
    restore_host_rng(state, rank=3)
    assert np.random.rand() == expected


def test_periodic_saves_need_a_directory() -> None:
    with pytest.raises(SpecError, match=r"checkpoint\.every_steps"):
        spec(every_steps=10)


def saved(root: Path, *steps: int) -> None:
    for step in steps:
        write_checkpoint(
            root,
            CheckpointState(step=step, model={"w": np.full(64, step, dtype=np.float32)}),
            origin=Origin(backend="ddp", framework="torch", world_size=2),
        )


def test_resume_takes_latest_unless_told_not_to(tmp_path: Path) -> None:
    assert checkpoint_to_resume(spec()).checkpoint is None  # no dir: nothing is resumed
    # An empty dir: a fresh start.
    assert checkpoint_to_resume(spec(dir=str(tmp_path))).checkpoint is None
    saved(tmp_path, 3, 6)
    found = checkpoint_to_resume(spec(dir=str(tmp_path)))
    assert found.checkpoint is not None and found.checkpoint.step == 6
    assert found.passed_over == ()
    assert checkpoint_to_resume(spec(dir=str(tmp_path), resume="never")).checkpoint is None


def test_a_damaged_latest_falls_back_to_the_newest_that_verifies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved(tmp_path, 3, 6, 9)
    model = tmp_path / "step-000009" / "model.safetensors"
    model.write_bytes(model.read_bytes()[:-8])  # truncated: the manifest still lists it whole
    flipped = tmp_path / "step-000006" / "model.safetensors"
    data = bytearray(flipped.read_bytes())
    data[-1] ^= 0xFF  # one byte changed, the size unchanged
    flipped.write_bytes(bytes(data))
    found = checkpoint_to_resume(spec(dir=str(tmp_path)))
    assert found.checkpoint is not None and found.checkpoint.step == 3
    assert [step for step, _ in found.passed_over] == ["step-000009", "step-000006"]
    assert "truncated" in found.passed_over[0][1]
    assert "checksum mismatch" in found.passed_over[1][1]
    announce(found)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("toolkit: not resuming from step-000009: ")
    assert lines[1].startswith("toolkit: not resuming from step-000006: ")
    assert lines[2].startswith(f"toolkit: resuming from {tmp_path / 'step-000003'} at step 3")


def test_a_pointer_to_a_missing_step_falls_back_and_newer_steps_are_not_taken(
    tmp_path: Path,
) -> None:
    saved(tmp_path, 3, 6)
    (tmp_path / "latest").write_text("step-000005\n")  # names a step that is gone
    found = checkpoint_to_resume(spec(dir=str(tmp_path)))
    assert found.checkpoint is not None and found.checkpoint.step == 3  # 6 is past the pointer
    assert found.passed_over[0][0] == "step-000005"
    assert "does not exist" in found.passed_over[0][1]


def test_when_no_checkpoint_verifies_the_resume_is_refused(tmp_path: Path) -> None:
    saved(tmp_path, 3)
    (tmp_path / "step-000003" / "model.safetensors").write_bytes(b"")
    with pytest.raises(ToolkitError, match=r"no checkpoint there verifies \(step-000003: "):
        checkpoint_to_resume(spec(dir=str(tmp_path)))
