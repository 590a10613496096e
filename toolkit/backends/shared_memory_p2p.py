"""Point-to-point sends and receives through shared memory, for ranks that share one host:
DeepSpeed's pipeline engine hands activations and their gradients between stages so
(`deepspeed.send_recv`; toolkit.backends.deepspeed.send_recv_comm).

Why: DeepSpeed's pipeline sends with blocking `dist.send`/`dist.recv`
(deepspeed/runtime/pipe/p2p.py refuses `async_op`). Over Gloo a send of a 512 KiB activation
returns only once the neighbour has received it, so every hand-off is a rendezvous: the stage
that gets there first waits for the other, each steady-state cycle lasts as long as the slower
stage's cycle of that moment, and the bubble sits above the formula (docs/bench/findings.md).
Through a mailbox a send returns as soon as its bytes are in the ring, and a stage waits only
for what it needs: a receive for its message.

How: one segment per job in /dev/shm holds a mailbox for each ordered pair of ranks that send to
each other (the pipeline's neighbours, `pairs`). A mailbox is a ring of MAILBOX_RING_BYTES and
two counters on cache lines of their own: the bytes its sender has written in all, and the bytes
its receiver has read in all. Their difference is what is in flight; only the sender writes the
first and only the receiver the second.

- send: a header (the payload's byte count) on a cache line of its own, then the payload, each
  written where the ring has room and published by advancing the written count. A message
  larger than the ring streams through it: the send then returns once the receiver has taken
  all but the last ring's worth.
- receive: wait for the header, check that the sender's byte count is this tensor's (Gloo
  refuses a receive of another size too; here it is an error naming both), copy the payload out
  as it arrives, and advance the read count.

Messages of a pair arrive in the order they were sent, as over Gloo with one tag. The counters
are ordinary stores and loads, correct under x86-64's total store order as the collectives'
barrier is (toolkit.backends.shared_memory): a receiver that sees the written count also sees
the bytes written before it, and a sender that sees the read count may overwrite what was read.
A peer that neither sends what a rank waits for nor frees room within `timeouts.collective_s`
fails the rank with an error naming that peer and the host, so a stopped stage ends the job.

A waiting rank sleeps between polls, up to LONGEST_PAUSE_SECONDS: a pipeline stage waits for its
neighbour's pass of tens of milliseconds every micro-batch, and the collectives' millisecond
there would be a millisecond of bubble per hand-off.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch

from toolkit.backends import shared_memory
from toolkit.errors import ToolkitError
from toolkit.launch.environment import LaunchEnvironment
from toolkit.shm_layout import (
    MAILBOX_ALIGN,
    MAILBOX_COUNTER_BYTES,
    MAILBOX_RING_BYTES,
    mailbox_bytes,
)
from toolkit.spec.fields import AllreduceTransport

SPIN_SECONDS = 0.0
"""A waiting stage does not spin: it waits for a neighbour's pass of tens of milliseconds, and a
spinning rank holds a core (the collectives spin 2 ms, where ranks arrive together)."""
LONGEST_PAUSE_SECONDS = 0.0001
"""The longest sleep between polls of a waiting rank (they double from 1/64 of it): a stage
picks up its message at most this much after it arrives."""
_WORDS_PER_LINE = MAILBOX_ALIGN // 8


def open_if_chosen(
    choice: AllreduceTransport,
    *,
    field: str,
    env: LaunchEnvironment,
    pairs: Sequence[tuple[int, int]],
    timeout_s: float,
) -> SharedMemoryMailboxes | None:
    """The mailboxes of `pairs` where `choice` resolves to shared memory (as the collectives',
    toolkit.backends.shared_memory.resolve), else None: the engine's Gloo. Collective: every
    rank calls it at the same point, with the same pairs."""
    transport = shared_memory.resolve(
        choice,
        field=field,
        world_size=env.world_size,
        local_world_size=env.local_world_size,
        segment_size=mailbox_bytes(len(set(pairs))),
    )
    if transport == "gloo" or not pairs:
        return None
    return SharedMemoryMailboxes(rank=env.rank, pairs=pairs, timeout_s=timeout_s, field=field)


def _aligned(nbytes: int) -> int:
    return -(-nbytes // MAILBOX_ALIGN) * MAILBOX_ALIGN


class _Mailbox:
    """One direction between two ranks: the ring and the two counters, as both ends see it."""

    def __init__(self, counters: np.ndarray, ring: torch.Tensor) -> None:
        self.counters = counters  # the written count on one cache line, the read count on the next
        self.ring = ring

    def room(self, written: int) -> int:
        """Bytes the sender, having written `written` in all, may write now."""
        return MAILBOX_RING_BYTES - (written - int(self.counters[_WORDS_PER_LINE]))

    def waiting(self, read: int) -> int:
        """Bytes the receiver, having read `read` in all, may read now."""
        return int(self.counters[0]) - read

    def publish_written(self, total: int) -> None:
        self.counters[0] = total

    def publish_read(self, total: int) -> None:
        self.counters[_WORDS_PER_LINE] = total


class SharedMemoryMailboxes:
    """The mailboxes of one job's pipeline. Create it on every rank at the same point, with the
    same `pairs` (ordered (sender, receiver) ranks): the constructor is collective over the
    default process group. `field` is the spec setting that chose it, named in its errors."""

    def __init__(
        self, *, rank: int, pairs: Sequence[tuple[int, int]], timeout_s: float, field: str
    ) -> None:
        self.rank = rank
        self.field = field
        self.timeout_s = timeout_s
        pairs = sorted(set(pairs))
        count = len(pairs)
        self._mapping = shared_memory.map_segment(rank, mailbox_bytes(count), field)
        counters = np.frombuffer(
            self._mapping, dtype=np.int64, count=count * MAILBOX_COUNTER_BYTES // 8
        ).reshape(count, -1)
        rings = torch.frombuffer(
            self._mapping,
            dtype=torch.uint8,
            offset=count * MAILBOX_COUNTER_BYTES,
            count=count * MAILBOX_RING_BYTES,
        ).view(count, MAILBOX_RING_BYTES)
        self._boxes = {
            pair: _Mailbox(counters[index], rings[index]) for index, pair in enumerate(pairs)
        }
        # This end's running total of each of its mailboxes: bytes written where it sends, read
        # where it receives. Every total is a whole number of cache lines.
        self._totals = dict.fromkeys(pairs, 0)
        self._burst = dict.fromkeys(pairs, 0)
        self.largest_burst = 0
        """The most ring bytes (headers and padding included) this rank has sent to one peer
        between two receives from it: what one send instruction of a pipeline puts in flight."""

    def connects(self, sender: int, receiver: int) -> bool:
        return (sender, receiver) in self._boxes

    def send(self, tensor: torch.Tensor, receiver: int) -> None:
        """Put `tensor`'s bytes in the mailbox to `receiver`; returns once they are all in the
        ring (a message larger than the ring, once all but its last ring's worth was taken)."""
        pair = (self.rank, receiver)
        box = self._boxes[pair]
        payload = _bytes_of(tensor.contiguous())
        header = torch.tensor([payload.numel()], dtype=torch.int64).view(torch.uint8)
        self._burst[pair] += MAILBOX_ALIGN + _aligned(payload.numel())
        self.largest_burst = max(self.largest_burst, self._burst[pair])
        for part in (header, payload):
            for at, piece in self._pieces(pair, part.numel(), box.room, receiver, "take"):
                box.ring[at : at + piece.stop - piece.start].copy_(part[piece])
                box.publish_written(self._totals[pair])

    def recv(self, tensor: torch.Tensor, sender: int) -> None:
        """Fill `tensor` with the next message from `sender`, waiting for it."""
        pair = (sender, self.rank)
        if (self.rank, sender) in self._burst:
            self._burst[(self.rank, sender)] = 0
        out = tensor if tensor.is_contiguous() else torch.empty_like(tensor).contiguous()
        payload = _bytes_of(out)
        header = torch.zeros(1, dtype=torch.int64)
        self._read(pair, header.view(torch.uint8))
        if int(header[0]) != payload.numel():
            raise ToolkitError(
                f"{self.field} (shared memory): rank {self.rank} expected {payload.numel()} "
                f"bytes from rank {sender} and rank {sender} sent {int(header[0])}; a send "
                "and its receive must have the same shape and dtype"
            )
        self._read(pair, payload)
        if out is not tensor:
            tensor.copy_(out)

    def _read(self, pair: tuple[int, int], part: torch.Tensor) -> None:
        """Fill `part` (bytes) from the mailbox of `pair` as they arrive."""
        box = self._boxes[pair]
        for at, piece in self._pieces(pair, part.numel(), box.waiting, pair[0], "send"):
            part[piece].copy_(box.ring[at : at + piece.stop - piece.start])
            box.publish_read(self._totals[pair])

    def _pieces(
        self,
        pair: tuple[int, int],
        nbytes: int,
        available: Callable[[int], int],
        peer: int,
        what: str,
    ) -> Iterator[tuple[int, slice]]:
        """Where in the ring each piece of an `nbytes` part goes or comes from, and which bytes
        of the part it is, as `available` (room to write, or bytes to read) allows. The pair's
        total has advanced past a piece by the time the caller publishes it: by the piece, and
        by the padding to a whole cache line after a part's last piece."""
        offset = 0
        while offset < nbytes:
            total = self._totals[pair]
            ready = self._wait(lambda: available(total), peer, what)  # noqa: B023 (called here)
            at = total % MAILBOX_RING_BYTES
            size = min(nbytes - offset, ready, MAILBOX_RING_BYTES - at)
            piece = slice(offset, offset + size)
            offset += size
            self._totals[pair] = total + (_aligned(size) if offset == nbytes else size)
            yield at, piece

    def _wait(self, available: Callable[[], int], peer: int, what: str) -> int:
        """What `available()` gives once it is positive, or a ToolkitError naming the peer that
        did not `what` a message within the timeout."""
        found = 0

        def ready() -> bool:
            nonlocal found
            found = available()
            return found > 0

        if not shared_memory.wait_for(
            ready,
            timeout_s=self.timeout_s,
            spin_s=SPIN_SECONDS,
            longest_pause_s=LONGEST_PAUSE_SECONDS,
        ):
            raise ToolkitError(
                f"{self.field} (shared memory): rank {self.rank} on {socket.gethostname()} "
                f"waited {self.timeout_s:g} s (timeouts.collective_s) for rank {peer} on the "
                f"same host to {what} a pipeline message; it is dead or stalled"
            )
        return found


def _bytes_of(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's bytes as a flat uint8 view (no copy)."""
    return tensor.view(-1).view(torch.uint8)
