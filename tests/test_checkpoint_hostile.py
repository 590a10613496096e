"""Damaged, foreign and hostile checkpoints: every one is refused with one ToolkitError that
names the file, never another exception type, and nothing is ever unpickled."""

from __future__ import annotations

import _pickle
import hashlib
import io
import json
import pickle
import random
import shutil
import struct
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolkit.checkpoint import (
    CheckpointState,
    begin_save,
    commit_save,
    load_weights,
    read_checkpoint,
    save_weights,
)
from toolkit.checkpoint.manifest import checksum_line, parse_manifest
from toolkit.checkpoint.tensorfile import parse_tensors
from toolkit.errors import ToolkitError
from toolkit.spec import TrainSpec

STEP = "step-000003"


@pytest.fixture(autouse=True)
def no_unpickling(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Any unpickling during a test fails it (the loaders must never get that far)."""
    calls: list[str] = []

    def refuse(name: str) -> Callable[..., Any]:
        def called(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            raise AssertionError(f"{name} was called while loading a checkpoint")

        return called

    for module in (pickle, _pickle):
        for name in ("load", "loads", "Unpickler"):
            monkeypatch.setattr(module, name, refuse(f"{module.__name__}.{name}"))
    yield calls
    assert calls == [], calls


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small checkpoint with every kind of file: whole model, sharded optimizer and arrays."""
    root = tmp_path_factory.mktemp("original")
    rng = np.random.default_rng(0)
    model = {f"layer{i}.weight": rng.standard_normal((8, 8)).astype(np.float32) for i in range(3)}
    for rank in range(2):
        pending = begin_save(root, 3, rank=rank, ranks=2)
        if rank == 0:
            pending.write("model", model, whole=True)
        pending.write("optimizer", {f"exp_avg/layer{rank}.weight": model[f"layer{rank}.weight"]})
        pending.write("arrays", {f"rng/rank{rank}": np.arange(16, dtype=np.uint32)})
        pending.finish()
    commit_save(root, 3, ranks=2, scalars={"step": 3}, extras={"epoch": 1})
    read_checkpoint(root)
    return root


def copy_of(original: Path, tmp_path: Path) -> Path:
    root = tmp_path / "ckpt"
    shutil.copytree(original, root)
    return root


def refused(path: Path, *, naming: str) -> str:
    """Loading `path` raises ToolkitError (and nothing else) whose message names `naming`."""
    try:
        read_checkpoint(path)
    except ToolkitError as error:
        assert naming in str(error), str(error)
        assert "\n" not in str(error)
        return str(error)
    raise AssertionError(f"{path} was loaded although {naming} is damaged")


def checkpoint_files(original: Path) -> list[str]:
    return sorted(p.name for p in (original / STEP).iterdir())


def test_every_truncation_of_every_file_is_refused(original: Path, tmp_path: Path) -> None:
    root = copy_of(original, tmp_path)
    names = checkpoint_files(original)
    assert len(names) == 7
    for name in names:
        target = root / STEP / name
        content = (original / STEP / name).read_bytes()
        for sixty_fourth in range(64):
            target.write_bytes(content[: len(content) * sixty_fourth // 64])
            refused(root, naming=name)
        target.write_bytes(content)
    read_checkpoint(root)


def test_bit_flips_in_every_file_are_refused(original: Path, tmp_path: Path) -> None:
    root = copy_of(original, tmp_path)
    rng = random.Random(11)
    for name in checkpoint_files(original):
        target = root / STEP / name
        content = (original / STEP / name).read_bytes()
        # The first 16 bytes (header length, start of header or digest) and random positions.
        positions = [*range(16), *(rng.randrange(len(content)) for _ in range(16))]
        for position in positions:
            damaged = bytearray(content)
            damaged[position] ^= 1 << rng.randrange(8)
            target.write_bytes(bytes(damaged))
            refused(root, naming=name)
        target.write_bytes(content)


def foreign_files() -> dict[str, bytes]:
    zip_bytes = io.BytesIO()
    with zipfile.ZipFile(zip_bytes, "w") as archive:
        archive.writestr("data.pkl", b"not really")
    npz = io.BytesIO()
    np.savez(npz, weight=np.zeros(4))
    real_pickle = pickle.dumps({"weight": [1.0, 2.0]}, protocol=pickle.HIGHEST_PROTOCOL)
    huge = struct.pack("<Q", 2**63 + 5) + b'{"a":1}'
    claims_more = struct.pack("<Q", 50 * 1024 * 1024) + b"{}" + b" " * 100
    nested = b"[" * 100_000 + b"]" * 100_000
    deep_header = struct.pack("<Q", len(nested)) + nested
    overlap = json.dumps(
        {
            "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
        }
    ).encode()
    overlapping = struct.pack("<Q", len(overlap)) + overlap + bytes(12)
    pickled_dtype = json.dumps({"a": {"dtype": "O", "shape": [1], "data_offsets": [0, 8]}})
    object_dtype = struct.pack("<Q", len(pickled_dtype)) + pickled_dtype.encode() + bytes(8)
    return {
        "empty": b"",
        "zip": zip_bytes.getvalue(),
        "npz": npz.getvalue(),
        "pickle": real_pickle,
        "random": random.Random(5).randbytes(4096),
        "huge-header-length": huge,
        "header-longer-than-file": claims_more,
        "deeply-nested-header": deep_header,
        "overlapping-tensors": overlapping,
        "object-dtype": object_dtype,
        "text": b"hello world\n",
    }


@pytest.mark.parametrize("kind", sorted(foreign_files()))
@pytest.mark.parametrize("manifest_agrees", [False, True], ids=["as-found", "manifest-agrees"])
def test_foreign_files_in_place_of_tensors_are_refused(
    original: Path, tmp_path: Path, kind: str, manifest_agrees: bool
) -> None:
    """As found, the checksum refuses them; with a manifest forged to agree with them (size,
    sha256, even a fresh manifest checksum), the safetensors parser must refuse them."""
    root = copy_of(original, tmp_path)
    content = foreign_files()[kind]
    (root / STEP / "model.safetensors").write_bytes(content)
    if manifest_agrees:
        manifest = json.loads((root / STEP / "manifest.json").read_bytes())
        for record in manifest["files"]:
            if record["path"] == "model.safetensors":
                record.update(bytes=len(content), sha256=hashlib.sha256(content).hexdigest())
        forge_manifest(root, manifest)
    refused(root, naming="model.safetensors")


@pytest.mark.parametrize("kind", sorted(foreign_files()))
def test_foreign_files_in_place_of_the_manifest_are_refused(
    original: Path, tmp_path: Path, kind: str
) -> None:
    root = copy_of(original, tmp_path)
    content = foreign_files()[kind]
    (root / STEP / "manifest.json").write_bytes(content)
    (root / STEP / "manifest.json.sha256").write_bytes(checksum_line(content))
    refused(root, naming="manifest.json")


@pytest.mark.parametrize("kind", sorted(foreign_files()))
def test_foreign_files_given_as_the_checkpoint_are_refused(tmp_path: Path, kind: str) -> None:
    path = tmp_path / f"{kind}.bin"
    path.write_bytes(foreign_files()[kind])
    refused(path, naming=path.name)


def forge_manifest(root: Path, manifest: dict[str, Any]) -> None:
    encoded = json.dumps(manifest).encode()
    (root / STEP / "manifest.json").write_bytes(encoded)
    (root / STEP / "manifest.json.sha256").write_bytes(checksum_line(encoded))


def first(manifest: dict[str, Any], path: str) -> dict[str, Any]:
    return next(record for record in manifest["files"] if record["path"] == path)


def as_corner_block(manifest: dict[str, Any]) -> None:
    """Make the first model tensor the only block of a whole twice its size in each dimension."""
    entry = first(manifest, "model.safetensors")["tensors"][0]
    entry["part"] = {"start": [0] * len(entry["shape"]), "of": [n * 2 for n in entry["shape"]]}


MANIFEST_DAMAGE: dict[str, tuple[Callable[[dict[str, Any]], Any], str]] = {
    "newer format": (lambda m: m.update(format_version=2), "reads up to format 1"),
    "not ours": (lambda m: m.update(format="other"), "not a toolkit manifest"),
    "format a list": (lambda m: m.update(format=[1]), "not a toolkit manifest"),
    "step missing": (lambda m: m.pop("step"), "step must be an integer"),
    "step a string": (lambda m: m.update(step="3"), "step must be an integer"),
    "world size 0": (lambda m: m.update(world_size=0), "world_size must be an integer >= 1"),
    "files not a list": (lambda m: m.update(files={}), "files must be a list"),
    "path escapes": (
        lambda m: first(m, "model.safetensors").update(path="../model.safetensors"),
        "bad path",
    ),
    "file listed twice": (lambda m: m["files"].append(m["files"][0]), "listed twice"),
    "file missing": (
        lambda m: first(m, "model.safetensors").update(path="gone.safetensors"),
        "gone.safetensors",
    ),
    "unknown section": (
        lambda m: first(m, "model.safetensors").update(section="weights"),
        "section must be one of",
    ),
    "bad sha": (lambda m: first(m, "model.safetensors").update(sha256="00"), "bad sha256"),
    "unhashable dtype": (
        lambda m: first(m, "model.safetensors")["tensors"][0].update(dtype=["F32"]),
        "unknown dtype",
    ),
    "negative shape": (
        lambda m: first(m, "model.safetensors")["tensors"][0].update(shape=[-8, -8]),
        "bad shape",
    ),
    "shape disagrees": (
        lambda m: first(m, "model.safetensors")["tensors"][0].update(shape=[64]),
        "differs from its manifest entry",
    ),
    "tensor not listed": (
        lambda m: first(m, "model.safetensors")["tensors"].pop(),
        "differ from those its manifest lists",
    ),
    "bad rank": (lambda m: m["files"][-1].update(rank=5), "bad rank/ranks"),
    "bad part": (
        lambda m: first(m, "model.safetensors")["tensors"][0].update(part="x"),
        "has a bad part",
    ),
    "part of nothing whole": (
        lambda m: first(m, "model.safetensors")["tensors"][0].update(
            part={"offset": 3, "of": [8, 8]}
        ),
        "gap or an overlap at element 0",
    ),
    "bad block": (
        lambda m: first(m, "model.safetensors")["tensors"][0].update(
            part={"start": [0, "x"], "of": [8, 8]}
        ),
        "has a bad block",
    ),
    "block of a bigger whole": (as_corner_block, "has parts covering"),
}


@pytest.mark.parametrize("damage", sorted(MANIFEST_DAMAGE))
def test_wrong_manifests_are_refused(original: Path, tmp_path: Path, damage: str) -> None:
    root = copy_of(original, tmp_path)
    manifest = json.loads((root / STEP / "manifest.json").read_bytes())
    change, message = MANIFEST_DAMAGE[damage]
    change(manifest)
    forge_manifest(root, manifest)
    error = refused(root, naming=STEP)
    assert message in error


@pytest.mark.parametrize(
    ("pointer", "message"),
    [
        (b"", "is not a checkpoint pointer"),
        (b"../../etc", "is not a checkpoint pointer"),
        (b"step-000009\n", "names step-000009, which does not exist"),
        (b"\xff\xfe" * 400, "is not a checkpoint pointer"),
    ],
)
def test_a_damaged_latest_pointer_is_refused(
    original: Path, tmp_path: Path, pointer: bytes, message: str
) -> None:
    root = copy_of(original, tmp_path)
    (root / "latest").write_bytes(pointer)
    assert message in refused(root, naming="latest")


def test_the_legacy_npz_loader_refuses_damage_clearly(tmp_path: Path) -> None:
    spec = TrainSpec.from_dict({"backend": "ddp", "batch": {"global": 8}})
    good = tmp_path / "w.npz"
    save_weights(str(good), {"a": np.arange(64, dtype=np.float32)}, step=1, spec=spec)
    content = good.read_bytes()
    bad = tmp_path / "bad.npz"
    corpus = [content[: len(content) * k // 64] for k in range(64)]
    corpus += list(foreign_files().values())
    single_array, object_array = io.BytesIO(), io.BytesIO()
    np.save(single_array, np.zeros(3))
    np.savez(object_array, a=np.array([{"code": 1}], dtype=object))
    corpus += [single_array.getvalue(), object_array.getvalue()]
    for damaged in corpus:
        bad.write_bytes(damaged)
        with pytest.raises(ToolkitError, match=r"bad\.npz"):
            load_weights(str(bad))


def test_the_loader_reads_what_it_wrote(original: Path) -> None:
    state = read_checkpoint(original)
    assert isinstance(state, CheckpointState) and state.step == 3


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
ENTRY = st.fixed_dictionaries(
    {
        "dtype": st.sampled_from(["F32", "I64", "U8", "BOOL", "F16", "BF16", "O", 7]),
        "shape": st.lists(st.integers(-2, 5), max_size=3) | JSON,
        "data_offsets": st.lists(st.integers(-4, 64), min_size=0, max_size=3) | JSON,
    }
)


@settings(max_examples=200, deadline=None)
@given(
    header=st.dictionaries(st.text(max_size=6), ENTRY | JSON, max_size=4),
    data=st.binary(max_size=96),
    length_delta=st.sampled_from([0, 0, 0, -1, 1, 2**40]),
)
def test_the_safetensors_parser_refuses_any_malformed_file(
    header: dict[str, Any], data: bytes, length_delta: int
) -> None:
    encoded = json.dumps(header).encode()
    raw = struct.pack("<Q", max(0, len(encoded) + length_delta)) + encoded + data
    try:
        tensors = parse_tensors(np.frombuffer(raw, np.uint8), Path("fuzz.safetensors"))
    except ToolkitError as error:
        assert "fuzz.safetensors" in str(error)
        return
    # Accepted: then the header length and the tensors account for every byte.
    (header_length,) = struct.unpack_from("<Q", raw)
    assert 8 + header_length + sum(array.nbytes for array in tensors.values()) == len(raw)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=64) | st.builds(lambda d: json.dumps(d).encode(), JSON))
def test_the_manifest_parser_refuses_anything_but_a_manifest(raw: bytes) -> None:
    with pytest.raises(ToolkitError, match=r"manifest\.json"):
        parse_manifest(raw, checksum_line(raw), Path("manifest.json"))


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.data())
def test_a_real_manifest_with_any_field_replaced_parses_or_is_refused(
    original: Path, data: st.DataObject
) -> None:
    manifest = json.loads((original / STEP / "manifest.json").read_bytes())
    target = manifest
    while True:
        key = data.draw(
            st.sampled_from(sorted(target) if isinstance(target, dict) else range(len(target)))
        )
        if not isinstance(target[key], dict | list) or not target[key] or data.draw(st.booleans()):
            break
        target = target[key]
    target[key] = data.draw(JSON)
    raw = json.dumps(manifest).encode()
    try:
        parse_manifest(raw, checksum_line(raw), Path("manifest.json"))
    except ToolkitError as error:
        assert "manifest.json" in str(error)
