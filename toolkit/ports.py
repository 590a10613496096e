"""Picking a free TCP port: used by the local launcher, the backends' rendezvous and the parity
harness. A module of its own so that none of them imports another for it."""

from __future__ import annotations

import random
import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on `host` a moment ago (the OS picks it; another process may
    still take it before the rendezvous binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
LOWEST_LISTEN_PORT = 10000
"""Below this many services listen by convention; the ranges start above it."""


def free_port_range(count: int, host: str = "127.0.0.1") -> int:
    """The first of `count` consecutive TCP ports that were all free on `host` a moment ago,
    below the kernel's ephemeral range.

    For engines that listen on a port per rank (TF's workers at tf.port + rank). A port from
    `free_port` lies in the ephemeral range, where Linux gives bind() and connect() ports of
    opposite parity, so tf.port + 1 is exactly the kind of port an outgoing connection of
    another job holds, and worker 1 could fail with "Could not start gRPC server". Below the
    ephemeral range only listeners take ports, and each port of the range is checked.
    """
    ephemeral_low = _ephemeral_low()
    candidates = list(range(LOWEST_LISTEN_PORT, ephemeral_low - count + 1))
    random.shuffle(candidates)
    for first in candidates[:200]:
        if all(_bindable(host, port) for port in range(first, first + count)):
            return first
    raise OSError(f"no {count} consecutive free ports on {host} below {ephemeral_low}")


def _ephemeral_low() -> int:
    try:
        with open(EPHEMERAL_RANGE_FILE) as file:
            return int(file.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True
