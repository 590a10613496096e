"""Host lists and hostfiles: "name:slots" entries and "name slots=N" lines.

Host names end up as argv elements of launchers that may hand them to ssh, pdsh or a shell on a
remote machine, so they are held to what a host name can be (letters, digits, dots and dashes,
RFC 1123) and anything else, shell metacharacters first of all, is a SpecError. Slot counts are
ASCII digits only ("²" is a digit to `str.isdigit` but not to `int`) and short enough to be
bounded before they are converted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from toolkit.spec.errors import IssueList, SpecIssue

HOST_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?"
"""RFC 1123 host names and dotted IPv4 addresses."""
_HOST_NAME = re.compile(HOST_NAME)
_ENTRY = re.compile(r"(?P<name>[^:\s]*)(?::(?P<slots>[^:]*))?")
_HOSTFILE_LINE = re.compile(r"(?P<name>\S+)(?:\s+slots\s*=\s*(?P<slots>\S+))?")
_SLOTS = re.compile(r"[0-9]{1,6}")

LOCAL_NAMES = frozenset({"localhost", "127.0.0.1"})
"""Names that mean this machine."""

MAX_RANKS = 65536
"""Upper bound on a job's ranks (and one host's slots): a typo guard, far above real jobs."""

ENTRY_ALLOWED = 'must be "name" or "name:slots" (letters, digits, dots, dashes; slots > 0)'
ENTRY_PATTERN = rf"{HOST_NAME}(?::[0-9]{{1,6}})?"
"""What a host entry looks like, for the JSON Schema (slots are also bounded by MAX_RANKS)."""


@dataclass(frozen=True, kw_only=True)
class Host:
    """One host and how many ranks it runs."""

    name: str
    """Host name or IPv4 address."""
    slots: int
    """Ranks on this host (> 0)."""

    def entry(self) -> str:
        """The "name:slots" form used by spec files, horovodrun -H and mpirun -H."""
        return f"{self.name}:{self.slots}"


def is_host_name(name: str) -> bool:
    """True for an RFC 1123 host name or dotted IPv4 address, nothing a shell would act on."""
    return bool(_HOST_NAME.fullmatch(name)) and ".." not in name


def check_host_entry(text: object, path: str) -> SpecIssue | None:
    """The issue with one "name[:slots]" entry, or None when it is valid."""
    if not isinstance(text, str):
        return SpecIssue(path=path, value=text, allowed=ENTRY_ALLOWED, hint='write e.g. "node1:4"')
    match = _ENTRY.fullmatch(text)
    if match is None or not is_host_name(match["name"]):
        return SpecIssue(
            path=path,
            value=text,
            allowed=ENTRY_ALLOWED,
            hint="host names cannot contain spaces, quotes or shell characters",
        )
    slots = match["slots"]
    if slots is not None and not (_SLOTS.fullmatch(slots) and 0 < int(slots) <= MAX_RANKS):
        hint = f"slots is a whole number in [1, {MAX_RANKS}], written with the digits 0-9"
        return SpecIssue(path=path, value=text, allowed=ENTRY_ALLOWED, hint=hint)
    return None


def host_list_issues(entries: tuple[object, ...], path: str) -> IssueList:
    """Issues with a host list: malformed entries, hosts named twice, too many slots."""
    issues = IssueList()
    if len(entries) > MAX_RANKS:
        issues.add(
            SpecIssue(
                path=path,
                value=list(entries),
                allowed=f"at most {MAX_RANKS} hosts ({len(entries)} given)",
                hint="list each host once, with its slots",
            )
        )
        return issues
    seen: set[str] = set()
    slots = 0
    for index, text in enumerate(entries):
        where = f"{path}[{index}]"
        issue = check_host_entry(text, where)
        if issue is None:
            host = parse_host(str(text))
            slots += host.slots
            if host.name in seen:
                issue = SpecIssue(
                    path=where,
                    value=text,
                    allowed="duplicate host",
                    hint="name each host once and give it all its slots",
                )
            seen.add(host.name)
        if issue is not None:
            issues.add(issue)
    if not issues and slots > MAX_RANKS:
        issues.add(
            SpecIssue(
                path=path,
                value=list(entries),
                allowed=f"at most {MAX_RANKS} slots in all ({slots} given)",
                hint="a job has at most that many ranks",
            )
        )
    return issues


def parse_host(text: str) -> Host:
    """Parse an entry already accepted by `check_host_entry`."""
    name, _, slots = text.partition(":")
    return Host(name=name, slots=int(slots) if slots else 1)


def parse_hostfile(text: str, path: str) -> tuple[list[str], IssueList]:
    """Host entries ("name:slots") from hostfile text, and the issues with its lines.

    Accepts MPI/DeepSpeed lines ("node1 slots=4"), "node1:4" and bare "node1" (one slot);
    blank lines and # comments are skipped.
    """
    entries: list[str] = []
    issues = IssueList()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{path}:{number}"
        if len(entries) >= MAX_RANKS:
            issues.add(
                SpecIssue(
                    path=where,
                    value=line,
                    allowed=f"a hostfile lists at most {MAX_RANKS} hosts",
                    hint="list each host once, with its slots",
                )
            )
            break
        match = _HOSTFILE_LINE.fullmatch(line)
        if match is None:
            issues.add(
                SpecIssue(
                    path=where,
                    value=line,
                    allowed='must be "name slots=N", "name:N" or "name"',
                    hint="one host per line",
                )
            )
            continue
        entry = match["name"] if match["slots"] is None else f"{match['name']}:{match['slots']}"
        issue = check_host_entry(entry, where)
        if issue is None:
            entries.append(entry)
        else:
            issues.add(issue)
    if not entries and not issues:
        issues.add(
            SpecIssue(
                path=path,
                value=text,
                allowed="must list at least one host",
                hint='one host per line, e.g. "node1 slots=4"',
            )
        )
    return entries, issues
