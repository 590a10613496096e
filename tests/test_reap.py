"""`python -m toolkit.launch.reap JOB_ID` stops that job's processes and nothing else, stopped
(SIGSTOP) ones included."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from toolkit.rank_variables import TOOLKIT_JOB_ID


def sleeper(job_id: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "120"], env={**os.environ, TOOLKIT_JOB_ID: job_id})


def test_reap_stops_the_jobs_processes_only() -> None:
    ours, stopped, other = sleeper("job-a"), sleeper("job-a"), sleeper("job-b")
    os.kill(stopped.pid, signal.SIGSTOP)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "toolkit.launch.reap", "job-a"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert ours.wait(timeout=10) == -signal.SIGKILL
        assert stopped.wait(timeout=10) == -signal.SIGKILL
        assert other.poll() is None
        assert done.stdout.strip() == "stopped 2 processes of job job-a"
    finally:
        for process in (ours, stopped, other):
            process.kill()
            process.wait()


def test_reap_without_a_job_id_is_a_usage_error() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "toolkit.launch.reap"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 2
    assert "usage" in done.stderr
