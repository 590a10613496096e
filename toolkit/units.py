"""Byte units, and the short size label every table and message of the toolkit uses."""

from __future__ import annotations

KIB = 1 << 10
MIB = 1 << 20


def size_label(size: int) -> str:
    """Whole MiB from 1 MiB up, else whole KiB: "64 MiB", "4 KiB"."""
    return f"{size // MIB} MiB" if size >= MIB else f"{size // KIB} KiB"
