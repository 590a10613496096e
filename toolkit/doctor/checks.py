"""Run the engine probes, find the launchers and list the GPUs; no engine is imported in this
process. GPUs the engines cannot use are known issues, never errors: the CPU still trains."""

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
from toolkit.gpu_facts import GpuListing, list_gpus
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
CUDA_FIX = "TOOLKIT_DEVICE=cuda make setup   (in the toolkit checkout: the engines' CUDA builds)"
DRIVER_FIX = (
    f"{CUDA_FIX}; if it persists, an NVIDIA driver that supports the engine's CUDA "
    "(nvidia-smi's header names the newest it supports)"
)


@dataclass
class DoctorReport:
    python: str
    engines: list[ProbeReport]
    launchers: dict[str, str | None] = field(default_factory=dict)
    gpus: GpuListing = field(default_factory=GpuListing)

    @property
    def ok(self) -> bool:
        return all(engine.ok for engine in self.engines)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "python": self.python,
            "engines": [engine.to_json() for engine in self.engines],
            "launchers": self.launchers,
            "gpus": self.gpus.to_json(),
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
    gpus = list_gpus(os.environ)
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
        report.problems += gpu_problems(report, len(gpus.admitted))
    return DoctorReport(python=sys.executable, engines=reports, launchers=launchers, gpus=gpus)


def gpu_problems(report: ProbeReport, visible: int) -> list[Problem]:
    """Known issues where this host shows `visible` GPUs that the engine's build cannot use."""
    gpu = report.gpu
    if gpu is None or visible == 0:
        return []
    shown = f"this host shows {visible} GPU{'' if visible == 1 else 's'}"
    if not gpu.built:
        message = f"{shown}, but this {report.engine} is a CPU-only build: it trains on the CPU"
        return [Problem(message, CUDA_FIX, blocking=False)]
    if gpu.devices == 0:
        message = f"{shown}, but {report.engine} sees none: {gpu.summary}"
        return [Problem(message, DRIVER_FIX, blocking=False)]
    return []


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
