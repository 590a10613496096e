"""Shared-memory files a job's engines leave in /dev/shm, removed when the job ends.

DeepSpeed's CPU accelerator loads its shm_comm op in `deepspeed.init_distributed` (a user's own
script runs it; the toolkit's backend turns the op off) and creates
/dev/shm/deepspeed_allreduce_buffer_* of 66 MiB a rank, which it never unlinks; Open MPI's
shared-memory transport leaves its vader_segment.* files when mpirun is killed. Every such job
leaked them (132 MiB a 2-rank DeepSpeed job, seen after each test run here), and a fuller
/dev/shm turns the toolkit's shared-memory allreduce off (`ddp.allreduce` and
`deepspeed.allreduce`: auto) or fails jobs in containers, whose /dev/shm is 64 MiB by default.
When a job's local processes have stopped, the supervisor removes the files it can tell the job
made: named by an engine, owned by this user, created since the job started, and mapped by no
live process (another job's are in use, or older); if the supervisor was killed, its watchdog
does (parent_death.py), and on every other host of the job the remote sweep does (reap.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from toolkit import shm_layout

SHM_DIRECTORY = Path(shm_layout.SHM_DIRECTORY)
DEEPSPEED_BUFFERS = "deepspeed_allreduce_buffer_*"
ENGINE_FILES = (DEEPSPEED_BUFFERS, "vader_segment.*")


def mapped_files(
    directory: Path = SHM_DIRECTORY, processes: Iterable[str] | None = None
) -> set[str]:
    """Paths under `directory` that some live process has mapped (those it may read), or one
    of `processes` (/proc entries: pids, or "self")."""
    prefix = f"{directory}/"
    found: set[str] = set()
    if processes is None:
        processes = filter(str.isdigit, os.listdir("/proc"))
    for pid in processes:
        try:
            with open(f"/proc/{pid}/maps") as maps:
                for line in maps:
                    path = line.split(maxsplit=5)[5:]
                    if path and path[0].startswith(prefix):
                        found.add(path[0].rstrip("\n").removesuffix(" (deleted)"))
        except OSError:  # ended meanwhile, or not ours to read
            continue
    return found


def leftovers(since: float, directory: Path = SHM_DIRECTORY) -> list[Path]:
    """The engine files in `directory` created at or after `since` (a time.time()) by this
    user that no live process maps."""
    candidates = []
    for pattern in ENGINE_FILES:
        for path in directory.glob(pattern):
            try:
                status = path.stat()
            except OSError:
                continue
            if status.st_uid == os.getuid() and status.st_ctime >= since:
                candidates.append(path)
    if not candidates:
        return []
    in_use = mapped_files(directory)
    return sorted(path for path in candidates if str(path) not in in_use)


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
