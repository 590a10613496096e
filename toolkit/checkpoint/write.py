"""Saving: every rank writes what it holds into a staging directory, rank 0 commits it.

    pending = begin_save(root, step, rank=r, ranks=n)     # every rank
    if r == 0:
        pending.write("model", full_weights, whole=True)  # -> model.safetensors
    pending.write("optimizer", state_this_rank_owns)      # -> optimizer-rank{r}-of-{n}.safetensors
    pending.finish()
    barrier()                                             # the caller's
    if r == 0:
        commit_save(root, step, ranks=n, origin=..., scalars=..., extras=..., keep=k)
    barrier()                                             # before anyone saves again

The commit is what makes a save atomic: the staging directory `.incomplete-step-N` becomes
`step-N` by one rename, only after every file in it and the manifest are on disk (fsync),
and `latest` moves to it only after that rename is on disk. A process killed at any moment
leaves `latest` on a complete checkpoint (or, while a step is being saved a second time,
no pointer: `latest()` then takes the newest complete directory), and the next commit
removes whatever the killed save left behind.

Ranks must share the filesystem that holds `root` (rank 0 checks that every rank's files
are there before committing). Instead of the first barrier, rank 0 may also wait for the
parts themselves (`wait_for_parts`): a background save (toolkit.checkpoint.background) does,
and a rank that cannot write its part says so with `fail()`.
"""

from __future__ import annotations

import json
import operator
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.checkpoint import layout
from toolkit.checkpoint.fragments import Part, index_tensors
from toolkit.checkpoint.manifest import (
    SECTIONS,
    FileRecord,
    Manifest,
    Origin,
    checksum_line,
    parse_records,
)
from toolkit.checkpoint.state import CheckpointState
from toolkit.checkpoint.tensorfile import write_tensors
from toolkit.errors import ToolkitError


class PendingSave:
    """One rank's part of a save in progress; see the module docstring for the protocol."""

    def __init__(self, root: str | os.PathLike[str], step: int, *, rank: int, ranks: int) -> None:
        step = _as_int("step", step, minimum=0)
        ranks = _as_int("ranks", ranks, minimum=1)
        rank = _as_int("rank", rank, minimum=0)
        if rank >= ranks:
            raise ToolkitError(f"rank {rank} is outside 0..{ranks - 1}")
        self.root = Path(root)
        self.step, self.rank, self.ranks = step, rank, ranks
        self.staging = layout.staging_dir(self.root, step)
        self.records: list[FileRecord] = []
        try:
            self.staging.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise ToolkitError(
                f"cannot create {self.staging} ({error.strerror or error})",
                "check checkpoint.dir: it must be a writable directory",
            ) from None
        self._sidecar.unlink(missing_ok=True)

    @property
    def _sidecar(self) -> Path:
        return _sidecar(self.staging, self.rank, self.ranks)

    def write(self, section: str, tensors: Mapping[str, Any], *, whole: bool = False) -> None:
        """Write the tensors of `section` ("model", "optimizer" or "arrays") this rank holds:
        arrays, or `Fragment`s and `Block`s of tensors partitioned across ranks. `whole=True`
        means they are the entire section (one file, named the same for every world size). An
        empty mapping writes nothing."""
        if section not in SECTIONS:
            raise ToolkitError(f"section {section!r} is not one of {', '.join(SECTIONS)}")
        if not tensors:
            return
        sharded = not whole and self.ranks > 1
        name = f"{section}-rank{self.rank}-of-{self.ranks}" if sharded else section
        path = self.staging / f"{name}.safetensors"
        if any(record.path == path.name for record in self.records):
            raise ToolkitError(f"{path.name} was already written in this save")
        parts = {name: value for name, value in tensors.items() if isinstance(value, Part)}
        stored = {n: parts[n].stored(n) if n in parts else v for n, v in tensors.items()}
        with _writing(path), open(path, "wb") as stream:
            written = write_tensors(stream, stored)
            stream.flush()
            os.fsync(stream.fileno())
        entries = tuple(
            parts[entry.name].placed(entry) if entry.name in parts else entry
            for entry in written.tensors
        )
        self.records.append(
            FileRecord(
                path=path.name,
                section=section,
                bytes=written.bytes,
                sha256=written.sha256,
                tensors=entries,
                rank=self.rank if sharded else None,
                ranks=self.ranks if sharded else None,
            )
        )

    def finish(self) -> None:
        """Mark this rank's part complete (after this, the caller's barrier, then commit). The
        sidecar appears whole or not at all: rank 0 may be polling for it."""
        written = self._sidecar.with_name(self._sidecar.name + ".tmp")
        with _writing(self._sidecar):
            _write_synced(written, json.dumps([r.to_json() for r in self.records]).encode())
            os.rename(written, self._sidecar)
            layout.fsync_dir(self.staging)

    def fail(self, why: str) -> None:
        """Tell rank 0, waiting in `wait_for_parts`, that this rank's part will not come. On a
        full disk even this may not be written; rank 0 then waits out its bound."""
        with suppress(OSError):
            _write_synced(_failure_note(self.staging, self.rank, self.ranks), why.encode())


