"""Background saves (`checkpoint.async`, toolkit.checkpoint.background) in one process: two
ranks' writers as real threads on real files, rank 0's committing once both parts are there;
the snapshot that training can no longer change; a failed part that rank 0 hears of instead of
waiting; and the spec fields."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pytest

from toolkit.checkpoint import begin_save, commit_save, latest, read_checkpoint
from toolkit.checkpoint.background import BackgroundSave, snapshot
from toolkit.checkpoint.fragments import Fragment
from toolkit.checkpoint.write import wait_for_parts
from toolkit.errors import ToolkitError
from toolkit.spec import SpecError, TrainSpec


def writer(root: Path, step: int, rank: int, tensors: dict[str, object]) -> BackgroundSave:
    commit = partial(commit_save, root, step, ranks=2) if rank == 0 else None
    return BackgroundSave(
        root,
        step,
        rank=rank,
        ranks=2,
        sections={"optimizer": snapshot(tensors)},
        commit=commit,
        bound_s=30,
    )


def test_two_ranks_written_in_the_background_commit_one_checkpoint(tmp_path: Path) -> None:
    live = np.arange(8, dtype=np.float32)
    first = writer(tmp_path, 4, 0, {"w": Fragment(live[:4], 0, (8,))})
    second = writer(tmp_path, 4, 1, {"w": Fragment(live[4:], 4, (8,))})
    live[:] = -1  # training goes on: the snapshot already holds its copy
    first.start()  # rank 0 first: it waits for rank 1's part before it commits
    second.start()
    assert second.wait() is None
    assert first.wait() is None
    saved = read_checkpoint(tmp_path)
    assert saved.step == 4
    np.testing.assert_array_equal(saved.optimizer["w"], np.arange(8, dtype=np.float32))
    assert not list((tmp_path / "step-000004").glob("*.tmp"))


def test_a_rank_that_cannot_write_its_part_tells_rank_0_which_commits_nothing(
    tmp_path: Path,
) -> None:
    first = writer(tmp_path, 2, 0, {"w": Fragment(np.zeros(2), 0, (4,))})
    # rank 1 writes a fragment that does not fit the whole: its save fails, and says so
    second = writer(tmp_path, 2, 1, {"w": Fragment(np.zeros(5), 2, (4,))})
    first.start()
    second.start()
    failed = second.wait()
    assert failed is not None
    refused = first.wait()
    assert refused is not None
    assert refused.message.startswith("rank 1 could not write its part of step 2: "), refused
    assert latest(tmp_path) is None


def test_a_part_that_never_comes_ends_the_wait_at_its_bound(tmp_path: Path) -> None:
    begin_save(tmp_path, 1, rank=0, ranks=2).finish()
    with pytest.raises(ToolkitError, match=r"rank\(s\) 1 did not finish their part of step 1"):
        wait_for_parts(tmp_path, 1, ranks=2, bound_s=0.2)


def test_a_save_that_cannot_start_is_an_error_of_the_writer_not_of_the_thread(
    tmp_path: Path,
) -> None:
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")
    save = writer(not_a_directory, 1, 0, {"w": np.zeros(2)})
    save.start()
    failure = save.wait()
    assert failure is not None and "cannot create" in failure.message


def test_the_snapshot_is_a_copy() -> None:
    live = {"a": np.ones(3), "b": Fragment(np.ones(2), 0, (4,))}
    copied = snapshot(live)
    live["a"][:] = 0
    np.asarray(live["b"].data)[:] = 0  # type: ignore[union-attr]
    np.testing.assert_array_equal(copied["a"], np.ones(3))
    np.testing.assert_array_equal(copied["b"].data, np.ones(2))


BASE = {"backend": "ddp", "batch": {"global": 8}}


def test_async_is_read_by_its_yaml_name() -> None:
    spec = TrainSpec.from_dict(
        {**BASE, "checkpoint": {"dir": "ckpt", "every_steps": 5, "async": True}}
    )
    assert spec.checkpoint.async_
    assert spec.to_dict()["checkpoint"]["async"] is True


def test_async_without_periodic_saves_is_refused() -> None:
    with pytest.raises(SpecError, match=r"checkpoint\.async.*every_steps is 0"):
        TrainSpec.from_dict({**BASE, "checkpoint": {"dir": "ckpt", "async": True}})


def test_save_failure_takes_stop_or_continue() -> None:
    with pytest.raises(SpecError, match=r"checkpoint\.save_failure"):
        TrainSpec.from_dict({**BASE, "checkpoint": {"dir": "ckpt", "save_failure": "ignore"}})
