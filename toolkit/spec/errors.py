"""Spec errors: every problem with a spec, collected, each naming its field.

A spec is checked as a whole and every problem comes back in one `SpecError`, so a user fixes
a file in one round instead of one error per run. Each `SpecIssue` says where (the dotted field
path), what was given, what is allowed and what to change.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from toolkit.errors import ToolkitError

_MAX_VALUE_CHARS = 80


def show_value(value: Any) -> str:
    """`repr` of a user value, shortened so one huge or odd value cannot flood the message."""
    try:
        text = repr(value)
    except Exception:  # a hostile __repr__ must not turn a spec error into a crash
        text = f"<{type(value).__name__}>"
    if len(text) > _MAX_VALUE_CHARS:
        text = text[: _MAX_VALUE_CHARS - 3] + "..."
    return text


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
    """What to change; None when `allowed` already says it."""

    def one_line(self) -> str:
        # A path holds user keys; one with a newline or tab must not break the one line.
        path = self.path if self.path.isprintable() else repr(self.path)
        line = f"{path}={show_value(self.value)}: {self.allowed}"
        return f"{line} HINT: {self.hint}" if self.hint else line


class SpecError(ToolkitError):
    """Everything wrong with one spec; its one line joins the issues with "; "."""

    def __init__(self, issues: Iterable[SpecIssue]) -> None:
        self.issues: tuple[SpecIssue, ...] = tuple(issues)
        if not self.issues:
            raise ValueError("SpecError needs at least one issue")
        super().__init__("spec error: " + "; ".join(issue.one_line() for issue in self.issues))

    @classmethod
    def single(cls, path: str, value: Any, allowed: str, hint: str | None = None) -> SpecError:
        return cls([SpecIssue(path=path, value=value, allowed=allowed, hint=hint)])
