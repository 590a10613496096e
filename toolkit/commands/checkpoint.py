"""`toolkit checkpoint inspect|export`: look into a checkpoint, take the weights out of it.

toolkit checkpoint inspect DIR [--json] [--verify]
    engine, step, world size and what is inside (tensors, parameters, bytes, dtypes per
    section); DIR is a checkpoint directory (its `latest` is shown) or one step-N in it.
    --verify also reads every file and checks its checksum.
toolkit checkpoint export DIR --to safetensors|torch --out FILE
    the consolidated model weights for inference: a safetensors file `from_pretrained`
    reads as model.safetensors, or a torch.save'd dict of tensors
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from toolkit.checkpoint import SECTIONS, open_checkpoint
from toolkit.checkpoint.export import EXPORT_FORMATS, SaveTorch, export_weights, summary


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
    save_torch = _torch_writer() if args.to == "torch" else None
    count = export_weights(checkpoint, args.out, to=args.to, save_torch=save_torch)
    print(f"wrote {count} tensors of step {checkpoint.step} to {args.out} ({args.to})")
    return 0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("checkpoint", help="inspect checkpoints, export weights")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    inspect = actions.add_parser("inspect", help="what a checkpoint holds")
    inspect.add_argument("dir", help="checkpoint directory, or one step-N directory in it")
    inspect.add_argument("--json", action="store_true", help="print JSON")
    inspect.add_argument("--verify", action="store_true", help="read every file, check sums")
    inspect.set_defaults(func=_inspect)
    export = actions.add_parser("export", help="write the model weights for inference")
    export.add_argument("dir", help="checkpoint directory, or one step-N directory in it")
    export.add_argument("--to", required=True, choices=EXPORT_FORMATS, help="file format")
    export.add_argument("--out", required=True, metavar="FILE", help="file to write")
    export.set_defaults(func=_export)
