"""The layouts of the shared-memory segments of the DDP and DeepSpeed backends, apart from the
backends so that `toolkit plan` can count their bytes without importing torch:

- the collectives' segment (toolkit.backends.shared_memory): a flag cache line per rank, then
  two sets of one slot per rank;
- the pipeline's mailboxes (toolkit.backends.shared_memory_p2p): for each ordered pair of ranks
  that send to each other, two counters on cache lines of their own and a ring of bytes."""

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


MAILBOX_RING_BYTES = 2 << 20
"""The bytes one sender may have in flight to one receiver before its send waits: four of the
bench pipeline's 512 KiB activations. A larger message streams through the ring."""
MAILBOX_COUNTER_BYTES = 128
"""Two int64 counters, each on its own 64-byte cache line: the bytes the sender has written in
all (its line) and the bytes the receiver has read in all (its line)."""
MAILBOX_ALIGN = 64
"""Every message's header and payload start on a cache line of the ring."""


def mailbox_bytes(mailboxes: int) -> int:
    """The mailboxes' segment: every mailbox's counters, then every mailbox's ring."""
    return mailboxes * (MAILBOX_COUNTER_BYTES + MAILBOX_RING_BYTES)


def mailboxes_per_rank(stages: int) -> int:
    """The mailboxes one pipeline rank sends or receives through: to and from its one
    neighbour with 2 stages, to and from each of 2 with more (DeepSpeed pairs every stage with
    the next, the last with the first)."""
    return 2 if stages == 2 else 4
