"""A progress bar on rank 0 only; other ranks stay quiet so logs are readable."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tqdm import tqdm


class _Silent:
    def update(self, count: int = 1) -> None:
        pass

    def set_postfix(self, **values: Any) -> None:
        pass


@contextmanager
def progress(*, total: int, desc: str, enabled: bool) -> Iterator[Any]:
    if not enabled:
        yield _Silent()
        return
    with tqdm(total=total, desc=desc, file=sys.stderr, dynamic_ncols=True, mininterval=0.5) as bar:
        yield bar
