"""A rank's own output, tagged with its rank, and its exit status told to the supervisor.

Under a launcher every rank writes into the launcher's console, and only some launchers say
which rank wrote a line. So a rank started by `toolkit launch` through a launcher routes its
stdout and stderr (the file descriptors, so C++ and engine logs too) through a small helper
process, `python -m toolkit.launch.rank_output`, that writes each line to the original
stream with "[rank R] " in front, as the supervisor copies a local rank's output
(toolkit.launch.output.pump: a progress bar's carriage-return redraws pass while it is drawn).
The supervisor sorts the tagged lines into each rank's tail.

The helper is a separate process, not a thread, because a rank that dies (SIGKILL, abort)
takes its threads and their unwritten buffers with it, and its last lines are the ones the
report needs; the helper reads until the pipe closes. It ignores SIGINT, SIGTERM and SIGHUP
(a launcher stopping the rank's process group must not cut those lines) and ends once every
writer has closed the pipe. At that moment the rank is exiting and its exit status is already
in /proc, so the helper sends it to the supervisor ("end" datagram, toolkit.launch.heartbeat),
which then knows how the rank ended even where the launcher reaps it at once and says little.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence

from toolkit.launch.heartbeat import parse_address, send
from toolkit.launch.output import RANK_TAG, Prefixer, pump
from toolkit.launch.tree import parse_exit_status

_helpers: list[subprocess.Popen[bytes]] = []
_READY_SECONDS = 30.0


def tag_output(rank: int, heartbeat: str | None) -> None:
    """Route this process's fds 1 and 2 through the tagging helper, once it is ready: a rank
    that dies a moment later must find it watching already."""
    sys.stdout.flush()
    sys.stderr.flush()
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    ready_read, ready_write = os.pipe()
    argv = [sys.executable, "-m", "toolkit.launch.rank_output", str(rank), str(os.getpid())]
    argv += [str(out_read), str(err_read), str(ready_write), heartbeat or ""]
    helper = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, pass_fds=(out_read, err_read, ready_write)
    )
    for fd in (out_read, err_read, ready_write):
        os.close(fd)
    with os.fdopen(ready_read, "rb") as ready:
        # One byte once it watches; end of file if it failed to start (then output still
        # flows through it or, at worst, is lost with it: never a hang).
        select.select([ready], [], [], _READY_SECONDS)
    os.dup2(out_write, 1)
    os.dup2(err_write, 2)
    os.close(out_write)
    os.close(err_write)
    _helpers.append(helper)  # never waited for: it outlives this process by design


def _writer(fd: int, prefix: Prefixer) -> Callable[[str], None]:
    """Write tagged text to `fd`; once the other end is gone, keep draining, stop writing."""
    open_ = [True]

    def write(text: str) -> None:
        data = prefix(text).encode()
        try:
            while data and open_[0]:
                data = data[os.write(fd, data) :]
        except OSError:
            open_[0] = False

    return write


class _ExitWatch:
    """The rank's /proc/<pid>/stat, opened while it runs: read again the moment its output
    closes, it holds the exit status before the rank's parent can reap it (a race the parent
    wins when it waits for the rank at once, as a shell does)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.status: int | None = None
        try:
            self._fd: int | None = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
        except OSError:
            self._fd = None

    def look(self) -> None:
        if self.status is None and self._fd is not None:
            with contextlib.suppress(OSError):  # ESRCH: reaped already
                status = parse_exit_status(os.pread(self._fd, 4096, 0))
                self.status = self.status if status is None else status

    def wait(self) -> int | None:
        """The status; should the rank close its output and live on, wait for its end."""
        self.look()
        if self.status is None:
            with contextlib.suppress(OSError):  # gone already, or no pidfd on this kernel
                pidfd = os.pidfd_open(self.pid)
                select.select([pidfd], [], [])
                os.close(pidfd)
                self.look()
        return self.status


def _relay(rank: int, sources: dict[int, int], exit_watch: _ExitWatch, ready: int) -> None:
    """Copy each source fd to its target fd with the rank tag, until every source closes.
    Writes to `ready` (and closes it) once every copy runs."""
    readers = [
        threading.Thread(
            target=pump,
            args=(source,),
            kwargs={
                "echo": _writer(target, Prefixer(RANK_TAG.format(rank=rank))),
                "lines": None,
                "on_end": exit_watch.look,
            },
        )
        for source, target in sources.items()
    ]
    for reader in readers:
        reader.start()
    with contextlib.suppress(OSError):
        os.write(ready, b"1")
    os.close(ready)
    for reader in readers:
        reader.join()


def main(argv: Sequence[str]) -> int:
    rank, pid, out_fd, err_fd, ready = (int(arg) for arg in argv[:5])
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    exit_watch = _ExitWatch(pid)
    _relay(rank, {out_fd: 1, err_fd: 2}, exit_watch, ready)
    address = parse_address(argv[5]) if argv[5] else None
    if address is not None:
        send(address, "end", rank, pid, status=exit_watch.wait())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
