"""Run the engine probes and find the launchers; no engine is imported in this process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from toolkit import engines
from toolkit.doctor.probe_protocol import REINSTALL_FIX, ProbeReport, Problem
from toolkit.launch.executables import find_launcher

# package name -> the probe module that reports on it: every engine's package (the table in
# toolkit.engines), and MPI, which is no engine but the transport under mpirun and Horovod.
ENGINES: dict[str, str] = {
    **{entry.package: entry.probe for entry in engines.ENGINES},
    "mpi": "toolkit.backends.mpi.probe",
}
# The spec's backend names, accepted as aliases so `doctor --engine ddp` means what it says.
ALIASES: dict[str, str] = {
    entry.backend: entry.package for entry in engines.ENGINES if entry.backend != entry.package
}

# The launcher each package ships and needs on PATH: its engines' implied launcher (the local
# launcher is the toolkit itself), and mpirun for MPI.
REQUIRED_LAUNCHERS: dict[str, tuple[str, ...]] = {
    **{
        entry.package: (entry.implied_launcher,)
        for entry in engines.ENGINES
        if entry.implied_launcher in engines.EXTERNAL_LAUNCHERS
    },
    "mpi": ("mpirun",),
}
LAUNCHERS: tuple[str, ...] = engines.EXTERNAL_LAUNCHERS
REPAIRS = {entry.package: entry.repair for entry in engines.ENGINES if entry.repair}
# TensorFlow and DeepSpeed import slowly on a loaded 2-core machine.
PROBE_TIMEOUT_S = 240


@dataclass
class DoctorReport:
    python: str
    engines: list[ProbeReport]
    launchers: dict[str, str | None] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(engine.ok for engine in self.engines)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "python": self.python,
            "engines": [engine.to_json() for engine in self.engines],
            "launchers": self.launchers,
        }


def resolve_engines(names: Sequence[str]) -> list[str]:
    """Canonical engine names in a stable order, aliases folded; empty means all."""
    wanted = {ALIASES.get(name, name) for name in names} or set(ENGINES)
    return [name for name in ENGINES if name in wanted]


def run_probe(engine: str) -> ProbeReport:
    argv = [sys.executable, "-m", ENGINES[engine]]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONWARNINGS": "ignore"}
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, env=env, check=False
        )
    except subprocess.TimeoutExpired:
        return _broken(engine, f"probe did not finish in {PROBE_TIMEOUT_S}s")
    report_line = _last_json_line(done.stdout)
    if done.returncode != 0 or report_line is None:
        stderr_tail = " | ".join(done.stderr.strip().splitlines()[-2:]) or "no output"
        return _broken(engine, f"importing it crashed (exit {done.returncode}): {stderr_tail}")
    return ProbeReport.from_json(report_line)


def run_doctor(engine_names: Sequence[str] = ()) -> DoctorReport:
    engines = resolve_engines(engine_names)
    with ThreadPoolExecutor(max_workers=2) as pool:
        reports = list(pool.map(run_probe, engines))
    launchers = {name: find_launcher(name) for name in LAUNCHERS}
    for report in reports:
        for launcher in REQUIRED_LAUNCHERS.get(report.engine, ()):
            if report.installed and launchers[launcher] is None:
                report.problems.append(
                    Problem(
                        f"launcher {launcher} is not on PATH nor beside {sys.executable}",
                        REINSTALL_FIX,
                    )
                )
    return DoctorReport(python=sys.executable, engines=reports, launchers=launchers)


def _last_json_line(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            try:
                data: dict[str, Any] = json.loads(line)
            except json.JSONDecodeError:
                return None
            return data
    return None


def _broken(engine: str, message: str) -> ProbeReport:
    fix = f"{REPAIRS[engine]} && {REINSTALL_FIX}" if engine in REPAIRS else REINSTALL_FIX
    return ProbeReport(engine=engine, installed=False, problems=[Problem(message, fix)])
