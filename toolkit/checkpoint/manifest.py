"""The manifest: a checkpoint's table of contents, and the only file trusted to describe the rest.

`manifest.json` says who wrote the checkpoint (engine, world size, spec), at which step, the
JSON-able state (optimizer scalars, extras) and, for every tensor file, its section, size,
sha256 and every tensor's name, dtype and shape. `manifest.json.sha256` holds the manifest's
own sha256 in `sha256sum` format (so `sha256sum -c manifest.json.sha256` checks it by hand),
which makes any change to any byte of a checkpoint detectable.

Tensor names are values in lists, never keys next to metadata, so no name can collide with
a field. Parsing validates every field and type: a hostile or damaged manifest is one
ToolkitError naming the file, never a KeyError or TypeError.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from toolkit import __version__
from toolkit.checkpoint.fragments import index_tensors
from toolkit.checkpoint.tensorfile import DTYPES, TensorEntry
from toolkit.errors import ToolkitError

FORMAT = "toolkit-checkpoint"
FORMAT_VERSION = 1
SECTIONS = ("model", "optimizer", "arrays")
"""model: full weights by state_dict name. optimizer: "<slot>/<param>" tensors, independent
of partitioning. arrays: anything else that is an array (RNG states, per rank if needed)."""
MAX_MANIFEST_BYTES = 64 * 1024 * 1024
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\.safetensors")
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, kw_only=True)
class Origin:
    """Who wrote a checkpoint: recorded for `inspect` and for resuming across engines."""

    backend: str | None = None
    framework: str | None = None
    world_size: int = 1
    """Ranks of the run that saved (not the number of ranks that wrote files)."""
    spec: dict[str, Any] | None = None
    """The run's spec as `TrainSpec.to_dict()` returns it."""


@dataclass(frozen=True, kw_only=True)
class FileRecord:
    path: str
    """A file name inside the checkpoint directory."""
    section: str
    bytes: int
    sha256: str
    tensors: tuple[TensorEntry, ...]
    rank: int | None = None
    """The rank that wrote this file, when the section is sharded across ranks."""
    ranks: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "section": self.section,
            "rank": self.rank,
            "ranks": self.ranks,
            "bytes": self.bytes,
            "sha256": self.sha256,
            "tensors": [entry.to_json() for entry in self.tensors],
        }


@dataclass(frozen=True, kw_only=True)
class Manifest:
    step: int
    origin: Origin
    files: tuple[FileRecord, ...]
    scalars: dict[str, Any] = field(default_factory=dict)
    extras: dict[str, Any] = field(default_factory=dict)
    created: str = ""
    toolkit_version: str = __version__
    format_version: int = FORMAT_VERSION

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "format_version": self.format_version,
            "toolkit_version": self.toolkit_version,
            "created": self.created,
            "step": self.step,
            "backend": self.origin.backend,
            "framework": self.origin.framework,
            "world_size": self.origin.world_size,
            "spec": self.origin.spec,
            "scalars": self.scalars,
            "extras": self.extras,
            "files": [record.to_json() for record in self.files],
        }

    def encode(self) -> bytes:
        """Indented JSON with one line per tensor, so that a person can read it."""
        data = self.to_json()
        files = data.pop("files")
        head = json.dumps(data, indent=1, allow_nan=False)
        records = []
        for record in files:
            tensors = record.pop("tensors")
            fields = json.dumps(record, indent=1)[1:-2].replace("\n", "\n  ")
            lines = ",\n".join(f"    {json.dumps(entry)}" for entry in tensors)
            records.append(f'  {{{fields},\n   "tensors": [\n{lines}\n   ]\n  }}')
        joined = ",\n".join(records)
        return f'{head[:-2]},\n "files": [\n{joined}\n ]\n}}\n'.encode()


def checksum_line(manifest_bytes: bytes) -> bytes:
    return f"{hashlib.sha256(manifest_bytes).hexdigest()}  manifest.json\n".encode()


def parse_manifest(raw: bytes, raw_sum: bytes, where: Path) -> Manifest:
    """The manifest in `raw` (from `where`), checked against `raw_sum` and validated."""
    if raw_sum != checksum_line(raw):
        raise ToolkitError(
            f"{where}: checksum mismatch with {where.name}.sha256 (damaged or edited by hand)",
            "load an older checkpoint; after a deliberate edit run "
            "`sha256sum manifest.json > manifest.json.sha256`",
        )
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise ToolkitError(f"{where}: is not a JSON manifest ({json_failure(error)})") from None
    check = _Checker(where)
    check.that(isinstance(data, dict) and data.get("format") == FORMAT, "not a toolkit manifest")
    version = data.get("format_version")
    check.that(type(version) is int and version >= 1, "format_version must be a positive integer")
    if version > FORMAT_VERSION:
        raise ToolkitError(
            f"{where}: written in checkpoint format {version} by toolkit "
            f"{data.get('toolkit_version')!s:.40}; this toolkit ({__version__}) reads up to "
            f"format {FORMAT_VERSION}",
            "upgrade toolkit to load it",
        )
    origin = Origin(
        backend=check.optional_str(data, "backend"),
        framework=check.optional_str(data, "framework"),
        world_size=check.integer(data, "world_size", minimum=1),
        spec=check.optional_dict(data, "spec"),
    )
    records = tuple(parse_records(data.get("files"), where))
    paths = [record.path for record in records]
    check.that(len(set(paths)) == len(paths), "a file is listed twice")
    for section in SECTIONS:
        index_tensors(records, section, where)
    created, toolkit_version = data.get("created"), data.get("toolkit_version")
    check.that(isinstance(created, str) and isinstance(toolkit_version, str), "bad created")
    return Manifest(
        step=check.integer(data, "step", minimum=0),
        origin=origin,
        files=records,
        scalars=check.optional_dict(data, "scalars") or {},
        extras=check.optional_dict(data, "extras") or {},
        created=created,
        toolkit_version=toolkit_version,
        format_version=version,
    )


