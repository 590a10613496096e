"""`python -m toolkit.launch.reap JOB_ID STARTED_AT`: stop every process of this user that
carries TOOLKIT_JOB_ID=JOB_ID, then remove the engine files the job left in /dev/shm (created
since STARTED_AT, a time.time(); toolkit.launch.shm_leftovers). The supervisor runs it on each
remote host at the end of a job. STARTED_AT is the supervisor's clock: a host whose clock runs
behind keeps files made in the difference, never removes one a live process maps.

SIGKILL, not SIGTERM: the job is already over (its launcher and its ranks on the supervisor's
host are stopped), and a rank stopped by SIGSTOP or hung in a collective would not act on a
gentler signal. Prints how many processes it stopped.
"""

from __future__ import annotations

import sys

import psutil

from toolkit.launch.shm_leftovers import remove_leftovers
from toolkit.launch.tree import job_processes


def main(argv: list[str]) -> int:
    started_at = _number(argv[1]) if len(argv) == 2 else None
    if started_at is None or not argv[0]:
        print("usage: python -m toolkit.launch.reap JOB_ID STARTED_AT", file=sys.stderr)
        return 2
    processes = job_processes(argv[0])
    for process in processes:
        try:
            process.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(processes, timeout=5)
    removed = remove_leftovers(started_at)
    print(f"stopped {len(processes)} processes of job {argv[0]}, removed {len(removed)} files")
    return 0


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
