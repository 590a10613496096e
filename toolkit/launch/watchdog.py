"""`python -m toolkit.launch.watchdog`: stops a job whose supervisor died (parent_death.py).

Reads pids from stdin, one per line. "done" means the supervisor finished normally: exit. End
of file without it means the supervisor is gone: stop every process named, every descendant
of theirs and every process carrying the job's id (the first argument), remove the engine
files the job left in /dev/shm (created since the second argument, a time.time()), then exit.
"""

from __future__ import annotations

import signal
import sys

from toolkit.launch.parent_death import WATCHDOG_GRACE_SECONDS
from toolkit.launch.shm_leftovers import remove_leftovers
from toolkit.launch.tree import ProcessTree


def main(job_id: str, started_at: str) -> int:
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    tree = ProcessTree()
    for line in sys.stdin.buffer:
        word = line.strip()
        if word == b"done":
            return 0
        if word.isdigit():
            tree.add_root(int(word))
    tree.add_job(job_id)
    tree.stop(WATCHDOG_GRACE_SECONDS)
    remove_leftovers(float(started_at))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
