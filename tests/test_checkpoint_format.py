"""The checkpoint format: exact round trips, sharded saves merged by name, `latest`, rotation,
leftover cleanup, file modes, and interchange with the reference safetensors package."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.numpy

from toolkit.checkpoint import (
    CheckpointState,
    Origin,
    begin_save,
    commit_save,
    latest,
    open_checkpoint,
    optimizer_key,
    read_checkpoint,
    split_optimizer_key,
    write_checkpoint,
)
from toolkit.checkpoint.fragments import Block, Fragment
from toolkit.checkpoint.manifest import checksum_line
from toolkit.checkpoint.tensorfile import DTYPES
from toolkit.errors import ToolkitError
from toolkit.spec import TrainSpec

SPEC = TrainSpec.from_dict({"backend": "deepspeed", "batch": {"global": 8}, "zero": {"stage": 3}})
ORIGIN = Origin(backend="deepspeed", framework="torch", world_size=2, spec=SPEC.to_dict())


def make_state(step: int = 5, seed: int = 0) -> CheckpointState:
    rng = np.random.default_rng(seed)
    params = {"fc1.weight": (16, 8), "fc1.bias": (16,), "fc2.weight": (4, 16), "fc2.bias": (4,)}
    model = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in params.items()}
    model["bn.num_batches_tracked"] = np.array(17, dtype=np.int64)
    optimizer = {
        optimizer_key(slot, name): rng.standard_normal(shape).astype(np.float32)
        for name, shape in params.items()
        for slot in ("exp_avg", "exp_avg_sq")
    }
    optimizer["step/fc1.weight"] = np.array(step, dtype=np.float32)
    return CheckpointState(
        step=step,
        model=model,
        optimizer=optimizer,
        scalars={"param_groups": [{"lr": 3e-4, "betas": [0.9, 0.999], "eps": 1e-8}]},
        arrays={"rng/numpy/rank0": rng.integers(0, 2**32, 624, dtype=np.uint32)},
        extras={"schedule": {"last_epoch": step}, "data": {"epoch": 1, "samples": 4096}},
    )


def assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        assert a[name].shape == b[name].shape, name
        assert a[name].tobytes() == b[name].tobytes(), name


def test_round_trip_is_exact(tmp_path: Path) -> None:
    state = make_state()
    state.arrays["nan_and_inf"] = np.array([np.nan, np.inf, -0.0], dtype=np.float64)
    for code, dtype in DTYPES.items():
        state.arrays[f"dtype/{code}"] = np.arange(6).astype(dtype).reshape(2, 3)
    state.arrays["empty"] = np.zeros((0, 3), dtype=np.float32)
    path = write_checkpoint(tmp_path, state, origin=ORIGIN)
    assert path == tmp_path / "step-000005"
    loaded = read_checkpoint(tmp_path)
    assert loaded.step == state.step
    for section in ("model", "optimizer", "arrays"):
        assert_same(getattr(loaded, section), getattr(state, section))
    assert loaded.scalars == state.scalars and loaded.extras == state.extras
    manifest = open_checkpoint(path).manifest
    assert manifest.origin == ORIGIN
    assert TrainSpec.from_dict(manifest.origin.spec or {}) == SPEC


def test_names_are_data_never_keys_next_to_metadata(tmp_path: Path) -> None:
    names = ["__metadata__", "toolkit.escaped:x", "format", "step", "manifest.json", "a/b/c", "é"]
    weights = {name: np.full(3, index, dtype=np.float32) for index, name in enumerate(names)}
    write_checkpoint(tmp_path, CheckpointState(step=1, model=weights))
    assert_same(read_checkpoint(tmp_path).model, weights)


def test_files_are_readable_by_the_reference_safetensors_package(tmp_path: Path) -> None:
    state = make_state()
    path = write_checkpoint(tmp_path, state)
    assert_same(safetensors.numpy.load_file(str(path / "model.safetensors")), state.model)
    assert_same(safetensors.numpy.load_file(str(path / "optimizer.safetensors")), state.optimizer)


def test_files_written_by_the_reference_package_are_read(tmp_path: Path) -> None:
    """Swap in a reference-written file (and fix up the manifest): the parser accepts it."""
    state = make_state()
    path = write_checkpoint(tmp_path, state)
    safetensors.numpy.save_file(state.model, str(path / "model.safetensors"), {"x": "y"})
    raw = (path / "model.safetensors").read_bytes()
    manifest = json.loads((path / "manifest.json").read_text())
    (record,) = (f for f in manifest["files"] if f["path"] == "model.safetensors")
    record.update(bytes=len(raw), sha256=hashlib.sha256(raw).hexdigest())
    encoded = json.dumps(manifest).encode()
    (path / "manifest.json").write_bytes(encoded)
    (path / "manifest.json.sha256").write_bytes(checksum_line(encoded))
    assert_same(read_checkpoint(path).model, state.model)


def test_optimizer_keys_split_back_even_when_parameter_names_hold_slashes() -> None:
    key = optimizer_key("exp_avg", "dense/kernel:0")
    assert key == "exp_avg/dense/kernel:0"
    assert split_optimizer_key(key) == ("exp_avg", "dense/kernel:0")
    with pytest.raises(ToolkitError):
        optimizer_key("exp/avg", "w")
    with pytest.raises(ToolkitError):
        split_optimizer_key("no-slot")


def sharded_save(root: Path, state: CheckpointState, ranks: int, keep: int = 0) -> Path:
    """What `ranks` ranks do, each holding every ranks-th optimizer tensor."""
    names = sorted(state.optimizer)
    for rank in range(ranks):
        pending = begin_save(root, state.step, rank=rank, ranks=ranks)
        if rank == 0:
            pending.write("model", state.model, whole=True)
        owned = {name: state.optimizer[name] for name in names[rank::ranks]}
        pending.write("optimizer", owned)
        pending.write("arrays", {f"rng/rank{rank}": np.arange(rank + 3, dtype=np.uint8)})
        pending.finish()
    return commit_save(
        root, state.step, ranks=ranks, origin=ORIGIN, scalars=state.scalars, keep=keep
    )


def test_sharded_save_is_merged_by_name(tmp_path: Path) -> None:
    state = make_state()
    path = sharded_save(tmp_path, state, ranks=3)
    files = sorted(p.name for p in path.iterdir())
    assert files == sorted(
        [
            "manifest.json",
            "manifest.json.sha256",
            "model.safetensors",
            *(f"optimizer-rank{r}-of-3.safetensors" for r in range(3)),
            *(f"arrays-rank{r}-of-3.safetensors" for r in range(3)),
        ]
    )
    checkpoint = open_checkpoint(tmp_path)
    assert_same(checkpoint.tensors("optimizer"), state.optimizer)
    assert sorted(checkpoint.tensors("arrays")) == ["rng/rank0", "rng/rank1", "rng/rank2"]
    wanted = ["exp_avg/fc2.bias"]
    assert_same(checkpoint.tensors("optimizer", wanted), {n: state.optimizer[n] for n in wanted})
    with pytest.raises(ToolkitError, match="no optimizer tensor named nope"):
        checkpoint.tensors("optimizer", ["nope"])


def test_commit_refuses_a_rank_that_did_not_finish(tmp_path: Path) -> None:
    state = make_state()
    begin_save(tmp_path, 5, rank=0, ranks=2).finish()
    begin_save(tmp_path, 5, rank=1, ranks=2).write("optimizer", state.optimizer)
    with pytest.raises(ToolkitError, match="rank 1 of 2 has not finished"):
        commit_save(tmp_path, 5, ranks=2)
    assert latest(tmp_path) is None
    with pytest.raises(ToolkitError, match="no save of step 6 in progress"):
        commit_save(tmp_path, 6, ranks=1)


def test_the_same_tensor_from_two_ranks_is_refused(tmp_path: Path) -> None:
    for rank in range(2):
        pending = begin_save(tmp_path, 1, rank=rank, ranks=2)
        pending.write("optimizer", {"exp_avg/w": np.zeros(2)})
        pending.finish()
    with pytest.raises(ToolkitError, match="optimizer tensor 'exp_avg/w' is stored more than once"):
        commit_save(tmp_path, 1, ranks=2)


def test_a_retried_save_of_the_same_step_drops_the_earlier_attempts_files(tmp_path: Path) -> None:
    state = make_state()
    begin_save(tmp_path, 5, rank=1, ranks=4).write("optimizer", {"exp_avg/stale": np.zeros(1)})
    path = sharded_save(tmp_path, state, ranks=2)
    assert not any("of-4" in p.name for p in path.iterdir())
    assert_same(read_checkpoint(path).optimizer, state.optimizer)


def test_latest_moves_and_keep_rotates_but_never_drops_latest(tmp_path: Path) -> None:
    for step in (1, 2, 3, 4):
        write_checkpoint(tmp_path, make_state(step), keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-000003", "step-000004"]
    assert (tmp_path / "latest").read_text() == "step-000004\n"
    # Resumed from an older step: the new save is latest even though higher steps exist.
    write_checkpoint(tmp_path, make_state(2), keep=1)
    assert latest(tmp_path) == tmp_path / "step-000002"
    assert (tmp_path / "step-000002").is_dir() and (tmp_path / "step-000004").is_dir()
    write_checkpoint(tmp_path, make_state(9), keep=0)
    assert len(list(tmp_path.glob("step-*"))) == 3


def test_saving_a_step_again_replaces_it(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, make_state(5, seed=1))
    second = make_state(5, seed=2)
    write_checkpoint(tmp_path, second)
    assert_same(read_checkpoint(tmp_path).model, second.model)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-000005"]


def test_without_a_pointer_latest_is_the_highest_complete_step(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        write_checkpoint(tmp_path, make_state(step))
    (tmp_path / "latest").unlink()
    (tmp_path / "step-000003" / "manifest.json").unlink()
    assert latest(tmp_path) == tmp_path / "step-000002"
    assert latest(tmp_path / "empty") is None


def test_leftovers_of_interrupted_saves_are_removed_by_the_next_save(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, make_state(1))
    (tmp_path / ".incomplete-step-000007").mkdir()
    (tmp_path / ".incomplete-step-000007" / "model.safetensors").write_bytes(b"x" * 100)
    (tmp_path / ".old-step-000001-123").mkdir()
    (tmp_path / ".latest.999.tmp").write_bytes(b"step-0")
    (tmp_path / "notes.txt").write_text("mine")
    write_checkpoint(tmp_path, make_state(2))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "latest",
        "notes.txt",
        "step-000001",
        "step-000002",
    ]


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_file_modes_follow_the_umask(tmp_path: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        path = write_checkpoint(tmp_path / "ckpt", make_state())
    finally:
        os.umask(old)
    for entry in [tmp_path / "ckpt" / "latest", *path.iterdir()]:
        assert stat.S_IMODE(entry.stat().st_mode) == 0o666 & ~umask, entry
    assert stat.S_IMODE(path.stat().st_mode) == 0o777 & ~umask


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"step": -1}, "step=-1 must be an integer"),
        ({"step": 1.5}, "step=1.5 must be an integer"),
        ({"extras": {"x": float("nan")}}, "extras cannot be stored as JSON"),
        ({"scalars": {"x": np.zeros(2)}}, "put arrays into CheckpointState.arrays"),
        ({"model": {"w": np.array(["a"])}}, "tensor 'w' has dtype <U1"),
        ({"model": {"w": np.zeros(2, dtype=np.complex64)}}, "tensor 'w' has dtype complex64"),
    ],
)
def test_state_that_cannot_be_stored_is_one_clear_error(
    tmp_path: Path, change: dict[str, object], message: str
) -> None:
    state = make_state()
    for key, value in change.items():
        setattr(state, key, value)
    with pytest.raises(ToolkitError, match=message):
        write_checkpoint(tmp_path, state)
    assert latest(tmp_path) is None


def test_numpy_scalars_in_json_state_come_back_as_python_values(tmp_path: Path) -> None:
    state = make_state(step=np.int64(3))  # type: ignore[arg-type]
    state.extras = {"epoch": np.int32(2), "loss_scale": np.float32(65536.0), "t": (1, 2)}
    write_checkpoint(tmp_path, state)
    loaded = read_checkpoint(tmp_path)
    assert loaded.step == 3 and loaded.extras == {"epoch": 2, "loss_scale": 65536.0, "t": [1, 2]}


def zero_partition(tensors: dict[str, np.ndarray], ranks: int) -> list[dict[str, Any]]:
    """What ZeRO gives each rank: an equal slice of all fp32 tensors flattened end to end, so
    slices start and end inside tensors. Rank 0 also holds the other tensors whole."""
    names = sorted(name for name in tensors if tensors[name].dtype == np.float32)
    flat = np.concatenate([tensors[name].reshape(-1) for name in names])
    bounds = np.linspace(0, flat.size, ranks + 1).astype(int)
    starts = np.cumsum([0, *(tensors[name].size for name in names)])
    held: list[dict[str, Any]] = [{} for _ in range(ranks)]
    held[0].update({name: tensors[name] for name in tensors if name not in names})
    for rank in range(ranks):
        low, high = bounds[rank], bounds[rank + 1]
        mine = held[rank]
        for name, start in zip(names, starts, strict=False):
            begin, end = max(low, start), min(high, start + tensors[name].size)
            if begin < end:
                part = flat[begin:end]
                mine[name] = Fragment(part, int(begin - start), tensors[name].shape)
    return held


def test_zero_partitions_are_written_as_fragments_and_read_whole(tmp_path: Path) -> None:
    state = make_state()
    ranks = 3
    model_parts = zero_partition(state.model, ranks)
    optimizer_parts = zero_partition(state.optimizer, ranks)
    assert any(len(parts) > 1 for parts in model_parts)  # some tensor is split across ranks
    for rank in range(ranks):
        pending = begin_save(tmp_path, state.step, rank=rank, ranks=ranks)
        pending.write("model", model_parts[rank])
        pending.write("optimizer", optimizer_parts[rank])
        pending.finish()
    commit_save(tmp_path, state.step, ranks=ranks)
    loaded = read_checkpoint(tmp_path)
    assert_same(loaded.model, state.model)
    assert_same(loaded.optimizer, state.optimizer)
    checkpoint = open_checkpoint(tmp_path)
    assert checkpoint.names("model") == sorted(state.model)
    # Read as 2 ranks: each reads only the names it needs now.
    mine = sorted(state.optimizer)[::2]
    assert_same(checkpoint.tensors("optimizer", mine), {n: state.optimizer[n] for n in mine})


def test_only_the_files_holding_the_asked_names_are_read(tmp_path: Path) -> None:
    state = make_state()
    path = sharded_save(tmp_path, state, ranks=2)
    names = sorted(state.optimizer)
    damaged = path / "optimizer-rank1-of-2.safetensors"
    damaged.write_bytes(damaged.read_bytes()[:-1] + b"\x00")
    checkpoint = open_checkpoint(path)
    assert_same(
        checkpoint.tensors("optimizer", names[0::2]), {n: state.optimizer[n] for n in names[0::2]}
    )
    with pytest.raises(ToolkitError, match=r"optimizer-rank1-of-2\.safetensors"):
        checkpoint.tensors("optimizer", names[1:2])


@pytest.mark.parametrize(
    ("parts", "message"),
    [
        ([(0, 4), (5, 12)], "gap or an overlap at element 4"),
        ([(0, 6), (5, 12)], "gap or an overlap at element 6"),
        ([(0, 4), (4, 10)], "covering 10 of 12 elements"),
    ],
)
def test_fragments_that_do_not_tile_the_tensor_are_refused(
    tmp_path: Path, parts: list[tuple[int, int]], message: str
) -> None:
    whole = np.arange(12, dtype=np.float32).reshape(3, 4)
    for rank, (begin, end) in enumerate(parts):
        pending = begin_save(tmp_path, 1, rank=rank, ranks=len(parts))
        pending.write("model", {"w": Fragment(whole.reshape(-1)[begin:end], begin, (3, 4))})
        pending.finish()
    with pytest.raises(ToolkitError, match=message):
        commit_save(tmp_path, 1, ranks=len(parts))
    assert latest(tmp_path) is None


def test_a_fragment_that_does_not_fit_its_tensor_is_refused(tmp_path: Path) -> None:
    pending = begin_save(tmp_path, 1, rank=0, ranks=2)
    with pytest.raises(ToolkitError, match="does not fit a tensor of shape"):
        pending.write("model", {"w": Fragment(np.zeros(5), 10, (3, 4))})


Placed = tuple[tuple[int, int], tuple[int, int]]
"""A block of a 6 x 4 tensor: its (row, column) start and its (rows, columns)."""


def write_blocks(root: Path, blocks: list[Placed]) -> None:
    """Rank r writes blocks[r] of one 6 x 4 tensor."""
    whole = np.arange(24, dtype=np.float32).reshape(6, 4)
    for rank, ((row, column), (rows, columns)) in enumerate(blocks):
        pending = begin_save(root, 1, rank=rank, ranks=len(blocks))
        data = whole[row : row + rows, column : column + columns]
        pending.write("model", {"w": Block(data, (row, column), (6, 4))})
        pending.finish()


def test_dtensor_blocks_on_a_2d_mesh_are_read_whole(tmp_path: Path) -> None:
    """FSDP x tensor parallel 2: rows split by FSDP, columns by the tensor-parallel ranks, and
    uneven rows (3 + 2 + 1), as DTensor places a rowwise-parallel weight."""
    write_blocks(
        tmp_path,
        [((0, 0), (3, 2)), ((0, 2), (3, 2)), ((3, 0), (3, 2)), ((3, 2), (2, 2)), ((5, 2), (1, 2))],
    )
    commit_save(tmp_path, 1, ranks=5)
    loaded = open_checkpoint(tmp_path).tensors("model")
    np.testing.assert_array_equal(loaded["w"], np.arange(24, dtype=np.float32).reshape(6, 4))


@pytest.mark.parametrize(
    ("blocks", "message"),
    [
        ([((0, 0), (3, 4)), ((2, 0), (4, 4))], "blocks that overlap at"),
        ([((0, 0), (3, 4)), ((3, 0), (2, 4))], "covering 20 of 24 elements"),
    ],
)
def test_blocks_that_do_not_tile_the_tensor_are_refused(
    tmp_path: Path, blocks: list[Placed], message: str
) -> None:
    with pytest.raises(ToolkitError, match=message):
        write_blocks(tmp_path, blocks)
        commit_save(tmp_path, 1, ranks=len(blocks))
    assert latest(tmp_path) is None


def test_a_tensor_stored_as_blocks_and_fragments_is_refused(tmp_path: Path) -> None:
    whole = np.arange(12, dtype=np.float32).reshape(3, 4)
    first = begin_save(tmp_path, 1, rank=0, ranks=2)
    first.write("model", {"w": Block(whole[:1], (0, 0), (3, 4))})
    first.finish()
    second = begin_save(tmp_path, 1, rank=1, ranks=2)
    second.write("model", {"w": Fragment(whole.reshape(-1)[4:], 4, (3, 4))})
    second.finish()
    with pytest.raises(ToolkitError, match="mixes blocks with flat fragments"):
        commit_save(tmp_path, 1, ranks=2)


def test_a_block_that_does_not_fit_its_tensor_is_refused(tmp_path: Path) -> None:
    pending = begin_save(tmp_path, 1, rank=0, ranks=2)
    with pytest.raises(ToolkitError, match="does not fit a tensor of shape"):
        pending.write("model", {"w": Block(np.zeros((3, 4)), (3, 1), (6, 4))})
