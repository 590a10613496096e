"""Probe: two shared-memory allreduces against torch's Gloo, in the same 2 processes: DeepSpeed's
and the one the toolkit's DDP and DeepSpeed backends use (toolkit/backends/shared_memory.py).

Not part of the bench (the toolkit's DeepSpeed backend turns DeepSpeed's shm_comm op off, see
toolkit/backends/deepspeed/backend.py, so a toolkit rank cannot time it): the evidence for one
route below the physical floor's gap (docs/bench/findings.md). `deepspeed.comm.
inference_all_reduce` on the CPU accelerator sums through a shared-memory segment of the
ranks of one host (the shm_comm op that scripts/setup.sh builds); `all_reduce` goes through
torch.distributed's Gloo over loopback TCP; the toolkit's `SharedMemoryCollectives.sum_` through
its own segment. Rank 0 prints one JSON line: per size, the median
of 10 timed calls (after 3 untimed) in ms and the algorithm bandwidth in GB/s, and whether
both sums were right.

    .venv/bin/deepspeed --num_gpus 2 scripts/shm_allreduce_probe.py
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from fnmatch import fnmatch
from pathlib import Path

import deepspeed
import deepspeed.comm as dist
import torch

from toolkit.backends.shared_memory import SharedMemoryCollectives
from toolkit.launch.shm_leftovers import DEEPSPEED_BUFFERS, mapped_files

SIZES_BYTES = (8, 4 << 10, 1 << 20, 4 << 20, 25 << 20, 64 << 20)
"""25 MiB: the gradients of the bench's MLP (6.3 M parameters, fp32)."""


def timed(call: Callable[[torch.Tensor], object], tensor: torch.Tensor) -> float:
    for _ in range(3):
        call(tensor)
    seconds = []
    for _ in range(10):
        dist.barrier()
        start = time.perf_counter()
        call(tensor)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def main() -> None:
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    toolkit_shm = SharedMemoryCollectives(
        rank=rank, world_size=world, timeout_s=60, field="ddp.allreduce"
    )
    paths: dict[str, Callable[[torch.Tensor], object]] = {
        "gloo": dist.all_reduce,
        "shm": dist.inference_all_reduce,
        "toolkit-shm": toolkit_shm.sum_,
    }
    results: dict[str, dict[str, float | bool]] = {}
    for size in SIZES_BYTES:
        elements = size // 4
        for name, call in paths.items():
            seconds = timed(call, torch.ones(elements))
            check = torch.full((elements,), float(rank + 1))
            call(check)
            results[f"{name} {size} B"] = {
                "ms": round(seconds * 1e3, 3),
                "algbw_gbs": round(size / seconds / 1e9, 3),
                "sum_right": bool(torch.all(check == world * (world + 1) / 2)),
            }
    if rank == 0:
        print(json.dumps(results))
    dist.barrier()
    remove_deepspeed_buffers()
    dist.destroy_process_group()


def remove_deepspeed_buffers() -> None:
    """Unlink the /dev/shm buffers DeepSpeed's shm_comm op mapped into this rank (66 MiB each),
    which it never removes; once every rank has passed the barrier above, none maps a peer's
    anew, and the memory goes when the processes end. Run by `toolkit launch`, the job's
    teardown would remove them; run by the deepspeed launcher, nothing else does."""
    for path in map(Path, mapped_files(processes=["self"])):
        if fnmatch(path.name, DEEPSPEED_BUFFERS):
            path.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
