"""Resume logic that needs no engine: data position, host generators, the spec's checkpoint
section and which checkpoint a run continues from. Real engines: tests/test_resume_real.py."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from toolkit.checkpoint import CheckpointState, Origin, write_checkpoint
from toolkit.runtime.resume import (
    DataPosition,
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


def test_resume_takes_latest_unless_told_not_to(tmp_path: Path) -> None:
    assert checkpoint_to_resume(spec()) is None  # no dir: nothing is resumed
    assert checkpoint_to_resume(spec(dir=str(tmp_path))) is None  # empty dir: a fresh start
    for step in (3, 6):
        write_checkpoint(
            tmp_path,
            CheckpointState(step=step, model={"w": np.zeros(2, dtype=np.float32)}),
            origin=Origin(backend="ddp", framework="torch", world_size=2),
        )
    found = checkpoint_to_resume(spec(dir=str(tmp_path)))
    assert found is not None and found.step == 6
    assert checkpoint_to_resume(spec(dir=str(tmp_path), resume="never")) is None
