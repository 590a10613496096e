"""Spec and config text -> plain data: what the readers share (result, limits, refusals).

PyYAML's `safe_load` and `json.loads` are not safe enough for a file anyone may hand over:
`safe_load` expands aliases without limit (a 470-byte "billion laughs" takes minutes and
gigabytes), recurses once per nesting level, keeps the last of two equal keys silently, and
resolves scalars by YAML 1.1 (`yes` is true, `1:30:00` is 5400, `1e-3` is text); `json.loads`
keeps the last of two equal keys too. So both readers (`toolkit.spec.yaml_reader`,
`toolkit.spec.json_reader`; `toolkit.spec.load.parse_document` picks one) hold to the same
limits, refuse duplicate keys at any depth, and keep the text the user wrote for each value
(`Document.written`), so errors show `yes`, `1:30:00` or `1e400` as written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from toolkit.spec.errors import SpecError, SpecIssue

MAX_DEPTH = 32
"""Deepest nesting of mappings and lists (a spec nests 3 deep)."""
MAX_NODES = 200_000
"""Values in a document, aliases counted at their expanded size."""
MAX_NUMBER_CHARS = 100
"""Longest number text: beyond it no field's range is met, and conversion gets costly."""


@dataclass(frozen=True)
class Document:
    """Parsed data, and the source text of its unquoted scalars (JSON: numbers) by field path."""

    data: Any
    written: dict[str, str] = field(default_factory=dict)


def refuse(source: str, problem: str, hint: str, root: str = "") -> SpecError:
    """The error for a whole file that cannot be read as data."""
    return SpecError.single(root or "spec", source, problem, hint=hint)


def too_deep(path: str) -> SpecIssue:
    """The issue for nesting past MAX_DEPTH at `path`."""
    # "a[0][0][0]...[0]" 32 times says nothing more than "a[0][0][...]".
    shown = re.sub(r"((?:\[[0-9]+\]){2})(?:\[[0-9]+\]|\.[^.\[]*)+$", r"\1[...]", path)
    return SpecIssue(
        path=shown or "spec",
        value=None,
        written="...",
        allowed=f"nests deeper than {MAX_DEPTH} levels",
        hint="a spec is sections of keys and short lists",
    )


def long_number(path: str, text: str) -> SpecIssue:
    """The issue for a number whose text is longer than MAX_NUMBER_CHARS."""
    return SpecIssue(
        path=path or "spec",
        value=None,
        written=text,
        allowed=f"a number of {len(text)} characters is out of range for every field",
        hint=f"write a number of at most {MAX_NUMBER_CHARS} characters",
    )
