"""The suite's options: environment variables that widen a default `make test` to a full
matrix. Each is read here once; the README's Development section says what each one adds."""

from __future__ import annotations

import os


def _full(name: str) -> bool:
    return os.environ.get(name) == "full"


FULL_MATRIX = _full("TOOLKIT_MATRIX")
FULL_FAULTS = _full("TOOLKIT_FAULTS")
FULL_RESUME = _full("TOOLKIT_RESUME")
FULL_PARITY = _full("TOOLKIT_PARITY")
FULL_CLUSTER = _full("TOOLKIT_CLUSTER")
FULL_GPT = _full("TOOLKIT_GPT")
