"""Spec errors: every problem with a spec, collected, each naming its field.

A spec is checked as a whole and every problem comes back in one `SpecError`, so a user fixes
a file in one round instead of one error per run. Each `SpecIssue` says where (the dotted field
path), what was given (as the user wrote it), what is allowed and what to change.

Whatever a spec holds, its message stays one short line: every value shown is cut to
`MAX_VALUE_CHARS` (and rendered without `repr`, which would walk a huge or deep value whole),
every path to `MAX_PATH_CHARS`, and at most `MAX_SHOWN` issues, or as many as fit in
`MAX_MESSAGE_CHARS`, are listed ("... and N more").
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from toolkit.errors import ToolkitError

MAX_VALUE_CHARS = 80
MAX_PATH_CHARS = 120
MAX_SHOWN = 20
"""Issues listed in the one-line message, at most."""
MAX_MESSAGE_CHARS = 4000
"""Length of the one-line message, past which no further issue is listed."""
MAX_KEPT = 200
"""Issues kept in `SpecError.issues`; beyond that they are only counted."""
_MAX_RENDER_DEPTH = 3
_MAX_TEXT_CHARS = 400
"""What is allowed and the hint are the toolkit's words, but may quote a user's."""


def cut(text: str, limit: int = MAX_VALUE_CHARS) -> str:
    """`text` shortened to `limit` characters, saying how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[: limit - 3]}... ({len(text)} characters)"


def show_value(value: Any, limit: int = MAX_VALUE_CHARS) -> str:
    """A user value in spec-file words (strings quoted, true/false, null), at most `limit`
    characters. Walks only what it shows, so a huge or deeply nested value costs nothing."""
    parts: list[str] = []
    _render(value, parts, [limit + 1], 0)
    text = "".join(parts)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _render(value: Any, out: list[str], budget: list[int], depth: int) -> None:
    """Append `value`'s text to `out` until `budget[0]` characters are spent."""
    if budget[0] <= 0:
        return
    if isinstance(value, dict | list | tuple):
        _render_collection(value, out, budget, depth)
        return
    text = _scalar_text(value, budget[0])
    out.append(text)
    budget[0] -= len(text)


def _render_collection(
    value: dict[Any, Any] | list[Any] | tuple[Any, ...],
    out: list[str],
    budget: list[int],
    depth: int,
) -> None:
    is_dict = isinstance(value, dict)
    opening, closing = ("{", "}") if is_dict else ("[", "]")
    if depth >= _MAX_RENDER_DEPTH and value:
        text = f"{opening}...{closing}"
        out.append(text)
        budget[0] -= len(text)
        return
    out.append(opening)
    budget[0] -= 1
    items = value.items() if isinstance(value, dict) else value
    for index, item in enumerate(items):
        if budget[0] <= 0:
            return
        if index:
            out.append(", ")
            budget[0] -= 2
        if is_dict:
            key, item = item
            _render(key, out, budget, depth + 1)
            out.append(": ")
            budget[0] -= 2
        _render(item, out, budget, depth + 1)
    out.append(closing)
    budget[0] -= 1


def _scalar_text(value: Any, budget: int) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        digits = math.floor(value.bit_length() * math.log10(2)) + 1
        return str(value) if digits <= 60 else f"<an integer of {digits} digits>"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return repr(value[: budget + 2])
    return f"<{type(value).__name__}>"  # never repr an object the spec did not make


@dataclass(frozen=True, kw_only=True)
class SpecIssue:
    """One problem with one field of a spec."""

    path: str
    """Dotted field path, e.g. `batch.global` or `launch.hosts[1]`."""
    value: Any
    """The value the spec gave (or derived) for that field."""
    allowed: str
    """What is allowed, or the rule the value breaks, e.g. `allowed sgd, adam, adamw`."""
    hint: str | None = None
    """What to change. Every issue the spec itself finds has one."""
    written: str | None = None
    """The value's text as written in the spec file (`1:30:00`, `1e400`), when known."""

    def shown_value(self) -> str:
        if self.written is not None:
            # A plain YAML scalar over a blank line keeps a newline in its text (`1e-8`, blank
            # line, `0.001`): shown escaped, like a path, so the line stays one line.
            written = self.written if self.written.isprintable() else repr(self.written)
            return cut(written)
        return show_value(self.value)

    def shown_path(self) -> str:
        # A path holds user keys; one with a newline or tab must not break the one line.
        path = self.path if self.path.isprintable() else repr(self.path)
        return cut(path, MAX_PATH_CHARS)

    def one_line(self) -> str:
        line = f"{self.shown_path()}={self.shown_value()}: {cut(self.allowed, _MAX_TEXT_CHARS)}"
        return f"{line} HINT: {cut(self.hint, _MAX_TEXT_CHARS)}" if self.hint else line


class SpecError(ToolkitError):
    """Everything wrong with one spec; its one line joins the issues with "; "."""

    def __init__(self, issues: Iterable[SpecIssue], *, more: int = 0) -> None:
        kept: list[SpecIssue] = []
        for issue in issues:
            if len(kept) < MAX_KEPT:
                kept.append(issue)
            else:
                more += 1
        if not kept:
            raise ValueError("SpecError needs at least one issue")
        self.issues: tuple[SpecIssue, ...] = tuple(kept)
        self.more = more
        """Issues found beyond `issues` (counted, not kept)."""
        lines: list[str] = []
        length = 0
        for issue in self.issues[:MAX_SHOWN]:
            line = issue.one_line()
            if lines and length + len(line) > MAX_MESSAGE_CHARS:
                break
            lines.append(line)
            length += len(line) + 2
        hidden = len(self.issues) - len(lines) + more
        if hidden:
            lines.append(f"... and {hidden} more")
        super().__init__("spec error: " + "; ".join(lines))

    @classmethod
    def single(cls, path: str, value: Any, allowed: str, hint: str | None = None) -> SpecError:
        return cls([SpecIssue(path=path, value=value, allowed=allowed, hint=hint)])


class IssueList:
    """Issues collected from input of any size: keeps the first `MAX_KEPT`, counts the rest."""

    def __init__(self) -> None:
        self.kept: list[SpecIssue] = []
        self.more = 0

    def add(self, issue: SpecIssue) -> None:
        if len(self.kept) < MAX_KEPT:
            self.kept.append(issue)
        else:
            self.more += 1

    def __bool__(self) -> bool:
        return bool(self.kept)

    def __len__(self) -> int:
        return len(self.kept) + self.more

    def raise_if_any(self) -> None:
        if self.kept:
            raise SpecError(self.kept, more=self.more)
