"""PyTorch FSDP2 (`fully_shard`): parameters, gradients and optimizer state sharded over ranks.

The model's units (`fsdp.wrap`, by default its repeated blocks) and then the whole model are
each given to `fully_shard` over a DeviceMesh of every rank, or of replicate x shard ranks for
HSDP (`parallel.replicate`). Each unit gathers its parameters for its forward and backward and
reduce-scatters its gradients; the optimizer steps on this rank's fp32 shards (DTensors).

- Accumulation is FSDP's own: every micro-batch but the last runs with
  `set_requires_gradient_sync(False)`, so gradients add up unsharded in each unit and are
  reduced once per step; each micro-batch's loss is divided by their number, and FSDP averages
  over ranks, so the step's gradient is the global-batch mean, as under DDP.
- Mixed precision is FSDP's MixedPrecisionPolicy: under bf16 or fp16 the gathered parameters
  and the forward are in that dtype, gradients are reduced in `fsdp.reduce_dtype` (fp32 unless
  the spec says otherwise) and the optimizer keeps fp32 masters. fp16 adds the spec's loss
  scaling (toolkit.backends.torch_loss_scale), its overflow check all-reduced over the shards.
  The model must be fp32 when it is sharded: a model cast to bf16 first would keep bf16
  masters (accelerate issue 2624's trap).
- Clipping is torch's `clip_grad_norm_` over the sharded gradients (DTensors: the norm is
  reduced over the ranks), the formula every engine uses.
- Weights and checkpoints go through PyTorch's distributed checkpoint state-dict API
  (`get_model_state_dict` / `get_optimizer_state_dict`). A save writes each rank's DTensor
  shards as `Block`s of the full fp32 tensors by state_dict name, with no gathering; a resume
  reads the whole tensors and sets them as full state dicts. That is the portable layout every
  engine reads, so checkpoints move between FSDP, DDP and ZeRO, and between layouts.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import parallelize_module

from toolkit.backends import torch_batches as batches
from toolkit.backends import torch_common as common
from toolkit.backends import torch_device, torch_state
from toolkit.backends.base import Backend, LossFn, MetricFn, MicroBatch, StateShare
from toolkit.backends.fsdp.tensor import tensor_plan
from toolkit.backends.torch_data import TorchData
from toolkit.backends.torch_loss_scale import LossScaler, loss_scaler, optimizer_step
from toolkit.backends.torch_recompute import modules_of_classes, recompute
from toolkit.checkpoint import Block, CheckpointState, optimizer_key
from toolkit.errors import ToolkitError

REDUCE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
COMPUTE_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
FULL = StateDictOptions(full_state_dict=True)
"""Every rank gathers every full tensor (full_state_dict is identical on every rank)."""


class FSDPBackend(common.TorchCollectives, TorchData, Backend):
    model: Any
    optimizer: torch.optim.Optimizer
    scaler: LossScaler | None = None

    def setup(self) -> None:
        self.device = torch_device.start_process_group(self.spec, self.env)
        # Each rank holds a shard of the gradients: whether they overflowed is all-reduced.
        self.scaler = loss_scaler(self.spec, self.device, sharded=True)
        if self.spec.fsdp.offload == "cpu" and self.device.type == "cpu":
            raise ToolkitError(
                "fsdp.offload: cpu moves shards from a GPU to the host, and this rank trains on "
                "the CPU (FSDP2's CPUOffloadPolicy needs an accelerator)",
                "set fsdp.offload: none on CPU machines",
            )
        self.mesh = self._mesh()

    def _mesh(self) -> DeviceMesh:
        """The layout as a DeviceMesh: every rank in one shard group, replicate x shard for
        HSDP, or shard x tensor with tensor parallelism (each tensor group consecutive ranks)."""
        layout = self.spec.layout_for(self.env.world_size)
        shape: tuple[int, ...]
        names: tuple[str, ...]
        if layout.tensor > 1:
            shape, names = (layout.shard, layout.tensor), ("shard", "tensor")
        elif layout.replicate > 1:
            shape, names = (layout.replicate, layout.shard), ("replicate", "shard")
        else:
            shape, names = (layout.shard,), ("shard",)
        return init_device_mesh(self.device.type, shape, mesh_dim_names=names)

    def prepare(self, model: Any, optimizer: Any | None = None) -> Any:
        module = common.require_module(model)
        _require_fp32(module)
        if optimizer is not None:
            raise ToolkitError(
                "backend fsdp builds the optimizer on the sharded parameters; prepare() got one "
                "built on the unsharded model",
                "call run.prepare(model) without an optimizer and name it in the spec's "
                "optimizer section",
            )
        module = module.to(self.device)
        if self.spec.parallel.tensor > 1:
            plan = tensor_plan(module, self.spec.parallel.tensor_plan)
            parallelize_module(module, self.mesh["tensor"], plan)
        # After tensor parallelism, before sharding: torchtitan's order.
        recompute(module, self.spec.activation_checkpointing.modules)
        settings: dict[str, Any] = {
            "mesh": self.mesh["shard"] if self.spec.parallel.tensor > 1 else self.mesh,
            "reshard_after_forward": self.spec.fsdp.reshard_after_forward,
            "mp_policy": self._precision_policy(),
            "offload_policy": CPUOffloadPolicy()
            if self.spec.fsdp.offload == "cpu"
            else OffloadPolicy(),
        }
        for unit in reversed(units_of(module, self.spec.fsdp.wrap)):
            fully_shard(unit, **settings)
        self.model = fully_shard(module, **settings)
        lr = self.spec.effective_lr(self.env.world_size)
        self.optimizer = common.build_optimizer(self.model.parameters(), self.spec, lr)
        self.scheduler = common.lr_scheduler(self.optimizer, self.spec)
        return self.model

    def _precision_policy(self) -> MixedPrecisionPolicy:
        """bf16 and fp16: gather and compute in that dtype, reduce in fsdp.reduce_dtype; fp32:
        no casts."""
        if self.spec.precision == "fp32":
            return MixedPrecisionPolicy()
        return MixedPrecisionPolicy(
            param_dtype=COMPUTE_DTYPES[self.spec.precision],
            reduce_dtype=REDUCE_DTYPES[self.spec.fsdp.reduce_dtype],
        )

    def train_step(self, micro_batches: Sequence[MicroBatch], loss_fn: LossFn | None) -> float:
        self.optimizer.zero_grad(set_to_none=True)
        count = len(micro_batches)
        losses = []
        for index, batch in enumerate(micro_batches):
            # Reduce-scatter with the last micro-batch's backward only (module docs).
            self.model.set_requires_gradient_sync(index == count - 1)
            loss = batches.micro_batch_loss(self.model, batch, loss_fn, device=self.device)
            share = batches.share_of_step(loss, count)
            (self.scaler.scale(share) if self.scaler else share).backward()
            losses.append(loss.detach())
        if self.scaler:
            self.scaler.unscale(self.optimizer, self.model.parameters())
        if self.spec.clip_grad_norm > 0:
            clip_sharded(list(self.model.parameters()), self.spec.clip_grad_norm)
        if optimizer_step(self.scaler, self.optimizer) and self.scheduler is not None:
            self.scheduler.step()
        return self.reported_loss(batches.mean_loss(losses))

    def eval_sums(
        self, micro_batches: Sequence[MicroBatch], metric_fn: MetricFn, *, pairs: bool
    ) -> dict[str, float]:
        # Through the sharded model: each unit gathers its parameters for its forward.
        common.rank0_buffers(self.model, self.broadcast_from_rank0)
        return batches.evaluate_module(
            self.model,
            micro_batches,
            metric_fn,
            pairs=pairs,
            precision=nullcontext(),
            device=self.device,
        )

    def full_state_dict(self) -> dict[str, np.ndarray]:
        # Collective: every rank gathers every tensor.
        common.rank0_buffers(self.model, self.broadcast_from_rank0)
        weights: dict[str, Any] = get_model_state_dict(self.model, options=FULL)
        return {name: common.portable(tensor) for name, tensor in weights.items()}

    def capture_state(self) -> StateShare:
        """Each rank writes its own blocks of the weights and optimizer state (its DTensor
        shards, nothing gathered; one replica of each under HSDP or a replicated tensor-
        parallel bias), rank 0 the tensors every rank holds whole, every rank its generators."""
        weights: dict[str, Any] = get_model_state_dict(self.model)
        optimizer: dict[str, Any] = get_optimizer_state_dict(self.model, self.optimizer)
        share = StateShare(arrays=torch_state.rng_arrays(self.env.rank))
        share.model = own_parts(weights, self.env.rank)
        slots, steps = _slots_and_steps(optimizer["state"])
        share.optimizer = own_parts(slots, self.env.rank)
        if self.env.rank == 0:
            share.scalars = torch_state.step_scalars(steps, share.optimizer)
            share.extras = self.scaler.state() if self.scaler else {}
        return share

    def restore_state(self, state: CheckpointState) -> None:
        """Every rank reads the whole checkpoint; FSDP keeps each rank's shards of it."""
        names = set(self.model.state_dict())  # this rank's shards: nothing is gathered
        if names != set(state.model):
            raise ToolkitError(
                f"the checkpoint's weights do not fit this model (missing "
                f"{sorted(names - set(state.model))[:5]}, unexpected "
                f"{sorted(set(state.model) - names)[:5]})",
                "resume with the model the checkpoint was saved from, or set "
                "checkpoint.resume: never",
            )
        weights: dict[str, Any] = {
            name: torch.from_numpy(np.array(v, order="C")) for name, v in state.model.items()
        }
        set_model_state_dict(self.model, weights, options=FULL)
        current: dict[str, Any] = get_optimizer_state_dict(self.model, self.optimizer, options=FULL)
        restored: dict[str, Any] = {
            "state": _torch_optimizer(state, weights),
            "param_groups": current["param_groups"],
        }
        set_optimizer_state_dict(self.model, self.optimizer, restored, options=FULL)
        torch_state.advance_scheduler(self.scheduler, state.applied_steps)
        if self.scaler:
            self.scaler.load(state.extras)
        torch_state.restore_rng(state, self.env.rank)

    def shutdown(self) -> None:
        common.release_process_groups(self, ("model", "optimizer", "scheduler", "mesh"))


