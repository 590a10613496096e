"""`toolkit doctor --hosts`: can a job run on these hosts, and if not, what to change.

Every host gets the same probe (`host_probe`), over ssh with the job's own settings, in
parallel and each within HOST_TIMEOUT_S; this machine gets it too, without ssh, as the
reference: the interpreter at the same path, the toolkit, Python and the engines' packages must
be the same everywhere, because the launchers start ranks on other hosts by path. The
rendezvous host (launch.master_addr, else the first host) also tries to bind the rendezvous
port, and every host reports its network interfaces: the one named (launch.interface) must
carry an IPv4 address on each of them; without one, the report says which interface carries
the route to the rendezvous host, which is what an engine left to itself tends to use.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolkit import engines
from toolkit.doctor import host_probe
from toolkit.doctor.probe_protocol import Problem
from toolkit.errors import ToolkitError
from toolkit.launch.remote import ssh_argv
from toolkit.spec.errors import SpecError
from toolkit.spec.hosts import LOCAL_NAMES, parse_host
from toolkit.spec.model import TrainSpec
from toolkit.spec.sections import LaunchSpec, SshSpec

HOST_TIMEOUT_S = 30.0
"""Bound on one host's probe, ssh connection included (ssh itself gives up after 10 s)."""
PACKAGES: tuple[str, ...] = (*dict.fromkeys(e.package for e in engines.ENGINES), "mpi4py")
"""Import names whose versions must match: every engine's package, and MPI's bindings."""
THIS_MACHINE = "this machine"
SAME_ENVIRONMENT_FIX = (
    "install the same environment at the same path on every host (`make setup` in the same "
    "checkout), or point launch.python at the interpreter there"
)


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


def _flag_line(issue: Any) -> str:
    name = issue.path.split("[")[0]
    shown = f"{_FLAG_OF_FIELD.get(name, name)}={issue.shown_value()}: {issue.allowed}"
    return f"{shown} HINT: {issue.hint}" if issue.hint else shown


@dataclass
class HostCheck:
    """One host's findings: the probe's facts (None when it could not run) and the problems."""

    host: str
    facts: dict[str, Any] | None = None
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(problem.blocking for problem in self.problems)

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "ok": self.ok,
            "reached": self.facts is not None,
            "facts": self.facts,
            "problems": [vars(problem) for problem in self.problems],
            "notes": self.notes,
        }


@dataclass
class HostsReport:
    request: HostsRequest
    reference: HostCheck
    """This machine, probed the same way: what every host must match."""
    hosts: list[HostCheck]

    @property
    def ok(self) -> bool:
        return self.reference.ok and all(host.ok for host in self.hosts)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "python": self.request.python,
            "ssh_options": self.request.ssh.options(),
            "interface": self.request.interface,
            "rendezvous": {"host": self.request.rendezvous, "port": self.request.master_port},
            "reference": self.reference.to_json(),
            "hosts": [host.to_json() for host in self.hosts],
        }


def run_host_doctor(request: HostsRequest) -> HostsReport:
    """Probe this machine and every host at once; compare each host with this machine."""
    with ThreadPoolExecutor(max_workers=min(32, len(request.hosts) + 1)) as pool:
        reference = pool.submit(_probe, request, None)
        checks = list(pool.map(lambda host: _probe(request, host), request.hosts))
    here = reference.result()
    if here.facts is not None:
        here.problems += compare(None, here.facts, request.python)
    for check in checks:
        if check.facts is not None:
            check.problems += compare(here.facts, check.facts, request.python)
            check.problems += network_problems(check.facts, request.interface)
            check.notes += network_notes(check.facts, request.interface)
    if request.rendezvous not in request.hosts:
        here.notes.append(
            f"rendezvous host {request.rendezvous} is not among the hosts: port "
            f"{request.master_port} not checked"
        )
    return HostsReport(request=request, reference=here, hosts=checks)


def probe_argv(request: HostsRequest, host: str | None) -> list[str]:
    """The probe's command for `host` (None: this machine): over ssh unless it is local."""
    command = [request.python, "-c", Path(host_probe.__file__).read_text(encoding="utf-8")]
    command += ["--packages", ",".join(PACKAGES)]
    if host is not None and host == request.rendezvous:
        command += ["--port", str(request.master_port)]
    if host is not None:
        command += ["--route-to", request.rendezvous]
    if host is None or host in LOCAL_NAMES:
        return command
    return ssh_argv(request.ssh, host, command)


