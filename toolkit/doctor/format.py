"""Human-readable rendering of a DoctorReport: the engines, the launchers, the GPUs (the
driver's, then each engine's own line), and the problems with their fixes."""

from __future__ import annotations

from typing import Any

from toolkit.doctor.checks import DoctorReport
from toolkit.doctor.probe_protocol import ProbeReport
from toolkit.gpu_facts import GpuListing


def format_report(report: DoctorReport) -> str:
    lines = [f"toolkit doctor: {report.python}", ""]
    lines.append(f"{'engine':<12}{'status':<9}{'version':<16}built with")
    for engine in report.engines:
        status = "ok" if engine.ok else ("BROKEN" if engine.installed else "MISSING")
        lines.append(f"{engine.engine:<12}{status:<9}{engine.version or '-':<16}{_summary(engine)}")
    lines.append("")
    lines.append("launchers:")
    for name, path in report.launchers.items():
        lines.append(f"  {name:<11}{path or 'not found'}")
    lines.append("")
    lines += gpu_lines(report.gpus, report.engines)
    problems = [(e.engine, p) for e in report.engines for p in e.problems]
    if problems:
        lines.append("")
        lines.append("problems:")
        for name, problem in problems:
            kind = "error" if problem.blocking else "known issue"
            lines.append(f"  {name}: {kind}: {problem.message}")
            lines.append(f"  {' ' * len(name)}  FIX: {problem.fix}")
    lines.append("")
    lines.append(
        "all requested engines work" if report.ok else "some requested engines do not work"
    )
    return "\n".join(lines)


def gpu_lines(gpus: GpuListing, engines: list[ProbeReport]) -> list[str]:
    """The GPU section: what the driver lists and a job would see, then each engine's GPU side
    in its probe's words (an engine that did not report one is left out)."""
    lines = [f"GPUs: {_driver(gpus)}"]
    lines += [
        f"  GPU {gpu.index:<7}{gpu.name}, "
        + ("memory unknown" if gpu.memory_mib is None else f"{gpu.memory_mib:,} MiB")
        for gpu in gpus.gpus
    ]
    if gpus.cuda_visible_devices is not None:
        seen = ", ".join(f"GPU {gpu.index}" for gpu in gpus.admitted) or "none"
        lines.append(f"  CUDA_VISIBLE_DEVICES={gpus.cuda_visible_devices!r} (a job sees: {seen})")
    lines += [
        f"  {engine.engine:<11}{engine.gpu.summary}" for engine in engines if engine.gpu is not None
    ]
    return lines


def _driver(gpus: GpuListing) -> str:
    if not gpus.gpus:
        return f"no GPU visible ({gpus.reason or 'not checked'})"
    if not gpus.admitted:
        return f"no GPU visible (CUDA_VISIBLE_DEVICES hides the {len(gpus.gpus)} listed)"
    drivers = sorted({gpu.driver for gpu in gpus.gpus})
    count = len(gpus.gpus)
    return f"{count} listed by NVIDIA driver {', '.join(drivers)}"


def _summary(engine: ProbeReport) -> str:
    return "; ".join(f"{key} {_value(value)}" for key, value in engine.details.items())


def _value(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(str(item) for item in value) or "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)
