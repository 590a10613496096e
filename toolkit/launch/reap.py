"""`python -m toolkit.launch.reap JOB_ID`: stop every process of this user that carries
TOOLKIT_JOB_ID=JOB_ID (run on each remote host by the supervisor at the end of a job).

SIGKILL, not SIGTERM: the job is already over (its launcher and its ranks on the supervisor's
host are stopped), and a rank stopped by SIGSTOP or hung in a collective would not act on a
gentler signal. Prints how many processes it stopped.
"""

from __future__ import annotations

import sys

import psutil

from toolkit.launch.tree import job_processes


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0]:
        print("usage: python -m toolkit.launch.reap JOB_ID", file=sys.stderr)
        return 2
    processes = job_processes(argv[0])
    for process in processes:
        try:
            process.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(processes, timeout=5)
    print(f"stopped {len(processes)} processes of job {argv[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
