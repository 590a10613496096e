"""Reading files a user names (spec, hostfile, DeepSpeed config): bounded, never blocking.

A path given on the command line or in a spec can be anything: a FIFO nobody writes to (a
plain `open` waits forever), `/dev/zero` (a plain `read` fills memory), a directory, a file of
gigabytes. Every such file is opened without blocking, must be a regular file, is read up to a
size limit, and must be UTF-8 text; anything else is a `UserFileError` saying which.
"""

from __future__ import annotations

import os
import stat

from toolkit.errors import ToolkitError
from toolkit.units import MIB, size_label

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class UserFileError(ToolkitError):
    """A user's file that cannot be read as text; `reason` says why, as "allowed" text."""

    def __init__(self, path: str | os.PathLike[str], reason: str, hint: str) -> None:
        self.path = str(path)
        self.reason = reason
        shown = self.path if self.path.isprintable() else repr(self.path)
        if len(shown) > 200:
            shown = shown[:197] + "..."
        super().__init__(f"{shown}: {reason}", hint)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def read_text(
    path: str | os.PathLike[str], *, limit: int, what: str, hint: str | None = None
) -> str:
    """The UTF-8 text of the regular file at `path`, at most `limit` bytes.

    `what` names the file in messages ("spec", "hostfile", ...); `hint` replaces the default
    hint for a path that cannot be opened or is not a regular file. O_NONBLOCK makes opening a
    FIFO return at once (it is then refused as a FIFO); reads stop at `limit` + 1 bytes.
    """
    path_hint = hint or f"check the {what}'s path"
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        descriptor = os.open(path, flags)
    except ValueError:  # a NUL in the path
        raise UserFileError(path, f"the {what}'s path holds a NUL character", path_hint) from None
    except OSError as error:
        reason = error.strerror or error.__class__.__name__
        raise UserFileError(path, f"cannot open the {what} ({reason})", path_hint) from None
    try:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            raise UserFileError(
                path, f"the {what} must be a regular file, not {_kind(mode)}", path_hint
            )
        os.set_blocking(descriptor, True)
        data = _read_at_most(descriptor, limit + 1)
    except OSError as error:
        reason = error.strerror or error.__class__.__name__
        raise UserFileError(path, f"cannot read the {what} ({reason})", path_hint) from None
    finally:
        os.close(descriptor)
    if len(data) > limit:
        raise UserFileError(
            path,
            f"the {what} is larger than {size_label(limit)}",
            f"a {what} is a small text file; check the path",
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise UserFileError(
            path,
            f"the {what} is not UTF-8 text (byte {error.start})",
            f"save the {what} as UTF-8 text",
        ) from None


def _read_at_most(descriptor: int, count: int) -> bytes:
    chunks: list[bytes] = []
    remaining = count
    while remaining > 0:
        chunk = os.read(descriptor, min(remaining, MIB))
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)
