"""Error types that reach users.

Every error a user can fix is a `ToolkitError`. Its message is one line: what is wrong (field,
value, what is allowed) and a HINT saying what to change. The CLI prints exactly that line and
exits 2; anything else escaping is a bug in the toolkit, not in the user's input.
"""

from __future__ import annotations


class ToolkitError(Exception):
    """A problem the user can fix; its message is the single line the CLI prints."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(self.one_line())

    def one_line(self) -> str:
        if self.hint:
            return f"{self.message} HINT: {self.hint}"
        return self.message
