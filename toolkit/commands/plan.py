"""`toolkit plan --spec FILE (--params N | --model module:factory) [--ranks N]
[--gpu-memory GIB] [--json]`

Per-rank memory of every engine (each ZeRO stage with and without CPU offload, the pipeline
when the spec has one) for the spec's optimizer, precision and batch, the bytes each rank sends
per step and the pipeline bubble (toolkit.plan). Nothing is launched; `--model` builds the
torch model once to count its layers and activations. A Horovod spec under horovodrun is
planned with the controller horovodrun picks on this machine, as `toolkit launch` runs it: the
controller sets the fusion buffer's default. A job that trains on CUDA (`device: cuda`, or
`auto` on a host with a GPU), or `--gpu-memory`, also gets each row's memory on one GPU against
the GPU's capacity (toolkit.plan.gpu).
"""

from __future__ import annotations

import argparse
import json
import math
import os
from typing import Any

from toolkit.commands._output import add_output, add_spec, emit
from toolkit.errors import ToolkitError


def _shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a shape like 3,32,32") from None
    if not shape or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: positive sizes only")
    return shape


def _gib(text: str) -> float:
    """argparse type: a GPU's memory in GiB, a positive number."""
    try:
        gib = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:20]!r}: give GiB, like 80 or 139.8") from None
    if not math.isfinite(gib) or gib <= 0:
        raise argparse.ArgumentTypeError(f"{text[:20]!r}: must be a positive number of GiB")
    return gib


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "plan", help="per-rank memory, communication and pipeline bubble for every engine"
    )
    add_spec(parser)
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--params", type=int, help="parameter count of the model")
    model.add_argument("--model", metavar="MODULE:FACTORY", help="a function building the model")
    parser.add_argument(
        "--largest-layer", type=int, default=None, help="with --params: its largest layer"
    )
    parser.add_argument(
        "--input-shape", type=_shape, default=None, help="with --model: one sample's shape"
    )
    parser.add_argument("--ranks", type=int, default=None, help="default: the spec's world size")
    parser.add_argument(
        "--gpu-memory",
        type=_gib,
        default=None,
        metavar="GIB",
        help="one GPU's memory: compare each rank against it (default for a CUDA spec: the "
        "smallest GPU nvidia-smi shows)",
    )
    parser.add_argument("--json", action="store_true", help="JSON instead of the table")
    add_output(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from toolkit.launch.machine_settings import for_this_machine
    from toolkit.plan import gpu, model_facts
    from toolkit.plan.report import text, to_json
    from toolkit.plan.table import plan_rows
    from toolkit.spec import load_spec

    spec = for_this_machine(load_spec(args.spec))
    ranks = spec.world_size if args.ranks is None else args.ranks
    if ranks < 1:
        raise ToolkitError(f"--ranks={ranks}: must be at least 1", "give the number of processes")
    if args.model:
        if args.largest_layer is not None:
            raise ToolkitError(
                "--largest-layer goes with --params; --model measures the layers itself",
                "drop --largest-layer",
            )
        facts = model_facts.from_factory(args.model, args.input_shape)
    else:
        facts = model_facts.from_params(args.params, args.largest_layer)
    rows = plan_rows(spec, facts, ranks)
    limit = gpu.capacity_for(spec.device, args.gpu_memory, os.environ)
    if args.json:
        data = to_json(rows, facts, ranks, spec.to_dict())
        if limit is not None:
            data["gpu"] = gpu.to_json(gpu.fits(rows, limit), limit)
        emit(json.dumps(data, indent=1), args.output)
    else:
        batch = spec.batch_for(ranks)
        header = (
            f"toolkit plan: {spec.optimizer.name}, {spec.precision}, micro {batch.micro} x "
            f"{batch.accumulation} micro-batches, {ranks} ranks"
        )
        table = text(rows, facts, ranks, header)
        if limit is not None:
            table += "\n\n" + gpu.text(gpu.fits(rows, limit), limit)
        emit(table, args.output)
    return 0
