"""Heartbeats: how the supervisor knows each rank's host and pid, notices one that stalled, and
learns how each rank ended, under any launcher.

Under `toolkit launch`, TOOLKIT_HEARTBEAT=host:port names a UDP socket of the supervisor. Each
rank, from `toolkit.init`, starts a daemon thread that sends a datagram (rank, pid, host) every
`INTERVAL` seconds. A rank that is stopped (SIGSTOP), frozen or hung in its interpreter's exit
stops beating; the supervisor ends the job when a rank that has beaten is silent for longer
than the stall timeout. A rank that waits in a collective keeps beating (its thread runs):
the collective timeout ends that case (the engines' own; under TF MultiWorker a watchdog of the
toolkit's, toolkit.backends.tf.deadline). A rank whose interpreter holds the GIL in
one C call for longer than the stall timeout would look stalled too, hence a default (60 s)
far above any such call in training.

Where the ranks share the launcher's console, each rank's output tagger
(`toolkit.launch.rank_output`) also sends one "end" datagram with the rank's exit status when
the rank exits, so the report names the rank that failed first and how it ended even when the
launcher only says "a process failed". UDP on loopback does not drop datagrams in practice;
across hosts a lost one costs a beat (the stall timeout spans many) or the exact status of an
end (the report then falls back to the launcher's words).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from dataclasses import dataclass

from toolkit.rank_variables import TOOLKIT_HOST

INTERVAL = 1.0
"""Seconds between beats."""
_MAX_DATAGRAM = 1024


def parse_address(address: str) -> tuple[str, int] | None:
    """host:port -> (host, port), None when malformed (the variable is ours; a broken value
    means no supervisor to talk to, not an error in the training script)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host.strip("[]"), int(port)


def host_name() -> str:
    """The host this rank runs on: as the spec names it when the toolkit started the rank over
    ssh (TOOLKIT_HOST), else the machine's hostname."""
    return os.environ.get(TOOLKIT_HOST) or socket.gethostname()


def send(address: tuple[str, int], kind: str, rank: int, pid: int, **extra: object) -> None:
    """One datagram to the supervisor; errors are ignored (nobody listening is not fatal)."""
    message = {"kind": kind, "rank": rank, "pid": pid, "host": host_name(), **extra}
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.sendto(json.dumps(message).encode(), address)
    except OSError:
        return


def start_beating(address: tuple[str, int], rank: int) -> threading.Thread:
    """Beat from a daemon thread for as long as the process runs."""

    def beat() -> None:
        host, pid = host_name(), os.getpid()
        message = json.dumps({"kind": "beat", "rank": rank, "pid": pid, "host": host}).encode()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            while True:
                with contextlib.suppress(OSError):  # nobody listening is not fatal
                    sock.sendto(message, address)
                time.sleep(INTERVAL)

    thread = threading.Thread(target=beat, name="toolkit-heartbeat", daemon=True)
    thread.start()
    return thread


@dataclass
class RankRecord:
    """What the supervisor knows about one rank."""

    rank: int
    host: str
    pid: int
    last_beat: float
    ended: bool = False
    status: int | None = None
    """Popen-style exit status from the rank's "end" datagram (None: unknown)."""


class Heartbeats:
    """The supervisor's side: a UDP socket and what each rank said on it."""

    def __init__(self, bind_host: str = "127.0.0.1") -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind((bind_host, 0))
        self._sock.setblocking(False)
        self.ranks: dict[int, RankRecord] = {}
        self.ends: list[RankRecord] = []
        """Ranks in the order their end was reported."""

    def fileno(self) -> int:
        return self._sock.fileno()

    @property
    def port(self) -> int:
        port: int = self._sock.getsockname()[1]
        return port

    def close(self) -> None:
        self._sock.close()

    def drain(self) -> None:
        """Read every datagram that has arrived."""
        now = time.monotonic()
        while True:
            try:
                data = self._sock.recv(_MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            self._record(data, now)

    def _record(self, data: bytes, now: float) -> None:
        try:
            message = json.loads(data)
            kind, rank, pid, host = (message[k] for k in ("kind", "rank", "pid", "host"))
        except (ValueError, TypeError, KeyError):
            return  # not ours
        if not isinstance(rank, int) or not isinstance(pid, int) or not isinstance(host, str):
            return
        record = self.ranks.get(rank)
        if record is None or record.pid != pid:
            record = self.ranks[rank] = RankRecord(rank, host, pid, now)
        if kind == "beat" and not record.ended:
            record.last_beat = now
        elif kind == "end":
            status = message.get("status")
            self.record_end(record, status if isinstance(status, int) else None)

    def record_end(self, record: RankRecord, status: int | None) -> None:
        """The rank ended: first come, first in `ends`; a later report may add the status."""
        if not record.ended:
            record.ended = True
            self.ends.append(record)
        if record.status is None:
            record.status = status

    def mark_ended(self, rank: int) -> None:
        """The supervisor saw the rank end by other means (its own child exited)."""
        record = self.ranks.get(rank)
        if record is not None:
            record.ended = True

    def stalled(self, now: float, timeout: float) -> RankRecord | None:
        """A rank that has beaten, has not ended, and has been silent for over `timeout`."""
        silent = [r for r in self.ranks.values() if not r.ended and now - r.last_beat > timeout]
        return min(silent, key=lambda r: r.last_beat, default=None)

    def first_failure(self) -> RankRecord | None:
        """The first rank whose end was reported as not a clean exit (unknown counts)."""
        return next((r for r in self.ends if r.status != 0), None)
