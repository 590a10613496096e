"""Safetensors files through the `safetensors` library: numpy arrays, no code, no pickle.

The toolkit adds what a checkpoint needs around the library's format: every file's size and
sha256 for the manifest, computed as it is written and checked before it is parsed
(`read_verified`; `verify_file` checks without keeping), the one dtype table the manifest
validates against, and names as data: the one key the format reserves (`__metadata__`) cannot
name a tensor in a file, so `escape_name` maps it (and anything that looks escaped) to a
distinct key and `unescape_name` maps it back.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import safetensors
import safetensors.numpy

from toolkit.errors import ToolkitError

METADATA_KEY = "__metadata__"
ESCAPE_PREFIX = "toolkit.escaped:"

DTYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "U8": np.dtype("u1"),
    "I8": np.dtype("i1"),
    "U16": np.dtype("<u2"),
    "I16": np.dtype("<i2"),
    "F16": np.dtype("<f2"),
    "U32": np.dtype("<u4"),
    "I32": np.dtype("<i4"),
    "F32": np.dtype("<f4"),
    "U64": np.dtype("<u8"),
    "I64": np.dtype("<i8"),
    "F64": np.dtype("<f8"),
}
_CODES = {(dtype.kind, dtype.itemsize): code for code, dtype in DTYPES.items()}
_READ_CHUNK = 8 * 1024 * 1024


@dataclass(frozen=True)
class TensorEntry:
    """What the manifest records for one tensor of a file."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int | None = None
    """For a fragment: where its elements start in the flattened whole tensor."""
    part_of: tuple[int, ...] | None = None
    """For a part: the whole tensor's shape (a fragment's own shape is 1-D)."""
    start: tuple[int, ...] | None = None
    """For a block: where it starts in each dimension of the whole."""

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}
        if self.start is not None and self.part_of is not None:
            data["part"] = {"start": list(self.start), "of": list(self.part_of)}
        elif self.part_of is not None:
            data["part"] = {"offset": self.offset, "of": list(self.part_of)}
        return data


@dataclass(frozen=True)
class WrittenFile:
    """One file as written: what the manifest needs to verify it later."""

    bytes: int
    sha256: str
    tensors: tuple[TensorEntry, ...]


def escape_name(name: str) -> str:
    if name == METADATA_KEY or name.startswith(ESCAPE_PREFIX):
        return ESCAPE_PREFIX + name
    return name


def unescape_name(key: str) -> str:
    return key[len(ESCAPE_PREFIX) :] if key.startswith(ESCAPE_PREFIX) else key


def dtype_code(dtype: np.dtype[Any]) -> str | None:
    """The safetensors code of a numpy dtype, or None if the format cannot hold it."""
    if dtype.kind not in "biuf" or dtype.fields is not None:
        return None
    return _CODES.get((dtype.kind, dtype.itemsize))


def as_storable(name: str, value: Any) -> np.ndarray:
    """`value` as a C-contiguous little-endian array of a dtype safetensors holds."""
    array = np.asarray(value)
    code = dtype_code(array.dtype)
    if code is None:
        raise ToolkitError(
            f"tensor {name!r} has dtype {array.dtype}, which a checkpoint cannot hold",
            "pass numeric numpy arrays (bool, int 8-64, uint 8-64, float 16/32/64)",
        )
    return np.asarray(array, dtype=DTYPES[code], order="C")  # keeps 0-d arrays 0-d


def write_tensors(
    stream: BinaryIO, tensors: Mapping[str, Any], metadata: Mapping[str, str] | None = None
) -> WrittenFile:
    """Write `tensors` to the open binary `stream`; returns its size, sha256 and contents.
    The caller flushes and fsyncs."""
    arrays = {name: as_storable(name, value) for name, value in tensors.items()}
    encoded = safetensors.numpy.save(
        {escape_name(name): array for name, array in arrays.items()},
        metadata=dict(metadata) if metadata else None,
    )
    stream.write(encoded)
    entries = tuple(
        TensorEntry(name, str(dtype_code(arrays[name].dtype)), arrays[name].shape)
        for name in sorted(arrays)
    )
    return WrittenFile(
        bytes=len(encoded), sha256=hashlib.sha256(encoded).hexdigest(), tensors=entries
    )


def read_verified(path: Path, *, size: int, sha256: str) -> np.ndarray:
    """The whole file, refused unless it has exactly `size` bytes whose sha256 is `sha256`."""
    buffer = np.empty(size, dtype=np.uint8)  # unlike bytearray(size), not zeroed first
    _read_checked(path, size, sha256, buffer, keep=True)
    return buffer


def verify_file(path: Path, *, size: int, sha256: str) -> None:
    """Refuse the file unless it has exactly `size` bytes whose sha256 is `sha256`; it is read
    in chunks and nothing is kept (a resume checks a whole checkpoint this way)."""
    _read_checked(path, size, sha256, np.empty(min(size, _READ_CHUNK), dtype=np.uint8), keep=False)


def _read_checked(path: Path, size: int, sha256: str, buffer: np.ndarray, *, keep: bool) -> None:
    """Read `path` into `buffer` (whole when `keep`, else chunk after chunk into its start),
    hashing as it goes, and refuse a size or checksum that differs from the manifest's."""
    try:
        with open(path, "rb") as stream:
            actual = _file_size(stream)
            if actual != size:
                raise ToolkitError(
                    f"{path}: has {actual} bytes, its manifest says {size} (truncated or replaced)",
                    "the checkpoint is damaged: load an older one",
                )
            view = buffer.data
            digest = hashlib.sha256()
            done = 0
            while done < size:
                start = done if keep else 0
                count = stream.readinto(view[start : start + min(_READ_CHUNK, size - done)])
                if not count:
                    raise ToolkitError(f"{path}: ended after {done} of {size} bytes")
                digest.update(view[start : start + count])
                done += count
    except OSError as error:
        raise ToolkitError(f"{path}: cannot be read ({error.strerror or error})") from None
    if digest.hexdigest() != sha256:
        raise ToolkitError(
            f"{path}: checksum mismatch (sha256 {digest.hexdigest()}, manifest says {sha256})",
            "the file is corrupted: load an older checkpoint",
        )


def _file_size(stream: BinaryIO) -> int:
    stream.seek(0, 2)
    size = stream.tell()
    stream.seek(0)
    return size


def parse_tensors(buffer: np.ndarray, where: Path) -> dict[str, np.ndarray]:
    """The tensors (by unescaped name) of a safetensors file held in `buffer` (a 1-D uint8
    array), as validated by the library; anything malformed is a ToolkitError naming `where`."""
    try:
        tensors = safetensors.numpy.load(buffer.tobytes())
    except (safetensors.SafetensorError, ValueError, TypeError, KeyError, OverflowError) as error:
        reason = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
        raise ToolkitError(f"{where}: not a valid safetensors file ({reason})") from None
    return {unescape_name(key): array for key, array in tensors.items()}
