"""ZeRO reduces its gradients and gathers its weights through the toolkit's shared memory
(toolkit.backends.shared_memory) when every rank is on one host (`deepspeed.allreduce`).

Where DeepSpeed communicates: every collective goes through one module-level object,
`deepspeed.comm.comm.cdb` (its TorchBackend over torch.distributed). DeepSpeed has no setting
for the transport of any of the collectives below (its CPU shared-memory op serves
`inference_all_reduce` only, never training), so the toolkit wraps `cdb`: a SUM all-reduce,
reduce or reduce-scatter, or an all-gather, over a group of every rank goes through shared
memory, anything else to DeepSpeed's own backend unchanged.

- ZeRO-0's `engine.allreduce_bucket` and ZeRO-1/2's `average_tensor` (with `reduce_scatter:
  true`, which the toolkit writes) flatten a bucket of gradients, divide it by the world size
  before or after, and call `cdb.all_reduce`.
- With `use_multi_rank_bucket_allreduce: false` (the toolkit's
  `zero.multi_rank_bucket_allreduce`), ZeRO-1/2's `average_tensor` instead reduces each rank's
  partition of the bucket to that rank (`allreduce_bucket` with a rank: `cdb.reduce` to its
  global rank).
- After the optimizer step, ZeRO-1/2 gather each rank's updated weight partition into the full
  flat weights (`all_gather_into_tensor_dp_groups` in runtime/utils.py:
  `cdb.all_gather_into_tensor`).
- ZeRO-3 gathers a module's weights before its forward and backward
  (`_dist_allgather_fn` in partition_parameters.py: `cdb.all_gather_into_tensor` with
  async_op=True, waited on before the weights are used) and reduces each bucket of gradients
  with `reduce_scatter_coalesced` (runtime/comm/coalesced_collectives.py: pre-divided, then
  `cdb.reduce_scatter_tensor`).

An asynchronous call completes before it returns. Under Gloo a ZeRO-3 gather overlaps the
work between its call and its wait; here that work waits instead, and the gather itself takes
a fraction of Gloo's time. Order: the shared memory serves every group of every rank through
one channel, in call order, where Gloo keeps a queue per group. That needs every rank to issue
these collectives in the same order, which DeepSpeed's ZeRO does (each rank runs the same
modules in the same order, and ZeRO-3's prefetch follows the trace of that order); a rank that
did not would meet a peer's different collective, and the transport stops every rank with
an error naming each one's call (a chunk records its collective and size). The pipeline engine
reduces over groups of some ranks, and its collectives stay DeepSpeed's
(`toolkit.spec.deepspeed_section.collectives_over_every_rank`); its sends and receives have a
wrapper of their own (toolkit.backends.deepspeed.send_recv_comm). A reduce's `dst` is a global
rank (DeepSpeed maps its group rank to one), which is the transport's rank over every rank.

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


class CommWrapper:
    """A wrapper in front of DeepSpeed's communication backend (`deepspeed.comm.comm.cdb`):
    what it does not define is the wrapped backend's."""

    inner: Any

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class SharedMemoryComm(CommWrapper):
    """DeepSpeed's communication backend with `all_reduce`, `reduce`, `all_gather_into_tensor`
    and `reduce_scatter_tensor` over shared memory where they can; every other attribute is the
    wrapped backend's. An asynchronous call (ZeRO-3's weight gathers) completes before it
    returns, with a handle whose `wait` has nothing left to do."""

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
        if not self._summable(tensor, op, group):
            return self.inner.all_reduce(tensor, op, group, async_op)
        self.transport.sum_(tensor)
        return _done(async_op)

    def reduce(
        self,
        tensor: torch.Tensor,
        dst: int,
        op: Any = ReduceOp.SUM,
        group: Any = None,
        async_op: bool = False,
    ) -> Any:
        if not self._summable(tensor, op, group):
            return self.inner.reduce(tensor=tensor, dst=dst, op=op, group=group, async_op=async_op)
        self.transport.reduce_to_(tensor, dst)
        return _done(async_op)

    def all_gather_into_tensor(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: Any = None,
        async_op: bool = False,
    ) -> Any:
        if not self._plain(output_tensor, input_tensor, group):
            return self.inner.all_gather_into_tensor(
                output_tensor=output_tensor,
                input_tensor=input_tensor,
                group=group,
                async_op=async_op,
            )
        self.transport.all_gather_into_(output_tensor, input_tensor)
        return _done(async_op)

    def reduce_scatter_tensor(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        op: Any = ReduceOp.SUM,
        group: Any = None,
        async_op: bool = False,
    ) -> Any:
        if not _is_sum(op) or not self._plain(input_tensor, output_tensor, group):
            return self.inner.reduce_scatter_tensor(
                output_tensor=output_tensor,
                input_tensor=input_tensor,
                op=op,
                group=group,
                async_op=async_op,
            )
        self.transport.reduce_scatter_into_(output_tensor, input_tensor)
        return _done(async_op)

    def _plain(self, whole: torch.Tensor, share: torch.Tensor, group: Any) -> bool:
        """A collective between one CPU tensor of every rank's shares and one share, over every
        rank: what the transport moves; anything else goes to DeepSpeed's backend."""
        return (
            whole.numel() == share.numel() * self.transport.world_size
            and whole.dtype == share.dtype
            and whole.is_contiguous()
            and share.is_contiguous()
            and not whole.is_cuda
            and self._every_rank(group)
        )

    def _summable(self, tensor: torch.Tensor, op: Any, group: Any) -> bool:
        """A SUM of one CPU tensor over every rank: what the transport's sums take."""
        return _is_sum(op) and self._every_rank(group) and not tensor.is_cuda

    def _every_rank(self, group: Any) -> bool:
        return group is None or dist.get_world_size(group) == self.transport.world_size


class _Completed:
    """The handle of an asynchronous collective that finished before it was returned."""

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


def _done(async_op: bool) -> _Completed | None:
    """What torch.distributed returns: a handle for an asynchronous call, None otherwise."""
    return _Completed() if async_op else None


def _is_sum(op: Any) -> bool:
    return op is ReduceOp.SUM or (isinstance(op, dist.ReduceOp) and op == dist.ReduceOp.SUM)


def install(transport: SharedMemoryCollectives) -> None:
    """Put the wrapper in front of DeepSpeed's backend; after `deepspeed.init_distributed`."""
    deepspeed_comm.cdb = SharedMemoryComm(deepspeed_comm.cdb, transport)


def uninstall() -> None:
    """Give DeepSpeed its own backend back (at shutdown, before it destroys its groups), from
    behind every wrapper the toolkit put in front of it."""
    while isinstance(deepspeed_comm.cdb, CommWrapper):
        deepspeed_comm.cdb = deepspeed_comm.cdb.inner
