"""What the runtime adds to a checkpoint beside the engine's state, and how a run resumes.

Automatic resume is decided in `toolkit.init` and applied in `run.prepare`: `init` finds the
checkpoint (`checkpoint.dir` set, `resume: auto`: `latest` there, or the newest older one
when `latest` does not verify), verifies every file of it and says so on rank 0, before
anything trains; the state itself can only be put
back once the engine has built the model and optimizer, so `prepare` restores weights,
optimizer state, schedule position, loss scaler and random generators right after wrapping
the model. Restoring the generators last, after the engine's own set-up, is what makes the
next step's random numbers those of the uninterrupted run. The data position is applied by
`run.steps`, which starts at the saved epoch and skips the steps already trained on, so the
next global batch is the one the uninterrupted run would have read.

No engine is imported here: numpy's and Python's generators are the runtime's, the torch
generator is the backend's (`toolkit.backends.torch_state`).
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from toolkit.checkpoint import CheckpointState, Newest, newest_verified
from toolkit.spec import TrainSpec


@dataclass(frozen=True)
class DataPosition:
    """Where the next step's global batch starts: `steps` steps into `epoch`."""

    epoch: int = 0
    steps: int = 0

    def to_json(self, global_batch: int) -> dict[str, int]:
        return {"epoch": self.epoch, "steps": self.steps, "samples": self.steps * global_batch}

    @classmethod
    def from_extras(cls, extras: dict[str, Any], global_batch: int) -> DataPosition:
        """The saved position; counted in samples, so a run whose global batch differs from
        the saving run's starts at the first whole step not yet seen."""
        data = extras.get("data")
        if not isinstance(data, dict):
            return cls()
        samples = data.get("samples", data.get("steps", 0) * global_batch)
        return cls(epoch=int(data.get("epoch", 0)), steps=-(-int(samples) // global_batch))


def checkpoint_to_resume(spec: TrainSpec) -> Newest:
    """The checkpoint this run continues from, every file verified (none: start afresh), and
    the newer ones passed over because they did not verify."""
    settings = spec.checkpoint
    if settings.dir is None or settings.resume == "never":
        return Newest(None)
    return newest_verified(settings.dir)


def announce(newest: Newest) -> None:
    """One line on stderr (rank 0) for each checkpoint passed over, then where the run
    continues from and who saved it."""
    for step, why in newest.passed_over:
        print(f"toolkit: not resuming from {step}: {why}", file=sys.stderr, flush=True)
    checkpoint = newest.checkpoint
    if checkpoint is None:
        return
    origin = checkpoint.manifest.origin
    saved_by = origin.backend or "an unknown engine"
    if origin.framework:
        saved_by += f" ({origin.framework})"
    print(
        f"toolkit: resuming from {checkpoint.path} at step {checkpoint.step}, saved by "
        f"{saved_by} with {origin.world_size} rank(s)",
        file=sys.stderr,
        flush=True,
    )


def host_rng_arrays(rank: int) -> dict[str, np.ndarray]:
    """numpy's global generator and Python's `random` of this rank, as arrays."""
    _, keys, position, has_gauss, cached = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    return {
        f"rng/numpy/rank{rank}": np.asarray(keys, dtype=np.uint32),
        f"rng/numpy_position/rank{rank}": np.array([position, has_gauss, cached], dtype=np.float64),
        f"rng/python/rank{rank}": np.asarray(internal, dtype=np.uint32),
        f"rng/python_gauss/rank{rank}": np.array(
            [version, gauss_next is not None, gauss_next or 0.0], dtype=np.float64
        ),
    }


def restore_host_rng(state: CheckpointState, rank: int) -> None:
    """This rank's numpy and Python generators as saved (a rank the saving run did not have
    keeps its seeded ones)."""
    arrays = state.arrays
    keys, extra = arrays.get(f"rng/numpy/rank{rank}"), arrays.get(f"rng/numpy_position/rank{rank}")
    if keys is not None and extra is not None:
        position, has_gauss, cached = extra.tolist()
        np.random.set_state(("MT19937", keys, int(position), int(has_gauss), cached))
    internal, gauss = (
        arrays.get(f"rng/python/rank{rank}"),
        arrays.get(f"rng/python_gauss/rank{rank}"),
    )
    if internal is not None and gauss is not None:
        version, has_next, value = gauss.tolist()
        numbers = tuple(int(n) for n in internal.tolist())
        random.setstate((int(version), numbers, value if has_next else None))
