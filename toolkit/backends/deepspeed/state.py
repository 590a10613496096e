"""DeepSpeed's training state in the portable checkpoint layout: written where it lies.

How ZeRO partitions (read in deepspeed 0.19's stage_1_and_2.py, stage3.py and
utils/tensor_fragment.py, the code `zero_to_fp32.py` mirrors offline):
- ZeRO-1/2 (and the bf16 optimizer): each parameter group is flattened and cut into one
  contiguous fp32 partition per data-parallel rank (`single_partition_of_fp32_groups[g]`); the
  torch optimizer's state is keyed by that flat partition. A parameter whose elements fall in
  this rank's partition carries `_hp_mapping`: `lp_fragment_address` (start and length in the
  flattened parameter) and `hp_fragment_address` (where they are in the flat partition).
  Every rank also holds the full low-precision parameter (the module's own tensor).
- ZeRO-3: every parameter is flattened and cut evenly, rank r holding elements
  [r*p, (r+1)*p) (the last one padded); `safe_get_local_fp32_param` / `_optimizer_state`
  give this rank's slice of the fp32 master and of each state, the module holds the
  low-precision slice in `param.ds_tensor`.
- ZeRO-0 in fp32 has no partitions: the engine's optimizer is the torch optimizer.

Saving: each rank writes its slices as `Fragment`s at their offsets in the flattened
parameter, so no rank gathers anything (a frozen ZeRO-3 parameter, which has no fp32 master,
is gathered once for rank 0). Loading: every rank reads the full tensors and copies out its
own slices, into the fp32 masters, the optimizer state and the low-precision copies; an
optimizer that has not stepped yet gets its state created in DeepSpeed's layout (torch
optimizers create it lazily on the first step, DeepSpeed links its fragments to it then).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import deepspeed
import torch
from deepspeed.utils import safe_get_local_fp32_param, safe_get_local_optimizer_state

from toolkit.backends import torch_state
from toolkit.backends.base import StateShare
from toolkit.backends.torch_common import portable, to_numpy
from toolkit.checkpoint import CheckpointState, Fragment, optimizer_key

STEP = torch_state.STEP


def is_zero3(parameter: torch.nn.Parameter) -> bool:
    return hasattr(parameter, "ds_id")


def is_flat_partitioned(parameter: torch.nn.Parameter) -> bool:
    return hasattr(parameter, "_hp_mapping")


def _flat_partitions(optimizer: Any) -> list[torch.Tensor]:
    """The fp32 flat partitions of ZeRO-1/2 (or of the bf16 optimizer), by group."""
    found = getattr(optimizer, "single_partition_of_fp32_groups", None)
    if found is None:
        found = optimizer.fp32_groups_flat_partition
    return list(found)


def _state_slots(torch_optimizer: torch.optim.Optimizer) -> tuple[list[str], float | None]:
    """The optimizer's tensor slots (e.g. exp_avg) and its step count, from any flat state."""
    slots: set[str] = set()
    step: float | None = None
    for state in torch_optimizer.state.values():
        for slot, value in state.items():
            if slot == STEP:
                step = float(value)
            elif isinstance(value, torch.Tensor):
                slots.add(slot)
    return sorted(slots), step


def _numpy(tensor: torch.Tensor) -> Any:
    return to_numpy(tensor.reshape(-1))


def _named_tensors(module: torch.nn.Module) -> Iterator[tuple[str, Any]]:
    """Every state_dict name (tied parameters under each) and its tensor or Parameter."""
    yield from module.state_dict(keep_vars=True).items()


