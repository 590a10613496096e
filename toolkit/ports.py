"""Picking a free TCP port: used by the local launcher, the backends' rendezvous and the parity
harness. A module of its own so that none of them imports another for it."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on `host` a moment ago (the OS picks it; another process may
    still take it before the rendezvous binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port