def wait_for_parts(
    root: str | os.PathLike[str], step: int, *, ranks: int, bound_s: float, poll_s: float = 0.05
) -> None:
    """Rank 0, in place of a barrier: return once every rank has finished its part of `step`;
    a ToolkitError when one failed (`PendingSave.fail`) or `bound_s` passes first."""
    staging = layout.staging_dir(Path(root), step)
    deadline = time.monotonic() + bound_s
    waiting = set(range(ranks))
    while True:
        for rank in sorted(waiting):
            note = _failure_note(staging, rank, ranks)
            if note.exists():
                why = note.read_text(errors="replace").strip() or "no reason given"
                raise ToolkitError(f"rank {rank} could not write its part of step {step}: {why}")
            if _sidecar(staging, rank, ranks).exists():
                waiting.discard(rank)
        if not waiting:
            return
        if time.monotonic() > deadline:
            listed = ", ".join(str(rank) for rank in sorted(waiting))
            raise ToolkitError(
                f"rank(s) {listed} did not finish their part of step {step} within "
                f"{bound_s:g} s (timeouts.collective_s)",
                f"check that every rank sees {root} (a filesystem all share) and has space",
            )
        time.sleep(poll_s)


def _sidecar(staging: Path, rank: int, ranks: int) -> Path:
    return staging / f"rank{rank}-of-{ranks}.json"


def _failure_note(staging: Path, rank: int, ranks: int) -> Path:
    return staging / f"rank{rank}-of-{ranks}.failed"


def begin_save(root: str | os.PathLike[str], step: int, *, rank: int, ranks: int) -> PendingSave:
    return PendingSave(root, step, rank=rank, ranks=ranks)


