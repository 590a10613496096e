"""Candidate fixes, applied to a running toolkit rank by monkeypatching, so the bench can
measure what each would buy before anyone changes a backend. Each takes the `Run` right after
`toolkit.init` and changes only speed, never the math of the step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

PATCHES: dict[str, Callable[[Any], None]] = {}
