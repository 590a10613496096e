"""What every PyTorch engine shares: the spec's optimizer, precision, rendezvous, conversions.

Imported only by the torch backends (ddp, horovod for torch, deepspeed).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.optim.lr_scheduler import LambdaLR

from toolkit.backends.base import refuse_missing_script_optimizer
from toolkit.cores import bind_rank, threads_in_rank
from toolkit.engines import MPI_ENVIRONMENTS
from toolkit.errors import ToolkitError
from toolkit.launch.environment import LaunchEnvironment
from toolkit.ports import free_port
from toolkit.schedule import lr_ratio
from toolkit.spec import TrainSpec


def collective_timeout(spec: TrainSpec) -> timedelta:
    """How long a blocking collective waits for its peers (the spec's timeouts.collective_s)
    before failing, so that a dead or stalled peer ends the job instead of hanging it."""
    return timedelta(seconds=spec.timeouts.collective_s)


def apply_collective_timeout(timeout: timedelta) -> None:
    """Make every process group this process creates give up after `timeout`.

    `init_process_group(timeout=...)` sets the timeout of the default group only, while
    `new_group()` without a timeout takes `distributed_c10d.default_pg_timeout` (torch's
    30-minute default), looked up when it is called. DeepSpeed creates its data-parallel, ZeRO
    and pipeline groups that way, so only the module default reaches them
    (docs/engine-notes.md, DeepSpeed).
    """
    dist.distributed_c10d.default_pg_timeout = timeout


@dataclass(frozen=True, kw_only=True)
class Rendezvous:
    """Where rank 0 of torch.distributed listens."""

    master_addr: str
    master_port: int


def configure_threads(spec: TrainSpec, env: LaunchEnvironment) -> None:
    """Ranks sharing few cores must not each start a full thread pool, and under
    launch.bind_cores each runs on cores of its own (see toolkit.cores)."""
    bind_rank(spec.launch.bind_cores, env.local_rank, env.local_world_size)
    setting = spec.launch.threads_per_rank
    torch.set_num_threads(threads_in_rank(setting, env.local_world_size, os.environ))


def build_optimizer(params: Any, spec: TrainSpec, lr: float) -> torch.optim.Optimizer:
    """The spec's optimizer with every constant passed explicitly (no torch defaults).

    `foreach=False` fixes the per-parameter loop implementation on every engine, so that two
    engines never differ by which kernel torch picked. Not the `fused` kernels, though faster:
    they round differently from the loop (fused Adam and AdamW everywhere, fused SGD with
    weight decay, or with momentum in the tail elements past a multiple of the vector width;
    docs/engine-notes.md, PyTorch). The spec's optimizer means one sequence of roundings on
    every engine, and the parity runs compare to the bit.
    """
    refuse_missing_script_optimizer(spec)
    opt = spec.optimizer
    if opt.name == "sgd":
        return torch.optim.SGD(
            params,
            lr=lr,
            momentum=opt.momentum,
            dampening=0.0,
            weight_decay=opt.weight_decay,
            nesterov=opt.nesterov,
            foreach=False,
        )
    optimizer_class = torch.optim.AdamW if opt.name == "adamw" else torch.optim.Adam
    return optimizer_class(
        params,
        lr=lr,
        betas=(opt.betas[0], opt.betas[1]),
        eps=opt.eps,
        weight_decay=opt.weight_decay,
        amsgrad=False,
        foreach=False,
    )


def lr_scheduler(optimizer: torch.optim.Optimizer, spec: TrainSpec) -> LambdaLR | None:
    """The spec's schedule (toolkit.schedule.lr_ratio) on the optimizer's learning rate, stepped
    once per optimizer step; None for a constant schedule. LambdaLR sets step 0's rate when it
    is built."""
    if spec.schedule.name == "constant":
        return None
    schedule = spec.schedule
    return LambdaLR(optimizer, lambda step: lr_ratio(schedule, step))


def autocast(spec: TrainSpec, device: torch.device) -> AbstractContextManager[Any]:
    """Mixed precision for the forward pass on `device` (torch autocast); fp32 runs without."""
    if spec.precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    if spec.precision == "fp16":
        return torch.autocast(device.type, dtype=torch.float16)
    return nullcontext()


def rendezvous(spec: TrainSpec, env: LaunchEnvironment) -> Rendezvous:
    """Where rank 0 of torch.distributed listens, from whatever launcher started us."""
    if env.master_addr and env.master_port:
        return Rendezvous(master_addr=env.master_addr, master_port=env.master_port)
    if env.world_size == 1:
        return Rendezvous(master_addr="127.0.0.1", master_port=free_port())
    if env.launcher in MPI_ENVIRONMENTS:
        from toolkit.backends.mpi.rendezvous import rank0_address

        address, port = rank0_address(single_host=env.local_world_size == env.world_size)
        return Rendezvous(master_addr=address, master_port=port)
    if env.hosts:
        return Rendezvous(master_addr=env.hosts[0], master_port=spec.launch.master_port)
    return Rendezvous(master_addr=spec.master_addr, master_port=spec.launch.master_port)


def export_torch_env(env: LaunchEnvironment, meeting: Rendezvous) -> None:
    """The variables torch.distributed's env:// and DeepSpeed read, from any launcher."""
    os.environ.update(
        MASTER_ADDR=meeting.master_addr,
        MASTER_PORT=str(meeting.master_port),
        RANK=str(env.rank),
        WORLD_SIZE=str(env.world_size),
        LOCAL_RANK=str(env.local_rank),
        LOCAL_WORLD_SIZE=str(env.local_world_size),
    )


def to_tensor(value: Any) -> torch.Tensor:
    return value if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))


