"""Output under the supervisor: prefixes at every line start (after "\\n" and "\\r"), tails that
keep what a terminal would show, tagged launcher lines sorted by rank, the exit-status
convention, and a progress bar that reaches the console while its rank is still running."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.supervised import rank, under
from toolkit.launch.heartbeat import Heartbeats
from toolkit.launch.outcome import describe_status, exit_code
from toolkit.launch.output import LauncherTails, Lines, Prefixer
from toolkit.launch.tree import parse_exit_status


@pytest.mark.parametrize(
    ("chunks", "expected"),
    [
        (["a\nb\n"], "[r] a\n[r] b\n"),
        (["\rstep 1", "\rstep 2", "\n"], "\r[r] step 1\r[r] step 2\n"),
        (["par", "tial\nnext"], "[r] partial\n[r] next"),
        (["a\r\nb"], "[r] a\r\n[r] b"),
        (["\n\n"], "\n\n"),
    ],
)
def test_prefix_goes_at_every_line_start(chunks: list[str], expected: str) -> None:
    prefix = Prefixer("[r] ")
    assert "".join(prefix(chunk) for chunk in chunks) == expected


@pytest.mark.parametrize(
    ("chunks", "lines"),
    [
        (["a\nb\n"], ["a", "b"]),
        (["\r10%", "\r50%", "\r100%\n", "done\n"], ["100%", "done"]),
        (["a\r\n"], ["a"]),
        (["no newline at the end"], ["no newline at the end"]),
        (["\r 45%|####"], [" 45%|####"]),
    ],
)
def test_lines_keep_what_a_terminal_shows(chunks: list[str], lines: list[str]) -> None:
    found: list[str] = []
    assembler = Lines(found.append)
    for chunk in chunks:
        assembler.feed(chunk)
    assembler.finish()
    assert found == lines


def test_launcher_lines_are_sorted_by_rank_tag() -> None:
    tails = LauncherTails()
    tails.line("[rank 1] Traceback (most recent call last):", "stderr")
    tails.line("[1]<stderr>:[rank 1] RuntimeError: broke", "stderr")  # horovodrun's prefix too
    tails.line("[rank 0] loss 0.5", "stdout")  # a rank's stdout is not its stderr tail
    tails.line("mpirun noticed that process rank 1 exited", "stderr")
    assert tails.of_rank(1) == ("Traceback (most recent call last):", "RuntimeError: broke")
    assert tails.of_rank(0) == ()
    assert tails.of_launcher() == ("mpirun noticed that process rank 1 exited",)


@pytest.mark.parametrize(
    ("status", "code", "words"),
    [
        (0, 0, "exited with status 0"),
        (3, 1, "exited with status 3"),
        (-9, 137, "was killed by SIGKILL"),
        (-11, 139, "was killed by SIGSEGV"),
        (None, 1, "ended (its exit status was not seen)"),
    ],
)
def test_exit_status_convention(status: int | None, code: int, words: str) -> None:
    assert (exit_code(status), describe_status(status)) == (code, words)


def stat_line(state: str, flags: int, exit_code: int) -> bytes:
    """A /proc/<pid>/stat line with the fields the reader uses (3: state, 9: flags, 52)."""
    fields = [state, *["0"] * 5, str(flags), *["0"] * 42, str(exit_code)]
    return b"123 (a (tricky) name) " + " ".join(fields).encode()


@pytest.mark.parametrize(
    ("stat", "status"),
    [
        (stat_line("S", 0, 0), None),  # running
        (stat_line("R", 0x4, 3 << 8), 3),  # exiting with status 3
        (stat_line("Z", 0, 9), -9),  # a zombie killed by SIGKILL
        (b"garbage", None),
    ],
)
def test_exit_status_from_proc(stat: bytes, status: int | None) -> None:
    assert parse_exit_status(stat) == status


def test_heartbeats_name_a_silent_rank_and_skip_ended_ones() -> None:
    beats = Heartbeats()
    try:
        beats._record(b'{"kind": "beat", "rank": 0, "pid": 10, "host": "a"}', now=0.0)
        beats._record(b'{"kind": "beat", "rank": 1, "pid": 11, "host": "b"}', now=0.0)
        beats._record(b'{"kind": "beat", "rank": 0, "pid": 10, "host": "a"}', now=9.0)
        beats._record(b"not json", now=9.0)
        stalled = beats.stalled(now=10.0, timeout=5.0)
        assert stalled is not None and (stalled.rank, stalled.host) == (1, "b")
        beats._record(b'{"kind": "end", "rank": 1, "pid": 11, "host": "b", "status": -9}', 9.5)
        assert beats.stalled(now=10.0, timeout=5.0) is None
        failed = beats.first_failure()
        assert failed is not None and (failed.rank, failed.status) == (1, -9)
    finally:
        beats.close()


def read_until(process: subprocess.Popen[bytes], marker: bytes, seconds: float = 60) -> bytes:
    """What the process wrote to stderr up to `marker`, read as it comes."""
    assert process.stderr is not None
    seen = b""
    deadline = time.monotonic() + seconds
    while marker not in seen:
        assert time.monotonic() < deadline, f"no {marker!r} within {seconds} s: {seen!r}"
        ready, _, _ = select.select([process.stderr], [], [], 1)
        if ready:
            chunk = os.read(process.stderr.fileno(), 65536)
            assert chunk, f"stderr closed before {marker!r}: {seen!r}"
            seen += chunk
    return seen


def supervise(command: list[str], launcher: str | None) -> subprocess.Popen[bytes]:
    call = f"run_local({command!r}, 2)" if launcher is None else f"run_launcher({command!r})"
    code = f"import sys\nfrom toolkit.launch import *\nsys.exit({call}.returncode)\n"
    return subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, bufsize=0)


@pytest.mark.usefixtures("no_orphans")
def test_progress_redraws_pass_through_live(tmp_path: Path) -> None:
    process = supervise(rank(tmp_path, "progress"), None)
    try:
        seen = read_until(process, b"step 2/3")
        assert b"\r[rank 0] step 0/3\r[rank 0] step 1/3\r[rank 0] step 2/3" in seen, seen
        assert process.poll() is None, "the bar must show while its rank runs"
    finally:
        process.terminate()
        process.wait(timeout=60)


@pytest.mark.multiproc
@pytest.mark.usefixtures("no_orphans")
def test_progress_redraws_pass_through_live_under_torchrun(tmp_path: Path) -> None:
    """Under a launcher the rank tags its own lines, carriage returns included."""
    process = supervise(under("torchrun", rank(tmp_path, "progress")), "torchrun")
    try:
        seen = read_until(process, b"step 2/3")
        assert b"\r[rank 0] step 1/3\r[rank 0] step 2/3" in seen, seen
        assert process.poll() is None, "the bar must show while its rank runs"
    finally:
        process.terminate()
        process.wait(timeout=60)


@pytest.mark.usefixtures("no_orphans")
def test_report_starts_on_a_line_of_its_own_after_a_bar(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("backend: ddp\nlaunch: {launcher: local, np: 2}\n")
    argv = [sys.executable, "-m", "toolkit", "launch", "--spec", str(spec), "--timeout", "3"]
    done = subprocess.run(
        [*argv, "--", *rank(tmp_path, "progress")[1:]], capture_output=True, timeout=120
    )
    assert done.returncode == 124, done.stderr
    assert b"\r[rank 0] step 2/3\ntoolkit launch: timed out after 3 s\n" in done.stderr
