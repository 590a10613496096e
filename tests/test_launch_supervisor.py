"""The supervisor with real subprocesses: local ranks, real launchers with a rank SIGKILLed
mid-run, and a launcher that never notices. The one timing bound is the issue's contract: a
failed job ends within 30 seconds."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import psutil
import pytest

from toolkit.errors import ToolkitError
from toolkit.launch import LaunchResult, free_port, run_launcher, run_local

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
CONTRACT_SECONDS = 30
ROOT_FLAGS = ["--allow-run-as-root"] if os.getuid() == 0 else []

pytestmark = pytest.mark.usefixtures("no_orphans")

# A rank that announces itself and then waits to be killed.
SLEEPING_RANK = "import time\nprint('rank up', flush=True)\nwhile True:\n    time.sleep(0.5)\n"


def python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def gone(process: psutil.Process) -> bool:
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_for(find: Callable[[], list[psutil.Process]], count: int) -> list[psutil.Process]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = find()
        if len(found) >= count:
            return found
        time.sleep(0.1)
    raise AssertionError(f"{count} processes did not appear within 60 s")


def ranks_of_this_test() -> list[psutil.Process]:
    """Descendants running SLEEPING_RANK (the launchers' own command lines contain the code
    too, but not as `python -c CODE`)."""
    ranks = []
    for process in psutil.Process().children(recursive=True):
        try:
            if process.cmdline()[1:3] == ["-c", SLEEPING_RANK]:
                ranks.append(process)
        except psutil.Error:
            continue
    return ranks


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
    start = time.monotonic()
    result = run_local(python(code), 2, timeout=120)
    elapsed = time.monotonic() - start
    assert result.returncode == 3, result.report()
    assert result.failed_rank == 1
    assert result.reason == "rank 1 exited with status 3"
    assert result.tail[-1] == "rank 1 is failing now"
    assert elapsed < CONTRACT_SECONDS
    rank0, grandchild = (int(pid) for pid in pids.read_text().split())
    for pid in (rank0, grandchild):
        assert not psutil.pid_exists(pid) or gone(psutil.Process(pid)), f"{pid} survived"


def test_rank_that_ignores_sigterm_is_killed() -> None:
    code = """
        import os, signal, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if os.environ["TOOLKIT_RANK"] == "1":
            time.sleep(1)
            os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(600)
    """
    start = time.monotonic()
    result = run_local(python(code), 2, grace=1, timeout=120)
    assert result.returncode == 128 + signal.SIGSEGV
    assert result.failed_rank == 1
    assert result.reason == "rank 1 was killed by SIGSEGV"
    assert time.monotonic() - start < CONTRACT_SECONDS


def test_timeout_stops_every_rank() -> None:
    result = run_local(python(SLEEPING_RANK), 2, timeout=2, grace=1)
    assert result.returncode == 124
    assert result.reason == "timed out after 2 s"
    assert result.failed_rank is None


def test_sigterm_to_the_supervisor_stops_the_ranks() -> None:
    """A scheduler stopping `toolkit launch` must not orphan ranks in their own sessions."""
    supervisor = f"""
        import sys
        from toolkit.launch import run_local
        result = run_local([sys.executable, "-c", {SLEEPING_RANK!r}], 2)
        print(result.reason, flush=True)
        sys.exit(result.returncode)
    """
    process = subprocess.Popen(python(supervisor), stdout=subprocess.PIPE, text=True)
    try:
        ranks = wait_for(ranks_of_this_test, 2)
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=CONTRACT_SECONDS)
    finally:
        process.kill()
    # The ranks are stopped first; then the SIGTERM ends the supervisor's process as it would
    # have without the supervisor, so a caller cannot carry on as if one launch had failed.
    assert process.returncode == -signal.SIGTERM
    assert "the supervisor got SIGTERM" not in out
    assert all(gone(rank) for rank in ranks)


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


def test_report_names_the_failure_and_its_tail() -> None:
    result = LaunchResult(3, 1, "rank 1 exited with status 3", ("Traceback", "ValueError: x"))
    assert result.report() == (
        "rank 1 exited with status 3\nlast stderr lines:\n  Traceback\n  ValueError: x"
    )
    assert LaunchResult(0).ok


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def kill_one_rank(
    argv: Sequence[str], *, local: bool = False
) -> tuple[LaunchResult, float, list[psutil.Process]]:
    """Run a launcher (or, with `local`, the toolkit's own) with two SLEEPING_RANKs, SIGKILL
    rank process 1 once both are up, and return the result, the seconds from the kill to the
    result, and every process seen."""
    if local:
        result = in_background(lambda: run_local(argv, 2, timeout=120))
    else:
        result = in_background(lambda: run_launcher(argv, timeout=120))
    ranks = wait_for(ranks_of_this_test, 2)
    tree = psutil.Process().children(recursive=True)
    killed_at = time.monotonic()
    ranks[1].send_signal(signal.SIGKILL)
    outcome = result()
    return outcome, time.monotonic() - killed_at, tree


def assert_job_ended(result: LaunchResult, elapsed: float, tree: list[psutil.Process]) -> None:
    assert result.returncode != 0, result.report()
    assert elapsed < CONTRACT_SECONDS, result.report()
    survivors = [p.pid for p in tree if not gone(p)]
    assert not survivors, f"still running: {survivors}"


@pytest.mark.multiproc
def test_local_rank_killed() -> None:
    """The toolkit's own launcher: the supervisor sees rank 1 die by SIGKILL (128 + 9)."""
    result, elapsed, tree = kill_one_rank(python(SLEEPING_RANK), local=True)
    assert_job_ended(result, elapsed, tree)
    assert result.returncode == 137
    assert result.failed_rank is not None


@pytest.mark.multiproc
def test_mpirun_rank_killed() -> None:
    """Open MPI aborts the job on its own: 'mpirun noticed that process rank 1 ... exited on
    signal 9 (Killed)', status 137, about a second after the kill."""
    argv = ["mpirun", *ROOT_FLAGS, "--oversubscribe", "-np", "2", *python(SLEEPING_RANK)]
    result, elapsed, tree = kill_one_rank(argv)
    assert_job_ended(result, elapsed, tree)
    assert result.returncode == 137
    assert any("exited on signal 9" in line for line in result.tail), result.report()


@pytest.mark.multiproc
def test_torchrun_rank_killed() -> None:
    """torchrun's default is --max-restarts 0: the agent stops the other worker and exits 1
    with a ChildFailedError naming the SIGKILLed rank as root cause."""
    argv = [
        str(BIN / "torchrun"),
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
        "--no-python",
        *python(SLEEPING_RANK),
    ]
    result, elapsed, tree = kill_one_rank(argv)
    assert_job_ended(result, elapsed, tree)
    assert any("Signal 9 (SIGKILL)" in line for line in result.tail), result.report()


@pytest.mark.multiproc
def test_deepspeed_rank_killed() -> None:
    """The deepspeed launcher polls once a second, kills the other rank and exits 247 (its
    launch.py calls sys.exit(-9)), logging the failure on stdout."""
    deepspeed = BIN / "deepspeed"
    if not deepspeed.exists():
        pytest.skip(f"{deepspeed} is not installed")
    argv = [
        str(deepspeed),
        "--num_gpus",
        "2",
        "--master_port",
        str(free_port()),
        "--no_python",
        "--no_local_rank",
        *python(SLEEPING_RANK),
    ]
    result, elapsed, tree = kill_one_rank(argv)
    assert_job_ended(result, elapsed, tree)
    assert any("exits with return code = -9" in line for line in result.tail), result.report()


@pytest.mark.multiproc
def test_horovodrun_rank_killed() -> None:
    """horovodrun --gloo runs each rank as `sh -c "env ... CMD"` under a middleman in a new
    session; it notices the dead rank, stops the other and exits 1 with a RuntimeError."""
    horovodrun = BIN / "horovodrun"
    if not horovodrun.exists():
        pytest.skip(f"{horovodrun} is not installed")
    argv = [str(horovodrun), "-np", "2", "-H", "localhost:2", "--gloo", *python(SLEEPING_RANK)]
    result, elapsed, tree = kill_one_rank(argv)
    assert_job_ended(result, elapsed, tree)
    assert any("Exit code: 137" in line for line in result.tail), result.report()


def test_launcher_that_never_reaps_its_dead_rank() -> None:
    """A stand-in for a hung launcher: it starts two ranks and never waits for them. The
    SIGKILLed rank stays a zombie, which the supervisor notices after `grace` seconds."""
    launcher = f"""
        import subprocess, sys, time
        ranks = [subprocess.Popen([sys.executable, "-c", {SLEEPING_RANK!r}]) for _ in range(2)]
        time.sleep(600)
    """
    result, elapsed, tree = kill_one_rank([*python(launcher)])
    assert_job_ended(result, elapsed, tree)
    assert result.returncode == 137
    launcher_name = os.path.basename(sys.executable)
    assert result.reason.endswith(
        f"was killed by SIGKILL and {launcher_name} did not react for 5 s; stopped the job"
    ), result.reason
