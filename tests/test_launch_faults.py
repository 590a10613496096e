"""Faults end jobs, under the toolkit's own launcher and real ones, with real processes: a
stopped (SIGSTOP) rank ends the job through the heartbeat backstop, a failing rank is named with
its host and its own last lines, exit statuses follow toolkit.launch.outcome, and SIGKILL of
`toolkit launch` itself leaves no rank running. The rank is tests/scripts/supervised_rank.py:
no engine, but it joins the supervisor as `toolkit.init` does."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.supervised import (
    CONTRACT_SECONDS,
    RANK_SCRIPT,
    UP_SECONDS,
    gone,
    in_background,
    rank,
    under,
    wait_for_ranks,
)
from toolkit.launch import LaunchResult, run_launcher, run_local
from toolkit.launch.shm_leftovers import SHM_DIRECTORY
from toolkit.ports import free_port

HOST = socket.gethostname()
STALL_SECONDS = 5.0
AFTER_SIGKILL_SECONDS = 5.0
"""The issue's bound: no rank is left this long after `toolkit launch` is SIGKILLed."""

pytestmark = pytest.mark.usefixtures("no_orphans")


def launch(launcher: str | None, command: list[str], **options: float) -> LaunchResult:
    if launcher is None:
        return run_local(command, 2, timeout=120, **options)
    return run_launcher(under(launcher, command), timeout=120, **options)


def stop_rank_1(launcher: str | None, piddir: Path) -> LaunchResult:
    """SIGSTOP rank 1 once both ranks beat; the job must end by itself."""
    result = in_background(
        lambda: launch(launcher, rank(piddir, "sleep"), stall_timeout=STALL_SECONDS)
    )
    ranks = wait_for_ranks(piddir)
    stopped_at = time.monotonic()
    os.kill(ranks[1], signal.SIGSTOP)
    outcome = result()
    assert time.monotonic() - stopped_at < CONTRACT_SECONDS, outcome.report()
    assert all(gone(pid) for pid in ranks.values())
    return outcome


def assert_stalled(result: LaunchResult) -> None:
    assert result.returncode == 124, result.report()
    assert (result.failed_rank, result.failed_host) == (1, HOST), result.report()
    assert result.reason.startswith(f"rank 1 on host {HOST} stalled (no heartbeat for ")


def test_local_stopped_rank_ends_the_job(tmp_path: Path) -> None:
    assert_stalled(stop_rank_1(None, tmp_path))


@pytest.mark.multiproc
@pytest.mark.parametrize("launcher", ["mpirun", "torchrun"])
def test_stopped_rank_ends_the_job_under_a_launcher(launcher: str, tmp_path: Path) -> None:
    assert_stalled(stop_rank_1(launcher, tmp_path))


def test_a_rank_that_never_beats_is_not_a_stall(tmp_path: Path) -> None:
    """Scripts that do not call toolkit.init are only watched for their exit."""
    code = "import time, sys\ntime.sleep(4)\nsys.exit(0)\n"
    result = run_local([sys.executable, "-c", code], 2, timeout=60, stall_timeout=2.5)
    assert result.ok, result.report()


EXITS = [
    # action, its arguments, the launch's exit status, how the report says the rank ended
    ("fail", ("1", "3"), 1, "exited with status 3"),
    ("raise", ("1",), 1, "exited with status 1"),
]
TAILS = {"fail": "rank 1 is failing now", "raise": "RuntimeError: rank 1 broke"}


@pytest.mark.parametrize(("action", "args", "status", "how"), EXITS)
def test_local_failure_names_the_rank_and_its_lines(
    action: str, args: tuple[str, ...], status: int, how: str, tmp_path: Path
) -> None:
    result = run_local(rank(tmp_path, action, *args), 2, timeout=120)
    assert result.returncode == status, result.report()
    assert result.reason == f"rank 1 on host {HOST} {how}"
    assert result.tail[-1] == TAILS[action], result.report()


@pytest.mark.multiproc
@pytest.mark.parametrize("launcher", ["mpirun", "torchrun"])
@pytest.mark.parametrize(("action", "args", "status", "how"), EXITS)
def test_launcher_failure_names_the_rank_and_its_lines(
    launcher: str, action: str, args: tuple[str, ...], status: int, how: str, tmp_path: Path
) -> None:
    """The report names the rank and its host and shows that rank's own stderr (tagged by the
    rank, sorted out of the launcher's console), whatever the launcher prints."""
    result = launch(launcher, rank(tmp_path, action, *args))
    assert result.returncode == status, result.report()
    assert (result.failed_rank, result.failed_host) == (1, HOST), result.report()
    # The status is read from /proc as the rank exits; a parent that reaps at once can win
    # that race (toolkit.launch.supervisor), and the report then says so.
    unseen = "ended (its exit status was not seen)"
    assert result.reason.startswith(
        (f"rank 1 on host {HOST} {how}; ", f"rank 1 on host {HOST} {unseen}; ")
    ), result.reason
    assert result.tail[-1] == TAILS[action], result.report()
    assert not any("[rank " in line for line in result.tail), result.report()


