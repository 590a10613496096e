"""`toolkit checkpoint import`: a native DeepSpeed checkpoint, as `engine.save_checkpoint` wrote
it (ZeRO stage 0, 1, 2 or 3), into the portable format, weights and optimizer state.

What it reads, and how (found in deepspeed 0.19.8 and checked on checkpoints that 2 CPU ranks
wrote over gloo at ZeRO 0, 1, 2 and 3: tests/test_checkpoint_import_deepspeed.py):

- Every file is first read with `torch.load(weights_only=True)` and an allowlist of DeepSpeed's
  own checkpoint classes (`native_files`): a file needing anything else is refused. The
  model_states files need no class at all; ZeRO-1/2's optim_states files need
  `fragment_address`, `LossScaler` and `ZeroStageEnum`, ZeRO-3's the last two. Metadata comes
  from that read: the stage, `dp_world_size`, `mp_world_size`, `global_steps`,
  `global_samples`, the optimizer's slot names and step count.
- ZeRO 1-3 weights: `deepspeed.utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint`,
  DeepSpeed's consolidation of the fp32 master partitions (buffers and tied parameters
  included); it equals what the engine held, bit for bit. It does not read ZeRO-0 checkpoints
  (it needs *_optim_states.pt, which ZeRO-0 in fp32 does not write).
- ZeRO 1-3 optimizer state: `deepspeed.checkpoint.ds_to_universal.main`, the "universal
  checkpoint" converter, into a scratch directory: per parameter `zero/<name>/exp_avg.pt` and
  `exp_avg_sq.pt` (stage 1-2 as {"param": tensor, "cat_dim": 0} in the parameter's shape,
  stage 3 as a flat tensor), read back with weights_only=True. It works on these CPU-written
  checkpoints, stage 3 included, given `inject_missing_state` (without it a checkpoint saved
  without Megatron's `universal_checkpoint_info` fails an assert) and one worker per pass (no
  process pool). It maps only Adam's `exp_avg` / `exp_avg_sq` (it indexes them by name: SGD's
  state would be a KeyError), so other optimizer state under ZeRO 1-3 is refused here, naming
  the slots. It writes a `latest_universal` file beside its output folder (inside the scratch
  directory here) and prints progress, which is captured and shown only if it fails.
- ZeRO 0 keeps the whole torch optimizer `state_dict()` in mp_rank_00_model_states.pt, keyed
  by index: index i is the i-th parameter of the module's state_dict order without buffers
  and without the second name of a tied parameter, which is `model.parameters()`'s order, the
  order a torch optimizer built from `model.parameters()` numbers them in.
- Both converters load the files again with `weights_only=False` (DeepSpeed's code, not
  ours): import only checkpoints you trust.
- The step is DeepSpeed's `global_steps`; the data position `global_samples` from epoch 0 (the
  toolkit runtime rolls it over its epochs: the native script must have read its data in the
  toolkit's order for the continuation to see the same batches). No RNG state is imported
  (DeepSpeed saves none); the learning-rate schedule is restored by position, as always.

Refused, one ToolkitError each: not a DeepSpeed checkpoint, a missing tag, the pipeline engine's
checkpoints, tensor or expert parallelism, fp16/bf16 at ZeRO-0 (no fp32 master in the file), an
optimizer state that cannot be mapped (named), a target that already holds checkpoints.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import uuid
from argparse import Namespace
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from toolkit.backends.deepspeed.native_files import NativeCheckpoint, load_trusted_classes, locate
from toolkit.backends.torch_common import portable
from toolkit.checkpoint import (
    CheckpointState,
    Origin,
    optimizer_key,
    refuse_used_target,
    write_checkpoint,
)
from toolkit.errors import ToolkitError

BACKEND, FRAMEWORK = "deepspeed", "torch"
STEP = "step"
UNIVERSAL_SLOTS = ("exp_avg", "exp_avg_sq")


@dataclass(frozen=True)
class Imported:
    path: Path
    """The step directory written."""
    stage: int
    tag: str
    state: CheckpointState
    world_size: int


def import_checkpoint(
    source: str | Path, target: str | Path, *, tag: str | None = None
) -> Imported:
    """Convert the DeepSpeed checkpoint `source` (its `latest` tag, or `tag`) into `target`."""
    native = locate(source, tag)
    refuse_used_target(target)
    meta = load_trusted_classes(native.model_files[0])
    for path in (*native.model_files[1:], *native.optim_files):
        load_trusted_classes(path)  # every file passes the check before DeepSpeed reads any
    world_size = _world_size(native, meta)
    optim = load_trusted_classes(native.optim_files[0]) if native.optim_files else None
    if optim is None:
        stage = 0
        model, optimizer, steps = _stage0(native, meta)
    else:
        stage = int(optim["optimizer_state_dict"].get("zero_stage", 1))
        if len(native.optim_files) != world_size:
            raise ToolkitError(
                f"{native.directory}: {len(native.optim_files)} *_optim_states.pt files for "
                f"{world_size} data-parallel ranks",
                "the checkpoint is incomplete: a rank did not finish saving it",
            )
        model, optimizer, steps = _partitioned(native, target, optim, stage)
    scalars = {STEP: steps} if steps is not None else {}
    samples = int(meta.get("global_samples") or 0)
    state = CheckpointState(
        step=int(meta.get("global_steps") or 0),
        model=model,
        optimizer=optimizer,
        scalars=scalars,
        extras={
            "data": {"epoch": 0, "samples": samples},
            "imported": {
                "from": str(native.directory.resolve()),
                "zero_stage": stage,
                "ds_version": str(meta.get("ds_version")),
            },
        },
    )
    origin = Origin(backend=BACKEND, framework=FRAMEWORK, world_size=world_size)
    path = write_checkpoint(target, state, origin=origin)
    return Imported(path=path, stage=stage, tag=native.tag, state=state, world_size=world_size)


def _world_size(native: NativeCheckpoint, meta: dict[str, Any]) -> int:
    mp = int(meta.get("mp_world_size") or 1)
    if mp > 1:
        raise ToolkitError(
            f"{native.directory}: saved with model (tensor) parallelism, mp_world_size {mp}; "
            "only data-parallel checkpoints are imported"
        )
    return int(meta.get("dp_world_size") or 1)


def _stage0(
    native: NativeCheckpoint, meta: dict[str, Any]
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], int | None]:
    """ZeRO-0: the module's weights and the torch optimizer's state_dict, both in the file."""
    where = native.model_files[0]
    module = meta.get("module")
    saved = meta.get("optimizer")
    if not isinstance(module, dict) or not module:
        raise ToolkitError(f"{where}: holds no module weights")
    buffers = set(meta.get("buffer_names") or ())
    names = _parameter_names(module, buffers)
    if any(module[name].dtype != torch.float32 for name in names):
        raise ToolkitError(
            f"{where}: ZeRO-0 weights in {module[names[0]].dtype}, and the fp32 master weights "
            "of DeepSpeed's fp16/bf16 optimizer are not imported",
            "save with fp32, or with ZeRO 1-3 (whose fp32 partitions are imported)",
        )
    model = {name: portable(tensor) for name, tensor in module.items()}
    if saved is None:
        return model, {}, None
    if not (isinstance(saved, dict) and {"state", "param_groups"} <= set(saved)):
        raise ToolkitError(
            f"{where}: the optimizer's state is not a torch optimizer state_dict "
            f"(keys {sorted(map(str, saved))[:6] if isinstance(saved, dict) else type(saved)})",
            "only a torch optimizer's state (e.g. torch.optim.Adam, SGD) is imported at ZeRO-0",
        )
    indices = [index for group in saved["param_groups"] for index in group["params"]]
    if len(indices) != len(names):
        raise ToolkitError(
            f"{where}: the optimizer holds {len(indices)} parameters, the module {len(names)}; "
            "cannot tell which state is whose",
            "build the optimizer from model.parameters() to import its state",
        )
    optimizer: dict[str, np.ndarray] = {}
    steps: set[int] = set()
    for index, name in zip(indices, names, strict=True):
        for slot, value in saved["state"].get(index, {}).items():
            if slot == STEP:
                steps.add(int(value))
            elif isinstance(value, torch.Tensor) and value.shape == module[name].shape:
                optimizer[optimizer_key(slot, name)] = portable(value)
            else:
                raise ToolkitError(
                    f"{where}: optimizer state {slot!r} of {name!r} is not a tensor of the "
                    "parameter's shape; the portable format cannot hold it",
                    "import a checkpoint of torch's SGD, Adam or AdamW",
                )
    return model, optimizer, max(steps) if steps else None


def _parameter_names(module: dict[str, torch.Tensor], buffers: set[str]) -> list[str]:
    """model.parameters()'s order: state_dict names without buffers and second tied names."""
    names, seen = [], set()
    for name, tensor in module.items():
        if name in buffers:
            continue
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key not in seen:
            seen.add(key)
            names.append(name)
    return names