def capture_partitioned(engine: Any, *, rank: int, dp_rank: int) -> StateShare:
    """ZeRO-1/2/3: each rank's slices of the fp32 masters and optimizer state, as Fragments;
    data-parallel rank 0 (of each pipeline stage) also writes buffers and parameters that
    have no master, rank 0 the scalars."""
    optimizer = engine.optimizer
    slots, step = _state_slots(optimizer.optimizer)
    share = StateShare(arrays=torch_state.rng_arrays(rank))
    names = torch_state.parameter_names(engine.module)
    done: dict[int, tuple[Any, dict[str, Any]]] = {}
    for name, tensor in _named_tensors(engine.module):
        if not isinstance(tensor, torch.nn.Parameter):
            if dp_rank == 0:
                share.model[name] = portable(tensor)
            continue
        if id(tensor) not in done:
            done[id(tensor)] = _parameter_share(tensor, optimizer, slots, dp_rank)
        weights, states = done[id(tensor)]
        if weights is not None:
            share.model[name] = weights
        if name == names.get(id(tensor)):
            share.optimizer.update(
                {optimizer_key(slot, name): value for slot, value in states.items()}
            )
    if rank == 0 and step is not None:
        share.scalars = {STEP: int(step)}
    return share


def _parameter_share(
    parameter: Any, optimizer: Any, slots: list[str], dp_rank: int
) -> tuple[Any, dict[str, Any]]:
    """(weights, {slot: value}) this rank writes for one parameter; weights None: nothing."""
    shape = tuple(parameter.ds_shape if is_zero3(parameter) else parameter.shape)
    if is_zero3(parameter):
        if not parameter.requires_grad:  # no fp32 master: gathered, written by rank 0
            with deepspeed.zero.GatheredParameters([parameter]):
                return (portable(parameter) if dp_rank == 0 else None), {}
        local = safe_get_local_fp32_param(parameter)
        offset = dp_rank * local.numel()
        valid = max(0, min(local.numel(), parameter.ds_numel - offset))
        if valid == 0:
            return None, {}
        states = {
            slot: Fragment(
                _numpy(safe_get_local_optimizer_state(parameter, slot))[:valid], offset, shape
            )
            for slot in slots
        }
        return Fragment(_numpy(local)[:valid], offset, shape), states
    mapping = getattr(parameter, "_hp_mapping", None)
    if not is_flat_partitioned(parameter):
        return (portable(parameter) if dp_rank == 0 else None), {}
    if mapping is None:
        return None, {}
    lp, hp = mapping.lp_fragment_address, mapping.hp_fragment_address
    flat = _flat_partitions(optimizer)[mapping.param_group_index]
    state = optimizer.optimizer.state.get(flat, {})
    states = {
        slot: Fragment(_numpy(state[slot].narrow(0, hp.start, hp.numel)), lp.start, shape)
        for slot in slots
        if slot in state
    }
    return Fragment(_numpy(mapping.hp_fragment), lp.start, shape), states


def restore_partitioned(
    engine: Any, state: CheckpointState, *, dp_rank: int, part: bool = False
) -> None:
    """ZeRO-1/2/3: this rank's slices from the full tensors, into masters, optimizer state and
    the low-precision copies the module computes with (`part`: one pipeline stage)."""
    module, optimizer = engine.module, engine.optimizer
    torch_state.require_same_names(module, state, part=part)
    torch_state.restore_buffers(module, state)
    found = torch_state.slots_by_parameter(state)
    parameters = dict(module.named_parameters())
    found = {name: slots for name, slots in found.items() if name in parameters or not part}
    torch_state.require_known(found, module, "optimizer state")
    parameters = dict(module.named_parameters())
    slots = sorted({slot for per in found.values() for slot in per if slot != STEP})
    _ensure_state(optimizer, slots, torch_state.common_step(found, state.scalars))
    for name, parameter in parameters.items():
        full = torch.from_numpy(state.model[name]).reshape(-1)
        per = found.get(name, {})
        if is_zero3(parameter):
            _restore_zero3(parameter, full, per, dp_rank)
        elif getattr(parameter, "_hp_mapping", None) is not None:
            _restore_flat(parameter, full, per, optimizer)
        if not is_zero3(parameter):
            with torch.no_grad():
                parameter.data.copy_(full.reshape(parameter.shape).to(parameter.dtype))


