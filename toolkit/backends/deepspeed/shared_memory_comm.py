"""ZeRO stages 0-2 sum their gradients, and ZeRO-1/2 gather their updated weights, through the
toolkit's shared memory (toolkit.backends.shared_memory) when every rank is on one host
(`deepspeed.allreduce`).

Where DeepSpeed sums: every collective goes through one module-level object,
`deepspeed.comm.comm.cdb` (its TorchBackend over torch.distributed). ZeRO-0's
`engine.allreduce_bucket` and ZeRO-1/2's `average_tensor` (with `reduce_scatter: true`, which the
toolkit writes) flatten a bucket of gradients, divide it by the world size before or after, and
call `deepspeed.comm.all_reduce(bucket, group=dp_process_group)`, that is `cdb.all_reduce(tensor,
op, group, async_op)`. After the optimizer step, ZeRO-1/2 gather each rank's updated weight
partition into the full flat weights (`all_gather_into_tensor_dp_groups` in runtime/utils.py:
`cdb.all_gather_into_tensor`). DeepSpeed has no setting for the transport of either (its CPU
shared-memory op serves `inference_all_reduce` only, never training), so the toolkit wraps `cdb`:
a synchronous SUM all-reduce or all-gather over a group of every rank goes through shared memory,
anything else to DeepSpeed's own backend unchanged. ZeRO-3 reduces with reduce_scatter and the
pipeline engine over groups of some ranks; neither is wrapped
(`toolkit.spec.deepspeed_section.all_reduces_over_every_rank`).

Bits: the sum of 2 ranks is a + b through either transport and a gather copies, so the weights are
Gloo's to the bit (the parity cases hold them to DDP's); with more ranks the order of the
additions differs from Gloo's ring, which changes the rounding only, as under DDP.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from deepspeed.comm import comm as deepspeed_comm
from deepspeed.comm.reduce_op import ReduceOp

from toolkit.backends.shared_memory import SharedMemoryCollectives

FIELD = "deepspeed.allreduce"


class SharedMemoryComm:
    """DeepSpeed's communication backend with `all_reduce` and `all_gather_into_tensor` over
    shared memory where they can; every other attribute is the wrapped backend's."""

    def __init__(self, inner: Any, transport: SharedMemoryCollectives) -> None:
        self.inner = inner
        self.transport = transport

    def all_reduce(
        self,
        tensor: torch.Tensor,
        op: Any = ReduceOp.SUM,
        group: Any = None,
        async_op: bool = False,
    ) -> Any:
        if async_op or not _is_sum(op) or not self._every_rank(group) or tensor.is_cuda:
            return self.inner.all_reduce(tensor, op, group, async_op)
        self.transport.sum_(tensor)
        return None  # what a synchronous torch.distributed.all_reduce returns

    def all_gather_into_tensor(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: Any = None,
        async_op: bool = False,
    ) -> Any:
        whole = output_tensor.numel() == input_tensor.numel() * self.transport.world_size
        plain = whole and output_tensor.is_contiguous() and not output_tensor.is_cuda
        if async_op or not plain or not self._every_rank(group):
            return self.inner.all_gather_into_tensor(
                output_tensor=output_tensor,
                input_tensor=input_tensor,
                group=group,
                async_op=async_op,
            )
        self.transport.all_gather_into_(output_tensor, input_tensor)
        return None

    def _every_rank(self, group: Any) -> bool:
        return group is None or dist.get_world_size(group) == self.transport.world_size

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _is_sum(op: Any) -> bool:
    return op is ReduceOp.SUM or (isinstance(op, dist.ReduceOp) and op == dist.ReduceOp.SUM)


def install(transport: SharedMemoryCollectives) -> None:
    """Put the wrapper in front of DeepSpeed's backend; after `deepspeed.init_distributed`."""
    deepspeed_comm.cdb = SharedMemoryComm(deepspeed_comm.cdb, transport)


def uninstall() -> None:
    """Give DeepSpeed its own backend back (at shutdown, before it destroys its groups)."""
    if isinstance(deepspeed_comm.cdb, SharedMemoryComm):
        deepspeed_comm.cdb = deepspeed_comm.cdb.inner
