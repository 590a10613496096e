"""Saves written by a background thread (`checkpoint.async`).

The training loop hands over a copy of this rank's state (`snapshot`: the engines' arrays are
often views of the live parameters) and goes on. The thread writes this rank's files with the
atomic protocol of toolkit.checkpoint.write, unchanged; on rank 0 it then waits for every
rank's part (`wait_for_parts`, in place of the barrier a synchronous save uses) and commits.
The thread uses no collective, so it never races the training loop's own. A killed rank leaves
`latest` on the previous complete checkpoint, as a killed synchronous save does.

The thread is not a daemon: a script that ends while a save is in flight still commits it
before the interpreter exits.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.checkpoint.fragments import Part
from toolkit.checkpoint.write import begin_save, wait_for_parts
from toolkit.errors import ToolkitError


def snapshot(tensors: Mapping[str, Any]) -> dict[str, Any]:
    """Copies of `tensors` (arrays or Fragments) that training can no longer change."""

    def copy(value: Any) -> Any:
        if isinstance(value, Part):
            return replace(value, data=np.array(value.data, copy=True))
        return np.array(value, copy=True)

    return {name: copy(value) for name, value in tensors.items()}


class BackgroundSave:
    """One rank's part of the save of `step`, written by a thread; rank 0's thread commits."""

    def __init__(
        self,
        root: Path,
        step: int,
        *,
        rank: int,
        ranks: int,
        sections: Mapping[str, Mapping[str, Any]],
        commit: Callable[[], object] | None,
        bound_s: float,
    ) -> None:
        """`sections`: "model", "optimizer", "arrays" to write (already snapshots); `commit`:
        rank 0's commit_save call, run once every rank's part is there (None elsewhere)."""
        self.root, self.step, self.rank, self.ranks = root, step, rank, ranks
        self._sections = sections
        self._commit = commit
        self._bound_s = bound_s
        self._failure: ToolkitError | None = None
        self._thread = threading.Thread(
            target=self._write, name=f"toolkit-save-step-{step}", daemon=False
        )

    def start(self) -> None:
        self._thread.start()

    def wait(self) -> ToolkitError | None:
        """Wait for the thread; the error that stopped the save (the caller says it), or None
        once it is written (and, on rank 0, committed)."""
        self._thread.join()
        return self._failure

    def _write(self) -> None:
        pending = None
        try:
            pending = begin_save(self.root, self.step, rank=self.rank, ranks=self.ranks)
            for section, tensors in self._sections.items():
                pending.write(section, tensors)
            pending.finish()
            if self._commit is not None:
                wait_for_parts(self.root, self.step, ranks=self.ranks, bound_s=self._bound_s)
                self._commit()
        except Exception as error:
            failure = error if isinstance(error, ToolkitError) else ToolkitError(repr(error))
            self._failure = failure
            if pending is not None:
                pending.fail(failure.message)