def _restore_zero3(parameter: Any, full: torch.Tensor, slots: dict[str, Any], dp_rank: int) -> None:
    size = parameter.ds_tensor.numel()
    offset = dp_rank * size

    def part(values: torch.Tensor) -> torch.Tensor:
        padded = torch.zeros(size, dtype=torch.float32)
        piece = values.reshape(-1)[offset : offset + size].float()
        padded[: piece.numel()] = piece
        return padded

    with torch.no_grad():
        parameter.ds_tensor.data.copy_(part(full).to(parameter.ds_tensor.dtype))
    if not parameter.requires_grad:
        return
    deepspeed.utils.safe_set_local_fp32_param(parameter, part(full))
    for slot, value in slots.items():
        if slot != STEP:
            deepspeed.utils.safe_set_local_optimizer_state(
                parameter, part(torch.from_numpy(value)), slot
            )


def _restore_flat(
    parameter: Any, full: torch.Tensor, slots: dict[str, Any], optimizer: Any
) -> None:
    mapping = parameter._hp_mapping
    lp, hp = mapping.lp_fragment_address, mapping.hp_fragment_address
    flat = _flat_partitions(optimizer)[mapping.param_group_index]
    state = optimizer.optimizer.state.get(flat, {})
    with torch.no_grad():
        mapping.hp_fragment.data.copy_(full[lp.start : lp.start + lp.numel])
        for slot, value in slots.items():
            if slot != STEP and slot in state:
                values = torch.from_numpy(value).reshape(-1)[lp.start : lp.start + lp.numel]
                state[slot].narrow(0, hp.start, hp.numel).copy_(values)


def _ensure_state(optimizer: Any, slots: list[str], step: torch.Tensor | None) -> None:
    """Create the torch optimizer's state for every flat partition if it has not stepped yet,
    in the layout its first step would have made (zeros where no parameter lies)."""
    if not slots:
        return
    flats = (
        list(optimizer.fp32_partitioned_groups_flat)
        if hasattr(optimizer, "fp32_partitioned_groups_flat")
        else _flat_partitions(optimizer)
    )
    for flat in flats:
        state = optimizer.optimizer.state[flat]
        for slot in slots:
            if slot not in state:
                state[slot] = torch.zeros_like(flat)
        if step is not None:
            state[STEP] = step.clone()


def loss_scaler_extras(optimizer: Any, skipped_steps: int) -> dict[str, Any]:
    """fp16's dynamic loss scale (DeepSpeed's names) and the steps it skipped, when the
    optimizer has one: the torch engines' loss scaler reads the same fields."""
    scaler = getattr(optimizer, "loss_scaler", None)
    if scaler is None or not hasattr(scaler, "cur_scale"):
        return {}
    scale = scaler.cur_scale
    saved = {
        "scale": float(scale.item() if isinstance(scale, torch.Tensor) else scale),
        "skipped_steps": int(skipped_steps),
    }
    for field in ("cur_iter", "last_overflow_iter", "cur_hysteresis"):
        if hasattr(scaler, field):
            saved[field] = int(getattr(scaler, field))
    return {"loss_scaler": saved}


def restore_loss_scaler(optimizer: Any, extras: dict[str, Any]) -> None:
    scaler = getattr(optimizer, "loss_scaler", None)
    saved = extras.get("loss_scaler")
    if scaler is None or not isinstance(saved, dict) or not hasattr(scaler, "cur_scale"):
        return
    if isinstance(scaler.cur_scale, torch.Tensor):
        scaler.cur_scale.fill_(float(saved["scale"]))
    else:
        scaler.cur_scale = float(saved["scale"])
    for field in ("cur_iter", "last_overflow_iter", "cur_hysteresis"):
        if field in saved and hasattr(scaler, field):
            setattr(scaler, field, int(saved[field]))
