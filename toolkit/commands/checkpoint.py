"""`toolkit checkpoint inspect|export|import`: look into a checkpoint, take the weights out of
it, bring a native DeepSpeed or PyTorch distributed checkpoint in.

toolkit checkpoint inspect DIR [--json] [--verify]
    engine, step, world size and what is inside (tensors, parameters, bytes, dtypes per
    section); DIR is a checkpoint directory (its `latest` is shown) or one step-N in it.
    --verify also reads every file and checks its checksum.
toolkit checkpoint export DIR --to safetensors|torch|dcp --out PATH
    the consolidated model weights for inference: a safetensors file `from_pretrained`
    reads as model.safetensors, or a torch.save'd dict of tensors; dcp: a PyTorch distributed
    checkpoint directory with the weights and optimizer state (toolkit.backends.fsdp.dcp)
toolkit checkpoint import SRC_DIR --to OUT_DIR [--from deepspeed|dcp] [--tag TAG]
    a directory written by DeepSpeed's engine.save_checkpoint (ZeRO 0-3), its `latest` tag or
    TAG, or with --from dcp one written by torch.distributed.checkpoint.save, as
    OUT_DIR/step-N with fp32 weights and optimizer state, so that a toolkit run with
    checkpoint.dir: OUT_DIR resumes from it under any torch engine. DeepSpeed's files and DCP's
    metadata are pickles: import only checkpoints you trust.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from toolkit.checkpoint import SECTIONS, open_checkpoint
from toolkit.checkpoint.export import EXPORT_FORMATS, SaveTorch, export_weights, summary
from toolkit.errors import ToolkitError

DCP = "dcp"


def _inspect(args: argparse.Namespace) -> int:
    checkpoint = open_checkpoint(args.dir)
    if args.verify:
        for section in SECTIONS:
            checkpoint.tensors(section)
    report = summary(checkpoint)
    report["verified"] = bool(args.verify)
    print(json.dumps(report, indent=2) if args.json else _format(report))
    return 0


def _format(report: dict[str, Any]) -> str:
    engine = "/".join(str(report[key]) for key in ("backend", "framework") if report[key])
    lines = [
        f"{report['path']}: step {report['step']}, {engine or 'unknown engine'}, "
        f"world size {report['world_size']}, {_size(report['bytes'])}"
        + (", checksums verified" if report["verified"] else ""),
        f"  written {report['created']} by toolkit {report['toolkit_version']} "
        f"(format {report['format_version']})",
    ]
    for name, section in report["sections"].items():
        dtypes = ", ".join(f"{count} {dtype}" for dtype, count in section["dtypes"].items())
        fragmented = f" ({section['fragmented']} in parts)" if section["fragmented"] else ""
        lines.append(
            f"  {name}: {section['tensors']} tensors{fragmented}, {section['elements']:,} "
            f"elements, {_size(section['bytes'])} in {len(section['files'])} file(s) ({dtypes})"
        )
    for key in ("scalars", "extras"):
        if report[key]:
            lines.append(f"  {key}: {', '.join(report[key])}")
    return "\n".join(lines)


def _size(count: int) -> str:
    if count < 1024:
        return f"{count} bytes"
    value = count / 1024
    for unit in ("KiB", "MiB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def _torch_writer() -> SaveTorch | None:
    try:
        from toolkit.backends.torch_files import save_tensors
    except ImportError:
        return None
    return save_tensors


def _export(args: argparse.Namespace) -> int:
    checkpoint = open_checkpoint(args.dir)
    if args.to == DCP:
        count = _dcp().export_dcp(checkpoint, args.out)
        print(f"wrote {count} tensors of step {checkpoint.step} to {args.out} (dcp)")
        return 0
    save_torch = _torch_writer() if args.to == "torch" else None
    count = export_weights(checkpoint, args.out, to=args.to, save_torch=save_torch)
    print(f"wrote {count} tensors of step {checkpoint.step} to {args.out} ({args.to})")
    return 0


def _dcp() -> Any:
    """The DCP converters (toolkit.backends.fsdp.dcp), which need PyTorch."""
    try:
        from toolkit.backends.fsdp import dcp
    except ImportError as error:
        raise ToolkitError(
            f"the dcp format needs PyTorch, which does not import ({error})",
            "pip install 'toolkit[torch]'",
        ) from None
    return dcp


def _import(args: argparse.Namespace) -> int:
    if args.source == DCP:
        done = _dcp().import_dcp(args.dir, args.to)
        print(
            f"imported PyTorch distributed checkpoint {args.dir} (step {done.state.step}): "
            f"{len(done.state.model)} weights, {len(done.state.optimizer)} optimizer tensors "
            f"-> {done.path}"
        )
        return 0
    try:
        from toolkit.backends.deepspeed.native_import import import_checkpoint
    except ImportError as error:
        raise ToolkitError(
            f"checkpoint import needs DeepSpeed and PyTorch, which do not import ({error})",
            "pip install 'toolkit[deepspeed]'",
        ) from None
    done = import_checkpoint(args.dir, args.to, tag=args.tag)
    state = done.state
    print(
        f"imported DeepSpeed ZeRO-{done.stage} checkpoint {done.tag} ({done.world_size} ranks, "
        f"step {state.step}): {len(state.model)} weights, {len(state.optimizer)} optimizer "
        f"tensors -> {done.path}"
    )
    return 0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "checkpoint", help="inspect checkpoints, export weights, import DeepSpeed's"
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    inspect = actions.add_parser("inspect", help="what a checkpoint holds")
    inspect.add_argument("dir", help="checkpoint directory, or one step-N directory in it")
    inspect.add_argument("--json", action="store_true", help="print JSON")
    inspect.add_argument("--verify", action="store_true", help="read every file, check sums")
    inspect.set_defaults(func=_inspect)
    export = actions.add_parser("export", help="write the model weights for inference")
    export.add_argument("dir", help="checkpoint directory, or one step-N directory in it")
    export.add_argument(
        "--to",
        required=True,
        choices=(*EXPORT_FORMATS, DCP),
        help="file format; dcp: a PyTorch distributed checkpoint directory with the optimizer "
        "state, which torch.distributed.checkpoint.load reads at any world size",
    )
    export.add_argument("--out", required=True, metavar="PATH", help="file (dir for dcp)")
    export.set_defaults(func=_export)
    native = actions.add_parser(
        "import",
        help="convert a native DeepSpeed checkpoint (ZeRO 0-3) or a PyTorch distributed one",
        description="Convert a directory written by DeepSpeed's engine.save_checkpoint (ZeRO "
        "stage 0-3; not the pipeline engine), or with --from dcp by "
        "torch.distributed.checkpoint.save (FSDP2, torchtitan: get_state_dict's 'model' and "
        "'optimizer'), into the portable format: fp32 weights and optimizer state, so that "
        "checkpoint.dir: OUT_DIR resumes from it. DeepSpeed's files are pickles: every file is "
        "first read with weights_only=True and DeepSpeed's classes only, but DeepSpeed's "
        "converters then load them fully; DCP's metadata is a pickle too. Import only "
        "checkpoints you trust.",
    )
    native.add_argument(
        "dir",
        metavar="SRC_DIR",
        help="save_dir of save_checkpoint, or a tag in it; or a DCP directory",
    )
    native.add_argument(
        "--from",
        dest="source",
        choices=("deepspeed", DCP),
        default="deepspeed",
        help="what wrote SRC_DIR (default deepspeed)",
    )
    native.add_argument("--to", required=True, metavar="OUT_DIR", help="checkpoint dir to write")
    native.add_argument("--tag", help="the tag to import (default: the one DS_DIR/latest names)")
    native.set_defaults(func=_import)
