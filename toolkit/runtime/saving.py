"""How a run saves its checkpoints: synchronously, or (`checkpoint.async`) in the background,
and what a save that cannot be written does (`checkpoint.save_failure`).

Every rank writes its part, then every rank learns which ranks failed, in one all-reduce of a
vector with one entry per rank; that all-reduce is also the save's barrier, so a rank that
failed never leaves the others waiting in one. Rank 0 then commits (toolkit.checkpoint.write),
and a second all-reduce tells everyone whether the commit held. A failed save removes what it
wrote (on a full disk the next save needs the space) and leaves every earlier checkpoint as
it was.

A background save hands its writer (toolkit.checkpoint.background) a copy of the state and
returns; the next save, a preemption's save and `Run.shutdown` first wait for it (at most one
is in flight) and learn, in the same all-reduce, whether it failed on any rank.
"""

from __future__ import annotations

import atexit
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

from toolkit.backends.base import Backend, StateShare
from toolkit.checkpoint import Origin, begin_save, commit_save
from toolkit.checkpoint.background import BackgroundSave, snapshot
from toolkit.checkpoint.layout import discard, staging_dir, step_name
from toolkit.errors import ToolkitError
from toolkit.exit_status import SAVE_FAILED
from toolkit.runtime.resume import DataPosition, host_rng_arrays
from toolkit.spec import TrainSpec

SECTIONS = ("model", "optimizer", "arrays")


class SaveFailed(ToolkitError):
    """A save that could not be written on some rank; every rank raises it."""

    def __init__(self, message: str, *, reporter: bool) -> None:
        super().__init__(
            message,
            "the checkpoints saved before are unchanged; free space or fix the permissions "
            "of checkpoint.dir, or set checkpoint.save_failure: continue to train on",
        )
        self.reporter = reporter
        """Whether this rank is the one that says so (the lowest rank that failed)."""


