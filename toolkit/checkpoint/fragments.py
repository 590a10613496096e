"""Tensors stored in parts: what a rank holds of a partitioned parameter, written as it is.

ZeRO flattens parameters and gives each rank a contiguous slice; a rank saves its slice of
each parameter (and of its optimizer state) as a `Fragment`, with no gathering. Each part is
stored as a 1-D tensor under the parameter's own name, and the manifest records its offset in
the flattened (C-order) whole and the whole's shape. A reader puts the parts back together,
so the partitioning that wrote a checkpoint never matters to the one that reads it.

A name is either one whole tensor or parts that tile the whole exactly (no gap, no overlap,
one dtype); a save or a manifest that breaks this is refused.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np

from toolkit.checkpoint.tensorfile import TensorEntry
from toolkit.errors import ToolkitError


class FileRecord(Protocol):
    """What this module reads of a manifest's file record (`toolkit.checkpoint.manifest`,
    which imports this module, so the record is described here rather than imported)."""

    @property
    def path(self) -> str: ...
    @property
    def section(self) -> str: ...
    @property
    def tensors(self) -> Sequence[TensorEntry]: ...


Record = TypeVar("Record", bound=FileRecord)


@dataclass(frozen=True)
class Fragment:
    """Elements [offset, offset + data.size) of the flattened tensor of shape `shape`."""

    data: Any
    offset: int
    shape: tuple[int, ...]

    def flat(self, name: str) -> np.ndarray:
        """The fragment's elements, 1-D, after checking that they fit the whole."""
        data = np.asarray(self.data).reshape(-1)
        shape = tuple(self.shape)
        fits = (
            all(type(n) is int and n >= 0 for n in shape)
            and type(self.offset) is int
            and 0 <= self.offset <= self.offset + data.size <= math.prod(shape)
        )
        if not fits:
            raise ToolkitError(
                f"fragment of {name!r} (offset {self.offset}, {data.size} elements) does not "
                f"fit a tensor of shape {shape}"
            )
        return data


def index_tensors(
    records: Iterable[Record], section: str, where: Path
) -> dict[str, list[tuple[Record, TensorEntry]]]:
    """Every tensor name of `section` and the (file, entry) pieces that make it up; a
    ToolkitError naming `where` unless each name is one whole tensor or a complete tiling."""
    index: dict[str, list[tuple[Record, TensorEntry]]] = {}
    for record in records:
        if record.section == section:
            for entry in record.tensors:
                index.setdefault(entry.name, []).append((record, entry))
    for name, pieces in index.items():
        problem = _tiling_problem([entry for _, entry in pieces])
        if problem:
            files = ", ".join(sorted({record.path for record, _ in pieces}))
            raise ToolkitError(f"{where}: {section} tensor {name!r} {problem} (in {files})")
    return index


def _tiling_problem(entries: Sequence[TensorEntry]) -> str | None:
    if len(entries) == 1 and entries[0].part_of is None:
        return None
    if any(entry.part_of is None for entry in entries):
        return "is stored more than once"
    whole, dtype = entries[0].part_of, entries[0].dtype
    if any(entry.part_of != whole or entry.dtype != dtype for entry in entries):
        return "has parts that disagree on the whole tensor's shape or dtype"
    expected = 0
    for entry in sorted(entries, key=lambda entry: entry.offset or 0):
        if len(entry.shape) != 1 or entry.offset != expected:
            return f"has a gap or an overlap at element {expected}"
        expected += entry.shape[0]
    if whole is None or expected != math.prod(whole):
        return f"has parts covering {expected} of {math.prod(whole or ())} elements"
    return None


def assemble(pieces: Sequence[tuple[TensorEntry, np.ndarray]]) -> np.ndarray:
    """The whole tensor from its pieces (already checked by `index_tensors`)."""
    first, array = pieces[0]
    if first.part_of is None:
        return array
    whole = np.empty(math.prod(first.part_of), dtype=array.dtype)
    for entry, part in pieces:
        offset = entry.offset or 0
        whole[offset : offset + part.size] = part
    return whole.reshape(first.part_of)
