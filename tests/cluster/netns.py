"""Hosts that are really apart: one network namespace per host, joined to this machine by a
bridge, each with its own address and its own sshd.

Unlike the loopback hosts (tests/cluster/sshd.py), whose ranks all talk over 127.0.0.1, a
namespace host has nothing but its link: its loopback is its own, and every byte to a rank on
another host or to `toolkit launch` crosses the link. Cutting the link (`cut`) is a real
network partition: packets are dropped, nothing is closed, nobody is told.

    this machine (root namespace)          host namespaces
    bridge tknet 10.77.0.1/24  ──veth──  tknet 10.77.0.11   (tk-h1)
                               ──veth──  tknet 10.77.0.12   (tk-h2)
                               ──veth──  tknet 10.77.0.13   (tk-h3)

Every side names its interface `tknet`, as every node of a real cluster names its own eth0, so
a spec's `launch.interface: tknet` holds on each host and on the launching machine. The
namespaces share this machine's files and processes (only the network is apart): the venv and
the project directory are where a user's shared file system would put them.

Needs root and iproute2 (`ip netns`, `ip link`); ClusterUnavailable says which is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from tests.cluster.processes import ClusterUnavailable
from tests.cluster.sshd import SshCluster, start_ssh_cluster

INTERFACE = "tknet"
SUBNET = "10.77.0"
NAMESPACE_PREFIX = "tk-h"
LINK_PREFIX = "tkv-h"
SSH_PORT = 22
"""Each namespace has its own ports: sshd can take the standard one."""


def _ip(*args: str, namespace: str | None = None) -> None:
    argv = ["ip", *args] if namespace is None else ["ip", "netns", "exec", namespace, "ip", *args]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise ClusterUnavailable(f"`{' '.join(argv)}` failed: {done.stderr.strip()}")


def _remove_stale() -> None:
    """What a test run that was killed left behind (names are fixed, so it would collide)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in listed.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(NAMESPACE_PREFIX):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
    links = subprocess.run(["ip", "-brief", "link"], capture_output=True, text=True).stdout
    for line in links.splitlines():
        name = line.split("@")[0].split()[0] if line.split() else ""
        if name.startswith(LINK_PREFIX):
            subprocess.run(["ip", "link", "del", name], capture_output=True)
    subprocess.run(["ip", "link", "del", INTERFACE], capture_output=True)


@dataclass(frozen=True)
class NamespaceHosts:
    """The hosts' addresses and how to start a program on one, cut its link or mend it."""

    addresses: tuple[str, ...]
    namespaces: dict[str, str]
    """The namespace of each address."""
    links: dict[str, str]
    """The bridge side of each host's link: setting it down is the partition."""
    bridge_address: str

    def run_at(self, address: str, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.namespaces[address], *argv]

    def cut(self, address: str) -> None:
        """The host's link goes down: its packets are dropped from now on, in both directions."""
        _ip("link", "set", self.links[address], "down")

    def mend(self, address: str) -> None:
        _ip("link", "set", self.links[address], "up")


def unavailable_reason() -> str | None:
    """Why namespace hosts cannot be built here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "`ip` is missing (Debian's iproute2)"
    return None


@contextmanager
def namespace_hosts(count: int) -> Iterator[NamespaceHosts]:
    """`count` hosts, 10.77.0.11 up; every namespace, link and the bridge removed on exit."""
    reason = unavailable_reason()
    if reason is not None:
        raise ClusterUnavailable(reason)
    _remove_stale()
    bridge = f"{SUBNET}.1"
    addresses = tuple(f"{SUBNET}.{11 + index}" for index in range(count))
    namespaces = {a: f"{NAMESPACE_PREFIX}{i + 1}" for i, a in enumerate(addresses)}
    links = {a: f"{LINK_PREFIX}{i + 1}" for i, a in enumerate(addresses)}
    try:
        _ip("link", "add", INTERFACE, "type", "bridge")
        _ip("addr", "add", f"{bridge}/24", "dev", INTERFACE)
        _ip("link", "set", INTERFACE, "up")
        for address in addresses:
            namespace, link = namespaces[address], links[address]
            _ip("netns", "add", namespace)
            _ip("link", "set", "lo", "up", namespace=namespace)
            _ip("link", "add", link, "type", "veth", "peer", "name", INTERFACE, "netns", namespace)
            _ip("link", "set", link, "master", INTERFACE, "up")
            _ip("addr", "add", f"{address}/24", "dev", INTERFACE, namespace=namespace)
            _ip("link", "set", INTERFACE, "up", namespace=namespace)
        yield NamespaceHosts(addresses, namespaces, links, bridge)
    finally:
        for link in links.values():
            subprocess.run(["ip", "link", "del", link], capture_output=True)
        for namespace in namespaces.values():
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
        subprocess.run(["ip", "link", "del", INTERFACE], capture_output=True)


@dataclass(frozen=True)
class NamespaceCluster:
    """Namespace hosts behind their sshds: `ssh` reaches them like the loopback cluster."""

    ssh: SshCluster
    network: NamespaceHosts

    def launch_section(self) -> dict[str, object]:
        """A spec's `launch`: ssh as SshCluster says, traffic on every host's own link."""
        return {**self.ssh.launch_section(), "interface": INTERFACE}


@contextmanager
def start_namespace_cluster(root: Path, count: int) -> Iterator[NamespaceCluster]:
    """`count` namespace hosts with an sshd each; everything removed on exit (processes
    first: a deleted namespace does not stop what runs in it)."""
    with (
        namespace_hosts(count) as network,
        start_ssh_cluster(
            root,
            hosts=network.addresses,
            addresses=network.addresses,
            run_at=network.run_at,
            port=SSH_PORT,
        ) as ssh,
    ):
        try:
            yield NamespaceCluster(ssh, network)
        finally:
            for address in network.addresses:
                with suppress(ClusterUnavailable):
                    network.mend(address)