def _probe(request: HostsRequest, host: str | None) -> HostCheck:
    check = HostCheck(host=host or THIS_MACHINE)
    try:
        done = subprocess.run(
            probe_argv(request, host),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=HOST_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        check.problems.append(
            Problem(
                f"no answer within {HOST_TIMEOUT_S:g} s (ssh or the probe hung)",
                f"check that the host is up and answers `{_ssh_try(request, check.host)}`",
            )
        )
        return check
    except OSError as error:
        check.problems.append(
            Problem(f"cannot run the probe ({error.strerror or error})", SAME_ENVIRONMENT_FIX)
        )
        return check
    check.facts = _json_line(done.stdout) if done.returncode == 0 else None
    if check.facts is None:
        check.problems.append(_failure(request, check.host, host is None, done))
    return check


def _failure(
    request: HostsRequest, host: str, here: bool, done: subprocess.CompletedProcess[str]
) -> Problem:
    """What a probe that printed no report says about the host."""
    last = _last_line(done.stderr)
    if done.returncode == 255 and not here:
        return Problem(
            f"ssh failed: {last}",
            f"make `{_ssh_try(request, host)}` work without a prompt (sshd running, port, key); "
            "set launch.ssh (port, identity_file, config_file) or --ssh-port, "
            "--ssh-identity-file, --ssh-config-file",
        )
    if done.returncode in (126, 127):
        return Problem(f"no interpreter {request.python} there ({last})", SAME_ENVIRONMENT_FIX)
    return Problem(
        f"the probe failed with {request.python} (exit {done.returncode}): {last}",
        SAME_ENVIRONMENT_FIX,
    )


def _ssh_try(request: HostsRequest, host: str) -> str:
    return shlex.join(["ssh", *request.ssh.options(), host, "true"])


def compare(reference: dict[str, Any] | None, facts: dict[str, Any], python: str) -> list[Problem]:
    """A host's toolkit, Python and packages against this machine's (None: unknown here, so
    only the toolkit's import is checked)."""
    toolkit = facts["toolkit"]
    if toolkit["error"]:
        return [
            Problem(
                f"{python} cannot import toolkit there ({toolkit['error']})", SAME_ENVIRONMENT_FIX
            )
        ]
    if reference is None:
        return []
    problems = []
    pairs = [
        ("toolkit", reference["toolkit"]["version"], toolkit["version"]),
        ("Python", reference["python_version"], facts["python_version"]),
        *(
            (name, version, facts["packages"].get(name))
            for name, version in reference["packages"].items()
        ),
    ]
    for name, here, there in pairs:
        if here is None or here == there:
            continue
        what = f"{name} is not installed there" if there is None else f"{name} {there} there"
        problems.append(
            Problem(f"{what}, {here} here", f"install {name} {here} there; {SAME_ENVIRONMENT_FIX}")
        )
    return problems


def network_problems(facts: dict[str, Any], interface: str | None) -> list[Problem]:
    """The rendezvous port taken, and the named interface missing or without IPv4."""
    problems = []
    port = facts.get("port")
    if port is not None and not port["free"]:
        problems.append(
            Problem(
                f"rendezvous port {port['port']} is not free there ({port['error']})",
                f"stop what listens on it (`ss -ltnp 'sport = :{port['port']}'` shows it), or "
                "set launch.master_port (--master-port) to a free port",
            )
        )
    interfaces = facts["interfaces"]
    if interface is None:
        return problems
    if isinstance(interfaces, str):
        problems.append(
            Problem(f"cannot list interfaces there: {interfaces}", SAME_ENVIRONMENT_FIX)
        )
    elif not interfaces.get(interface):
        what = "has no IPv4 address" if interface in interfaces else "does not exist"
        problems.append(
            Problem(
                f"network interface {interface} {what} there (with IPv4: "
                f"{_with_ipv4(interfaces) or 'none'})",
                "set launch.interface (--interface) to an interface every host has with an "
                "IPv4 address (`ip -brief address` lists them)",
            )
        )
    return problems


def network_notes(facts: dict[str, Any], interface: str | None) -> list[str]:
    """Without a named interface: the interface that reaches the rendezvous host, and every
    interface with IPv4 (information, not a problem)."""
    interfaces = facts["interfaces"]
    if interface is not None or isinstance(interfaces, str):
        return []
    route = facts.get("route") or {}
    notes = [f"interfaces with IPv4: {_with_ipv4(interfaces) or 'none'}"]
    if route.get("interface"):
        notes.insert(
            0,
            f"traffic to {route['to']} leaves by {route['interface']} ({route['address']}); "
            "set launch.interface to choose",
        )
    return notes


def _with_ipv4(interfaces: dict[str, list[dict[str, str]]]) -> str:
    return ", ".join(
        f"{name} {entries[0]['address']}" for name, entries in interfaces.items() if entries
    )


def _json_line(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                return None
            return data if isinstance(data, dict) else None
    return None


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no message"


def problem_lines(report: HostsReport) -> list[str]:
    """Each problem as one line: host, what is wrong, the fix."""
    return [
        f"{check.host}: {problem.message}. FIX: {problem.fix}"
        for check in (report.reference, *report.hosts)
        for problem in check.problems
    ]