def _flat_state(optim: dict[str, Any], stage: int) -> list[dict[str, Any]]:
    """The torch optimizer's state of each flat group, from a ZeRO 1-3 optim_states file."""
    zero = optim["optimizer_state_dict"]
    base = zero.get("optimizer_state_dict" if stage == 3 else "base_optimizer_state")
    state = base.get("state") if isinstance(base, dict) else base
    if isinstance(state, dict):
        return list(state.values())
    return list(state or [])


def _partitioned(
    native: NativeCheckpoint, target: str | Path, optim: dict[str, Any], stage: int
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], int | None]:
    groups = _flat_state(optim, stage)
    slots = sorted({slot for group in groups for slot in group if slot != STEP})
    steps = [int(group[STEP]) for group in groups if STEP in group]
    if slots and slots != sorted(UNIVERSAL_SLOTS):
        raise ToolkitError(
            f"{native.optim_files[0]}: optimizer state {', '.join(slots)} under ZeRO-{stage} "
            "cannot be mapped: DeepSpeed's universal-checkpoint converter reads only Adam's "
            "exp_avg and exp_avg_sq",
            "import a checkpoint of Adam/AdamW, or of the same optimizer at ZeRO-0",
        )
    weights = _run_quietly(_zero_to_fp32, native)
    model = {name: portable(tensor) for name, tensor in weights.items()}
    optimizer = _universal_slots(native, Path(target), model, stage) if slots else {}
    return model, optimizer, max(steps) if steps else None


