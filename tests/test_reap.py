"""`python -m toolkit.launch.reap JOB_ID STARTED_AT` stops that job's processes and nothing else,
stopped (SIGSTOP) ones included, and removes the /dev/shm files the job left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

from toolkit.launch.remote import reap_command
from toolkit.launch.shm_leftovers import SHM_DIRECTORY
from toolkit.rank_variables import TOOLKIT_JOB_ID


def sleeper(job_id: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "120"], env={**os.environ, TOOLKIT_JOB_ID: job_id})


def test_reap_stops_the_jobs_processes_only() -> None:
    ours, stopped, other = sleeper("job-a"), sleeper("job-a"), sleeper("job-b")
    os.kill(stopped.pid, signal.SIGSTOP)
    try:
        done = subprocess.run(
            reap_command(sys.executable, "job-a", time.time()),
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert ours.wait(timeout=10) == -signal.SIGKILL
        assert stopped.wait(timeout=10) == -signal.SIGKILL
        assert other.poll() is None
        assert done.stdout.strip().startswith("stopped 2 processes of job job-a, removed ")
    finally:
        for process in (ours, stopped, other):
            process.kill()
            process.wait()


def test_reap_removes_the_engine_files_made_since_the_job_started() -> None:
    name = f"deepspeed_allreduce_buffer_toolkit-test-{uuid.uuid4().hex[:8]}"
    older, newer = SHM_DIRECTORY / f"{name}_older", SHM_DIRECTORY / f"{name}_newer"
    older.write_bytes(b"x")  # another job's, from before this one started
    try:
        time.sleep(0.05)
        started_at = time.time()
        # The kernel stamps a file with its coarse clock, up to a tick behind time.time(): a
        # file written at once could read as older than the job (a failed fresh-clone run).
        time.sleep(0.05)
        newer.write_bytes(b"x")
        done = subprocess.run(
            reap_command(sys.executable, "job-c", started_at),
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert not newer.exists() and older.exists()
        # At least ours: another test's job may have left one since `started_at` too.
        assert done.stdout.startswith("stopped 0 processes of job job-c, removed ")
    finally:
        older.unlink(missing_ok=True)
        newer.unlink(missing_ok=True)


def test_reap_without_a_job_id_and_start_is_a_usage_error() -> None:
    for argv in ([], ["job-a"], ["job-a", "yesterday"]):
        done = subprocess.run(
            [sys.executable, "-m", "toolkit.launch.reap", *argv],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 2
        assert "usage" in done.stderr
