"""Run a launcher, or N local ranks, and make sure one failing process ends the whole job.

`run_launcher(argv)` runs a real launcher (mpirun, torchrun, deepspeed, horovodrun, srun) and
`run_local(argv, nprocs)` is the toolkit's own one-machine launcher: it starts `nprocs` copies
of argv, each with TOOLKIT_* variables that `toolkit.launch.environment` reads. Both stream
every line of output as it comes (prefixed with the rank in local mode), and keep the last
`TAIL_LINES` lines for the error report: each local rank's stderr, or the launcher's whole
output (the deepspeed launcher reports a failed rank on stdout).

When a process exits non-zero or dies by a signal, every other one is stopped: SIGTERM, then
SIGKILL after `grace` seconds, to every process group involved and to every descendant seen.
Killing the launcher's process group is not enough: none of the launchers keeps its ranks there.
What each did here with 2 ranks when one rank was SIGKILLed mid-run (Open MPI 4.1.4, torch
2.13, DeepSpeed 0.19.8, Horovod 0.28.1):

- mpirun: each rank in a process group of its own (same session). Aborts the job about a
  second later ("mpirun noticed that process rank 1 ... exited on signal 9 (Killed)"), 137.
- torchrun: each worker in a session of its own. Its default --max-restarts is 0, so it stops
  the other worker and exits 1 with a ChildFailedError naming the killed rank (with restarts
  left it would restart the whole group instead). On SIGTERM it waits up to 30 s for workers.
- deepspeed: ranks stay in the launcher's group. launch.py polls them once a second,
  terminates the rest (waiting up to 30 s) and exits 247 (it calls sys.exit(-9)), logging
  the failure on stdout, not stderr.
- horovodrun --gloo: each rank is `sh -c "env ... CMD"` under a middleman in a new session.
  Stops the other rank and exits 1 with "RuntimeError: Horovod detected that one or more
  processes exited with non-zero status".

So the supervisor lists the whole process table's parent links every POLL_SECONDS and remembers
every descendant it has seen, which finds ranks in other sessions and ranks whose launcher died
and left them to init. A descendant that starts and detaches between two polls would escape;
none of the launchers above does that. If the supervisor itself is SIGKILLed, its ranks survive
(it cannot clean up after that); SIGTERM to it is handled and stops them.

A launcher that never notices its dead rank is caught too: a rank that ended badly and stays an
unreaped zombie for longer than `grace` means its parent is not watching, and the supervisor
tears the job down itself. All four launchers above noticed on their own.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import defaultdict, deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, TextIO

import psutil

from toolkit.errors import ToolkitError
from toolkit.launch.environment import (
    TOOLKIT_LOCAL_RANK,
    TOOLKIT_MASTER_ADDR,
    TOOLKIT_MASTER_PORT,
    TOOLKIT_RANK,
    TOOLKIT_WORLD_SIZE,
)

TAIL_LINES = 20
POLL_SECONDS = 0.2
DEFAULT_GRACE_SECONDS = 5.0
TIMEOUT_RETURNCODE = 124  # what coreutils' timeout returns
_RANK_VARS = frozenset(
    (TOOLKIT_RANK, TOOLKIT_LOCAL_RANK, TOOLKIT_WORLD_SIZE, TOOLKIT_MASTER_ADDR, TOOLKIT_MASTER_PORT)
)


@dataclass(frozen=True)
class LaunchResult:
    """How a launch ended. `returncode` follows the shell: 128 + N for death by signal N."""

    returncode: int
    failed_rank: int | None = None
    """The local rank that failed first (local mode only; a launcher does not say which)."""
    reason: str = ""
    """One line: what ended the job, empty on success."""
    tail: tuple[str, ...] = ()
    """The last stderr lines of the failed rank; in launcher mode the launcher's last lines of
    output (stdout and stderr, which carry its ranks' output too)."""

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def report(self) -> str:
        """The reason followed by the stderr tail, for printing on failure."""
        if self.ok:
            return "launch succeeded"
        lines = [self.reason]
        if self.tail:
            lines.append("last stderr lines:")
            lines += [f"  {line}" for line in self.tail]
        return "\n".join(lines)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on `host` a moment ago (the OS picks it; another process may
    still take it before the rendezvous binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def run_launcher(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    grace: float = DEFAULT_GRACE_SECONDS,
    echo: bool = True,
) -> LaunchResult:
    """Run one launcher command (an argv list, never a shell string) and supervise its tree.
    TOOLKIT_* rank variables are removed from its environment: they come first in detection,
    so ranks of a launch started from inside a toolkit-launched rank would otherwise inherit
    the outer rank's identity."""
    base = {k: v for k, v in (os.environ if env is None else env).items() if k not in _RANK_VARS}
    process = _start(argv, base, rank=None, echo=echo)
    return _supervise([process], timeout, grace)


def run_local(
    argv: Sequence[str],
    nprocs: int,
    *,
    env: Mapping[str, str] | None = None,
    master_addr: str = "127.0.0.1",
    master_port: int | None = None,
    rank_envs: Sequence[Mapping[str, str]] | None = None,
    timeout: float | None = None,
    grace: float = DEFAULT_GRACE_SECONDS,
    echo: bool = True,
) -> LaunchResult:
    """Start `nprocs` copies of argv on this machine, rank i with TOOLKIT_RANK=i etc., and
    supervise them. `rank_envs[i]`, when given, adds rank i's own variables (TF_CONFIG).
    PYTHONUNBUFFERED=1 is set unless given, so that output arrives line by line
    and the stderr tail of a killed rank is not lost in its buffer."""
    if nprocs < 1:
        raise ToolkitError(f"nprocs={nprocs}: must be at least 1.", "start one or more ranks")
    port = free_port(master_addr) if master_port is None else master_port
    base = dict(os.environ if env is None else env)
    base.setdefault("PYTHONUNBUFFERED", "1")
    processes: list[_Process] = []
    try:
        for rank in range(nprocs):
            own = dict(rank_envs[rank]) if rank_envs else {}
            rank_env = (
                base
                | own
                | {
                    TOOLKIT_RANK: str(rank),
                    TOOLKIT_LOCAL_RANK: str(rank),
                    TOOLKIT_WORLD_SIZE: str(nprocs),
                    TOOLKIT_MASTER_ADDR: master_addr,
                    TOOLKIT_MASTER_PORT: str(port),
                }
            )
            processes.append(_start(argv, rank_env, rank=rank, echo=echo))
    except BaseException:
        _Tree(processes).stop(grace)
        raise
    return _supervise(processes, timeout, grace)


@dataclass
class _Process:
    """One process the supervisor started, with its output readers and stderr tail."""

    popen: subprocess.Popen[bytes]
    label: str
    rank: int | None
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    readers: list[threading.Thread] = field(default_factory=list)


_OUTPUT_LOCK = threading.Lock()


def _start(
    argv: Sequence[str], env: Mapping[str, str], *, rank: int | None, echo: bool
) -> _Process:
    """Start one process; `rank` is None for a launcher."""
    if isinstance(argv, str) or not argv:
        raise ValueError(f"argv must be a non-empty list of arguments, not {argv!r}")
    label = os.path.basename(argv[0]) if rank is None else f"rank {rank}"
    try:
        popen = subprocess.Popen(
            list(argv),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except FileNotFoundError:
        raise ToolkitError(
            f"cannot start {argv[0]!r}: no such program.",
            "install it, or put the directory that holds it on PATH",
        ) from None
    process = _Process(popen, label, rank)
    prefix = f"[{label}] " if rank is not None else ""
    assert popen.stdout is not None and popen.stderr is not None  # both are PIPE above
    # A launcher's own messages often go to stdout (deepspeed logs its failures there), so in
    # launcher mode the tail is the whole console; a local rank's tail is its stderr.
    stdout_tail = process.tail if rank is None else None
    streams = ((popen.stdout, "stdout", stdout_tail), (popen.stderr, "stderr", process.tail))
    for pipe, name, tail in streams:
        reader = threading.Thread(
            target=_pump,
            args=(pipe, name, prefix if echo else None, tail),
            name=f"toolkit-{label}-{name}",
            daemon=True,
        )
        reader.start()
        process.readers.append(reader)
    return process


def _pump(pipe: IO[bytes], stream: str, prefix: str | None, tail: deque[str] | None) -> None:
    """Copy lines from a child's pipe to ours (looked up per line, so capture works)."""
    with pipe:
        for raw in iter(pipe.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            if tail is not None:
                tail.append(line)
            if prefix is not None:
                target: TextIO = sys.stdout if stream == "stdout" else sys.stderr
                with _OUTPUT_LOCK:
                    target.write(f"{prefix}{line}\n")
                    target.flush()


def _supervise(processes: list[_Process], timeout: float | None, grace: float) -> LaunchResult:
    tree = _Tree(processes)
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        with _sigterm_recorded() as terminated:
            result, culprit = _watch(processes, tree, deadline, timeout, grace, terminated)
    finally:
        tree.stop(grace)
        for process in processes:
            for reader in process.readers:
                reader.join(timeout=grace)
    if terminated.is_set():
        # The ranks are stopped; now the SIGTERM reaches its real target, this process, with
        # the disposition it had before. Returning a result instead would let a caller that
        # runs many launches (the parity harness) carry on with the next one.
        signal.raise_signal(signal.SIGTERM)
    if culprit is None:
        return result
    # Read the tail only now that the readers are done: the last lines may have been in flight.
    return LaunchResult(result.returncode, result.failed_rank, result.reason, tuple(culprit.tail))


def _watch(
    processes: list[_Process],
    tree: _Tree,
    deadline: float | None,
    timeout: float | None,
    grace: float,
    terminated: threading.Event,
) -> tuple[LaunchResult, _Process | None]:
    """Poll until every process succeeded, one failed, or the deadline passed. Returns the
    result without its tail, and the process whose stderr tail explains it."""
    launcher = processes[0] if processes[0].rank is None else None
    while True:
        for process in processes:
            code = process.popen.poll()
            if code:
                reason = f"{process.label} {_describe_status(code)}"
                return LaunchResult(_shell_code(code), process.rank, reason), process
        if all(process.popen.returncode == 0 for process in processes):
            return LaunchResult(0), None
        tree.refresh()
        # Only in launcher mode: local ranks are polled directly above, and what a rank does
        # with its own subprocesses is the rank's business.
        orphan = tree.unreaped_failure(grace) if launcher is not None else None
        if orphan is not None:
            code, what = orphan
            reason = (
                f"{what} {_describe_status(code)} and {processes[0].label} did not react for "
                f"{grace:g} s; stopped the job"
            )
            return LaunchResult(_shell_code(code), None, reason), launcher
        if terminated.is_set():
            return LaunchResult(128 + signal.SIGTERM, None, "the supervisor got SIGTERM"), None
        if deadline is not None and time.monotonic() > deadline:
            reason = f"timed out after {timeout:g} s"
            return LaunchResult(TIMEOUT_RETURNCODE, None, reason), launcher
        time.sleep(POLL_SECONDS)


@contextmanager
def _sigterm_recorded() -> Iterator[threading.Event]:
    """While supervising from the main thread, SIGTERM (a scheduler or `kill` stopping the
    launch) is recorded instead of ending Python at once: the ranks are in sessions of their
    own, so they would outlive the supervisor. Once they are stopped the signal is raised again
    with the previous handler in place. Other threads cannot install handlers; there the
    default stays."""
    terminated = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield terminated
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: terminated.set())
    try:
        yield terminated
    finally:
        signal.signal(signal.SIGTERM, previous)


def _describe_status(code: int) -> str:
    """Popen's returncode (negative for a signal) as words."""
    if code >= 0:
        return f"exited with status {code}"
    try:
        return f"was killed by {signal.Signals(-code).name}"
    except ValueError:  # a real-time signal has no name
        return f"was killed by signal {-code}"


def _shell_code(code: int) -> int:
    return 128 - code if code < 0 else code


class _Tree:
    """Every process the supervisor started and every descendant it has seen since."""

    def __init__(self, processes: Iterable[_Process]) -> None:
        self._roots = list(processes)
        self._seen: dict[int, psutil.Process] = {}
        self._zombie_since: dict[int, float] = {}

    def refresh(self) -> None:
        """Remember the current descendants of the running roots and of every live process
        seen so far; the latter finds children whose parent was already killed."""
        children: dict[int, list[psutil.Process]] = defaultdict(list)
        for process in psutil.process_iter(["ppid"]):
            children[process.info["ppid"]].append(process)
        parents = [root.popen.pid for root in self._roots if root.popen.poll() is None]
        parents += [process.pid for process in self._live_descendants()]
        visited = set(parents)
        while parents:
            for child in children.get(parents.pop(), []):
                if child.pid in visited:
                    continue
                visited.add(child.pid)
                parents.append(child.pid)
                known = self._seen.get(child.pid)
                if known is None or not _running(known):  # new, or a reused pid
                    self._seen[child.pid] = child

    def unreaped_failure(self, grace: float) -> tuple[int, str] | None:
        """A descendant that ended badly and that its parent has not reaped for `grace`
        seconds: (Popen-style status, description), or None."""
        now = time.monotonic()
        for pid, process in self._seen.items():
            try:
                zombie = process.status() == psutil.STATUS_ZOMBIE
                name = process.name()
            except psutil.Error:
                zombie = False
            if not zombie:
                self._zombie_since.pop(pid, None)
                continue
            since = self._zombie_since.setdefault(pid, now)
            code = _zombie_status(pid)
            if code and now - since >= grace:
                return code, f"process {pid} ({name})"
        return None

    def stop(self, grace: float) -> None:
        """SIGTERM every group and process of the tree, SIGKILL what is left after `grace`."""
        self.refresh()
        self._signal(signal.SIGTERM)
        end = time.monotonic() + grace
        while time.monotonic() < end and self._alive():
            time.sleep(POLL_SECONDS)
        self.refresh()
        if self._alive():
            self._signal(signal.SIGKILL)
        for root in self._roots:
            try:
                root.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                continue
        psutil.wait_procs(self._live_descendants(), timeout=grace)

    def _signal(self, signum: signal.Signals) -> None:
        # Each root leads its own group (start_new_session); a reaped root's group is reached
        # through its surviving members, whose groups are collected below.
        groups = {root.popen.pid for root in self._roots if root.popen.poll() is None}
        descendants = self._live_descendants()
        for process in descendants:
            try:
                groups.add(os.getpgid(process.pid))
            except ProcessLookupError:
                continue
        groups.discard(os.getpgrp())
        for group in groups:
            try:
                os.killpg(group, signum)
            except (ProcessLookupError, PermissionError):
                continue
        for process in descendants:
            try:
                process.send_signal(signum)
            except psutil.Error:
                continue

    def _alive(self) -> bool:
        return any(root.popen.poll() is None for root in self._roots) or bool(
            self._live_descendants()
        )

    def _live_descendants(self) -> list[psutil.Process]:
        return [process for process in self._seen.values() if _running(process)]


def _running(process: psutil.Process) -> bool:
    """Alive and not a zombie; False too when its pid now belongs to another process."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _zombie_status(pid: int) -> int | None:
    """The wait status of an unreaped process as Popen reports it (negative for a signal),
    from field 52 of /proc/<pid>/stat (Linux 3.5+); None where that is unavailable."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
        status = int(fields[49])  # fields[0] is field 3 (state)
    except (OSError, IndexError, ValueError):
        return None
    if status & 0x7F:
        return -(status & 0x7F)
    return (status >> 8) & 0xFF
