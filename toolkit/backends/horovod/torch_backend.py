"""Horovod for PyTorch: hvd.DistributedOptimizer (ring-allreduce over Gloo or MPI).

Accumulation is Horovod's own `backward_passes_per_step`: gradients of a step's micro-batches
sum locally and are all-reduced once, averaged over ranks (op=Average), with each micro-batch's
loss divided by the number of micro-batches. `gradient_predivide_factor` is set to 1.0
explicitly: it splits the averaging into a division before and after the sum, and any other
value changes the rounding.

`hvd.broadcast_optimizer_state` "initializes" an optimizer that has no state yet by
calling `step()` once with all-zero gradients. That advances Adam's step count (so every later
bias correction differs from torch's) and applies weight decay once (AdamW, or SGD/Adam with L2)
before training starts. A fresh optimizer is identical on every rank anyway (same seed, and the
parameters are broadcast), so the state is broadcast only when there is some (a resumed one).

Clipping and fp16 loss scaling must see the all-reduced gradient: `synchronize()` first, then
the GradScaler's unscale and the clip, then the step inside `skip_synchronize()`, as Horovod's
docs prescribe for torch.cuda.amp.

On GPUs each rank binds `cuda:<Horovod's local rank>` and Horovod reduces the CUDA tensors with
its NCCL operations when it was built with them (`toolkit doctor` says); a Horovod built
without CUDA is refused under device cuda.

Every collective waits with Horovod's own `synchronize`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import horovod.torch as hvd
import numpy as np
import torch

from toolkit.backends import torch_batches as batches
from toolkit.backends import torch_common as common
from toolkit.backends import torch_device, torch_state
from toolkit.backends.base import Backend, LossFn, MetricFn, MicroBatch, StateShare
from toolkit.backends.horovod.settings import check_world_size, export_environment
from toolkit.backends.torch_data import TorchData
from toolkit.backends.torch_loss_scale import LossScaler, loss_scaler, optimizer_step
from toolkit.backends.torch_recompute import recompute
from toolkit.checkpoint import CheckpointState
from toolkit.errors import ToolkitError
from toolkit.render import horovod as render_horovod

OPS = {"Average": hvd.Average, "Sum": hvd.Sum, "Adasum": hvd.Adasum}
COMPRESSION = {"Compression.none": hvd.Compression.none, "Compression.fp16": hvd.Compression.fp16}


class HorovodTorchBackend(TorchData, Backend):
    model: torch.nn.Module
    optimizer: Any
    scaler: LossScaler | None = None

    def setup(self) -> None:
        common.configure_threads(self.spec, self.env)
        export_environment(self.spec, self.env)
        hvd.init()
        check_world_size(hvd.size(), self.env)
        self.device = torch_device.bind_device(self.spec, self.env, local_rank=hvd.local_rank())
        if self.device.type == "cuda" and not hvd.cuda_built():
            raise ToolkitError(
                "device cuda: this Horovod was built without CUDA, so it cannot reduce GPU tensors",
                "rebuild Horovod with HOROVOD_GPU_OPERATIONS=NCCL (scripts/build_horovod.sh), or "
                "set device: cpu",
            )
        self.scaler = loss_scaler(self.spec, self.device)

    def prepare(self, model: Any, optimizer: Any | None = None) -> torch.nn.Module:
        self.model = common.require_module(model).to(self.device)
        recompute(self.model, self.spec.activation_checkpointing.modules)
        lr = self.spec.effective_lr(self.env.world_size)
        base = optimizer or common.build_optimizer(self.model.parameters(), self.spec, lr)
        options = render_horovod.optimizer_options(self.spec, self.env.world_size)
        self.optimizer = hvd.DistributedOptimizer(
            base,
            named_parameters=self.model.named_parameters(),
            compression=COMPRESSION[options["compression"]],
            op=OPS[options["op"]],
            backward_passes_per_step=options["backward_passes_per_step"],
            gradient_predivide_factor=options["gradient_predivide_factor"],
        )
        self.scheduler = common.lr_scheduler(self.optimizer, self.spec)
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        if self.optimizer.state_dict()["state"]:
            # Only state that exists (a resumed optimizer) is broadcast; see the module docs.
            hvd.broadcast_optimizer_state(self.optimizer, root_rank=0)
        return self.model

    def train_step(self, micro_batches: Sequence[MicroBatch], loss_fn: LossFn | None) -> float:
        self.optimizer.zero_grad()
        count = len(micro_batches)
        losses = []
        for batch in micro_batches:
            with common.autocast(self.spec, self.device):
                loss = batches.micro_batch_loss(self.model, batch, loss_fn, device=self.device)
            share = batches.share_of_step(loss, count)
            (self.scaler.scale(share) if self.scaler else share).backward()
            losses.append(loss.detach())
        if self.spec.clip_grad_norm > 0 or self.scaler:
            taken = self._synchronized_step()
        else:
            self.optimizer.step()
            taken = True
        if taken and self.scheduler is not None:
            self.scheduler.step()
        return self.reported_loss(batches.mean_loss(losses))

    def _synchronized_step(self) -> bool:
        """The step on the all-reduced gradient, unscaled and clipped first (module docs);
        False when fp16 gradients overflowed and the step was skipped."""
        self.optimizer.synchronize()
        if self.scaler:
            self.scaler.unscale(self.optimizer, self.model.parameters())
        if self.spec.clip_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.spec.clip_grad_norm)
        with self.optimizer.skip_synchronize():
            return optimizer_step(self.scaler, self.optimizer)

    def eval_sums(
        self, micro_batches: Sequence[MicroBatch], metric_fn: MetricFn, *, pairs: bool
    ) -> dict[str, float]:
        common.rank0_buffers(self.model, self._broadcast_from_rank0)
        return batches.evaluate_module(
            self.model,
            micro_batches,
            metric_fn,
            pairs=pairs,
            precision=common.autocast(self.spec, self.device),
            device=self.device,
        )

    def full_state_dict(self) -> dict[str, np.ndarray]:
        common.rank0_buffers(self.model, self._broadcast_from_rank0)
        return common.numpy_state(self.model)

    @staticmethod
    def _broadcast_from_rank0(tensor: torch.Tensor) -> None:
        hvd.broadcast_(tensor, root_rank=0)

    def capture_state(self) -> StateShare:
        return torch_state.capture_replicated(
            self.model, self.optimizer, rank=self.env.rank, scaler=self.scaler
        )

    def restore_state(self, state: CheckpointState) -> None:
        # Every rank reads the same checkpoint, so nothing needs broadcasting.
        torch_state.restore_replicated(
            self.model,
            self.optimizer,
            state,
            rank=self.env.rank,
            scheduler=self.scheduler,
            scaler=self.scaler,
        )

    def allreduce(self, value: Any, op: str = "mean") -> Any:
        reduce_op = hvd.Average if op == "mean" else hvd.Sum
        tensor = common.to_tensor(value)
        return hvd.allreduce(tensor, op=reduce_op)

    def allreduce_(self, tensor: Any, op: str = "mean") -> Any:
        reduce_op = hvd.Average if op == "mean" else hvd.Sum
        target = common.in_place_target(tensor, op)
        hvd.allreduce_(target, op=reduce_op)
        return tensor

    def broadcast(self, value: Any, root: int = 0) -> Any:
        tensor = common.to_tensor(value)
        return hvd.broadcast(tensor, root_rank=root)

    def barrier(self) -> None:
        hvd.barrier()

    def shutdown(self) -> None:
        hvd.shutdown()