def units_of(module: torch.nn.Module, names: Sequence[str]) -> list[torch.nn.Module]:
    """The modules that become FSDP units, outermost first: those of the classes `names`, or
    by default the model's repeated blocks (the modules of its ModuleLists, else the children
    of an nn.Sequential that hold parameters)."""
    if names:
        return modules_of_classes(module, names, "fsdp.wrap")
    lists = [m for m in module.modules() if isinstance(m, torch.nn.ModuleList)]
    if lists:
        return [block for blocks in lists for block in blocks]
    if isinstance(module, torch.nn.Sequential):
        return [child for child in module.children() if any(True for _ in child.parameters())]
    return []


def own_parts(tensors: dict[str, Any], rank: int) -> dict[str, Any]:
    """What this rank writes of a sharded state dict: its `Block` of each DTensor unless
    another rank holds the same block (`_own_block`), and on rank 0 every plain tensor."""
    parts: dict[str, Any] = {}
    for name, tensor in tensors.items():
        if isinstance(tensor, DTensor):
            block = _own_block(tensor, rank)
            if block is not None:
                parts[name] = block
        elif rank == 0:
            parts[name] = common.portable(tensor)
    return parts


def _own_block(tensor: DTensor, rank: int) -> Block | None:
    """This rank's block of `tensor` as DTensor places it (the offsets torch's distributed
    checkpoint saves it at); None for an empty block, or where the tensor is replicated over
    a mesh dimension and this rank is not its first replica there."""
    coordinate: Sequence[int] = tensor.device_mesh.get_coordinate() or ()
    replica = any(
        place.is_replicate() and index != 0
        for place, index in zip(tensor.placements, coordinate, strict=True)
    )
    if tensor.numel() == 0:  # nothing to split: rank 0 writes the empty whole
        empty = common.portable(torch.empty(tensor.shape, dtype=tensor.dtype))
        return Block(empty, (0,) * tensor.ndim, tuple(tensor.shape)) if rank == 0 else None
    local = tensor.to_local()
    if replica or local.numel() == 0:
        return None
    [chunk] = tensor.__create_chunk_list__()
    return Block(common.portable(local), tuple(chunk.offsets), tuple(tensor.shape))


