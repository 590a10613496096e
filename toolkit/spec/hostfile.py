"""`launch.hostfile`: read while a spec is loaded, its hosts put into `launch.hosts`."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from toolkit.spec.errors import SpecIssue
from toolkit.spec.fields import rule_error
from toolkit.spec.hosts import parse_hostfile
from toolkit.spec.sections import LaunchSpec
from toolkit.userfiles import MIB, UserFileError, read_text

HOSTFILE_LIMIT = 4 * MIB
"""Largest hostfile read: 65,536 hosts of a long name each."""


def read_hostfile(launch: Any, context: Any) -> Any:
    """launch data with its hostfile's hosts filled in (the hostfile field then cleared: its
    content is in `hosts`, which is what the job runs on and what `to_dict` writes).

    The file is read only while loading (`context` holds `base_dir`); a spec built in Python
    must give its hosts.
    """
    hostfile = launch.get("hostfile") if isinstance(launch, dict) else None
    if isinstance(launch, LaunchSpec) and launch.hostfile is not None and not launch.hosts:
        hostfile = launch.hostfile
    if not isinstance(hostfile, str) or not hostfile.isprintable() or not hostfile.strip():
        return launch  # nothing to read, or LaunchSpec reports the bad value
    issue = _hostfile_issue(hostfile)
    if isinstance(launch, dict) and "hosts" in launch:
        raise rule_error([issue("give launch.hosts or launch.hostfile, not both", "remove one")])
    if not isinstance(launch, dict) or not isinstance(context, dict) or "base_dir" not in context:
        raise rule_error(
            [
                issue(
                    "hostfiles are read when a spec is loaded; this spec has no hosts",
                    "build it with TrainSpec.from_dict or load_spec, or give launch.hosts",
                )
            ]
        )
    path = os.path.join(context["base_dir"], os.path.expanduser(hostfile))
    try:
        text = read_text(
            path,
            limit=HOSTFILE_LIMIT,
            what="hostfile",
            hint="relative paths are resolved from the spec file's directory",
        )
    except UserFileError as error:
        raise rule_error([issue(error.reason, error.hint or "check the path")]) from None
    entries, issues = parse_hostfile(text, "launch.hostfile")
    if issues:
        raise rule_error(issues)
    return {**launch, "hosts": entries, "hostfile": None}


def _hostfile_issue(hostfile: str) -> Callable[[str, str], SpecIssue]:
    def issue(allowed: str, hint: str) -> SpecIssue:
        return SpecIssue(path="launch.hostfile", value=hostfile, allowed=allowed, hint=hint)

    return issue
