"""PyTorch DistributedDataParallel: the reference every other engine is held to.

Its process group runs over NCCL when the ranks train on GPUs (each rank on `cuda:<local
rank>`, the module wrapped with `device_ids` of that one GPU) and over Gloo on the CPU
(toolkit.backends.torch_device).

Accumulation uses DDP's own `no_sync()`: gradients of all but the last micro-batch stay local,
and the last backward all-reduces the sum. Each micro-batch's loss is divided by the number of
micro-batches, and DDP averages over ranks, so the step's gradient is the global-batch mean.

Local SGD (`ddp.sync.every_steps` > 1) is torch's post-local SGD: its communication hook stops
all-reducing gradients after `ddp.sync.after` steps, and PostLocalSGDOptimizer's averager
averages the ranks' parameters every `every_steps` steps from there on.

Evaluation runs the unwrapped module: DDP's own forward would broadcast buffers, a collective
that evaluation does not need.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch
from torch.distributed.algorithms.ddp_comm_hooks import (
    default_hooks,
    post_localSGD_hook,
    powerSGD_hook,
)
from torch.distributed.algorithms.model_averaging import averagers
from torch.distributed.optim import PostLocalSGDOptimizer
from torch.nn.parallel import DistributedDataParallel

from toolkit.backends import torch_batches as batches
from toolkit.backends import torch_common as common
from toolkit.backends import torch_device, torch_state
from toolkit.backends.base import Backend, LossFn, MetricFn, MicroBatch, StateShare
from toolkit.backends.torch_data import TorchData
from toolkit.backends.torch_loss_scale import LossScaler, loss_scaler, optimizer_step
from toolkit.backends.torch_recompute import recompute
from toolkit.checkpoint import CheckpointState
from toolkit.errors import ToolkitError
from toolkit.spec import rules


class DDPBackend(common.TorchCollectives, TorchData, Backend):
    model: DistributedDataParallel
    optimizer: torch.optim.Optimizer
    scaler: LossScaler | None = None

    def setup(self) -> None:
        self.device = torch_device.start_process_group(self.spec, self.env)
        self.scaler = loss_scaler(self.spec, self.device)

    def prepare(self, model: Any, optimizer: Any | None = None) -> DistributedDataParallel:
        module = common.require_module(model).to(self.device)
        recompute(module, self.spec.activation_checkpointing.modules)
        # DDP broadcasts rank 0's parameters and buffers at construction.
        self.model = DistributedDataParallel(
            module,
            device_ids=[self.device] if self.device.type == "cuda" else None,
            bucket_cap_mb=self.spec.ddp.bucket_cap_mb,
            gradient_as_bucket_view=self.spec.ddp.gradient_as_bucket_view,
        )
        self._compress(self.spec.compression)
        lr = self.spec.effective_lr(self.env.world_size)
        self.optimizer = optimizer or common.build_optimizer(self.model.parameters(), self.spec, lr)
        self.scheduler = common.lr_scheduler(self.optimizer, self.spec)
        self.stepper: torch.optim.Optimizer = self.optimizer
        if self.spec.ddp.sync.local:
            self.stepper = self._local_sgd(self.optimizer)
        return self.model

    def _local_sgd(self, optimizer: torch.optim.Optimizer) -> PostLocalSGDOptimizer:
        """torch's post-local SGD: the hook all-reduces gradients for `ddp.sync.after` steps
        and then not at all (post_local_gradient_allreduce off: each rank steps alone), and
        the optimizer averages the ranks' parameters every `ddp.sync.every_steps` steps from
        there on. The schedule steps the inner optimizer."""
        sync = self.spec.ddp.sync
        state = post_localSGD_hook.PostLocalSGDState(
            process_group=None,
            subgroup=None,
            start_localSGD_iter=sync.after,
            post_local_gradient_allreduce=False,
        )
        self.model.register_comm_hook(state, post_localSGD_hook.post_localSGD_hook)
        averager = averagers.PeriodicModelAverager(period=sync.every_steps, warmup_steps=sync.after)
        return PostLocalSGDOptimizer(optim=optimizer, averager=averager)

    def _compress(self, compression: str) -> None:
        """DDP's own communication hooks for `compression`: its fp16/bf16 casts (the bucket
        divided by the world size, cast, summed, cast back) or PowerSGD with error feedback."""
        if compression == "bf16" and self.device.type != "cuda":
            raise ToolkitError(
                "compression: bf16 runs DDP's bf16 hook, which needs CUDA 11+ with NCCL 2.10+, "
                "and this rank trains on the CPU",
                "set compression: fp16 on CPU machines",
            )
        if compression in ("fp16", "bf16"):
            hook = default_hooks.fp16_compress_hook
            if compression == "bf16":
                hook = default_hooks.bf16_compress_hook
            self.model.register_comm_hook(None, hook)
        elif compression == "powersgd":
            state = powerSGD_hook.PowerSGDState(
                process_group=None,
                matrix_approximation_rank=self.spec.ddp.powersgd_rank,
                start_powerSGD_iter=self.spec.ddp.powersgd_start_step,
                random_seed=self.spec.seed,
            )
            self.model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)

    def train_step(self, micro_batches: Sequence[MicroBatch], loss_fn: LossFn | None) -> float:
        self.stepper.zero_grad(set_to_none=True)
        count = len(micro_batches)
        losses = []
        for index, batch in enumerate(micro_batches):
            sync = nullcontext() if index == count - 1 else self.model.no_sync()
            with sync:
                with common.autocast(self.spec, self.device):
                    loss = batches.micro_batch_loss(self.model, batch, loss_fn, device=self.device)
                scaled = batches.share_of_step(loss, count)
                (self.scaler.scale(scaled) if self.scaler else scaled).backward()
            losses.append(loss.detach())
        self._step()
        return self.reported_loss(batches.mean_loss(losses))

    def _step(self) -> None:
        if self.scaler:
            self.scaler.unscale(self.optimizer, self.model.parameters())
        if self.spec.clip_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.spec.clip_grad_norm)
        # The stepper is the optimizer itself unless local SGD, which fp16 is refused with.
        if optimizer_step(self.scaler, self.stepper) and self.scheduler is not None:
            self.scheduler.step()

    def eval_sums(
        self, micro_batches: Sequence[MicroBatch], metric_fn: MetricFn, *, pairs: bool
    ) -> dict[str, float]:
        common.rank0_buffers(self.model.module, self.broadcast_from_rank0)
        return batches.evaluate_module(
            self.model.module,
            micro_batches,
            metric_fn,
            pairs=pairs,
            precision=common.autocast(self.spec, self.device),
            device=self.device,
        )

    def full_state_dict(self) -> dict[str, np.ndarray]:
        common.rank0_buffers(self.model.module, self.broadcast_from_rank0)
        return common.numpy_state(self.model.module)

    def capture_state(self) -> StateShare:
        if self.spec.ddp.sync.local:
            raise ToolkitError(
                f"run.save() under local SGD (ddp.sync.every_steps "
                f"{self.spec.ddp.sync.every_steps}): {rules.LOCAL_SGD_STATE}",
                "save without ddp.sync, or keep the weights with run.full_state_dict()",
            )
        return torch_state.capture_replicated(
            self.model.module, self.optimizer, rank=self.env.rank, scaler=self.scaler
        )

    def restore_state(self, state: CheckpointState) -> None:
        torch_state.restore_replicated(
            self.model.module,
            self.optimizer,
            state,
            rank=self.env.rank,
            scheduler=self.scheduler,
            scaler=self.scaler,
        )

    def shutdown(self) -> None:
        common.release_process_groups(self, ("model", "optimizer", "stepper", "scheduler"))