def parse_records(data: Any, where: Path) -> list[FileRecord]:
    """File records as `FileRecord.to_json` wrote them (a list), validated."""
    check = _Checker(where)
    check.that(isinstance(data, list), "files must be a list")
    return [_record(check, item) for item in data]


def _record(check: _Checker, item: Any) -> FileRecord:
    check.that(isinstance(item, dict), "each files entry must be an object")
    path = item.get("path")
    check.that(isinstance(path, str) and bool(_FILE_NAME.fullmatch(path)), f"bad path {path!r}")
    section = item.get("section")
    check.that(section in SECTIONS, f"{path}: section must be one of {', '.join(SECTIONS)}")
    sha = item.get("sha256")
    check.that(isinstance(sha, str) and bool(_SHA256.fullmatch(sha)), f"{path}: bad sha256")
    tensors = item.get("tensors")
    check.that(isinstance(tensors, list), f"{path}: tensors must be a list")
    entries = tuple(_tensor(check, path, entry) for entry in tensors)
    check.that(len({e.name for e in entries}) == len(entries), f"{path}: a tensor is listed twice")
    rank, ranks = item.get("rank"), item.get("ranks")
    sharded = type(rank) is int and type(ranks) is int and 0 <= rank < ranks
    check.that(sharded or (rank is None and ranks is None), f"{path}: bad rank/ranks")
    return FileRecord(
        path=path,
        section=section,
        bytes=check.integer(item, "bytes", minimum=8, within=path),
        sha256=sha,
        tensors=entries,
        rank=rank,
        ranks=ranks,
    )


def _tensor(check: _Checker, path: str, entry: Any) -> TensorEntry:
    check.that(isinstance(entry, dict), f"{path}: each tensor must be an object")
    name, dtype, shape = entry.get("name"), entry.get("dtype"), entry.get("shape")
    check.that(isinstance(name, str), f"{path}: a tensor name is not a string")
    check.that(
        isinstance(dtype, str) and dtype in DTYPES,
        f"{path}: tensor {name!r} has unknown dtype {dtype!r}",
    )
    check.that(
        isinstance(shape, list) and all(type(n) is int and n >= 0 for n in shape),
        f"{path}: tensor {name!r} has a bad shape",
    )
    part = entry.get("part")
    if part is None:
        return TensorEntry(name, dtype, tuple(shape))
    check.that(isinstance(part, dict), f"{path}: tensor {name!r} has a bad part")
    whole = part.get("of")
    check.that(
        isinstance(whole, list) and all(type(n) is int and n >= 0 for n in whole),
        f"{path}: tensor {name!r} has a bad part (whole shape)",
    )
    if "start" in part:
        start = part.get("start")
        check.that(
            isinstance(start, list)
            and len(start) == len(whole) == len(shape)
            and all(type(n) is int and n >= 0 for n in start),
            f"{path}: tensor {name!r} has a bad block (start, shape and whole shape)",
        )
        return TensorEntry(name, dtype, tuple(shape), part_of=tuple(whole), start=tuple(start))
    offset = part.get("offset")
    check.that(
        type(offset) is int and offset >= 0,
        f"{path}: tensor {name!r} has a bad part (offset and whole shape)",
    )
    return TensorEntry(name, dtype, tuple(shape), offset=offset, part_of=tuple(whole))


class _Checker:
    """Raises one ToolkitError naming the manifest for the first thing that is wrong."""

    def __init__(self, where: Path) -> None:
        self.where = where

    def that(self, condition: bool, what: str) -> None:
        if not condition:
            self.fail(what)

    def fail(self, what: str) -> NoReturn:
        raise ToolkitError(
            f"{self.where}: invalid manifest ({what})",
            "the checkpoint is damaged or not a toolkit checkpoint",
        )

    def integer(
        self, data: dict[str, Any], key: str, *, minimum: int, within: str | None = None
    ) -> int:
        value = data.get(key)
        what = f"{within}: {key}" if within else key
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            self.fail(f"{what} must be an integer >= {minimum}")
        return value

    def optional_str(self, data: dict[str, Any], key: str) -> str | None:
        value = data.get(key)
        self.that(value is None or isinstance(value, str), f"{key} must be a string or null")
        return value

    def optional_dict(self, data: dict[str, Any], key: str) -> dict[str, Any] | None:
        value = data.get(key)
        self.that(value is None or isinstance(value, dict), f"{key} must be an object or null")
        return value


def json_failure(error: Exception) -> str:
    """A short reason why bytes did not decode as JSON."""
    if isinstance(error, UnicodeDecodeError):
        return "not UTF-8 text"
    if isinstance(error, RecursionError):
        return "nested too deeply"
    return str(error)[:100]
