"""A host's probe facts against this machine's: each difference a Problem with its fix, and
what is worth knowing but not wrong (which interface reaches the rendezvous host) as notes."""

from __future__ import annotations

from typing import Any

from toolkit.doctor.probe_protocol import Problem

SAME_ENVIRONMENT_FIX = (
    "install the same environment at the same path on every host (`make setup` in the same "
    "checkout), or point launch.python at the interpreter there"
)


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
