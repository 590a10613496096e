"""Human-readable rendering of a HostsReport: a table of hosts, then one line per problem."""

from __future__ import annotations

import shlex
from typing import Any

from toolkit.doctor.hosts import HostCheck, HostsReport, problem_lines


def format_hosts_report(report: HostsReport) -> str:
    request = report.request
    ssh = shlex.join(["ssh", *request.ssh.options()])
    lines = [
        f"toolkit doctor --hosts: {len(report.hosts)} hosts, python {request.python}, {ssh}",
        f"rendezvous {request.rendezvous}:{request.master_port}, "
        f"interface {request.interface or '(each engine chooses)'}",
        "",
        f"{'host':<24}{'ssh':<6}{'toolkit':<10}{'versions':<10}{'port':<7}interface",
    ]
    lines += [_row(check, report.reference, request.interface) for check in report.hosts]
    notes = [
        f"  {check.host}: {note}"
        for check in (report.reference, *report.hosts)
        for note in check.notes
    ]
    if notes:
        lines += ["", "notes:", *notes]
    problems = problem_lines(report)
    if problems:
        lines += ["", "problems:", *(f"  {line}" for line in problems)]
    failed = sum(not check.ok for check in report.hosts)
    lines.append("")
    if report.ok:
        lines.append(f"all {len(report.hosts)} hosts pass")
    elif failed:
        lines.append(f"{failed} of {len(report.hosts)} hosts failed a check")
    else:
        lines.append("this machine failed a check")
    return "\n".join(lines)


def _row(check: HostCheck, reference: HostCheck, interface: str | None) -> str:
    facts = check.facts
    if facts is None:
        return f"{check.host:<24}{'FAIL':<6}{'-':<10}{'-':<10}{'-':<7}-"
    toolkit = facts["toolkit"]["version"] or "MISSING"
    versions = "-" if reference.facts is None else _versions(reference.facts, facts)
    port = facts.get("port")
    port_text = "-" if port is None else ("free" if port["free"] else "TAKEN")
    return f"{check.host:<24}{'ok':<6}{toolkit:<10}{versions:<10}{port_text:<7}" + _interface(
        facts, interface
    )


def _versions(reference: dict[str, Any], facts: dict[str, Any]) -> str:
    same = reference["python_version"] == facts["python_version"] and all(
        version is None or facts["packages"].get(name) == version
        for name, version in reference["packages"].items()
    )
    return "same" if same else "DIFFER"


def _interface(facts: dict[str, Any], interface: str | None) -> str:
    interfaces = facts["interfaces"]
    if isinstance(interfaces, str):
        return "unknown"
    if interface is None:
        route = facts.get("route") or {}
        return f"{route.get('interface') or '?'} (route)"
    entries = interfaces.get(interface)
    if not entries:
        return f"{interface} MISSING"
    return f"{interface} {entries[0]['address']}"