class Saver:
    """One run's saves; every method that saves or settles is collective."""

    def __init__(
        self, spec: TrainSpec, backend: Backend, *, rank: int, ranks: int, global_batch: int
    ) -> None:
        self.spec, self.backend, self.rank, self.ranks = spec, backend, rank, ranks
        self.global_batch = global_batch
        self.saved_step: int | None = None
        """The step of the newest save known to be committed."""
        self._in_flight: BackgroundSave | None = None
        self._reports_at_exit = False

    @property
    def spec_dir(self) -> Path | None:
        return None if self.spec.checkpoint.dir is None else Path(self.spec.checkpoint.dir)

    def save(self, root: Path, step: int, position: DataPosition) -> Path:
        """Save synchronously as `root/step-N`, after the background save in flight; raises
        SaveFailed on every rank when some rank's part or the commit fails."""
        self.settle(step)
        share = self._capture()
        sections = [getattr(share, section) for section in SECTIONS]
        failure = _attempt(partial(self._write_part, root, step, sections))
        failed = self._failed_ranks(failure)
        if not failed:
            if self.rank == 0:
                failure = _attempt(partial(self._commit, root, share, step, position))
            failed = self._failed_ranks(failure)
        if failed:
            raise self._lost(root, step, failed, failure)
        self.saved_step = step
        return root / step_name(step)

    def periodic(self, step: int, position: DataPosition) -> None:
        """The every_steps save into checkpoint.dir: synchronous, or handed to a background
        writer. A failure stops this rank with SAVE_FAILED or, with `save_failure: continue`,
        is said once and training goes on."""
        root = Path(str(self.spec_dir))
        if not self.spec.checkpoint.async_:
            try:
                self.save(root, step, position)
            except SaveFailed as failure:
                self._after(failure)
            return
        self.settle(step)
        share = self._capture()
        commit = partial(self._commit, root, share, step, position) if self.rank == 0 else None
        writer = BackgroundSave(
            root,
            step,
            rank=self.rank,
            ranks=self.ranks,
            sections={section: snapshot(getattr(share, section)) for section in SECTIONS},
            commit=commit,
            bound_s=self.spec.timeouts.collective_s,
        )
        if not self._reports_at_exit:
            atexit.register(self._report_unsettled)
            self._reports_at_exit = True
        writer.start()
        self._in_flight = writer

    def settle(self, next_step: int) -> None:
        """Wait for this rank's background save, and learn whether it failed on any rank
        (collective under checkpoint.async; nothing otherwise). `next_step` is the step about
        to be saved: rank 0 removes what a killed attempt at it left before anyone writes
        again, and the all-reduce orders the two."""
        if not self.spec.checkpoint.async_:
            return
        writer, self._in_flight = self._in_flight, None
        failure = writer.wait() if writer is not None else None
        root = self.spec_dir
        if self.rank == 0 and root is not None:
            stale = staging_dir(root, next_step)
            if stale.exists() and (writer is None or writer.step != next_step):
                discard(stale)
        failed = self._failed_ranks(failure)
        if writer is None:
            return
        if failed:
            self._after(self._lost(writer.root, writer.step, failed, failure))
        else:
            self.saved_step = writer.step

    def close(self) -> None:
        """Before the engine is released: settle the background save in flight, if any (the
        same on every rank, so the all-reduce is too)."""
        if self._in_flight is not None:
            self.settle(self._in_flight.step)

    # -- one save ---------------------------------------------------------------------------
    def _capture(self) -> StateShare:
        share = self.backend.capture_state()
        share.arrays.update(host_rng_arrays(self.rank))
        return share

    def _write_part(self, root: Path, step: int, sections: list[dict[str, object]]) -> None:
        pending = begin_save(root, step, rank=self.rank, ranks=self.ranks)
        for section, tensors in zip(SECTIONS, sections, strict=True):
            pending.write(section, tensors)
        pending.finish()

    def _commit(self, root: Path, share: StateShare, step: int, position: DataPosition) -> None:
        """Rank 0, once every rank's part of `step` is written (by a background writer while
        training has gone on: hence the step and data position as they were)."""
        origin = Origin(
            backend=self.spec.backend,
            framework=self.spec.framework_name,
            world_size=self.ranks,
            spec=self.spec.to_dict(),
        )
        commit_save(
            root,
            step,
            ranks=self.ranks,
            origin=origin,
            scalars=share.scalars,
            extras={**share.extras, "data": position.to_json(self.global_batch)},
            keep=self.spec.checkpoint.keep if root == self.spec_dir else 0,
        )

    # -- failures ---------------------------------------------------------------------------
    def _failed_ranks(self, failure: ToolkitError | None) -> list[int]:
        """Collective: the ranks whose part failed (each rank knows only its own error)."""
        local = np.zeros(self.ranks)
        local[self.rank] = 0.0 if failure is None else 1.0
        total = np.asarray(self.backend.allreduce(local, op="sum"), dtype=np.float64)
        return [rank for rank, count in enumerate(total) if count > 0]

    def _lost(
        self, root: Path, step: int, failed: list[int], failure: ToolkitError | None
    ) -> SaveFailed:
        """The error every rank raises; rank 0 removes what the save wrote."""
        staging = staging_dir(root, step)
        if self.rank == 0 and staging.exists():
            discard(staging)
        why = failure.message if failure is not None else f"rank {failed[0]} could not write"
        return SaveFailed(
            f"could not save step {step} to {root}: {why}", reporter=self.rank == failed[0]
        )

    def _after(self, failure: SaveFailed) -> None:
        stop = self.spec.checkpoint.save_failure == "stop"
        if failure.reporter:
            then = f"stopping with status {SAVE_FAILED}" if stop else "training goes on"
            _say(f"toolkit: {failure.one_line()}; {then}")
        if stop:
            raise SystemExit(SAVE_FAILED)

    def _report_unsettled(self) -> None:
        """At exit: a background save nobody waited for (the script ended without
        `run.shutdown()`) is still said to have failed, by the rank it failed on."""
        writer = self._in_flight
        failure = writer.wait() if writer is not None else None
        if failure is not None and writer is not None:
            _say(f"toolkit: could not save step {writer.step} to {writer.root}: {failure.message}")


def _attempt(action: Callable[[], object]) -> ToolkitError | None:
    """One rank's part of a save; the ToolkitError it raised, so that every rank learns of it
    before any raises (a rank that raised alone would leave the others in a barrier)."""
    try:
        action()
    except ToolkitError as error:
        return error
    return None


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
