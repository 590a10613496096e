"""`toolkit doctor [--engine NAME ...] [--json]`: exit 0 only when every asked engine works.
The GPUs it lists (none, on a machine without a driver) never change that.

`toolkit doctor --hosts [a,b] [--spec FILE] [ssh and network flags] [--json]` checks other
hosts instead (toolkit.doctor.hosts): exit 0 when every host passes, 1 when a check failed.
That part is imported only when asked for, since it needs the spec's dependencies and the
engine check must run where nothing but the standard library is installed.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from toolkit.doctor import ENGINES, run_doctor
from toolkit.doctor.checks import ALIASES
from toolkit.doctor.format import format_report
from toolkit.errors import ToolkitError

_HOST_OPTIONS = {
    "spec": "--spec",
    "ssh_port": "--ssh-port",
    "ssh_identity_file": "--ssh-identity-file",
    "ssh_config_file": "--ssh-config-file",
    "interface": "--interface",
    "master_port": "--master-port",
}


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "doctor",
        help="check that the engines and launchers are installed and work together",
        description="Check the engines on this machine, or with --hosts the hosts of a job.",
    )
    parser.add_argument(
        "--engine",
        action="append",
        default=[],
        choices=sorted([*ENGINES, *ALIASES]),
        help="check only this engine (repeatable); default: all",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON report")
    hosts = parser.add_argument_group(
        "hosts", "check other hosts by ssh: same toolkit and engines, free port, interface"
    )
    hosts.add_argument(
        "--hosts",
        nargs="?",
        const=True,
        metavar="A,B",
        help="check these hosts (name or name:slots, comma-separated); alone: the spec's",
    )
    hosts.add_argument("--spec", metavar="FILE", help="take hosts and launch settings from it")
    hosts.add_argument("--ssh-port", metavar="PORT", help="sshd port (launch.ssh.port)")
    hosts.add_argument(
        "--ssh-identity-file", metavar="FILE", help="private key (launch.ssh.identity_file)"
    )
    hosts.add_argument(
        "--ssh-config-file", metavar="FILE", help="ssh client config (launch.ssh.config_file)"
    )
    hosts.add_argument(
        "--interface", metavar="NAME", help="network interface for the job (launch.interface)"
    )
    hosts.add_argument(
        "--master-port", metavar="PORT", help="rendezvous port to find free (launch.master_port)"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.hosts is not None:
        return run_hosts(args)
    given = [flag for name, flag in _HOST_OPTIONS.items() if getattr(args, name) is not None]
    if given:
        raise ToolkitError(f"{', '.join(given)} apply only with --hosts", "add --hosts")
    report = run_doctor(args.engine)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(format_report(report))
    return 0 if report.ok else 1


def run_hosts(args: argparse.Namespace) -> int:
    try:
        from toolkit.doctor.hosts import run_host_doctor
        from toolkit.doctor.hosts_format import format_hosts_report
        from toolkit.doctor.hosts_request import HostFlags, hosts_request
        from toolkit.spec import load_spec
    except ImportError as missing:
        raise ToolkitError(
            f"toolkit doctor --hosts needs the toolkit's dependencies ({missing})",
            "make setup (or pip install the toolkit with its dependencies)",
        ) from None
    if args.engine:
        raise ToolkitError(
            "--engine checks this machine and does not combine with --hosts",
            "run `toolkit doctor --engine ...` and `toolkit doctor --hosts ...` separately",
        )
    flags = HostFlags(
        hosts=args.hosts if isinstance(args.hosts, str) else None,
        ssh_port=args.ssh_port,
        ssh_identity_file=args.ssh_identity_file,
        ssh_config_file=args.ssh_config_file,
        interface=args.interface,
        master_port=args.master_port,
    )
    spec = load_spec(args.spec) if args.spec is not None else None
    report = run_host_doctor(hosts_request(spec, flags))
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(format_hosts_report(report))
    return 0 if report.ok else 1
