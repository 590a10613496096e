"""The weights-only .npz of run.save: round trip, atomic replacement, safe and clear loading,
the umask, leftovers of killed saves, and a weight named like the metadata key."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from toolkit.checkpoint import load_weights, save_weights
from toolkit.checkpoint.legacy import META_KEY
from toolkit.errors import ToolkitError
from toolkit.spec import TrainSpec

SPEC = TrainSpec.from_dict({"backend": "ddp", "batch": {"global": 8}})


def test_round_trip_keeps_weights_and_metadata(tmp_path: Path) -> None:
    weights = {"0.weight": np.arange(6, dtype=np.float32).reshape(2, 3), "0.bias": np.ones(2)}
    save_weights(str(tmp_path / "w.npz"), weights, step=7, spec=SPEC)
    loaded, meta = load_weights(str(tmp_path / "w.npz"))
    assert set(loaded) == set(weights)
    np.testing.assert_array_equal(loaded["0.weight"], weights["0.weight"])
    assert loaded["0.bias"].dtype == np.float32
    assert meta["step"] == 7 and meta["backend"] == "ddp"
    assert TrainSpec.from_dict(meta["spec"]) == SPEC


def test_a_failed_save_leaves_the_previous_checkpoint_and_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "w.npz"
    save_weights(str(target), {"a": np.zeros(3)}, step=1, spec=SPEC)
    before = target.read_bytes()

    def crash(*args: Any, **kwargs: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", crash)
    with pytest.raises(OSError, match="disk full"):
        save_weights(str(target), {"a": np.ones(3)}, step=2, spec=SPEC)
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["w.npz"]


def test_files_that_are_not_toolkit_checkpoints_are_refused_clearly(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not a zip")
    with pytest.raises(ToolkitError, match="not a readable toolkit checkpoint"):
        load_weights(str(garbage))
    foreign = tmp_path / "foreign.npz"
    np.savez(foreign, a=np.zeros(2))
    with pytest.raises(ToolkitError, match="no toolkit metadata"):
        load_weights(str(foreign))
    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, a=np.array([{"code": "x"}], dtype=object))
    with pytest.raises(ToolkitError, match="not a readable toolkit checkpoint"):
        load_weights(str(pickled))


def test_the_file_mode_follows_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        save_weights(str(tmp_path / "w.npz"), {"a": np.zeros(3)}, step=1, spec=SPEC)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "w.npz").stat().st_mode) == 0o640


def test_temporary_files_of_killed_saves_are_removed_by_the_next_save(tmp_path: Path) -> None:
    (tmp_path / ".w.npz.0123abcd.tmp").write_bytes(b"x" * 1000)
    (tmp_path / ".other.npz.0123abcd.tmp").write_bytes(b"not ours to remove")
    save_weights(str(tmp_path / "w.npz"), {"a": np.zeros(3)}, step=1, spec=SPEC)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.npz.0123abcd.tmp", "w.npz"]


def test_a_weight_named_like_the_metadata_key_is_refused_not_dropped(tmp_path: Path) -> None:
    with pytest.raises(ToolkitError, match="__toolkit_meta__"):
        save_weights(str(tmp_path / "w.npz"), {META_KEY: np.zeros(3)}, step=1, spec=SPEC)
    assert not (tmp_path / "w.npz").exists()
