"""Field-local constraints, attached to spec fields as metadata and checked with their types.

    lr: float = field(default=1e-3, metadata=number(gt=0))

A constraint sees one field's value (already of the right type) and its path, and returns the
issues. Rules that relate several fields live in `toolkit.spec.validate`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from toolkit.spec.errors import SpecIssue

Check = Callable[[Any, str], list[SpecIssue]]


def metadata(check: Check) -> dict[str, Any]:
    """Field metadata attaching `check`."""
    return {"check": check}


def number(
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    hint: str | None = None,
) -> dict[str, Any]:
    """Bounds for a number, each number of a tuple, or an optional number when given."""
    parts = []
    if ge is not None:
        parts.append(f">= {ge}")
    if gt is not None:
        parts.append(f"> {gt}")
    if le is not None:
        parts.append(f"<= {le}")
    if lt is not None:
        parts.append(f"< {lt}")
    allowed = "must be " + " and ".join(parts)

    def ok(value: float) -> bool:
        return not (
            (ge is not None and value < ge)
            or (gt is not None and value <= gt)
            or (le is not None and value > le)
            or (lt is not None and value >= lt)
        )

    def check(value: Any, path: str) -> list[SpecIssue]:
        if value is None:
            return []
        if isinstance(value, tuple):
            return [
                SpecIssue(path=f"{path}[{index}]", value=item, allowed=allowed, hint=hint)
                for index, item in enumerate(value)
                if not ok(item)
            ]
        return [] if ok(value) else [SpecIssue(path=path, value=value, allowed=allowed, hint=hint)]

    return metadata(check)


def text(
    pattern: str | None = None, *, what: str = "text", hint: str | None = None
) -> dict[str, Any]:
    """A string (when given) that is non-empty, has no control characters, matches `pattern`.

    These strings become argv elements, file names or YAML values: never shell text.
    """
    regex = re.compile(pattern) if pattern else None

    def check(value: Any, path: str) -> list[SpecIssue]:
        if value is None:
            return []
        bad = not value.strip() or any(ord(char) < 32 for char in value)
        if bad or (regex is not None and not regex.fullmatch(value)):
            return [SpecIssue(path=path, value=value, allowed=f"must be {what}", hint=hint)]
        return []

    return metadata(check)
