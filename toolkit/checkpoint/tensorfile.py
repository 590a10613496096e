"""Safetensors files, written and read by the toolkit itself: numpy arrays, no code, no pickle.

The format (https://huggingface.co/docs/safetensors): an 8-byte little-endian header length N,
N bytes of JSON `{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
{str: str}}` padded with spaces, then the tensors' bytes back to back. The `safetensors`
package reads what this module writes and the other way round (the tests check both ways).

It is implemented here rather than called from the package so that one pass over the bytes
does everything: writing streams each array to the file while hashing it (no second copy of
a multi-GB state in memory, no re-read to checksum), and reading hashes the bytes as they
arrive, then validates the header strictly before any array is made: size bounds first (a
header length beyond the file or beyond MAX_HEADER_BYTES is refused before it is read),
then every offset, dtype and shape, the way the reference implementation checks them.

Names are data: the one key the format reserves (`__metadata__`) cannot name a tensor in a
file, so `escape_name` maps it (and anything that looks escaped) to a distinct key and
`unescape_name` maps it back; every other name is stored as it is.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from toolkit.errors import ToolkitError

MAX_HEADER_BYTES = 100 * 1024 * 1024
"""The reference implementation's limit; a larger header length means a corrupt file."""

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
    """For a fragment: the whole tensor's shape (this entry's shape is then 1-D)."""

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}
        if self.part_of is not None:
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

    Tensors are laid out widest dtype first, then by name (as the reference does), so each
    one starts at a multiple of its item size. The caller flushes and fsyncs.
    """
    arrays = {name: as_storable(name, value) for name, value in tensors.items()}
    order = sorted(arrays, key=lambda name: (-arrays[name].dtype.itemsize, name))
    header: dict[str, Any] = {}
    if metadata:
        header[METADATA_KEY] = dict(metadata)
    offset = 0
    for name in order:
        array = arrays[name]
        code = dtype_code(array.dtype)
        header[escape_name(name)] = {
            "dtype": code,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        offset += array.nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    digest = hashlib.sha256()
    for piece in (struct.pack("<Q", len(encoded)), encoded):
        stream.write(piece)
        digest.update(piece)
    for name in order:
        raw = arrays[name].reshape(-1).view(np.uint8)
        stream.write(raw.data)
        digest.update(raw.data)
    entries = tuple(
        TensorEntry(name, str(dtype_code(arrays[name].dtype)), arrays[name].shape)
        for name in sorted(arrays)
    )
    return WrittenFile(bytes=8 + len(encoded) + offset, sha256=digest.hexdigest(), tensors=entries)


def read_verified(path: Path, *, size: int, sha256: str) -> np.ndarray:
    """The whole file, refused unless it has exactly `size` bytes whose sha256 is `sha256`."""
    try:
        with open(path, "rb") as stream:
            actual = _file_size(stream)
            if actual != size:
                raise ToolkitError(
                    f"{path}: has {actual} bytes, its manifest says {size} (truncated or replaced)",
                    "the checkpoint is damaged: load an older one",
                )
            buffer = np.empty(size, dtype=np.uint8)  # unlike bytearray(size), not zeroed first
            view = buffer.data
            digest = hashlib.sha256()
            done = 0
            while done < size:
                count = stream.readinto(view[done : done + _READ_CHUNK])
                if not count:
                    raise ToolkitError(f"{path}: ended after {done} of {size} bytes")
                digest.update(view[done : done + count])
                done += count
    except OSError as error:
        raise ToolkitError(f"{path}: cannot be read ({error.strerror or error})") from None
    if digest.hexdigest() != sha256:
        raise ToolkitError(
            f"{path}: checksum mismatch (sha256 {digest.hexdigest()}, manifest says {sha256})",
            "the file is corrupted: load an older checkpoint",
        )
    return buffer


def _file_size(stream: BinaryIO) -> int:
    stream.seek(0, 2)
    size = stream.tell()
    stream.seek(0)
    return size


def parse_tensors(buffer: np.ndarray, where: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The tensors (by unescaped name) and metadata of a safetensors file held in `buffer`
    (a 1-D uint8 array).

    Arrays are views into `buffer`. Anything malformed is a ToolkitError naming `where`.
    """

    def bad(what: str) -> ToolkitError:
        return ToolkitError(f"{where}: not a valid safetensors file ({what})")

    if len(buffer) < 8:
        raise bad(f"{len(buffer)} bytes, shorter than the 8-byte header length")
    header_length = int.from_bytes(buffer[:8].tobytes(), "little")
    if header_length > min(MAX_HEADER_BYTES, len(buffer) - 8):
        raise bad(f"header length {header_length} exceeds the file's {len(buffer)} bytes")
    try:
        text = buffer[8 : 8 + header_length].tobytes().decode("utf-8")
        header = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise bad(f"header is not JSON: {json_failure(error)}") from None
    if not text.startswith("{") or not isinstance(header, dict):
        raise bad("header is not a JSON object")
    metadata = header.pop(METADATA_KEY, {})
    if not isinstance(metadata, dict) or not all(
        isinstance(value, str) for value in metadata.values()
    ):
        raise bad("__metadata__ must map strings to strings")
    data_start = 8 + header_length
    spans = sorted((*_span(key, value, bad), key) for key, value in header.items())
    entries = {key: _entry(key, value, bad) for key, value in header.items()}
    tensors: dict[str, np.ndarray] = {}
    expected = 0
    for begin, end, key in spans:
        if begin != expected:
            raise bad(f"tensor {key!r} starts at {begin}, expected {expected} (gap or overlap)")
        if data_start + end > len(buffer):
            raise bad(f"tensor {key!r} ends at {data_start + end}, past the file's end")
        expected = end
        dtype, shape = entries[key]
        array = np.frombuffer(buffer, dtype, math.prod(shape), data_start + begin)
        tensors[unescape_name(key)] = array.reshape(shape)
    if data_start + expected != len(buffer):
        raise bad(f"tensor data ends at {data_start + expected}, the file at {len(buffer)}")
    return tensors, metadata