def commit_save(
    root: str | os.PathLike[str],
    step: int,
    *,
    ranks: int,
    origin: Origin | None = None,
    scalars: Mapping[str, Any] | None = None,
    extras: Mapping[str, Any] | None = None,
    keep: int = 0,
) -> Path:
    """Rank 0, after every rank's `finish()`: write the manifest, publish `step-N` and point
    `latest` at it, remove leftovers, keep the newest `keep` (0 = all). Returns `step-N`."""
    keep = _as_int("keep", keep, minimum=0)
    step = _as_int("step", step, minimum=0)
    ranks = _as_int("ranks", ranks, minimum=1)
    root = Path(root)
    staging = layout.staging_dir(root, step)
    if not staging.is_dir():
        raise ToolkitError(
            f"no save of step {step} in progress in {root}",
            "every rank calls begin_save(...) and finish() before rank 0 commits",
        )
    records = _gather_records(staging, step, ranks)
    manifest = Manifest(
        step=step,
        origin=origin or Origin(),
        files=tuple(sorted(records, key=lambda record: record.path)),
        scalars=_json_copy(scalars or {}, "scalars"),
        extras=_json_copy(extras or {}, "extras"),
        created=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    with _writing(root):
        for entry in staging.iterdir():
            if entry.name not in {record.path for record in records}:
                entry.unlink()  # other ranks' sidecars, files of an earlier attempt at this step
        raw = manifest.encode()
        for name, data in ((layout.MANIFEST, raw), (layout.MANIFEST_SUM, checksum_line(raw))):
            _write_synced(staging / name, data)
        layout.fsync_dir(staging)
        target = _publish(root, staging, step)
        layout.remove_leftovers(root)
        _rotate(root, keep, target)
    return target


def _publish(root: Path, staging: Path, step: int) -> Path:
    """Rename the complete staging directory to step-N, then point `latest` at it."""
    target = root / layout.step_name(step)
    if target.exists():  # saved again: no pointer to it while it is being replaced
        if _pointer_or_none(root) == target.name:
            layout.remove_pointer(root)
        layout.discard(target)
    os.rename(staging, target)
    layout.fsync_dir(root)
    layout.write_pointer(root, target.name)
    return target


def write_checkpoint(
    root: str | os.PathLike[str],
    state: CheckpointState,
    *,
    origin: Origin | None = None,
    keep: int = 0,
) -> Path:
    """Save `state` from one process (which holds all of it) as `root/step-N`; returns it."""
    pending = begin_save(root, state.step, rank=0, ranks=1)
    pending.write("model", state.model)
    pending.write("optimizer", state.optimizer)
    pending.write("arrays", state.arrays)
    pending.finish()
    return commit_save(
        root,
        state.step,
        ranks=1,
        origin=origin,
        scalars=state.scalars,
        extras=state.extras,
        keep=keep,
    )


def _gather_records(staging: Path, step: int, ranks: int) -> list[FileRecord]:
    records: list[FileRecord] = []
    for rank in range(ranks):
        sidecar = _sidecar(staging, rank, ranks)
        try:
            records += parse_records(json.loads(sidecar.read_bytes()), sidecar)
        except (OSError, ValueError):
            raise ToolkitError(
                f"rank {rank} of {ranks} has not finished its part of step {step} in {staging}",
                "commit after every rank's finish() and a barrier, on a filesystem all share",
            ) from None
    paths = [record.path for record in records]
    duplicates = sorted({path for path in paths if paths.count(path) > 1})
    if duplicates:
        raise ToolkitError(f"{', '.join(duplicates)} written by more than one rank in {staging}")
    for section in SECTIONS:
        index_tensors(records, section, staging)
    for record in records:
        size = (staging / record.path).stat().st_size
        if size != record.bytes:
            raise ToolkitError(f"{staging / record.path}: {size} bytes, written {record.bytes}")
    return records


def _rotate(root: Path, keep: int, newest: Path) -> None:
    """Delete all but the `keep` highest steps, never the one just written (`latest`)."""
    if keep == 0:
        return
    steps = sorted(layout.committed(root).items())
    for _, path in steps[:-keep]:
        if path != newest:
            layout.discard(path)


def _pointer_or_none(root: Path) -> str | None:
    try:
        return layout.read_pointer(root)
    except ToolkitError:
        return None  # a damaged pointer is about to be replaced


def _json_copy(value: Mapping[str, Any], what: str) -> dict[str, Any]:
    """`value` as it will read back from JSON; a clear error if it cannot be stored."""

    def numpy_scalar(item: Any) -> Any:
        if isinstance(item, np.generic):
            return item.item()
        raise TypeError(f"{type(item).__name__} is not JSON-able")

    try:
        copy: dict[str, Any] = json.loads(
            json.dumps(dict(value), allow_nan=False, default=numpy_scalar)
        )
    except (TypeError, ValueError) as error:
        raise ToolkitError(
            f"checkpoint {what} cannot be stored as JSON ({error})",
            "keep them to str, int, finite float, bool, None, lists and dicts; "
            "put arrays into CheckpointState.arrays",
        ) from None
    return copy


@contextmanager
def _writing(where: Path) -> Iterator[None]:
    """A failed write (disk full, permissions) as one ToolkitError naming the file."""
    try:
        yield
    except OSError as error:
        raise ToolkitError(
            f"cannot write checkpoint file {error.filename or where}: {error.strerror or error}",
            "check free space and permissions where checkpoint.dir points",
        ) from None


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as stream:
        stream.write(data)
        stream.flush()
        os.fsync(stream.fileno())


def _as_int(name: str, value: Any, *, minimum: int) -> int:
    """`value` as an int (numpy integers welcome), refusing bools and floats."""
    try:
        number = operator.index(value)
    except TypeError:
        number = None
    if number is None or isinstance(value, bool) or number < minimum:
        raise ToolkitError(f"{name}={value!r} must be an integer >= {minimum}")
    return number
