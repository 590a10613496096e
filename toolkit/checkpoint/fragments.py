"""Tensors stored in parts: what a rank holds of a partitioned parameter, written as it is.

Two kinds of part, one per way engines partition, each written with no gathering:

- ZeRO flattens parameters and gives each rank a contiguous slice: a `Fragment`, stored as a
  1-D tensor with its offset in the flattened (C-order) whole.
- FSDP and tensor parallelism (DTensor) give each rank a rectangular block (rows under FSDP,
  columns or rows under tensor parallelism, both on a 2-D mesh): a `Block`, stored in its own
  shape with where it starts in each dimension of the whole.

Each part is stored under the parameter's own name, and the manifest records the whole's
shape. A reader puts the parts back together, so the partitioning that wrote a checkpoint
never matters to the one that reads it. A name is either one whole tensor or parts of one
kind that tile the whole exactly (no gap, no overlap, one dtype); a save or a manifest that
breaks this is refused.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
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

    def stored(self, name: str) -> np.ndarray:
        """What the tensor file holds: the elements, 1-D."""
        return self.flat(name)

    def placed(self, entry: TensorEntry) -> TensorEntry:
        """The manifest's entry for the stored elements, with where they go in the whole."""
        return replace(entry, offset=self.offset, part_of=tuple(self.shape))


@dataclass(frozen=True)
class Block:
    """The block of the tensor of shape `shape` that starts at index `start` in each
    dimension and has `data`'s shape (a DTensor's local shard)."""

    data: Any
    start: tuple[int, ...]
    shape: tuple[int, ...]

    def stored(self, name: str) -> np.ndarray:
        """What the tensor file holds: the block in its own shape, after checking that it
        lies inside the whole."""
        data = np.asarray(self.data)
        start, shape = tuple(self.start), tuple(self.shape)
        fits = (
            len(start) == len(shape) == data.ndim
            and all(type(n) is int and n >= 0 for n in (*start, *shape))
            and all(s + n <= whole for s, n, whole in zip(start, data.shape, shape, strict=True))
        )
        if not fits:
            raise ToolkitError(
                f"block of {name!r} (start {list(start)}, shape {list(data.shape)}) does not "
                f"fit a tensor of shape {list(shape)}"
            )
        return data

    def placed(self, entry: TensorEntry) -> TensorEntry:
        """The manifest's entry for the stored block, with where it starts in the whole."""
        return replace(entry, start=tuple(self.start), part_of=tuple(self.shape))


Part = Fragment | Block
"""What a rank may write for a tensor partitioned across ranks."""


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
    blocks = [entry.start is not None for entry in entries]
    if any(blocks) and not all(blocks):
        return "mixes blocks with flat fragments"
    assert whole is not None  # every entry is a part
    covered = _block_problem(entries, whole) if all(blocks) else _range_problem(entries)
    if isinstance(covered, str):
        return covered
    if covered != math.prod(whole):
        return f"has parts covering {covered} of {math.prod(whole)} elements"
    return None


def _range_problem(entries: Sequence[TensorEntry]) -> str | int:
    """Flat fragments: a problem, or how many elements they cover end to end."""
    expected = 0
    for entry in sorted(entries, key=lambda entry: entry.offset or 0):
        if len(entry.shape) != 1 or entry.offset != expected:
            return f"has a gap or an overlap at element {expected}"
        expected += entry.shape[0]
    return expected


def _block_problem(entries: Sequence[TensorEntry], whole: tuple[int, ...]) -> str | int:
    """Blocks: a problem, or how many elements they cover, once each inside the whole."""
    for entry in entries:
        start = entry.start or ()
        if len(start) != len(whole) or len(entry.shape) != len(whole):
            return f"has a block of {len(entry.shape)} dimensions in a tensor of {len(whole)}"
        if any(s + n > w for s, n, w in zip(start, entry.shape, whole, strict=True)):
            return f"has a block at {list(start)} that reaches outside the whole"
    for one, other in itertools.combinations(entries, 2):
        if _overlap(one, other):
            return f"has blocks that overlap at {list(other.start or ())}"
    return sum(math.prod(entry.shape) for entry in entries)


def _overlap(one: TensorEntry, other: TensorEntry) -> bool:
    spans = zip(one.start or (), one.shape, other.start or (), other.shape, strict=True)
    return all(a < b + m and b < a + n for a, n, b, m in spans)


def assemble(pieces: Sequence[tuple[TensorEntry, np.ndarray]]) -> np.ndarray:
    """The whole tensor from its pieces (already checked by `index_tensors`)."""
    first, array = pieces[0]
    if first.part_of is None:
        return array
    whole = np.empty(first.part_of, dtype=array.dtype)
    if first.start is not None:
        for entry, part in pieces:
            spans = zip(entry.start or (), entry.shape, strict=True)
            whole[tuple(slice(s, s + n) for s, n in spans)] = part.reshape(entry.shape)
        return whole
    flat = whole.reshape(-1)
    for entry, part in pieces:
        offset = entry.offset or 0
        flat[offset : offset + part.size] = part
    return whole
