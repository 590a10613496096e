"""`toolkit doctor` on the real stack, in a real environment without Horovod, and with a
broken one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import venv
from pathlib import Path

import pytest

from toolkit.doctor.checks import DoctorReport, resolve_engines
from toolkit.doctor.format import format_report
from toolkit.doctor.probe_protocol import ProbeReport, Problem

ROOT = Path(__file__).resolve().parent.parent
ALL_ENGINES = {"torch", "tensorflow", "mpi", "deepspeed", "horovod"}


def run_doctor(
    python: str, *args: str, extra_path: Path | None = None
) -> subprocess.CompletedProcess[str]:
    pythonpath = [str(ROOT)] + ([str(extra_path)] if extra_path else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(pythonpath)}
    return subprocess.run(
        [python, "-m", "toolkit", "doctor", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A fresh virtual environment with no engine in it: the toolkit's core needs only stdlib."""
    env_dir = tmp_path_factory.mktemp("bare-venv")
    venv.EnvBuilder(with_pip=False).create(env_dir)
    return str(env_dir / "bin" / "python")


def test_aliases_fold_to_engines_in_stable_order() -> None:
    assert resolve_engines(["horovod", "ddp", "tf"]) == ["torch", "horovod", "tensorflow"]
    assert set(resolve_engines([])) == ALL_ENGINES


def test_format_names_the_problem_and_its_fix() -> None:
    broken = ProbeReport("horovod", installed=False, problems=[Problem("gone", "make setup")])
    text = format_report(DoctorReport(python="py", engines=[broken], launchers={"srun": None}))
    assert "MISSING" in text and "FIX: make setup" in text and "srun       not found" in text


def test_real_stack_reports_every_engine_and_passes() -> None:
    done = run_doctor(sys.executable, "--json")
    report = json.loads(done.stdout)
    assert done.returncode == 0, json.dumps(report, indent=2) + done.stderr
    engines = {engine["engine"]: engine for engine in report["engines"]}
    assert set(engines) == ALL_ENGINES
    assert all(engine["version"] for engine in engines.values())
    horovod = engines["horovod"]["details"]
    assert set(horovod["frameworks"]) == {"pytorch", "tensorflow"}
    assert set(horovod["controllers"]) == {"mpi", "gloo"}
    assert engines["deepspeed"]["details"]["communication_backend"] == "gloo"
    # scripts/setup.sh installs DeepSpeed with these built in, so no job compiles them.
    compiled = set(engines["deepspeed"]["details"]["compiled_ops"])
    assert {"cpu_adam", "deepspeed_shm_comm"} <= compiled
    assert engines["mpi"]["details"]["implementation"] == "Open MPI"
    # Keras 3 breaks horovod.tensorflow.keras: named as a known issue with its fix, not fatal.
    known = [p for p in engines["horovod"]["problems"] if not p["blocking"]]
    assert any("Keras 3" in p["message"] for p in known)
    assert all(
        report["launchers"][name] for name in ("horovodrun", "mpirun", "deepspeed", "torchrun")
    )


def test_environment_without_horovod_is_one_clear_line_and_non_zero(bare_python: str) -> None:
    done = run_doctor(bare_python, "--engine", "horovod")
    assert done.returncode == 1
    assert "Traceback" not in done.stdout + done.stderr
    assert "horovod     MISSING" in done.stdout
    assert "No module named 'horovod'" in done.stdout
    assert "FIX: make setup" in done.stdout


@pytest.mark.parametrize(
    ("init_source", "expected"),
    [
        # What a Horovod compiled against another torch looks like at import.
        (
            "raise ImportError('mpi_lib.cpython-311-x86_64-linux-gnu.so: "
            "undefined symbol: _ZN3c10')",
            "undefined symbol",
        ),
        # A crash in a compiled extension: the probe's interpreter dies, the doctor does not.
        ("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)", "crashed (exit -11)"),
    ],
)
def test_broken_horovod_is_reported_with_the_rebuild_fix(
    bare_python: str, tmp_path: Path, init_source: str, expected: str
) -> None:
    for package in ("horovod", "horovod/torch", "horovod/tensorflow"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("__version__ = '0.28.1'\n")
    (tmp_path / "horovod" / "torch" / "__init__.py").write_text(init_source + "\n")
    (tmp_path / "horovod" / "tensorflow" / "__init__.py").write_text(init_source + "\n")
    done = run_doctor(bare_python, "--engine", "horovod", "--json", extra_path=tmp_path)
    assert done.returncode == 1
    assert "Traceback" not in done.stdout
    (horovod,) = json.loads(done.stdout)["engines"]
    assert not horovod["ok"]
    import_problems = [p for p in horovod["problems"] if expected in p["message"]]
    assert import_problems, horovod["problems"]
    assert all("rm -rf ~/.cache/toolkit/wheels/horovod-*" in p["fix"] for p in import_problems)


def test_stale_jit_build_locks_are_found_and_fresh_ones_are_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from toolkit.backends.deepspeed.probe import STALE_LOCK_SECONDS, stale_build_locks

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    stale, building = tmp_path / "cpu_adam" / "lock", tmp_path / "shm_comm" / "lock"
    for lock in (stale, building):
        lock.parent.mkdir()
        lock.touch()
    long_ago = time.time() - STALE_LOCK_SECONDS - 60
    os.utime(stale, (long_ago, long_ago))
    assert stale_build_locks() == [stale]
