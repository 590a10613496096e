"""Detection under the real launchers: `python -m toolkit.launch.probe` started with 2 processes
by each launcher, every rank's description checked. Runs through the supervisor, so a hung
launcher is stopped after 60 s and takes no rank with it; its output is in the failure."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from toolkit.launch import run_launcher, run_local
from toolkit.ports import free_port

BIN = Path(sys.executable).parent
PROBE = [sys.executable, "-m", "toolkit.launch.probe"]
ROOT_FLAGS = ["--allow-run-as-root"] if os.getuid() == 0 else []

pytestmark = [pytest.mark.multiproc, pytest.mark.usefixtures("no_orphans")]


def venv_program(name: str) -> str:
    """A launcher installed next to this Python; skip only when it is absent."""
    program = BIN / name
    if not program.exists():
        pytest.skip(f"{program} is not installed")
    return str(program)


def probe_reports(out: str) -> list[dict[str, Any]]:
    """The probe's JSON lines, whatever prefix the launcher put before them."""
    reports = []
    for line in out.splitlines():
        start = line.find('{"')
        if start >= 0 and '"launcher"' in line:
            reports.append(json.loads(line[start:]))
    return reports


def assert_two_ranks(
    capfd: pytest.CaptureFixture[str], returncode: int, report: str, launcher: str
) -> None:
    out, err = capfd.readouterr()
    context = f"{report}\n--- stdout ---\n{out}\n--- stderr ---\n{err}"
    assert returncode == 0, context
    reports = probe_reports(out)
    assert sorted(r["rank"] for r in reports) == [0, 1], context
    for r in reports:
        assert r["launcher"] == launcher, context
        assert (r["world_size"], r["local_world_size"], r["node_rank"]) == (2, 2, 0), context
        assert r["local_rank"] == r["rank"], context


def launch(argv: list[str]) -> tuple[int, str]:
    result = run_launcher(argv, timeout=60)
    return result.returncode, result.report()


def test_toolkit_local_launcher(capfd: pytest.CaptureFixture[str]) -> None:
    result = run_local(PROBE, 2, timeout=60)
    assert_two_ranks(capfd, result.returncode, result.report(), "local")


def test_mpirun(capfd: pytest.CaptureFixture[str]) -> None:
    argv = ["mpirun", *ROOT_FLAGS, "--oversubscribe", "-np", "2", *PROBE]
    assert_two_ranks(capfd, *launch(argv), "openmpi")


def test_torchrun(capfd: pytest.CaptureFixture[str]) -> None:
    torchrun = venv_program("torchrun")
    argv = [torchrun, "--nproc_per_node", "2", "--master_port", str(free_port()), "--no-python"]
    assert_two_ranks(capfd, *launch([*argv, *PROBE]), "torchrun")


def test_deepspeed(capfd: pytest.CaptureFixture[str]) -> None:
    """On a machine without a GPU the launcher counts one device per NUMA node (or LOCAL_SIZE);
    --num_gpus 2 overrides that. It puts --local_rank=N right after the program, so a module
    goes through --module (with --no_python, `python --local_rank=0 -m ...` fails); the probe
    checks that argument against LOCAL_RANK."""
    deepspeed = venv_program("deepspeed")
    argv = [deepspeed, "--num_gpus", "2", "--master_port", str(free_port()), "--module"]
    assert_two_ranks(capfd, *launch([*argv, "toolkit.launch.probe"]), "deepspeed")


def test_horovodrun_gloo(capfd: pytest.CaptureFixture[str]) -> None:
    horovodrun = venv_program("horovodrun")
    argv = [horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", *PROBE]
    assert_two_ranks(capfd, *launch(argv), "horovodrun")


def test_horovodrun_mpi(capfd: pytest.CaptureFixture[str]) -> None:
    """horovodrun --mpi sets no HOROVOD_RANK: its ranks are plain Open MPI processes."""
    horovodrun = venv_program("horovodrun")
    argv = [horovodrun, "-np", "2", "-H", "localhost:2", "--mpi", *PROBE]
    assert_two_ranks(capfd, *launch(argv), "openmpi")