def in_place_target(tensor: Any, op: str) -> torch.Tensor:
    """`tensor`, checked that `op` can reduce it in place."""
    if not isinstance(tensor, torch.Tensor):
        raise ToolkitError(
            f"run.allreduce_ reduces a torch.Tensor in place, not a {type(tensor).__name__}",
            "use run.allreduce(value), which takes numbers and arrays too",
        )
    if op == "mean" and not tensor.is_floating_point():
        raise ToolkitError(
            f"run.allreduce_ cannot hold a mean in a {tensor.dtype} tensor",
            'reduce it with op="sum", or use run.allreduce, which returns a float tensor',
        )
    return tensor


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A float32 numpy copy, detached from autograd and from the tensor's storage."""
    return tensor.detach().float().cpu().numpy().copy()


def portable(tensor: torch.Tensor) -> np.ndarray:
    """The portable weights format of one state-dict entry: a floating tensor as float32 (the
    fp32 weights whatever the training precision), any other (an integer buffer such as
    BatchNorm's num_batches_tracked, a bool mask) in its own dtype, so that it loads back."""
    if tensor.is_floating_point():
        return to_numpy(tensor)
    return tensor.detach().cpu().numpy().copy()


def numpy_state(module: torch.nn.Module) -> dict[str, np.ndarray]:
    """Every state_dict() entry (tied parameters under each of their names) in portable form."""
    return {name: portable(tensor) for name, tensor in module.state_dict().items()}


def rank0_buffers(module: torch.nn.Module, broadcast: Callable[[torch.Tensor], None]) -> None:
    """Put rank 0's buffers (BatchNorm's running statistics and counter) on every rank, in
    place, with the engine's own `broadcast` from rank 0.

    Data parallelism defines a model's buffers as rank 0's, grown from its own samples: DDP
    broadcasts them from rank 0 before every forward, while Horovod, DeepSpeed and FSDP leave
    each rank its own. Rank 0's are the same under every engine; the backends call this before
    they evaluate and before they read the full weights, so that metrics and weights are the
    same on every rank and engine. Training never reads them, so the step is unchanged."""
    for buffer in module.buffers():
        broadcast(buffer)


def require_module(model: Any) -> torch.nn.Module:
    if not isinstance(model, torch.nn.Module):
        raise ToolkitError(
            f"prepare() needs a torch.nn.Module for a torch backend, got {type(model).__name__}.",
            "build the model with torch, or set framework: tensorflow with a TF backend",
        )
    return model


class TorchCollectives:
    """allreduce, broadcast and barrier over torch.distributed, for backends built on it.
    Values go to the rank's device first: NCCL reduces GPU tensors only."""

    env: LaunchEnvironment
    device: torch.device

    def allreduce(self, value: Any, op: str = "mean") -> Any:
        tensor = to_tensor(value).to(self.device).clone()
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor / self.env.world_size if op == "mean" else tensor

    def allreduce_(self, tensor: Any, op: str = "mean") -> Any:
        dist.all_reduce(in_place_target(tensor, op), op=dist.ReduceOp.SUM)
        return tensor.div_(self.env.world_size) if op == "mean" else tensor

    def broadcast(self, value: Any, root: int = 0) -> Any:
        tensor = to_tensor(value).to(self.device).clone()
        dist.broadcast(tensor, src=root)
        return tensor

    def barrier(self) -> None:
        dist.barrier()

    def broadcast_from_rank0(self, tensor: torch.Tensor) -> None:
        """In place, over the job's process group (rank0_buffers)."""
        dist.broadcast(tensor, src=0)


def release_process_groups(
    backend: object,
    holders: Sequence[str],
    destroy: Callable[[], None] = dist.destroy_process_group,
) -> None:
    """End torch.distributed so that its gloo threads are joined before the interpreter exits.

    Otherwise runs can abort as the script exits, with "terminate called without an active
    exception" (SIGABRT; docs/engine-notes.md, PyTorch): a gloo worker thread
    (ProcessGroupGloo::runLoop) destroys a finished allreduce whose tensors hold Python objects,
    taking the GIL while the interpreter finalizes; Python ends that thread with pthread_exit,
    and the forced unwind through a noexcept destructor calls std::terminate. The groups stay
    alive because the DDP wrapper, DeepSpeed's engine, optimizer and caches hold them after
    destroy_process_group. So: a barrier (no work in flight), the destroy, drop the backend
    attributes named in `holders`, and collect, which destroys the groups and joins their
    threads now.
    """
    if not dist.is_initialized():
        return
    dist.barrier()
    destroy()
    for name in holders:
        backend.__dict__.pop(name, None)
    gc.collect()
