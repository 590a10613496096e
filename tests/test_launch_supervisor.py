"""The supervisor with real subprocesses: local ranks that succeed, fail, ignore SIGTERM or run
past the timeout; signals to the supervisor; real launchers with a rank SIGKILLed mid-run; and
a launcher that never notices. The one timing bound is the issue's contract: a failed job ends
within 30 seconds. Stalls, exit statuses and naming under each launcher: test_launch_faults.py."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from tests.supervised import (
    CONTRACT_SECONDS,
    gone,
    in_background,
    rank,
    under,
    wait_for_ranks,
)
from toolkit.errors import ToolkitError
from toolkit.launch import LaunchResult, run_launcher, run_local
from toolkit.ports import free_port

HOST = socket.gethostname()

pytestmark = pytest.mark.usefixtures("no_orphans")


def python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def test_two_local_ranks_succeed(capfd: pytest.CaptureFixture[str]) -> None:
    code = """
        import os, sys
        print("hello from", os.environ["TOOLKIT_RANK"], "of", os.environ["TOOLKIT_WORLD_SIZE"])
        print("to stderr", file=sys.stderr)
    """
    result = run_local(python(code), 2, timeout=60)
    out, err = capfd.readouterr()
    assert result == LaunchResult(0), err
    assert "[rank 0] hello from 0 of 2" in out
    assert "[rank 1] hello from 1 of 2" in out
    assert "[rank 1] to stderr" in err


def test_failing_rank_stops_the_others(tmp_path: Path) -> None:
    """Rank 1 exits 3 while rank 0 sleeps, with a grandchild in a session of its own that only
    descendant tracking can find."""
    pids = tmp_path / "pids"
    code = f"""
        import os, subprocess, sys, time
        rank = int(os.environ["TOOLKIT_RANK"])
        if rank == 1:
            time.sleep(1)
            print("rank 1 is failing now", file=sys.stderr)
            sys.exit(3)
        child = subprocess.Popen(["sleep", "600"], start_new_session=True)
        with open({str(pids)!r}, "w") as f:
            f.write(f"{{os.getpid()}} {{child.pid}}")
        time.sleep(600)
    """
    result = run_local(python(code), 2, timeout=120)
    assert result.returncode == 1, result.report()
    assert (result.failed_rank, result.failed_host) == (1, HOST)
    assert result.reason == f"rank 1 on host {HOST} exited with status 3"
    assert result.tail[-1] == "rank 1 is failing now"
    rank0, grandchild = (int(pid) for pid in pids.read_text().split())
    assert gone(rank0) and gone(grandchild)


def test_rank_that_ignores_sigterm_is_killed() -> None:
    code = """
        import os, signal, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if os.environ["TOOLKIT_RANK"] == "1":
            time.sleep(1)
            os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(600)
    """
    result = run_local(python(code), 2, grace=1, timeout=120)
    assert result.returncode == 128 + signal.SIGSEGV
    assert result.failed_rank == 1
    assert result.reason == f"rank 1 on host {HOST} was killed by SIGSEGV"


def test_timeout_stops_every_rank(tmp_path: Path) -> None:
    result = run_local(rank(tmp_path, "sleep"), 2, timeout=2, grace=1)
    assert result.returncode == 124
    assert result.reason == "timed out after 2 s"
    assert result.failed_rank is None
    assert all(gone(pid) for pid in wait_for_ranks(tmp_path).values())


def supervise_in_subprocess(piddir: Path) -> subprocess.Popen[str]:
    """A supervisor in the main thread of a process of its own, as `toolkit launch` runs."""
    supervisor = f"""
        import sys
        from toolkit.launch import run_local
        result = run_local({rank(piddir, "sleep")!r}, 2)
        print(result.returncode, result.reason, flush=True)
        sys.exit(result.returncode)
    """
    return subprocess.Popen(python(supervisor), stdout=subprocess.PIPE, text=True)


def test_sigterm_to_the_supervisor_stops_the_ranks(tmp_path: Path) -> None:
    """A scheduler stopping `toolkit launch` must not orphan ranks in their own sessions."""
    process = supervise_in_subprocess(tmp_path)
    try:
        ranks = wait_for_ranks(tmp_path)
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=CONTRACT_SECONDS)
    finally:
        process.kill()
    # The ranks are stopped first; then the SIGTERM ends the supervisor's process as it would
    # have without the supervisor, so a caller cannot carry on as if one launch had failed.
    assert process.returncode == -signal.SIGTERM
    assert "the supervisor got SIGTERM" not in out
    assert all(gone(pid) for pid in ranks.values())


def test_ctrl_c_stops_the_ranks_and_exits_130(tmp_path: Path) -> None:
    process = supervise_in_subprocess(tmp_path)
    try:
        ranks = wait_for_ranks(tmp_path)
        process.send_signal(signal.SIGINT)
        out, _ = process.communicate(timeout=CONTRACT_SECONDS)
    finally:
        process.kill()
    assert process.returncode == 130, out
    assert out.splitlines()[-1] == "130 interrupted; stopped every rank"
    assert all(gone(pid) for pid in ranks.values())


def test_launcher_ranks_do_not_inherit_toolkit_rank_variables(
    capfd: pytest.CaptureFixture[str],
) -> None:
    outer_rank = {"TOOLKIT_RANK": "1", "TOOLKIT_WORLD_SIZE": "2", "TOOLKIT_LOCAL_RANK": "1"}
    probe = [sys.executable, "-m", "toolkit.launch.probe"]
    result = run_launcher(probe, env=os.environ | outer_rank, timeout=60)
    out, err = capfd.readouterr()
    assert result.ok, err
    assert '"launcher": "local"' not in out


def test_shell_strings_are_refused() -> None:
    with pytest.raises(ValueError, match="must be a non-empty list of arguments"):
        run_launcher("mpirun -np 2 python train.py")


def test_missing_program_is_a_user_error() -> None:
    with pytest.raises(ToolkitError, match="cannot start 'no-such-launcher'"):
        run_launcher(["no-such-launcher", "-np", "2"])


def test_report_names_the_failure_and_both_tails() -> None:
    result = LaunchResult(
        1, 1, "h", "rank 1 on host h exited with status 3", ("ValueError: x",), ("mpirun: bad",)
    )
    assert result.report() == (
        "rank 1 on host h exited with status 3\n"
        "last stderr lines of rank 1:\n  ValueError: x\n"
        "last lines of the launcher:\n  mpirun: bad"
    )
    assert LaunchResult(0).ok


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def kill_rank_1(argv: list[str], piddir: Path, *, local: bool = False) -> LaunchResult:
    """Run two ranks of the rank script under a launcher (or the toolkit's own), SIGKILL rank
    1 once both are up, and check that the job ended with nothing left running. Processes
    that were already running (the session's test-cluster daemons) are not the job's."""
    before = {child.pid for child in psutil.Process().children(recursive=True)}
    if local:
        result = in_background(lambda: run_local(argv, 2, timeout=120))
    else:
        result = in_background(lambda: run_launcher(argv, timeout=120))
    ranks = wait_for_ranks(piddir)
    tree = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    os.kill(ranks[1], signal.SIGKILL)
    outcome = result()
    survivors = [p.pid for p in tree if not gone(p.pid)]
    assert not survivors, f"still running: {survivors}"
    return outcome


def test_local_rank_killed(tmp_path: Path) -> None:
    result = kill_rank_1(rank(tmp_path, "sleep"), tmp_path, local=True)
    assert result.returncode == 137, result.report()
    assert result.reason == f"rank 1 on host {HOST} was killed by SIGKILL"


@pytest.mark.multiproc
def test_mpirun_rank_killed(tmp_path: Path) -> None:
    """Open MPI aborts the job on its own: 'mpirun noticed that process rank 1 ... exited on
    signal 9 (Killed)', status 137, about a second after the kill."""
    result = kill_rank_1(under("mpirun", rank(tmp_path, "sleep")), tmp_path)
    assert (result.returncode, result.failed_rank) == (137, 1), result.report()
    assert result.reason.startswith(f"rank 1 on host {HOST} was killed by SIGKILL")
    assert any("exited on signal 9" in line for line in result.launcher_tail), result.report()


@pytest.mark.multiproc
def test_torchrun_rank_killed(tmp_path: Path) -> None:
    """torchrun's default is --max-restarts 0: the agent stops the other worker and exits 1
    with a ChildFailedError naming the SIGKILLed rank as root cause."""
    result = kill_rank_1(under("torchrun", rank(tmp_path, "sleep")), tmp_path)
    assert (result.returncode, result.failed_rank) == (137, 1), result.report()
    assert any("Signal 9 (SIGKILL)" in line for line in result.launcher_tail), result.report()


@pytest.mark.multiproc
def test_deepspeed_rank_killed(tmp_path: Path) -> None:
    """The deepspeed launcher polls once a second, kills the other rank and exits 247 (its
    launch.py calls sys.exit(-9)); it reports only pids, the supervisor names the rank."""
    result = kill_rank_1(under("deepspeed", rank(tmp_path, "sleep")), tmp_path)
    assert (result.returncode, result.failed_rank) == (137, 1), result.report()
    assert result.reason.startswith(f"rank 1 on host {HOST} was killed by SIGKILL")


@pytest.mark.multiproc
def test_horovodrun_rank_killed(tmp_path: Path) -> None:
    """horovodrun --gloo runs each rank under a shell that reaps it at once, so the rank's
    status is seen only when its end report wins that race; the rank is named either way."""
    result = kill_rank_1(under("horovodrun", rank(tmp_path, "sleep")), tmp_path)
    assert result.failed_rank == 1, result.report()
    assert result.returncode in (137, 1), result.report()
    assert result.reason.startswith(f"rank 1 on host {HOST} "), result.reason


def test_launcher_that_never_reaps_its_dead_rank(tmp_path: Path) -> None:
    """A stand-in for a hung launcher: it starts two ranks that do not join the supervisor
    and never waits for them. The SIGKILLed rank stays a zombie, which the supervisor notices
    after `grace` seconds."""
    sleeper = "import time\nwhile True: time.sleep(0.5)\n"
    launcher = f"""
        import subprocess, sys, time
        ranks = [subprocess.Popen([sys.executable, "-c", {sleeper!r}]) for _ in range(2)]
        with open({str(tmp_path / "1")!r}, "w") as f:
            f.write(str(ranks[1].pid))
        open({str(tmp_path / "0")!r}, "w").write(str(ranks[0].pid))
        time.sleep(600)
    """
    result = kill_rank_1(python(launcher), tmp_path)
    assert result.returncode == 137
    launcher_name = os.path.basename(sys.executable)
    assert result.reason.endswith(
        f"was killed by SIGKILL and {launcher_name} did not react for 5 s; stopped the job"
    ), result.reason
