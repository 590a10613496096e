"""Shared-memory files a job's engines leave in /dev/shm, removed when the job ends.

DeepSpeed's CPU accelerator loads its shm_comm op in `deepspeed.init_distributed` and creates
a /dev/shm/deepspeed_allreduce_buffer_* file per rank, which it never unlinks, so every such job
leaks one per rank (sizes: docs/faults.md). Open MPI's shared-memory transport leaves its
vader_segment.* files when mpirun is killed. `horovodrun --gloo` makes a multiprocessing Event
per rank in the spawn context (safe_shell_exec.execute), five named semaphores each
(/dev/shm/sem.mp-*), which Python unlinks only when horovodrun exits normally or its resource
tracker outlives it: SIGKILLed with its tracker it leaves them. In a process that has imported
joblib (TensorFlow's import can bring it in) they are named sem.loky-PID-*: joblib's loky
renames every multiprocessing semaphore. A fuller /dev/shm fails jobs in containers, whose
/dev/shm is 64 MiB by default.
When a job's local processes have stopped, the supervisor removes the files it can tell the job
made: named by an engine, owned by this user, created since the job started, and mapped by no
live process (another job's are in use, or older); if the supervisor was killed, its watchdog
does (parent_death.py), and on every other host of the job the remote sweep does (reap.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

SHM_DIRECTORY = Path("/dev/shm")
DEEPSPEED_BUFFERS = "deepspeed_allreduce_buffer_*"
PYTHON_SEMAPHORES = ("sem.mp-*", "sem.loky-*")
ENGINE_FILES = (DEEPSPEED_BUFFERS, "vader_segment.*", *PYTHON_SEMAPHORES)


def _mappings(directory: Path, processes: Iterable[str] | None) -> Iterator[tuple[str, int]]:
    """(path, inode) of each mapping of a file under `directory` by a live process, or by one
    of `processes` (/proc entries: pids, or "self")."""
    prefix = f"{directory}/"
    if processes is None:
        processes = filter(str.isdigit, os.listdir("/proc"))
    for pid in processes:
        try:
            with open(f"/proc/{pid}/maps") as maps:
                lines = maps.readlines()
        except OSError:  # ended meanwhile, or not ours to read
            continue
        for line in lines:
            fields = line.split(maxsplit=5)  # address perms offset device inode path
            if len(fields) == 6 and fields[5].startswith(prefix):
                yield fields[5].rstrip("\n").removesuffix(" (deleted)"), int(fields[4])


def mapped_files(
    directory: Path = SHM_DIRECTORY, processes: Iterable[str] | None = None
) -> set[str]:
    """Paths under `directory` that some live process has mapped (those it may read), or one
    of `processes` (/proc entries: pids, or "self")."""
    return {path for path, _ in _mappings(directory, processes)}


def mapped_inodes(
    directory: Path = SHM_DIRECTORY, processes: Iterable[str] | None = None
) -> set[int]:
    """The inodes of the files under `directory` that some live process has mapped.

    By inode, not by path, because a file can be mapped under a name it no longer has: glibc's
    sem_open maps a temporary /dev/shm/sem.XXXXXX, links it to the semaphore's name and
    unlinks the temporary one, so /proc/PID/maps of every process using a named semaphore
    shows a path that does not exist (and none shows sem.mp-*)."""
    return {inode for _, inode in _mappings(directory, processes)}


def unused_files(
    paths: Iterable[Path], directory: Path = SHM_DIRECTORY, since: float = 0.0
) -> list[Path]:
    """Those of `paths` (files in `directory`) that this user created at or after `since` (a
    time.time()) and that no live process maps."""
    candidates: dict[Path, int] = {}
    for path in paths:
        try:
            status = path.stat()
        except OSError:  # removed meanwhile
            continue
        if status.st_uid == os.getuid() and status.st_ctime >= since:
            candidates[path] = status.st_ino
    if not candidates:
        return []
    in_use = mapped_inodes(directory)
    return sorted(path for path, inode in candidates.items() if inode not in in_use)


def leftovers(since: float, directory: Path = SHM_DIRECTORY) -> list[Path]:
    """The engine files in `directory` created at or after `since` (a time.time()) by this
    user that no live process maps."""
    found = (path for pattern in ENGINE_FILES for path in directory.glob(pattern))
    return unused_files(found, directory, since)


def remove_leftovers(since: float, directory: Path = SHM_DIRECTORY) -> list[Path]:
    """Remove `leftovers(since)`; the paths removed."""
    removed = []
    for path in leftovers(since, directory):
        try:
            path.unlink()
        except OSError:
            continue
        removed.append(path)
    return removed
