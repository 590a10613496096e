"""`toolkit bench compare|step|allreduce`: short measurements on this machine, as JSON, a
Markdown table and (compare) a plot.

- `compare --spec A.yaml --spec B.yaml ... [--model module:factory]`: each spec's engine
  briefly on the same model, one table (step time, samples/s, peak memory per rank,
  toolkit / native where a native script runs the same step; with `--link IFACE` the MB per
  step rank 0's host sent over IFACE).
- `step --spec S [--all]`: the toolkit's step against the engine's native script, on the same
  launcher, interleaved (the adapter's cost).
- `allreduce --spec S ...`: `run.allreduce`'s bus bandwidth by message size.

Imports no engine: engines run only inside the launched ranks.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

DEFAULT_OUT = "reports/bench"


def _positive(text: str) -> int:
    if not (text.isascii() and text.isdigit() and 0 < int(text) <= 1_000_000):
        raise argparse.ArgumentTypeError(f"{text[:20]!r}: give a whole number from 1")
    return int(text)


def _layers(text: str) -> tuple[int, ...]:
    try:
        widths = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: give widths like 512,2048,10") from None
    if len(widths) < 2 or min(widths) < 1:
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: at least two positive widths")
    return widths


def _interface(text: str) -> str:
    """A network interface's name as Linux allows it: 1-15 characters, no slash or space."""
    if not (0 < len(text) <= 15) or any(c in text for c in "/ \t\n:") or text in (".", ".."):
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r}: give a network interface's name, e.g. eth0 (see `ip link`)"
        )
    return text


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _size(text: str) -> int:
    """4096, 4K, 4KiB, 64M, 1G -> bytes."""
    number = text.upper().removesuffix("IB").removesuffix("B")
    unit = number[-1] if number[-1:] in ("K", "M", "G") else ""
    try:
        value = int(number.removesuffix(unit)) * _UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text[:20]!r}: give a size like 4096, 4K or 64M"
        ) from None
    if not 4 <= value <= 1 << 32:
        raise argparse.ArgumentTypeError(f"{text[:20]!r}: between 4 bytes and 4G")
    return value


def _timing(parser: argparse.ArgumentParser, steps: int) -> None:
    parser.add_argument("--steps", type=_positive, default=steps, help="timed steps per launch")
    parser.add_argument("--warmup", type=_positive, default=5, help="untimed steps first")
    parser.add_argument("--reps", type=_positive, default=3, help="launches of each (default 3)")
    parser.add_argument(
        "--out", default=DEFAULT_OUT, help=f"results folder (default {DEFAULT_OUT})"
    )


def _timing_of(args: argparse.Namespace) -> dict[str, Any]:
    """What `_timing` added to a parser, as the bench functions take it."""
    return {"reps": args.reps, "steps": args.steps, "warmup": args.warmup, "out": Path(args.out)}


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("bench", help="measure engines and the toolkit on this machine")
    commands = parser.add_subparsers(dest="bench_command", metavar="WHAT", required=True)

    compare = commands.add_parser("compare", help="several specs on the same model, one table")
    compare.add_argument(
        "--spec", action="append", required=True, metavar="FILE", help="a spec; give two or more"
    )
    compare.add_argument(
        "--model",
        default=None,
        metavar="MODULE:FACTORY",
        help="factory() returns (model, loss_fn, inputs, targets); default the bench MLP",
    )
    compare.add_argument("--layers", type=_layers, default=None, help="bench MLP widths")
    compare.add_argument(
        "--link",
        type=_interface,
        default=None,
        metavar="IFACE",
        help="also count the MB per step rank 0's host sends over this network interface",
    )
    _timing(compare, steps=20)
    compare.set_defaults(func=_compare)

    step = commands.add_parser("step", help="toolkit step vs the engine's native script")
    step.add_argument(
        "--spec", metavar="FILE", help="the spec (YAML or JSON); with --all, the base of each case"
    )
    step.add_argument("--all", action="store_true", help="every engine's case, not the spec's")
    step.add_argument(
        "--cases", nargs="*", default=[], metavar="PATTERN", help="with --all: only these"
    )
    _timing(step, steps=30)
    step.set_defaults(func=_step)

    sweep = commands.add_parser("allreduce", help="run.allreduce bus bandwidth by message size")
    sweep.add_argument("--spec", action="append", required=True, metavar="FILE", help="a spec")
    sweep.add_argument(
        "--sizes",
        nargs="+",
        type=_size,
        default=None,
        metavar="SIZE",
        help="message sizes, e.g. 4K 1M 64M (default 4K 64K 1M 16M 64M)",
    )
    sweep.add_argument("--repeats", type=_positive, default=10, help="timed calls per size")
    sweep.add_argument("--out", default=DEFAULT_OUT, help=f"results folder (default {DEFAULT_OUT})")
    sweep.set_defaults(func=_allreduce)


def _specs(paths: list[str]) -> list[tuple[str, Any]]:
    """(label, spec) per file, resolved for this machine as `toolkit launch` resolves them."""
    from toolkit.launch.machine_settings import for_this_machine
    from toolkit.spec import load_spec

    return [(Path(path).stem, for_this_machine(load_spec(path))) for path in paths]


def _compare(args: argparse.Namespace) -> int:
    from toolkit.bench import compare

    return compare.run(
        _specs(args.spec),
        model=args.model,
        layers=args.layers,
        link=args.link,
        **_timing_of(args),
    )


def _step(args: argparse.Namespace) -> int:
    from toolkit.bench import step
    from toolkit.errors import ToolkitError
    from toolkit.spec import TrainSpec

    if args.spec is None and not args.all:
        raise ToolkitError("bench step needs --spec FILE, or --all", "give a spec, or --all")
    if args.spec is None:
        spec = TrainSpec()
    else:
        ((_, spec),) = _specs([args.spec])
    return step.run(spec, every_engine=args.all, cases=args.cases, **_timing_of(args))


def _allreduce(args: argparse.Namespace) -> int:
    from toolkit.bench import allreduce

    return allreduce.run(
        _specs(args.spec),
        sizes=args.sizes or allreduce.DEFAULT_SIZES,
        repeats=args.repeats,
        out=Path(args.out),
    )
