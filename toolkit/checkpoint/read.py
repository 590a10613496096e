"""Loading: find the checkpoint, trust nothing until its checksum matches, merge shards by name.

`open_checkpoint` reads and verifies only the manifest; tensors are read per section (or per
set of names) on demand, so a rank that needs part of the optimizer state reads only the
files that hold it. Each file is read once: its size must match the manifest before a byte is
read, its sha256 is computed while reading, and only then is its header parsed (bounded) and
compared with the manifest. Every failure is a ToolkitError naming the file; nothing is ever
unpickled.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from toolkit.checkpoint import layout
from toolkit.checkpoint.fragments import assemble, index_tensors
from toolkit.checkpoint.manifest import (
    MAX_MANIFEST_BYTES,
    SECTIONS,
    FileRecord,
    Manifest,
    parse_manifest,
)
from toolkit.checkpoint.state import CheckpointState
from toolkit.checkpoint.tensorfile import (
    DTYPES,
    TensorEntry,
    parse_tensors,
    read_verified,
    verify_file,
)
from toolkit.errors import ToolkitError

_HINT = "pass a checkpoint directory (DIR, which holds step-N directories, or DIR/step-N)"


def latest(root: str | os.PathLike[str]) -> Path | None:
    """The checkpoint `root/latest` names, or, without a pointer, the highest complete step;
    None when `root` holds no checkpoint. A pointer to a missing directory is an error."""
    root = Path(root)
    name = layout.read_pointer(root)
    if name is not None:
        target = root / name
        if not target.is_dir():
            raise ToolkitError(
                f"{root / layout.LATEST} names {name}, which does not exist in {root}",
                f"write the name of an existing step directory into {root / layout.LATEST}",
            )
        return target
    candidates = [
        path for _, path in sorted(layout.committed(root).items()) if layout.complete(path)
    ]
    return candidates[-1] if candidates else None


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint whose manifest has been verified; tensors are read when asked for."""

    path: Path
    manifest: Manifest

    @property
    def step(self) -> int:
        return self.manifest.step

    def names(self, section: str) -> list[str]:
        return sorted(self.index(section))

    def index(self, section: str) -> dict[str, list[tuple[FileRecord, TensorEntry]]]:
        """Each tensor name of `section` and the (file, entry) pieces it is stored in."""
        return index_tensors(self.manifest.files, _section(section), self.path)

    def tensors(self, section: str, names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
        """The tensors of `section` (all, or only `names`), put together from the files that
        hold them; only those files are read."""
        index = self.index(section)
        wanted = sorted(index) if names is None else list(dict.fromkeys(names))
        missing = [name for name in wanted if name not in index]
        if missing:
            raise ToolkitError(f"{self.path}: no {section} tensor named {', '.join(missing[:5])}")
        files = {record.path: record for name in wanted for record, _ in index[name]}
        arrays = {path: self._read(record) for path, record in sorted(files.items())}
        return {
            name: assemble(
                [(entry, arrays[record.path][entry.name]) for record, entry in index[name]]
            )
            for name in wanted
        }

    def _read(self, record: FileRecord) -> dict[str, np.ndarray]:
        """One file's tensors, after its checksum and header have matched the manifest."""
        where = self.path / record.path
        buffer = read_verified(where, size=record.bytes, sha256=record.sha256)
        arrays = parse_tensors(buffer, where)
        listed = {entry.name: entry for entry in record.tensors}
        if set(arrays) != set(listed):
            raise ToolkitError(f"{where}: its tensors differ from those its manifest lists")
        for name, array in arrays.items():
            entry = listed[name]
            if array.shape != entry.shape or array.dtype != DTYPES[entry.dtype]:
                raise ToolkitError(f"{where}: tensor {name!r} differs from its manifest entry")
        return arrays

    def verify(self) -> None:
        """Check every file's size and checksum against the manifest, keeping nothing: a
        ToolkitError naming the first file that differs."""
        for record in self.manifest.files:
            verify_file(self.path / record.path, size=record.bytes, sha256=record.sha256)

    def state(self) -> CheckpointState:
        """Everything, as one `CheckpointState`."""
        return CheckpointState(
            step=self.manifest.step,
            model=self.tensors("model"),
            optimizer=self.tensors("optimizer"),
            scalars=self.manifest.scalars,
            arrays=self.tensors("arrays"),
            extras=self.manifest.extras,
        )


@dataclass(frozen=True)
class Newest:
    """The newest checkpoint of a directory that verifies whole, and the newer ones passed
    over because they did not, each with why."""

    checkpoint: Checkpoint | None
    passed_over: tuple[tuple[str, str], ...] = ()
    """(step directory name, the first thing that failed in it), newest first."""


def newest_verified(root: str | os.PathLike[str]) -> Newest:
    """The checkpoint `root/latest` names if every file of it verifies, else the newest older
    committed one that does (a save killed or a disk that lost a file must not stop every
    later resume); without a pointer, the newest committed one that verifies. When checkpoints
    exist and none verifies, a ToolkitError listing each."""
    root = Path(root)
    name = layout.read_pointer(root)
    steps = layout.committed(root)
    candidates = sorted(steps.items(), reverse=True)
    passed: list[tuple[str, str]] = []
    if name is not None:
        pointed = layout.parse_step(name)
        assert pointed is not None  # read_pointer refuses anything else
        if pointed not in steps:
            passed.append((name, f"{root / layout.LATEST} names it, but it does not exist"))
        candidates = [(step, path) for step, path in candidates if step <= pointed]
    for _, path in candidates:
        try:
            found = open_checkpoint(path)
            found.verify()
        except ToolkitError as error:
            passed.append((path.name, error.message))
            continue
        return Newest(found, tuple(passed))
    if passed:
        listed = "; ".join(f"{step}: {why}" for step, why in passed)
        raise ToolkitError(
            f"{root}: no checkpoint there verifies ({listed})",
            "move the damaged step directories away, or set checkpoint.resume: never",
        )
    return Newest(None)


def refuse_used_target(target: str | os.PathLike[str]) -> None:
    """An import writes into a new or empty checkpoint directory: one that already holds
    checkpoints would mix them with another run's."""
    existing = latest(target)
    if existing is not None:
        raise ToolkitError(
            f"--to {target}: already holds checkpoints (latest {existing.name}); an import "
            "would mix them with another run's",
            "import into a new or empty directory",
        )


def open_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """`path` is a step directory, or a directory of them (then `latest` is opened)."""
    directory = _resolve(Path(path))
    manifest_path = directory / layout.MANIFEST
    raw = _read_small(manifest_path, MAX_MANIFEST_BYTES)
    raw_sum = _read_small(directory / layout.MANIFEST_SUM, 256)
    return Checkpoint(directory, parse_manifest(raw, raw_sum, manifest_path))


def read_checkpoint(path: str | os.PathLike[str]) -> CheckpointState:
    """The whole state of the checkpoint at `path` (see `open_checkpoint`)."""
    return open_checkpoint(path).state()


def _resolve(path: Path) -> Path:
    if (path / layout.MANIFEST).is_file() or layout.parse_step(path.name) is not None:
        return path
    if path.is_dir():
        found = latest(path)
        if found is None:
            raise ToolkitError(f"{path}: holds no checkpoint", _HINT)
        return found
    if path.exists():
        raise ToolkitError(f"{path}: is a file, not a checkpoint directory", _HINT)
    raise ToolkitError(f"{path}: does not exist", _HINT)


def _read_small(path: Path, limit: int) -> bytes:
    try:
        with open(path, "rb") as stream:
            data = stream.read(limit + 1)
    except FileNotFoundError:
        raise ToolkitError(f"{path}: missing (the checkpoint is incomplete)", _HINT) from None
    except OSError as error:
        raise ToolkitError(f"{path}: cannot be read ({error.strerror or error})") from None
    if len(data) > limit:
        raise ToolkitError(f"{path}: larger than {limit} bytes, so not a toolkit manifest")
    return data


def _section(section: str) -> str:
    if section not in SECTIONS:
        raise ToolkitError(f"section {section!r} is not one of {', '.join(SECTIONS)}")
    return section