def clip_sharded(parameters: Sequence[torch.nn.Parameter], max_norm: float) -> None:
    """torch's clip_grad_norm_ over gradients that are DTensors on different meshes (sharded
    only, or sharded and tensor-parallel): each mesh's norm is reduced over its ranks, the
    total is the norm of those norms, and every gradient is scaled by max_norm / (total + 1e-6)
    when that is below 1, torch's formula."""
    groups: dict[Any, list[torch.Tensor]] = {}
    for parameter in parameters:
        if parameter.grad is not None:
            mesh = getattr(parameter.grad, "device_mesh", None)
            groups.setdefault(mesh, []).append(parameter.grad)
    norms = []
    for grads in groups.values():
        norm = torch.nn.utils.get_total_norm(grads, foreach=False)
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    if not norms:
        return
    total = float(torch.linalg.vector_norm(torch.stack(norms)))
    scale = max_norm / (total + 1e-6)
    if scale < 1.0:
        for grads in groups.values():
            for grad in grads:
                grad.mul_(scale)


def _require_fp32(module: torch.nn.Module) -> None:
    low = sorted({str(p.dtype) for p in module.parameters() if p.dtype != torch.float32})
    if low:
        raise ToolkitError(
            f"backend fsdp shards an fp32 model; this one has {', '.join(low)} parameters, which "
            "would make the optimizer's masters low precision",
            "build the model in fp32 and set precision: bf16 in the spec: FSDP computes in bf16 "
            "and keeps fp32 masters",
        )


