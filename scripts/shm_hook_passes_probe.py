"""Probe: the most a fused kernel could save in the DDP hook's shared-memory mean.

The hook (toolkit/backends/shared_memory.py, `_reduce_chunk_`) makes each rank's sums of its own
share in three torch calls: divide in place, add the peer's term, copy the sums into its slot.
A kernel of the toolkit's own could make them in one pass (read own and peer, write bucket and
slot) with the same two roundings. This probe bounds its gain without writing it: the hook's
memory work on one 25 MiB fp32 bucket of 2 ranks, chunk by chunk (barriers left out, one
process: the peer's slot is a second buffer), against the same work with those three calls
replaced by one `torch.add(own, peer, out=slot)`, which makes one write fewer than the fused
kernel would. Beside them, one copy of the bucket: the physical floor's move of issue 13.

One JSON line: the median ms of each over `--reps` interleaved repetitions.

    .venv/bin/python scripts/shm_hook_passes_probe.py [--reps 40]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from toolkit.shm_layout import SLOT_BYTES

BUCKET_BYTES = 25 << 20
"""torch's default DDP bucket; the bench MLP's gradients are about this size."""


class Buffers:
    def __init__(self) -> None:
        elements = BUCKET_BYTES // 4
        self.per_slot = SLOT_BYTES // 4
        self.bucket = torch.randn(elements)
        self.original = self.bucket.clone()
        self.my_slots = torch.randn(2, self.per_slot)
        self.peer_slots = torch.randn(2, self.per_slot)

    def hook(self, *, fused_bound: bool) -> None:
        for chunk, start in enumerate(range(0, self.bucket.numel(), self.per_slot)):
            part = self.bucket[start : start + self.per_slot]
            count, half = part.numel(), part.numel() // 2
            mine, peer = self.my_slots[chunk % 2, :count], self.peer_slots[chunk % 2, :count]
            torch.div(part[half:], 2, out=mine[half:])  # the peer's share, divided, to my slot
            own = part[:half]
            if fused_bound:
                torch.add(own, peer[:half], out=mine[:half])
            else:
                torch.div(own, 2, out=own)
                own.add_(peer[:half])
                mine[:half].copy_(own)
            part[half:].copy_(peer[half:])  # the peer's sums of its share into my bucket

    def copy_once(self) -> None:
        self.bucket.copy_(self.original)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(1)
    buffers = Buffers()
    calls: dict[str, Callable[[], None]] = {
        "hook_ms": lambda: buffers.hook(fused_bound=False),
        "fused_bound_ms": lambda: buffers.hook(fused_bound=True),
        "one_copy_ms": buffers.copy_once,
    }
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(args.reps):
        for name, call in calls.items():
            buffers.copy_once()
            start = time.perf_counter()
            call()
            seconds[name].append(time.perf_counter() - start)
    print(json.dumps({name: round(statistics.median(s) * 1e3, 2) for name, s in seconds.items()}))


if __name__ == "__main__":
    main()
