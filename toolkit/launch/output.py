"""Children's output: echoed as it comes, and each source's last lines kept for the report.

Output is read in raw chunks, not lines, so a progress bar that redraws itself with carriage
returns (tqdm writes "\\r 45%|####  |" with no newline) reaches the console while it is drawn,
not when its process ends: finished lines go at once, an unfinished one after a twentieth of a
second without more (`pump`). A prefix
("[rank 1] ") goes at the start of every line, where a line starts after "\\n" or "\\r", so a
redrawn bar keeps its prefix and stays on one console line.

For the report, a carriage return means what it means on a terminal: the text after it replaces
the line. A tail keeps the lines as they were last shown, not every redraw of a bar.

Under a launcher every rank writes into the launcher's own pipes. Ranks started by
`toolkit launch` tag their lines themselves (`toolkit.launch.rank_output`: "[rank R] " at the
start of each line, possibly after a launcher's own prefix such as horovodrun's
"[1]<stderr>:"), so `LauncherTails` sorts each finished line to its rank's tail or to the
launcher's.
"""

from __future__ import annotations

import codecs
import os
import re
import select
import sys
import threading
from collections import deque
from collections.abc import Callable
from typing import TextIO

TAIL_LINES = 20
PARTIAL_LINE_SECONDS = 0.05
_CHUNK = 65536
_LINE_BREAK = re.compile(r"(\r\n|\r|\n)")
RANK_TAG = "[rank {rank}] "
_TAG = re.compile(r"^(.{0,64}?)\[rank (\d+)\] ")


class Console:
    """This process's stdout and stderr, shared by every reader thread. Looked up at each
    write (so test capture works); one writer at a time. When one source left a line open (a
    progress bar between redraws) and another writes, the other starts on a new line."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open_line: dict[str, object | None] = {"stdout": None, "stderr": None}

    def write(self, stream: str, source: object, text: str) -> None:
        if not text:
            return
        with self._lock:
            target: TextIO = sys.stdout if stream == "stdout" else sys.stderr
            owner = self._open_line[stream]
            if owner is not None and owner is not source and not text.startswith("\n"):
                target.write("\n")
            target.write(text)
            target.flush()
            self._open_line[stream] = None if text.endswith("\n") else source

    def end_lines(self) -> None:
        """End a line left open (a progress bar), so that what follows starts on its own."""
        with self._lock:
            for stream, owner in self._open_line.items():
                if owner is not None:
                    target: TextIO = sys.stdout if stream == "stdout" else sys.stderr
                    target.write("\n")
                    target.flush()
                    self._open_line[stream] = None


class Prefixer:
    """Puts `prefix` at the start of every line of a stream that arrives in chunks."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._at_line_start = True

    def __call__(self, text: str) -> str:
        parts = []
        for part in _LINE_BREAK.split(text):
            if not part:
                continue
            if _LINE_BREAK.fullmatch(part):
                self._at_line_start = True
            elif self._at_line_start:
                parts.append(self.prefix)
                self._at_line_start = False
            parts.append(part)
        return "".join(parts)


class Lines:
    """Assembles chunks into finished lines, a carriage return replacing the line as on a
    terminal ("a\\rb\\n" is "b"; "a\\r\\n" is "a"). `finish` hands over an unfinished last line."""

    def __init__(self, on_line: Callable[[str], None]) -> None:
        self._on_line = on_line
        self._pending: list[str] = []
        self._returned = False

    def feed(self, text: str) -> None:
        for part in _LINE_BREAK.split(text):
            if not part:
                continue
            if part == "\r":
                self._returned = True
                continue
            if part in ("\n", "\r\n"):
                self._on_line("".join(self._pending))
                self._pending.clear()
            else:
                if self._returned:
                    self._pending.clear()
                self._pending.append(part)
            self._returned = False

    def finish(self) -> None:
        if self._pending:
            self._on_line("".join(self._pending))
            self._pending.clear()


def new_tail() -> deque[str]:
    return deque(maxlen=TAIL_LINES)


class LauncherTails:
    """Every finished line of a launcher's output, sorted by its rank tag: each rank's own
    stderr lines (tag removed) and the launcher's own untagged lines."""

    def __init__(self) -> None:
        self.ranks: dict[int, deque[str]] = {}
        self.launcher = new_tail()
        self._lock = threading.Lock()

    def line(self, text: str, stream: str) -> None:
        match = _TAG.match(text)
        with self._lock:
            if match is None:
                self.launcher.append(text)
            elif stream == "stderr":
                rank = int(match.group(2))
                self.ranks.setdefault(rank, new_tail()).append(text[match.end() :])

    def of_rank(self, rank: int | None) -> tuple[str, ...]:
        with self._lock:
            return tuple(self.ranks.get(rank, ())) if rank is not None else ()

    def of_launcher(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(self.launcher)


def pump(
    fd: int,
    *,
    echo: Callable[[str], None] | None,
    lines: Lines | None,
    on_end: Callable[[], None] | None = None,
) -> None:
    """Copy a child's pipe until it closes, to `echo` and to `lines`. Finished lines go at
    once; an unfinished one (a progress bar between redraws, a prompt) waits up to
    `PARTIAL_LINE_SECONDS` for its end, so that a line written in several pieces (print()
    writes each argument separately when unbuffered) is not split by another rank's output.
    `on_end` is called the moment the pipe reports its end. Closes `fd`."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending = ""

    def emit(text: str) -> None:
        if echo is not None and text:
            echo(text)
        if lines is not None:
            lines.feed(text)

    try:
        while True:
            if pending and not select.select([fd], [], [], PARTIAL_LINE_SECONDS)[0]:
                emit(pending)
                pending = ""
                continue
            chunk = os.read(fd, _CHUNK)
            if not chunk:
                if on_end is not None:
                    on_end()
                break
            text = pending + decoder.decode(chunk)
            cut = max(text.rfind("\n"), text.rfind("\r")) + 1
            emit(text[:cut])
            pending = text[cut:]
    finally:
        os.close(fd)
        emit(pending + decoder.decode(b"", final=True))
        if lines is not None:
            lines.finish()
