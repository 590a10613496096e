"""What `toolkit doctor --hosts` checks, from the spec's launch section and the command line.

The flags are validated by the spec's own rules (a LaunchSpec built from them), so a value the
spec would refuse is refused here too, in one line naming the flag instead of the field.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolkit.errors import ToolkitError
from toolkit.spec.errors import SpecError, SpecIssue
from toolkit.spec.hosts import parse_host
from toolkit.spec.model import TrainSpec
from toolkit.spec.sections import LaunchSpec, SshSpec


@dataclass(frozen=True, kw_only=True)
class HostFlags:
    """What the command line gave, as written; None = not given (the spec's value holds)."""

    hosts: str | None = None
    ssh_port: str | None = None
    ssh_identity_file: str | None = None
    ssh_config_file: str | None = None
    interface: str | None = None
    master_port: str | None = None


_FLAG_OF_FIELD = {
    "hosts": "--hosts",
    "ssh.port": "--ssh-port",
    "ssh.identity_file": "--ssh-identity-file",
    "ssh.config_file": "--ssh-config-file",
    "interface": "--interface",
    "master_port": "--master-port",
}


@dataclass(frozen=True, kw_only=True)
class HostsRequest:
    """The hosts to check and how a job reaches them."""

    hosts: tuple[str, ...]
    ssh: SshSpec
    python: str
    """The interpreter, at the same path on every host."""
    interface: str | None
    rendezvous: str
    master_port: int


def hosts_request(spec: TrainSpec | None, flags: HostFlags) -> HostsRequest:
    """The spec's launch settings with the flags over them; ToolkitError (one line naming the
    flag or spec field) for a value the spec itself would refuse, a key or config file that
    does not exist, or no hosts at all."""
    base = spec.launch if spec is not None else LaunchSpec()
    given: dict[str, Any] = {}
    if flags.hosts is not None:
        given["hosts"] = [entry.strip() for entry in flags.hosts.split(",")]
    ssh_given = {
        key: value
        for key, value in (
            ("port", _number(flags.ssh_port)),
            ("identity_file", flags.ssh_identity_file),
            ("config_file", flags.ssh_config_file),
        )
        if value is not None
    }
    if ssh_given:
        given["ssh"] = {**base.ssh.model_dump(exclude_none=True), **ssh_given}
    if flags.interface is not None:
        given["interface"] = flags.interface
    if flags.master_port is not None:
        given["master_port"] = _number(flags.master_port)
    try:
        checked = LaunchSpec.model_validate(given)
    except SpecError as error:
        raise ToolkitError("; ".join(_flag_line(issue) for issue in error.issues)) from None
    if flags.hosts is not None:
        hosts = tuple(parse_host(entry).name for entry in checked.hosts)
    elif spec is not None:
        hosts = tuple(host.name for host in spec.hosts)
    else:
        raise ToolkitError("--hosts needs a list of hosts or --spec FILE", "write e.g. --hosts a,b")
    if not hosts:
        raise ToolkitError(
            "the spec's launch.hosts is empty: no host to check",
            "list the hosts in launch.hosts, or give --hosts a,b",
        )
    ssh = checked.ssh if ssh_given else base.ssh
    for key, value in (("identity_file", ssh.identity_file), ("config_file", ssh.config_file)):
        if value is not None and not Path(value).expanduser().is_file():
            where = _FLAG_OF_FIELD[f"ssh.{key}"] if key in ssh_given else f"launch.ssh.{key}"
            raise ToolkitError(
                f"{where}={value!r}: no such file", "give the path of an existing file"
            )
    return HostsRequest(
        hosts=hosts,
        ssh=ssh,
        python=base.python or sys.executable,
        interface=flags.interface if flags.interface is not None else base.interface,
        rendezvous=base.master_addr or hosts[0],
        master_port=checked.master_port if flags.master_port is not None else base.master_port,
    )


def _number(text: str | None) -> int | str | None:
    """A flag's digits as an int; anything else as written, for the spec's check to refuse."""
    if text is not None and text.isascii() and text.isdigit() and len(text) <= 6:
        return int(text)
    return text


def _flag_line(issue: SpecIssue) -> str:
    name = issue.path.split("[")[0]
    shown = f"{_FLAG_OF_FIELD.get(name, name)}={issue.shown_value()}: {issue.allowed}"
    return f"{shown} HINT: {issue.hint}" if issue.hint else shown