def _slots_and_steps(
    slots_by_name: dict[str, dict[str, Any]],
) -> tuple[dict[str, Any], dict[str, float]]:
    """A sharded optimizer state by parameter name as portable keys ("exp_avg/<param>") to
    their tensors, and each parameter's step count."""
    slots = {
        optimizer_key(slot, name): value
        for name, state in slots_by_name.items()
        for slot, value in state.items()
        if slot != torch_state.STEP and isinstance(value, torch.Tensor)
    }
    steps = {
        name: float(state[torch_state.STEP])
        for name, state in slots_by_name.items()
        if torch_state.STEP in state
    }
    return slots, steps


def _torch_optimizer(
    state: CheckpointState, weights: dict[str, torch.Tensor]
) -> dict[str, dict[str, torch.Tensor]]:
    """The checkpoint's optimizer state as a full torch state by parameter name."""
    restored: dict[str, dict[str, torch.Tensor]] = {}
    for name, slots in torch_state.slots_by_parameter(state).items():
        if name not in weights:
            raise ToolkitError(
                f"the checkpoint's optimizer state names {name!r}, which this model does not have",
                "resume with the model the checkpoint was saved from, or set "
                "checkpoint.resume: never",
            )
        step = torch_state.step_tensor(slots, state.scalars)
        restored[name] = {
            slot: torch.from_numpy(np.array(value, order="C")).to(weights[name].dtype)
            for slot, value in slots.items()
        }
        if step is not None:
            restored[name][torch_state.STEP] = step
    return restored