def toolkit_launch(
    spec: Path, piddir: Path, launcher: str, *action: str
) -> subprocess.Popen[bytes]:
    port = free_port()
    spec.write_text(f"backend: ddp\nlaunch: {{launcher: {launcher}, np: 2, master_port: {port}}}\n")
    argv = [sys.executable, "-m", "toolkit", "launch", "--spec", str(spec)]
    return subprocess.Popen([*argv, "--", RANK_SCRIPT, str(piddir), *(action or ["sleep"])])


def detached_daemons(piddir: Path, count: int = 2) -> list[int]:
    """The pids of the daemons the ranks of `detach` started, once each has written it."""
    files = [piddir / f"detached-{rank}" for rank in range(count)]
    deadline = time.monotonic() + UP_SECONDS
    while not all(file.exists() for file in files):
        assert time.monotonic() < deadline, f"no daemon pid files within {UP_SECONDS} s"
        time.sleep(0.1)
    return [int(file.read_text()) for file in files]


def assert_gone_soon(pids: list[int], what: str) -> None:
    deadline = time.monotonic() + AFTER_SIGKILL_SECONDS
    while time.monotonic() < deadline and not all(gone(pid) for pid in pids):
        time.sleep(0.1)
    survivors = [f"{pid} {command_line(pid)}" for pid in pids if not gone(pid)]
    assert not survivors, f"alive {AFTER_SIGKILL_SECONDS:g} s after {what}: {survivors}"


def command_line(pid: int) -> list[str]:
    """A survivor's command line, or [] if it ended since it was seen alive."""
    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:
        return []


def sigkill_toolkit_launch(launcher: str, tmp_path: Path, *action: str) -> None:
    """SIGKILL `toolkit launch` once its ranks are up (and, for `detach`, their daemons): no
    process it started, nor any daemon, is left."""
    piddir = tmp_path / "pids"
    piddir.mkdir()
    process = toolkit_launch(tmp_path / "spec.yaml", piddir, launcher, *action)
    try:
        ranks = wait_for_ranks(piddir)
        daemons = detached_daemons(piddir) if action[:1] == ("detach",) else []
        tree = psutil.Process(process.pid).children(recursive=True)
    finally:
        process.kill()
        process.wait()
    assert_gone_soon([p.pid for p in tree] + daemons, "SIGKILL")
    assert set(ranks.values()) <= {p.pid for p in tree}


def test_sigkill_of_toolkit_launch_leaves_no_local_rank(tmp_path: Path) -> None:
    sigkill_toolkit_launch("local", tmp_path)


@pytest.mark.multiproc
@pytest.mark.parametrize("launcher", ["torchrun", "mpirun"])
def test_sigkill_of_toolkit_launch_leaves_no_rank_of_a_launcher(
    launcher: str, tmp_path: Path
) -> None:
    """The launcher gets SIGTERM from the kernel (parent-death signal), and the watchdog stops
    its ranks, which torchrun keeps in sessions of their own."""
    sigkill_toolkit_launch(launcher, tmp_path)


@pytest.mark.parametrize("launcher", ["local", pytest.param("mpirun", marks=pytest.mark.multiproc)])
def test_sigkill_of_toolkit_launch_leaves_no_daemon_of_a_rank(
    launcher: str, tmp_path: Path
) -> None:
    """A process that left the job's tree (no parent link to any process of the job) is found
    by the job id in its environment, by the watchdog."""
    sigkill_toolkit_launch(launcher, tmp_path, "detach", "sleep")


def test_a_job_that_ends_stops_the_daemons_of_its_ranks(tmp_path: Path) -> None:
    result = run_local(rank(tmp_path, "detach", "exit"), 2, timeout=120)
    assert result.ok, result.report()
    assert_gone_soon(detached_daemons(tmp_path), "the job ended")


def test_toolkit_launch_exit_status_is_the_rank_convention(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("backend: ddp\nlaunch: {launcher: local, np: 2}\n")
    argv = [sys.executable, "-m", "toolkit", "launch", "--spec", str(spec), "--"]
    done = subprocess.run(
        [*argv, RANK_SCRIPT, str(tmp_path), "fail", "1", "7"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert f"toolkit launch: rank 1 on host {HOST} exited with status 7" in done.stderr


def test_sigkill_of_toolkit_launch_removes_the_shm_files_its_ranks_left(tmp_path: Path) -> None:
    """The supervisor is gone, so its watchdog removes them once the ranks have stopped."""
    name = f"toolkit-test-{os.getpid()}-{time.monotonic_ns()}"
    files = [SHM_DIRECTORY / f"deepspeed_allreduce_buffer_{name}_{rank}" for rank in (0, 1)]
    piddir = tmp_path / "pids"
    piddir.mkdir()
    process = toolkit_launch(tmp_path / "spec.yaml", piddir, "local", "shm", name, "sleep")
    try:
        wait_for_ranks(piddir)
        deadline = time.monotonic() + UP_SECONDS
        while not all(file.exists() for file in files):
            assert time.monotonic() < deadline, f"the ranks wrote no {files}"
            time.sleep(0.1)
        process.kill()
        process.wait()
        deadline = time.monotonic() + 2 * AFTER_SIGKILL_SECONDS
        while any(file.exists() for file in files) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [file for file in files if file.exists()]
    finally:
        process.kill()
        for file in files:
            file.unlink(missing_ok=True)
