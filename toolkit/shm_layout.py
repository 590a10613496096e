"""The layout of the shared-memory allreduce segment of the DDP and DeepSpeed backends
(toolkit.backends.shared_memory), apart from the backend so that `toolkit plan` can count its
bytes without importing torch: a flag cache line per rank, then two sets of one slot per rank."""

from __future__ import annotations

SHM_DIRECTORY = "/dev/shm"
"""Where this segment lives, and where engines leave theirs (toolkit.launch.shm_leftovers)."""
SLOT_BYTES = 4 << 20
"""One chunk: 4 MiB, so the two slot sets of 2 ranks take 16 MiB of /dev/shm, of 8 ranks 64 MiB
(Docker's default /dev/shm). 256 KiB to 16 MiB chunks stepped within 1 ms of each other here."""
FLAG_STRIDE = 8
"""int64 words per rank: one 64-byte cache line each, so ranks do not share a line. Word 0 is
the rank's barrier count, words 1 and 2 the bytes of the chunk it last wrote into slot set 0
and 1, words 3 and 4 which collective that chunk belongs to."""


def flag_bytes(world_size: int) -> int:
    return FLAG_STRIDE * 8 * world_size


def slots_bytes(world_size: int) -> int:
    """Both slot sets, after the flags."""
    return 2 * world_size * SLOT_BYTES


def segment_bytes(world_size: int) -> int:
    """The whole segment, which every rank maps and, reading its peers' slots, touches."""
    return flag_bytes(world_size) + slots_bytes(world_size)
