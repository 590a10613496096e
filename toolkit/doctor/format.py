"""Human-readable rendering of a DoctorReport."""

from __future__ import annotations

from typing import Any

from toolkit.doctor.checks import DoctorReport
from toolkit.doctor.probe_protocol import ProbeReport


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


def _summary(engine: ProbeReport) -> str:
    return "; ".join(f"{key} {_value(value)}" for key, value in engine.details.items())


def _value(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(str(item) for item in value) or "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)
