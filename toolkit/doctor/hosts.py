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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolkit import engines
from toolkit.doctor import host_probe
from toolkit.doctor.host_checks import (
    SAME_ENVIRONMENT_FIX,
    compare,
    network_notes,
    network_problems,
)
from toolkit.doctor.hosts_request import HostsRequest
from toolkit.doctor.probe_protocol import Problem
from toolkit.launch.remote import ssh_argv
from toolkit.spec.hosts import LOCAL_NAMES

HOST_TIMEOUT_S = 30.0
"""Bound on one host's probe, ssh connection included (ssh itself gives up after 10 s)."""
PACKAGES: tuple[str, ...] = (*dict.fromkeys(e.package for e in engines.ENGINES), "mpi4py")
"""Import names whose versions must match: every engine's package, and MPI's bindings."""
THIS_MACHINE = "this machine"


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
        fix = SAME_ENVIRONMENT_FIX
        if host is not None:
            fix = f"check that the host is up and answers `{_ssh_try(request, host)}`"
        check.problems.append(
            Problem(f"no answer within {HOST_TIMEOUT_S:g} s (ssh or the probe hung)", fix)
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
    """Each problem as one line: host, what is wrong, the fix (a remote error's own line
    breaks folded)."""
    return [
        " ".join(f"{check.host}: {problem.message}. FIX: {problem.fix}".split())
        for check in (report.reference, *report.hosts)
        for problem in check.problems
    ]
