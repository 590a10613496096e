"""The contract between `toolkit doctor` and the engine probes it runs in subprocesses.

A probe is a module `toolkit.backends.<engine>.probe` whose `main()` prints one JSON object, a
`ProbeReport`, on stdout. Probes run in their own interpreter because a broken compiled engine
(a Horovod built against another torch, say) can fail with an undefined symbol or even a
segfault at import, and the doctor must survive to report it.

A probe may add its engine's GPU side (`GpuSupport`): whether its build can use a GPU, what it
sees here and one line saying so, which the doctor prints as the engine wrote it, so that no
code outside the engine's package reads an engine's facts. Without a GPU nothing there is a
problem: the engine trains on the CPU.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

REINSTALL_FIX = "make setup   (in the toolkit checkout; it reinstalls the pinned engine stack)"


@dataclass
class Problem:
    """Something wrong or known-broken, and the command or change that fixes it."""

    message: str
    fix: str
    # A blocking problem makes the engine unusable; a warning names a known-broken corner
    # (for example Horovod's Keras integration on Keras 3) that the toolkit works around.
    blocking: bool = True


@dataclass
class GpuSupport:
    """An engine's GPU side: whether its build has one (`built`), how many GPUs it sees here
    (`devices`; None where it cannot tell without starting a job) and one line for people."""

    built: bool
    devices: int | None
    summary: str
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass
class ProbeReport:
    engine: str
    installed: bool
    version: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    gpu: GpuSupport | None = None

    @property
    def ok(self) -> bool:
        return self.installed and not any(p.blocking for p in self.problems)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["ok"] = self.ok
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProbeReport:
        return cls(
            engine=data["engine"],
            installed=data["installed"],
            version=data.get("version"),
            details=data.get("details", {}),
            problems=[Problem(**p) for p in data.get("problems", [])],
            gpu=GpuSupport(**data["gpu"]) if data.get("gpu") else None,
        )


def not_installed(engine: str, package: str, error: BaseException) -> ProbeReport:
    return ProbeReport(
        engine=engine,
        installed=False,
        problems=[Problem(f"{package} is not importable ({error})", REINSTALL_FIX)],
    )


def run_probe(probe: Callable[[], ProbeReport]) -> None:
    """Entry point shared by every probe module: print the report as JSON and exit 0."""
    report = probe()
    json.dump(report.to_json(), sys.stdout)
    sys.stdout.write("\n")
