"""The training state of the torch engines in the portable checkpoint layout, and back.

Imported only by the torch backends. The layout (`toolkit.checkpoint.state`): full fp32
weights by state_dict name, optimizer state as torch's own per-parameter slots
("exp_avg/<param>", "exp_avg_sq/<param>", "momentum_buffer/<param>") with the parameter's
full shape and one step count in `scalars["step"]` (per-parameter "step/<param>" tensors
when parameters stepped different numbers of times), and the torch CPU generator per rank.

A parameter is named by its first name in `named_parameters()` (a tied parameter once),
which is how every engine walks the model, so a checkpoint moves between engines.

The learning-rate schedule is restored by position: a fresh scheduler is stepped to the
checkpoint's step with its own `step()`, so the rate is what the uninterrupted run had,
whichever scheduler class (torch's LambdaLR, DeepSpeed's own) the engine drives.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from toolkit.backends.base import StateShare
from toolkit.backends.torch_common import numpy_state, portable, to_numpy
from toolkit.backends.torch_loss_scale import LossScaler
from toolkit.checkpoint import CheckpointState, optimizer_key, split_optimizer_key
from toolkit.errors import ToolkitError

STEP = "step"


def parameter_names(module: torch.nn.Module) -> dict[int, str]:
    """id(parameter) -> its first name in the module."""
    return {id(parameter): name for name, parameter in module.named_parameters()}


def rng_arrays(rank: int) -> dict[str, np.ndarray]:
    """This rank's torch generators: the CPU one, and its GPU's where CUDA is in use (dropout
    on a GPU draws from the GPU's generator)."""
    arrays = {f"rng/torch/rank{rank}": torch.get_rng_state().numpy().copy()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        arrays[f"rng/torch_cuda/rank{rank}"] = torch.cuda.get_rng_state().numpy().copy()
    return arrays


def restore_rng(state: CheckpointState, rank: int) -> None:
    """This rank's torch generators as they were saved; a rank the saving run did not have
    keeps its seeded generators, and a GPU generator saved on GPUs is left out on the CPU."""
    saved = state.arrays.get(f"rng/torch/rank{rank}")
    if saved is not None:
        torch.set_rng_state(_byte_tensor(saved))
    saved_cuda = state.arrays.get(f"rng/torch_cuda/rank{rank}")
    if saved_cuda is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(_byte_tensor(saved_cuda))


def _byte_tensor(saved: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(saved, dtype=np.uint8))


def optimizer_tensors(
    optimizer: torch.optim.Optimizer, module: torch.nn.Module
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """A torch optimizer's per-parameter state (every rank holds all of it)."""
    names = parameter_names(module)
    tensors: dict[str, np.ndarray] = {}
    steps: dict[str, float] = {}
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            state = optimizer.state.get(parameter)
            if not state:
                continue
            name = names.get(id(parameter))
            if name is None:
                raise ToolkitError("the optimizer holds a parameter that is not in the model")
            for slot, value in state.items():
                if slot == STEP:
                    steps[name] = float(value)
                elif isinstance(value, torch.Tensor) and value.shape == parameter.shape:
                    tensors[optimizer_key(slot, name)] = to_numpy(value)
    return tensors, step_scalars(steps, tensors)


def slot_arrays(
    slots_by_name: dict[str, dict[str, Any]],
) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """A full optimizer state by parameter name ({name: {slot: tensor, "step": count}}, what
    torch's distributed checkpoint API gives) as the portable tensors and each parameter's
    step count."""
    tensors: dict[str, np.ndarray] = {}
    steps: dict[str, float] = {}
    for name, slots in slots_by_name.items():
        for slot, value in slots.items():
            if slot == STEP:
                steps[name] = float(value)
            elif isinstance(value, torch.Tensor):
                tensors[optimizer_key(slot, name)] = portable(value)
    return tensors, steps


def step_scalars(steps: dict[str, float], tensors: dict[str, np.ndarray]) -> dict[str, Any]:
    """One "step" scalar when every parameter stepped alike, else per-parameter tensors."""
    if len(set(steps.values())) > 1:
        for name, count in steps.items():
            tensors[optimizer_key(STEP, name)] = np.asarray(count, dtype=np.float64)
        return {}
    return {STEP: int(next(iter(steps.values())))} if steps else {}


def slots_by_parameter(state: CheckpointState) -> dict[str, dict[str, np.ndarray]]:
    """{param: {slot: full tensor}} of the checkpoint's optimizer section."""
    found: dict[str, dict[str, np.ndarray]] = {}
    for key, value in state.optimizer.items():
        slot, name = split_optimizer_key(key)
        found.setdefault(name, {})[slot] = value
    return found


def step_tensor(slots: dict[str, np.ndarray], scalars: dict[str, Any]) -> torch.Tensor | None:
    """The step count a parameter's optimizer state restarts from, as torch keeps it."""
    if STEP in slots:
        return torch.tensor(float(slots.pop(STEP)), dtype=torch.float32)
    if STEP in scalars:
        return torch.tensor(float(scalars[STEP]), dtype=torch.float32)
    return None


def require_known(names: Iterable[str], module: torch.nn.Module, what: str) -> None:
    own = dict(module.named_parameters())
    unknown = sorted(set(names) - set(own))
    if unknown:
        raise ToolkitError(
            f"the checkpoint's {what} names parameters this model does not have: "
            f"{', '.join(unknown[:5])}",
            "resume with the model the checkpoint was saved from, or set checkpoint.resume: never",
        )


def full_tensor(value: np.ndarray, like: torch.Tensor, name: str) -> torch.Tensor:
    if tuple(value.shape) != tuple(like.shape):
        raise ToolkitError(
            f"the checkpoint's {name!r} has shape {tuple(value.shape)}, the model's "
            f"{tuple(like.shape)}",
            "resume with the model the checkpoint was saved from, or set checkpoint.resume: never",
        )
    return torch.from_numpy(np.array(value, order="C")).to(dtype=like.dtype, device=like.device)


def restore_optimizer(
    optimizer: torch.optim.Optimizer,
    module: torch.nn.Module,
    state: CheckpointState,
    *,
    part: bool = False,
) -> None:
    """A torch optimizer's per-parameter state from full tensors (every rank holds all;
    `part`: the module is one pipeline stage and takes its own parameters' state)."""
    parameters = dict(module.named_parameters())
    found = slots_by_parameter(state)
    if part:
        found = {name: slots for name, slots in found.items() if name in parameters}
    require_known(found, module, "optimizer state")
    for name, slots in found.items():
        parameter = parameters[name]
        step = step_tensor(slots, state.scalars)
        restored: dict[str, Any] = {
            slot: full_tensor(value, parameter, optimizer_key(slot, name))
            for slot, value in slots.items()
        }
        if step is not None:
            restored[STEP] = step
        optimizer.state[parameter] = restored


def require_same_names(
    module: torch.nn.Module, state: CheckpointState, *, part: bool = False
) -> None:
    """The checkpoint's weights have the module's names (`part`: the module is one pipeline
    stage, whose names are a part of the checkpoint's)."""
    own = module.state_dict(keep_vars=True)
    missing = sorted(set(own) - set(state.model))
    unexpected = [] if part else sorted(set(state.model) - set(own))
    if missing or unexpected:
        raise ToolkitError(
            f"the checkpoint's weights do not fit this model (missing {missing[:5]}, "
            f"unexpected {unexpected[:5]})",
            "resume with the model the checkpoint was saved from, or set checkpoint.resume: never",
        )


def restore_module(module: torch.nn.Module, state: CheckpointState, *, part: bool = False) -> None:
    """Weights and buffers from the checkpoint's full state_dict (strict: same names)."""
    require_same_names(module, state, part=part)
    with torch.no_grad():
        for name, tensor in module.state_dict().items():
            tensor.copy_(full_tensor(state.model[name], tensor, name))


def restore_buffers(module: torch.nn.Module, state: CheckpointState) -> None:
    """The state_dict entries that are not parameters (BatchNorm statistics, say)."""
    with torch.no_grad():
        for name, tensor in module.state_dict(keep_vars=True).items():
            if not isinstance(tensor, torch.nn.Parameter):
                tensor.copy_(full_tensor(state.model[name], tensor, name))


def common_step(
    found: dict[str, dict[str, np.ndarray]], scalars: dict[str, Any]
) -> torch.Tensor | None:
    """The one step count of an optimizer whose parameters all step together (ZeRO's flat
    groups): the checkpoint's scalar, or else the highest per-parameter count."""
    counts = [float(slots[STEP]) for slots in found.values() if STEP in slots]
    if STEP in scalars:
        return torch.tensor(float(scalars[STEP]), dtype=torch.float32)
    return torch.tensor(max(counts), dtype=torch.float32) if counts else None


def advance_scheduler(scheduler: Any, steps: int) -> None:
    """Put a freshly built scheduler where it is after `steps` optimizer steps.

    Torch's LRScheduler counts in `last_epoch`, DeepSpeed's in `last_batch_iteration`; each is
    moved to one before the target and stepped once, so that the scheduler computes the rate
    itself, as it did in the uninterrupted run.
    """
    if scheduler is None or steps == 0:
        return
    counter = "last_batch_iteration" if hasattr(scheduler, "last_batch_iteration") else "last_epoch"
    setattr(scheduler, counter, getattr(scheduler, counter) + steps - 1)
    with warnings.catch_warnings():
        # torch warns when a scheduler steps before its optimizer has: here it is on purpose.
        warnings.simplefilter("ignore", UserWarning)
        scheduler.step()


def capture_replicated(
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    rank: int,
    writer: bool | None = None,
    scaler: LossScaler | None = None,
) -> StateShare:
    """Engines whose every rank holds the whole state (DDP, Horovod, ZeRO-0): one rank (rank
    0, or the `writer` of each pipeline stage) writes the weights and the optimizer state,
    every rank its generator, rank 0 the scalars."""
    share = StateShare(arrays=rng_arrays(rank))
    if rank == 0 if writer is None else writer:
        share.model = dict(numpy_state(module))
        share.optimizer, scalars = optimizer_tensors(optimizer, module)
        if rank == 0:
            share.scalars = scalars
            share.extras = scaler.state() if scaler else {}
    return share


def restore_replicated(
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    state: CheckpointState,
    *,
    rank: int,
    scheduler: Any = None,
    scaler: LossScaler | None = None,
) -> None:
    """Every rank loads the whole state from the checkpoint (no broadcast needed)."""
    restore_module(module, state)
    restore_optimizer(optimizer, module, state)
    advance_scheduler(scheduler, state.applied_steps)
    if scaler:
        scaler.load(state.extras)
    restore_rng(state, rank)
