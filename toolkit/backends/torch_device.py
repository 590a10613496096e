"""The torch engines' device: the spec's `device` resolved in the rank, bound before any group.

Imported only by the torch backends. Under CUDA each rank binds `cuda:<local rank>` with
`torch.cuda.set_device` before its process group starts (NCCL creates its communicator on the
current device), and the engines' groups use NCCL; on the CPU they use Gloo
(`toolkit.device`). The model, every micro-batch, the loss, the optimizer state and the
schedule then live on that device; weights, metrics and checkpoints come back as CPU arrays
(`torch_common.portable`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from toolkit.backends import torch_common as common
from toolkit.device import (
    announce,
    check_gpus_for_ranks,
    process_group_backend,
    resolve_device,
)
from toolkit.launch.environment import LaunchEnvironment
from toolkit.spec import TrainSpec


def visible_cuda_gpus() -> int:
    """GPUs this process's torch can use (0 for a CPU build of torch)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def bind_device(
    spec: TrainSpec, env: LaunchEnvironment, *, local_rank: int | None = None
) -> torch.device:
    """This rank's torch.device, bound as the current CUDA device under CUDA.

    `local_rank` overrides the launcher's (Horovod knows it only after hvd.init). Under
    `device: auto` rank 0 says once on stderr which device it chose.
    """
    visible = visible_cuda_gpus()
    device = resolve_device(spec.device, visible)
    announce(spec.device, device, visible, env.rank)
    if device == "cpu":
        return torch.device("cpu")
    index = env.local_rank if local_rank is None else local_rank
    check_gpus_for_ranks(env.local_world_size, visible)
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def group_backend(device: torch.device) -> str:
    """torch.distributed's backend for the bound device: NCCL for a GPU, Gloo for the CPU."""
    return process_group_backend("cuda" if device.type == "cuda" else "cpu")


def start_process_group(spec: TrainSpec, env: LaunchEnvironment) -> torch.device:
    """What DDP and FSDP start with: the rank's threads, the rendezvous variables, the spec's
    collective timeout, its device bound, then torch's default group on that device's backend
    (unless the script started one); returns the device."""
    common.configure_threads(spec, env)
    common.export_torch_env(env, common.rendezvous(spec, env))
    common.apply_collective_timeout(common.collective_timeout(spec))
    device = bind_device(spec, env)
    if not dist.is_initialized():
        dist.init_process_group(
            group_backend(device),
            init_method="env://",
            rank=env.rank,
            world_size=env.world_size,
            timeout=common.collective_timeout(spec),
        )
    return device
