"""The pipeline's shared-memory mailboxes (toolkit/backends/shared_memory_p2p.py) in real
processes: every message arrives whole and in order, whatever its size against the ring's; a
send returns before its receive is posted (what Gloo's blocking send does not); a receive of the
wrong size and a peer that never sends are named errors within the timeout; /dev/shm is left as
it was found."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from toolkit.backends.shared_memory import SEGMENT_PREFIX
from toolkit.backends.shared_memory_p2p import SharedMemoryMailboxes
from toolkit.errors import ToolkitError
from toolkit.ports import free_port
from toolkit.shm_layout import MAILBOX_RING_BYTES

FIELD = "deepspeed.send_recv"
ON_X86_64 = platform.machine().lower() in ("x86_64", "amd64") and os.path.isdir("/dev/shm")
RING_FLOATS = MAILBOX_RING_BYTES // 4
# Sizes in float32 elements: empty, tiny, not a whole cache line, exactly the ring, larger than
# it, several rings and a remainder.
SIZES = (0, 1, 17, RING_FLOATS, RING_FLOATS + 5, 3 * RING_FLOATS + 999)
DTYPES = (torch.float32, torch.bfloat16, torch.int64)

pytestmark = [
    pytest.mark.multiproc,
    pytest.mark.skipif(not ON_X86_64, reason="the shared-memory transport runs on x86-64 only"),
]


def _join(rank: int, port: int) -> SharedMemoryMailboxes:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    return SharedMemoryMailboxes(rank=rank, pairs=[(0, 1), (1, 0)], timeout_s=5, field=FIELD)


def _message(index: int, size: int, dtype: torch.dtype) -> torch.Tensor:
    generator = torch.Generator().manual_seed(index)
    return (torch.randn(size, generator=generator, dtype=torch.float64) * 1000).to(dtype)


def _exchange(rank: int, port: int, results: Path) -> None:
    """Rank 0 sends every case to rank 1, several in the ring at once, rank 1 receives them all
    and sends each back; both check every byte."""
    mailboxes = _join(rank, port)
    cases = [
        (i, size, dtype)
        for i, (size, dtype) in enumerate((size, dtype) for dtype in DTYPES for size in SIZES)
    ]
    lines = []
    if rank == 0:
        for index, size, dtype in cases:
            mailboxes.send(_message(index, size, dtype), 1)
        for index, size, dtype in cases:
            back = torch.empty(size, dtype=dtype)
            mailboxes.recv(back, 1)
            lines.append(f"{index} {torch.equal(back, _message(index, size, dtype) + 1)}")
    else:
        received = []
        for index, size, dtype in cases:
            got = torch.full((size,), -7, dtype=dtype)
            mailboxes.recv(got, 0)
            lines.append(f"{index} {torch.equal(got, _message(index, size, dtype))}")
            received.append(got)
        for got in received:
            mailboxes.send(got + 1, 0)
    # A strided tensor goes as its values, and a strided one receives them.
    matrix = torch.arange(12.0).view(3, 4)
    if rank == 0:
        mailboxes.send(matrix.t(), 1)
    else:
        into = torch.empty(3, 4).t()
        mailboxes.recv(into, 0)
        lines.append(f"strided {torch.equal(into, matrix.t())}")
    (results / f"rank{rank}.txt").write_text("\n".join(lines))
    dist.destroy_process_group()


def _segments() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith(SEGMENT_PREFIX)}


def test_every_message_arrives_whole_and_in_order(tmp_path: Path) -> None:
    before = _segments()
    mp.spawn(_exchange, args=(free_port(), tmp_path), nprocs=2)
    for rank in range(2):
        lines = (tmp_path / f"rank{rank}.txt").read_text().splitlines()
        assert len(lines) == len(SIZES) * len(DTYPES) + rank
        assert all(line.endswith("True") for line in lines), lines
    assert _segments() == before, "a segment was left in /dev/shm"


def _send_without_a_receiver(rank: int, port: int, results: Path) -> None:
    """Rank 0 sends two messages of a quarter ring each while rank 1 sleeps; then a receive of
    the wrong size, then a receive from a peer that sends nothing more."""
    mailboxes = _join(rank, port)
    message = torch.ones(RING_FLOATS // 4)
    if rank == 0:
        start = time.monotonic()
        mailboxes.send(message, 1)
        mailboxes.send(message, 1)
        (results / "send_s").write_text(f"{time.monotonic() - start}")
        mailboxes.send(torch.ones(3), 1)
        start = time.monotonic()
        try:
            mailboxes.recv(torch.empty(1), 1)
        except ToolkitError as error:
            (results / "timeout").write_text(f"{time.monotonic() - start}\n{error}")
    else:
        time.sleep(2)
        for _ in range(2):
            mailboxes.recv(torch.empty(RING_FLOATS // 4), 0)
        try:
            mailboxes.recv(torch.empty(4), 0)
        except ToolkitError as error:
            (results / "size").write_text(str(error))
        time.sleep(7)  # past rank 0's 5 s timeout, sending nothing
    dist.destroy_process_group()


def test_sends_do_not_wait_for_the_receiver_and_faults_are_named(tmp_path: Path) -> None:
    mp.spawn(_send_without_a_receiver, args=(free_port(), tmp_path), nprocs=2)
    # Both went in while the receiver slept 2 s: no rendezvous.
    assert float((tmp_path / "send_s").read_text()) < 1.0
    size = (tmp_path / "size").read_text()
    assert "rank 1 expected 16 bytes from rank 0 and rank 0 sent 12" in size
    waited, message = (tmp_path / "timeout").read_text().split("\n", 1)
    assert 5 <= float(waited) < 7
    assert "rank 0 on" in message and "waited 5 s (timeouts.collective_s) for rank 1" in message
    assert "to send a pipeline message; it is dead or stalled" in message
