"""A progress bar on rank 0 only; other ranks stay quiet so logs are readable."""

from __future__ import annotations

import sys

from tqdm import tqdm


def progress(*, total: int | None, desc: str, enabled: bool, leave: bool = True) -> tqdm:
    """`total` None: a stream, whose number of steps is known when it ends."""
    return tqdm(
        total=total,
        desc=desc,
        file=sys.stderr,
        dynamic_ncols=True,
        mininterval=0.5,
        disable=not enabled,
        leave=leave,
    )
