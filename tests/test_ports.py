"""Port picking for engines that listen on a port per rank."""

from __future__ import annotations

import socket

import pytest

from toolkit import ports


def test_a_port_range_is_free_and_below_the_ephemeral_range() -> None:
    first = ports.free_port_range(4)
    assert first >= ports.LOWEST_LISTEN_PORT and first + 3 < ports._ephemeral_low()
    for port in range(first, first + 4):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))  # each one binds: raises if it was taken


def test_a_range_that_holds_a_port_in_use_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    held.bind(("127.0.0.1", 0))
    taken = held.getsockname()[1]
    try:
        # Candidates in order from just below the held port: the first two ranges hold it.
        monkeypatch.setattr(ports, "LOWEST_LISTEN_PORT", taken - 1)
        monkeypatch.setattr(ports, "_ephemeral_low", lambda: taken + 400)
        monkeypatch.setattr(ports.random, "shuffle", lambda candidates: None)
        first = ports.free_port_range(2)
        assert first > taken
    finally:
        held.close()
