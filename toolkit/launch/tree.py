"""Every process of a job, found and stopped, wherever the launcher put it.

Killing the launcher's process group is not enough: none of the launchers keeps its ranks
there. What each did here with 2 ranks (Open MPI 4.1.4, torch 2.13, DeepSpeed 0.19.8,
Horovod 0.28.1):

- mpirun: each rank in a process group of its own (same session).
- torchrun: each worker in a session of its own; on SIGTERM it waits up to 30 s for workers.
- deepspeed: ranks stay in the launcher's group.
- horovodrun --gloo: each rank is `sh -c "env ... CMD"` under a middleman in a new session.

So a `ProcessTree` lists the whole process table's parent links on each `refresh` and remembers
every descendant of its roots it has seen, which finds ranks in other sessions and ranks whose
launcher died and left them to init. A descendant that starts and is orphaned between two
refreshes (a double-forked daemon, or a rank whose launcher died a moment after starting it,
before the next refresh) has no parent link left to the tree: `add_job` finds those by the job
id every process of a job carries in its environment (TOOLKIT_JOB_ID), as Jenkins' process
tree killer finds a build's processes by a cookie in theirs. It reads every process's
/proc/<pid>/environ, so it runs only when a job is stopped, not on each refresh.

A stopped (SIGSTOP) process keeps a SIGTERM pending, so `stop` sends SIGCONT after it; what is
still alive after the grace period gets SIGKILL.
"""

from __future__ import annotations

import os
import signal
import time
from collections import defaultdict

import psutil

from toolkit.rank_variables import TOOLKIT_JOB_ID

_POLL_SECONDS = 0.1
# /proc/<pid>/stat, counted after the command's closing parenthesis (field 3 is index 0).
_STATE, _FLAGS, _EXIT_CODE = 0, 6, 49
_PF_EXITING = 0x4


class ProcessTree:
    """Roots the caller started (or was told about) and every descendant seen since."""

    def __init__(self) -> None:
        self._roots: list[psutil.Process] = []
        self._seen: dict[int, psutil.Process] = {}
        self._zombie_since: dict[int, float] = {}

    def add_root(self, pid: int) -> None:
        try:
            self._roots.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            return

    def add_job(self, job_id: str) -> None:
        """Add as roots this user's processes that carry TOOLKIT_JOB_ID=`job_id`."""
        for process in job_processes(job_id):
            self._roots.append(process)

    def refresh(self) -> list[psutil.Process]:
        """Remember the current descendants of the live roots and of every live process seen
        so far (the latter finds children whose parent was already killed). Returns the ones
        not seen before."""
        children: dict[int, list[psutil.Process]] = defaultdict(list)
        for process in psutil.process_iter(["ppid"]):
            children[process.info["ppid"]].append(process)
        parents = [p.pid for p in self._roots if running(p)] + [p.pid for p in self._live()]
        visited = set(parents)
        new = []
        while parents:
            for child in children.get(parents.pop(), []):
                if child.pid in visited:
                    continue
                visited.add(child.pid)
                parents.append(child.pid)
                known = self._seen.get(child.pid)
                if known is None or not running(known):  # new, or a reused pid
                    self._seen[child.pid] = child
                    new.append(child)
        return new

    def unreaped_failure(self, grace: float) -> tuple[int, psutil.Process] | None:
        """A descendant that ended badly and that its parent has not reaped for `grace`
        seconds: (Popen-style status, process), or None."""
        now = time.monotonic()
        for pid, process in self._seen.items():
            try:
                zombie = process.status() == psutil.STATUS_ZOMBIE
            except psutil.Error:
                zombie = False
            if not zombie:
                self._zombie_since.pop(pid, None)
                continue
            since = self._zombie_since.setdefault(pid, now)
            code = exit_status(pid)
            if code and now - since >= grace:
                return code, process
        return None

    def stop(self, grace: float) -> None:
        """SIGTERM every group and process of the tree (and SIGCONT, for stopped ones),
        SIGKILL what is left after `grace`. Roots that are the caller's children are left
        for the caller to reap."""
        self.refresh()
        self._signal(signal.SIGTERM)
        self._signal(signal.SIGCONT)
        if self._wait(grace):
            return
        self.refresh()
        self._signal(signal.SIGKILL)
        self._wait(grace)

    def alive(self) -> bool:
        return any(running(root) for root in self._roots) or bool(self._live())

    def _wait(self, seconds: float) -> bool:
        end = time.monotonic() + seconds
        while self.alive():
            if time.monotonic() >= end:
                return False
            time.sleep(_POLL_SECONDS)
        return True

    def _signal(self, signum: signal.Signals) -> None:
        # Roots lead groups of their own (start_new_session); a dead root's group is reached
        # through its surviving members, whose groups are collected below.
        live = [p for p in self._roots if running(p)] + self._live()
        groups = set()
        for process in live:
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
        for process in live:
            try:
                process.send_signal(signum)
            except psutil.Error:
                continue

    def _live(self) -> list[psutil.Process]:
        return [process for process in self._seen.values() if running(process)]


def job_processes(job_id: str) -> list[psutil.Process]:
    """This user's processes of job `job_id`, this process and its ancestors excepted."""
    spared = {os.getpid(), *ancestors()}
    found = []
    for process in psutil.process_iter():
        if process.pid in spared:
            continue
        try:
            if process.environ().get(TOOLKIT_JOB_ID) == job_id:
                found.append(process)
        except psutil.Error:
            continue
    return found


def ancestors() -> set[int]:
    """The pids of this process's ancestors, as far up as they can still be read.

    psutil's `Process.parents()` raises when an ancestor ends while it walks them, and the
    watchdog walks them just after its parent, `toolkit launch`, was killed: it died there once
    (a CI run), and left the job's /dev/shm files behind. An ancestor that has ended has no
    process left to spare, and the chain above it is no longer this process's."""
    found: set[int] = set()
    process: psutil.Process | None = psutil.Process()
    while process is not None:
        try:
            process = process.parent()
        except psutil.Error:
            return found
        if process is not None:
            found.add(process.pid)
    return found


def running(process: psutil.Process) -> bool:
    """Alive and not a zombie; False too when its pid now belongs to another process."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def pid_running(pid: int) -> bool:
    try:
        return running(psutil.Process(pid))
    except psutil.Error:
        return False


def exit_status(pid: int) -> int | None:
    """The exit status of a process that is ending or ended but not yet reaped, Popen-style
    (negative for a signal), from /proc/<pid>/stat (Linux 3.5+): the kernel sets it as the
    process starts to exit, before it closes its files. None while it runs, once it is
    reaped, or where /proc does not say."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return parse_exit_status(stat.read())
    except OSError:
        return None


def parse_exit_status(stat: bytes) -> int | None:
    """`exit_status` from the bytes of a /proc/<pid>/stat read (an open one is read faster)."""
    try:
        fields = stat.rpartition(b")")[2].split()
        state, flags, status = fields[_STATE], int(fields[_FLAGS]), int(fields[_EXIT_CODE])
    except (IndexError, ValueError):
        return None
    if state not in (b"Z", b"X") and not flags & _PF_EXITING:
        return None
    if status & 0x7F:
        return -(status & 0x7F)
    return (status >> 8) & 0xFF
