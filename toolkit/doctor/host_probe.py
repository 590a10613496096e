"""What `toolkit doctor --hosts` learns on one host, printed as one JSON line.

The doctor sends this file's source to each host as `python -c SOURCE ARGS` (it also runs as
`python -m toolkit.doctor.host_probe ARGS`), so it needs nothing from the toolkit on the other
side: it reports a host whose toolkit is missing, or of another version, instead of failing
there. It uses the standard library alone, and psutil (a toolkit dependency) for interface
addresses when it is importable. It never imports an engine: versions come from the installed
distributions' metadata.

Arguments: --packages a,b (import names whose versions to report), --port N (try binding it,
as the rendezvous will), --route-to HOST (which local address and interface carry traffic to
HOST; no packet is sent).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import ipaddress
import json
import platform
import socket
import sys
from typing import Any


def package_versions(packages: list[str]) -> dict[str, str | None]:
    """Import name -> version of the distribution that provides it (None: not installed)."""
    providers = importlib.metadata.packages_distributions()
    found: dict[str, str | None] = {}
    for name in packages:
        versions = set()
        for distribution in providers.get(name, []):
            try:
                versions.add(importlib.metadata.version(distribution))
            except importlib.metadata.PackageNotFoundError:
                continue
        found[name] = " ".join(sorted(versions)) or None
    return found


def toolkit_facts() -> dict[str, Any]:
    """The toolkit this interpreter imports: version and location, or the import error."""
    try:
        import toolkit
    except Exception as error:  # a broken install is a finding here, whatever it raises
        return {"version": None, "path": None, "error": f"{type(error).__name__}: {error}"}
    return {"version": toolkit.__version__, "path": toolkit.__path__[0], "error": None}


def port_facts(port: int) -> dict[str, Any]:
    """Whether a listener could bind `port` on every address, as a rendezvous server does."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("", port))
        listener.listen(1)
    except OSError as error:
        return {"port": port, "free": False, "error": error.strerror or str(error)}
    finally:
        listener.close()
    return {"port": port, "free": True, "error": None}


def ipv4_interfaces() -> dict[str, list[dict[str, str]]] | str:
    """Interface -> its IPv4 addresses and netmasks (every interface, even without one);
    the error text when psutil is missing."""
    try:
        import psutil
    except ImportError as error:
        return f"psutil is not importable ({error})"
    return {
        name: [
            {"address": entry.address, "netmask": entry.netmask or "255.255.255.255"}
            for entry in entries
            if entry.family == socket.AF_INET
        ]
        for name, entries in psutil.net_if_addrs().items()
    }


def route_facts(host: str, interfaces: dict[str, list[dict[str, str]]] | str) -> dict[str, Any]:
    """The local address the kernel picks to reach `host` (a UDP connect sends nothing), and
    the interface holding that address."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((host, 9))
        source = probe.getsockname()[0]
    except OSError as error:
        return {"to": host, "address": None, "interface": None, "error": str(error)}
    finally:
        probe.close()
    found = None
    if isinstance(interfaces, dict):
        found = interface_of(source, interfaces)
    return {"to": host, "address": source, "interface": found, "error": None}


def interface_of(address: str, interfaces: dict[str, list[dict[str, str]]]) -> str | None:
    """The interface that holds `address`, else the first whose network contains it."""
    within = None
    for name, entries in interfaces.items():
        for entry in entries:
            if entry["address"] == address:
                return name
            network = ipaddress.ip_network(f"{entry['address']}/{entry['netmask']}", strict=False)
            if within is None and ipaddress.ip_address(address) in network:
                within = name
    return within


def probe(packages: list[str], port: int | None, route_to: str | None) -> dict[str, Any]:
    interfaces = ipv4_interfaces()
    return {
        "python": sys.executable,
        "python_version": platform.python_version(),
        "toolkit": toolkit_facts(),
        "packages": package_versions(packages),
        "port": None if port is None else port_facts(port),
        "interfaces": interfaces,
        "route": None if route_to is None else route_facts(route_to, interfaces),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="toolkit.doctor.host_probe")
    parser.add_argument("--packages", default="")
    parser.add_argument("--port", type=int)
    parser.add_argument("--route-to")
    args = parser.parse_args(argv)
    packages = [name for name in args.packages.split(",") if name]
    print(json.dumps(probe(packages, args.port, args.route_to)))


if __name__ == "__main__":
    main()
