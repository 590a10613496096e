"""DDP's comm hook over the shared-memory allreduce (toolkit.backends.shared_memory)."""

# No `from __future__ import annotations` here: DDP's register_comm_hook compares comm_hook's
# annotations with dist.GradBucket and Future[Tensor] themselves and rejects strings.

import torch
import torch.distributed as dist

from toolkit.backends.shared_memory import SharedMemoryCollectives


def comm_hook(
    state: SharedMemoryCollectives, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP's comm hook signature: average one bucket, already done when it returns. DDP calls
    it from the backward pass, for the same buckets in the same order on every rank."""
    done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    done.set_result(state.mean_(bucket.buffer()))
    return done