def _zero_to_fp32(native: NativeCheckpoint) -> dict[str, torch.Tensor]:
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    weights: dict[str, torch.Tensor] = get_fp32_state_dict_from_zero_checkpoint(
        str(native.root), tag=native.tag
    )
    return weights


def _universal_slots(
    native: NativeCheckpoint, target: Path, model: dict[str, np.ndarray], stage: int
) -> dict[str, np.ndarray]:
    """Adam's state per parameter, through ds_to_universal into a scratch directory named as
    a leftover of the target (removed by the next save there if this process is killed)."""
    from deepspeed.checkpoint import ds_to_universal

    target.mkdir(parents=True, exist_ok=True)
    scratch = target / f".incomplete-import-{uuid.uuid4().hex[:12]}"
    output = scratch / native.tag
    arguments = Namespace(
        input_folder=str(native.directory),
        output_folder=str(output),
        num_extract_workers=1,
        num_merge_workers=1,
        keep_temp_folder=False,
        strict=True,
        inject_missing_state=True,
    )
    try:
        _run_quietly(ds_to_universal.main, arguments)
        optimizer = {}
        for folder in sorted((output / "zero").iterdir()):
            name = folder.name
            if name not in model:
                continue
            for slot in UNIVERSAL_SLOTS:
                file = folder / f"{slot}.pt"
                if file.is_file():
                    optimizer[optimizer_key(slot, name)] = _universal_tensor(file, model[name])
        return optimizer
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _universal_tensor(file: Path, like: np.ndarray) -> np.ndarray:
    loaded = torch.load(file, map_location="cpu", weights_only=True)
    tensor = loaded["param"] if isinstance(loaded, dict) else loaded
    if tensor.numel() != like.size:
        raise ToolkitError(
            f"{file}: {tensor.numel()} elements for a parameter of shape {like.shape}",
            "the DeepSpeed checkpoint's partitions do not add up; it may be damaged",
        )
    return portable(tensor.reshape(like.shape))


def _run_quietly(function: Any, *arguments: Any) -> Any:
    """DeepSpeed's converters print progress; keep it, and show it only if they fail."""
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            return function(*arguments)
    except ToolkitError:
        raise
    except Exception as error:  # DeepSpeed's converters raise anything
        last = (printed.getvalue().strip().splitlines() or [""])[-1]
        raise ToolkitError(
            f"DeepSpeed's converter {getattr(function, '__module__', '')}"
            f".{getattr(function, '__name__', '')} failed: {type(error).__name__}: "
            f"{str(error)[:200]}" + (f" (last output: {last[:120]})" if last else ""),
            "the checkpoint may be incomplete, or of a kind this import does not handle",
        ) from None