def _span(key: str, value: Any, bad: Callable[[str], ToolkitError]) -> tuple[int, int]:
    offsets = value.get("data_offsets") if isinstance(value, dict) else None
    if not isinstance(offsets, list) or len(offsets) != 2 or not _ints(offsets):
        raise bad(f"tensor {key!r} needs data_offsets: two non-negative integers")
    return offsets[0], offsets[1]


def _entry(
    key: str, value: Any, bad: Callable[[str], ToolkitError]
) -> tuple[np.dtype[Any], tuple[int, ...]]:
    if set(value) != {"dtype", "shape", "data_offsets"}:
        raise bad(f"entry {key!r} must have exactly dtype, shape and data_offsets")
    dtype = DTYPES.get(value["dtype"]) if isinstance(value["dtype"], str) else None
    if dtype is None:
        raise bad(f"tensor {key!r} has dtype {value['dtype']!r}; readable: {', '.join(DTYPES)}")
    shape, offsets = value["shape"], value["data_offsets"]
    if not _ints(shape):
        raise bad(f"tensor {key!r} needs a shape: a list of non-negative integers")
    begin, end = offsets
    if end - begin != math.prod(shape) * dtype.itemsize:
        raise bad(f"tensor {key!r}: data_offsets {offsets} do not fit {value['dtype']} {shape}")
    return dtype, tuple(shape)


def _ints(value: Any) -> bool:
    return isinstance(value, list) and all(
        type(item) is int and 0 <= item < 2**63 for item in value
    )


def json_failure(error: Exception) -> str:
    """A short reason why bytes did not decode as JSON."""
    if isinstance(error, UnicodeDecodeError):
        return "not UTF-8 text"
    if isinstance(error, RecursionError):
        return "nested too deeply"
    return str(error)[:100]


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        raise ValueError("duplicate key")
    return result


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
