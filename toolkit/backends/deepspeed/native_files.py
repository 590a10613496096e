"""The files of a native DeepSpeed checkpoint (`engine.save_checkpoint(save_dir, tag)`): where
they are, what kind of checkpoint they make, and reading them with as little trust as works.

    save_dir/latest                                       the newest tag, e.g. "global_step5"
    save_dir/TAG/mp_rank_00_model_states.pt               ZeRO 0-2: module, metadata (stage 0:
                                                          also the torch optimizer's state_dict)
    save_dir/TAG/zero_pp_rank_R_mp_rank_00_model_states.pt    ZeRO-3: one per data-parallel rank
    save_dir/TAG/[bf16_]zero_pp_rank_R_mp_rank_00_optim_states.pt   ZeRO 1-3: one per rank
    save_dir/TAG/layer_LL-model_00-model_states.pt        the pipeline engine's layer files

They are pickles. `load_trusted_classes` reads one with `torch.load(weights_only=True)` and an
allowlist of exactly the DeepSpeed classes its files hold (found by
`torch.serialization.get_unsafe_globals_in_checkpoint` on checkpoints of ZeRO 0-3 written by
deepspeed 0.19.8 on CPU); a file that needs any other global is refused before anything else
unpickles it. DeepSpeed's own converters, which the import then calls, load the same files again
with `weights_only=False`: they only run on files that passed this check.
"""

from __future__ import annotations

import pickle
import re
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
from deepspeed.runtime.zero.config import ZeroStageEnum
from deepspeed.utils.tensor_fragment import fragment_address

from toolkit.errors import ToolkitError

LATEST = "latest"
MODEL_STATES = "model_states.pt"
OPTIM_STATES = "_optim_states.pt"
_PIPELINE_LAYER = re.compile(r"layer_\d+-model_.*model_states\.pt")
_EXPERT = re.compile(r".*_expert_.*model_states\.pt")
TRUSTED_CLASSES: list[Any] = [fragment_address, ZeroStageEnum, LossScaler, DynamicLossScaler]
"""What DeepSpeed pickles beside tensors and builtins: ZeRO-1/2's `param_slice_mappings`
(fragment_address), the stage (ZeroStageEnum) and the loss scaler object (LossScaler in fp32
and bf16; DynamicLossScaler under fp16's dynamic scaling, which a CPU cannot run to check)."""
_TRUST_HINT = "import only checkpoints you trust: DeepSpeed's files are pickles"


@dataclass(frozen=True)
class NativeCheckpoint:
    """One tag of a native DeepSpeed checkpoint, its files sorted by rank."""

    root: Path
    tag: str
    model_files: tuple[Path, ...]
    optim_files: tuple[Path, ...]

    @property
    def directory(self) -> Path:
        return self.root / self.tag


def _rank_order(path: Path) -> list[int | str]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name)]


def _read_latest(root: Path) -> str:
    pointer = root / LATEST
    try:
        raw = pointer.read_bytes()[:1024]
    except OSError as error:
        raise ToolkitError(f"{pointer}: cannot be read ({error.strerror or error})") from None
    tag = raw.decode("utf-8", errors="replace").strip()
    if not tag or "/" in tag or tag in {".", ".."}:
        raise ToolkitError(f"{pointer}: does not name a checkpoint tag (holds {raw[:60]!r})")
    return tag


def locate(source: str | Path, tag: str | None = None) -> NativeCheckpoint:
    """The tag directory to import: `tag`, else the one `source/latest` names; `source` may
    also be a tag directory itself. Refuses what is not a DeepSpeed checkpoint, and the kinds
    this import does not handle (pipeline engine, tensor or expert parallelism)."""
    root = Path(source)
    if not root.is_dir():
        raise ToolkitError(f"{source}: is not a directory", "give the save_dir of save_checkpoint")
    if tag is None and not (root / LATEST).is_file() and any(root.glob(f"*{MODEL_STATES}")):
        root, tag = root.parent, root.name  # a tag directory was given
    if tag is None:
        if not (root / LATEST).is_file():
            raise ToolkitError(
                f"{source}: is not a DeepSpeed checkpoint (no '{LATEST}' file, no *{MODEL_STATES})",
                "give the directory engine.save_checkpoint wrote, or name the tag with --tag",
            )
        tag = _read_latest(root)
    directory = root / tag
    if not directory.is_dir():
        tags = sorted(p.name for p in root.iterdir() if any(p.glob(f"*{MODEL_STATES}")))
        raise ToolkitError(
            f"{source}: has no checkpoint tag {tag!r}",
            f"tags there: {', '.join(tags) or 'none'}",
        )
    names = sorted(path.name for path in directory.iterdir())
    if any(_PIPELINE_LAYER.fullmatch(name) for name in names):
        raise ToolkitError(
            f"{directory}: written by DeepSpeed's pipeline engine (layer_*-model_states.pt files), "
            "which this import does not support",
            "save it from a data-parallel engine (ZeRO 0-3 without PipelineModule) to import it",
        )
    if any(_EXPERT.fullmatch(name) for name in names):
        raise ToolkitError(f"{directory}: holds mixture-of-experts files, which are not supported")
    model = tuple(sorted(directory.glob(f"*{MODEL_STATES}"), key=_rank_order))
    optim = tuple(sorted(directory.glob(f"*{OPTIM_STATES}"), key=_rank_order))
    if not model:
        raise ToolkitError(
            f"{directory}: is not a DeepSpeed checkpoint (no *{MODEL_STATES})",
            "give the directory engine.save_checkpoint wrote",
        )
    return NativeCheckpoint(root=root, tag=tag, model_files=model, optim_files=optim)


@contextmanager
def _trusted_classes() -> Any:
    with torch.serialization.safe_globals(TRUSTED_CLASSES):
        yield


def load_trusted_classes(path: Path) -> dict[str, Any]:
    """`path` loaded with weights_only=True and only DeepSpeed's checkpoint classes allowed."""
    try:
        with _trusted_classes():
            loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as error:
        detail = str(error).strip().splitlines()
        unsafe = _unsafe_globals(path)
        what = f"needs {', '.join(unsafe)}" if unsafe else (detail[0] if detail else "unpickling")
        raise ToolkitError(
            f"{path}: refused, it holds Python objects beyond DeepSpeed's checkpoint classes "
            f"({what:.300})",
            _TRUST_HINT,
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile) as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ToolkitError(
            f"{path}: is not a readable torch checkpoint file ({first:.200})",
            "the DeepSpeed checkpoint is damaged or incomplete",
        ) from None
    if not isinstance(loaded, dict):
        raise ToolkitError(f"{path}: holds a {type(loaded).__name__}, not DeepSpeed's state dict")
    return loaded


def _unsafe_globals(path: Path) -> list[str]:
    try:
        found = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # only improves the message
        return []
    trusted = {f"{c.__module__}.{c.__qualname__}" for c in TRUSTED_CLASSES}
    return [name for name in found if name not in trusted][:5]
