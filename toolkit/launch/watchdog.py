"""`python -m toolkit.launch.watchdog`: stops a job whose supervisor died (parent_death.py).

Reads pids from stdin, one per line. "done" means the supervisor finished normally: exit. End
of file without it means the supervisor is gone: stop every process named and every
descendant of theirs, then exit.
"""

from __future__ import annotations

import signal
import sys

from toolkit.launch.parent_death import WATCHDOG_GRACE_SECONDS
from toolkit.launch.tree import ProcessTree


def main() -> int:
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    tree = ProcessTree()
    for line in sys.stdin.buffer:
        word = line.strip()
        if word == b"done":
            return 0
        if word.isdigit():
            tree.add_root(int(word))
    tree.stop(WATCHDOG_GRACE_SECONDS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
