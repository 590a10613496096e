"""Small, engine-free helpers for scripts that report on a run."""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable

import numpy as np

from toolkit.errors import ToolkitError


def weights_digest(weights: dict[str, np.ndarray]) -> str:
    """sha256 over names, shapes and bytes in name order: equal only for identical weights."""
    digest = hashlib.sha256()
    for name in sorted(weights):
        array = np.ascontiguousarray(weights[name], dtype=np.float32)
        digest.update(f"{name}:{array.shape};".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def print_json(**values: object) -> None:
    print(json.dumps(values), flush=True)


def exit_on_user_error(main: Callable[[], int]) -> int:
    """Run a script's main; a ToolkitError becomes one line on stderr and exit status 2."""
    try:
        return main()
    except ToolkitError as error:
        print(f"error: {error.one_line()}", file=sys.stderr, flush=True)
        return 2
