"""The context every benchmark JSON carries: when, on what machine, under what load, with which
engine versions (read from package metadata, so no engine is imported here)."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGES = ("torch", "tensorflow-cpu", "deepspeed", "horovod", "mpi4py", "numpy")


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


CPU_FEATURES = ("avx2", "avx512f", "amx_tile")
"""The vector units that set a CPU step's speed, recorded beside the model name."""


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields


def cpu_model() -> str:
    """The processor's name as the kernel reports it, with its family and model numbers and
    its vector units: figures of two sessions compare only on the same CPU. This project's
    machines have been an Intel CPU with AMX and two kinds of AMD EPYC, one with AVX-512 and
    one without, all called "vm" with 2 cores and both EPYCs named just "AMD EPYC"."""
    fields = _cpuinfo()
    name = fields.get("model name") or platform.processor() or "unknown"
    if "cpu family" not in fields:
        return name
    flags = set(fields.get("flags", "").split())
    units = "+".join(unit for unit in CPU_FEATURES if unit in flags) or "no AVX2"
    return f"{name}, family {fields['cpu family']} model {fields.get('model', '?')}, {units}"


def toolkit_commit() -> str | None:
    """The commit of the toolkit checkout that ran the bench, with `+changes` when the
    package's files differ from it (results the bench writes into docs/ do not count); None
    outside a git checkout (an installed wheel)."""
    package = Path(__file__).resolve().parents[1]

    def git(*words: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(package), *words], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "--short=12", "HEAD")
    if commit is None:
        return None
    return commit + (
        "+changes" if git("status", "--porcelain", "--untracked-files=no", "--", ".") else ""
    )


def machine() -> dict[str, Any]:
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "started": time.monotonic(),
        "commit": toolkit_commit(),
        "host": platform.node(),
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_average_start": list(os.getloadavg()),
        "versions": {name: _version(name) for name in PACKAGES},
    }


def finish(context: dict[str, Any]) -> dict[str, Any]:
    """The context with the load average at the end (other jobs come and go during a run) and
    the run's wall minutes."""
    finished = {key: value for key, value in context.items() if key != "started"}
    finished["minutes"] = round((time.monotonic() - context["started"]) / 60, 1)
    return {**finished, "load_average_end": list(os.getloadavg())}


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, allow_nan=True) + "\n")


def write_measured(path: Path, data: dict[str, Any], *, measured: bool) -> bool:
    """`data` into `path` when the run measured something. A run whose every launch failed
    writes nothing, so the last good result (docs/bench holds the project's) stays as it was;
    its errors are printed instead. True when it wrote."""
    if not measured:
        print(f"nothing measured: {path} left as it was")
        return False
    write_json(path, data)
    return True


def read_json(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data
