"""Helpers for the supervisor tests: the rank script (tests/scripts/supervised_rank.py) under
each launcher, and waiting for its ranks to come up."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from toolkit.launch import LaunchResult
from toolkit.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
RANK_SCRIPT = str(ROOT / "tests" / "scripts" / "supervised_rank.py")
STALL_SCRIPT = str(ROOT / "tests" / "scripts" / "stall_train.py")
ROOT_FLAGS = ["--allow-run-as-root"] if os.getuid() == 0 else []
CONTRACT_SECONDS = 30
"""A failed or stalled job ends well within this (the issue's contract); not a timing test."""
UP_SECONDS = 60


def rank(piddir: Path, action: str, *args: str) -> list[str]:
    return [sys.executable, RANK_SCRIPT, str(piddir), action, *args]


def venv_program(name: str) -> str:
    program = BIN / name
    if not program.exists():
        pytest.skip(f"{program} is not installed")
    return str(program)


def under(launcher: str, command: list[str]) -> list[str]:
    """Two ranks of `command` under a real launcher on this machine."""
    if launcher == "mpirun":
        return ["mpirun", *ROOT_FLAGS, "--oversubscribe", "-np", "2", *command]
    if launcher == "torchrun":
        port = str(free_port())
        argv = [venv_program("torchrun"), "--nproc_per_node", "2", "--master_port", port]
        return [*argv, "--no-python", *command]
    if launcher == "deepspeed":
        argv = [venv_program("deepspeed"), "--num_gpus", "2", "--master_port", str(free_port())]
        return [*argv, "--no_python", "--no_local_rank", *command]
    if launcher == "horovodrun":
        return [venv_program("horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", *command]
    raise ValueError(launcher)


def wait_for_ranks(
    piddir: Path,
    count: int = 2,
    *,
    bound: float = UP_SECONDS,
    job: subprocess.Popen[bytes] | None = None,
    log: Path | None = None,
) -> dict[int, int]:
    """Rank -> pid once every rank has written its pid file. With `job` (the launch running
    them), its end before that fails at once, showing the end of `log`."""
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if job is not None and job.poll() is not None:
            shown = log.read_text()[-3000:] if log is not None else ""
            raise AssertionError(f"the job ended before its ranks came up:\n{shown}")
        texts = {int(p.name): p.read_text() for p in piddir.iterdir() if p.name.isdigit()}
        pids = {rank: int(text) for rank, text in texts.items() if text.strip().isdigit()}
        if len(pids) >= count:
            return pids
        time.sleep(0.1)
    shown = log.read_text()[-3000:] if log is not None else ""
    raise AssertionError(f"{count} ranks did not come up within {bound:g} s\n{shown}")


def start_training_job(
    spec: Path, directory: Path, env: dict[str, str]
) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """`toolkit launch` of tests/scripts/stall_train.py in the background: (the launch, the
    directory where each rank writes its pid once training, the launch's log)."""
    piddir, log = directory / "pids", directory / "job.log"
    piddir.mkdir()
    argv = [str(BIN / "toolkit"), "launch", "--spec", str(spec), "--"]
    with log.open("wb") as sink:
        job = subprocess.Popen(
            [*argv, sys.executable, STALL_SCRIPT, str(piddir), str(spec)],
            cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT,
        )  # fmt: skip
    return job, piddir, log


def in_background(call: Callable[[], LaunchResult]) -> Callable[[], LaunchResult]:
    """Start `call` in a thread; the returned function waits for its result."""
    results: list[LaunchResult] = []
    thread = threading.Thread(target=lambda: results.append(call()), daemon=True)
    thread.start()

    def result() -> LaunchResult:
        thread.join(timeout=120)
        assert results, "the supervisor did not return within 120 s"
        return results[0]

    return result


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def ended(job: subprocess.Popen[bytes], bound: float) -> tuple[int, float]:
    """(status, seconds) of a job that must end by itself within `bound`."""
    started = time.monotonic()
    try:
        return job.wait(timeout=bound), time.monotonic() - started
    finally:
        job.kill()
        job.wait()
