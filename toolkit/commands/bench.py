"""`toolkit bench step|allreduce|memory|report`: measurements on this machine, as JSON and PNG.

- `step --spec FILE [--all] [--reps N] [--steps N] [--vs-defaults] [--floor]`: the toolkit's
  training step against the same engine's native script, started by the same launcher,
  interleaved; beside the engine's own defaults, and beside the machine's physical floor.
- `allreduce [--sizes ...]`: allreduce bus bandwidth through the toolkit and each raw path, with
  memcpy measured in the same run as the physical limit.
- `memory --spec FILE`: `toolkit plan`'s per-rank memory against real CPU runs.
- `bubble [--micro-batches M ...]`: DeepSpeed's pipeline bubble, measured, against the plan's.
- `report`: BENCHMARKS.md from the JSON the others wrote; `all`: every figure, then the report.

Imports no engine: engines run only inside the launched ranks.
"""

from __future__ import annotations

import argparse
from typing import Any

from toolkit.commands._output import add_spec

DEFAULT_OUT = "reports/bench"


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be between 0 and 1, e.g. 0.01 for 1%")
    return value


def _layers(text: str) -> tuple[int, ...]:
    try:
        widths = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give widths like 512,2048,10") from None
    if len(widths) < 2 or min(widths) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: at least two positive widths")
    return widths


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _size(text: str) -> int:
    """4096, 4K, 4KiB, 64M, 1G -> bytes."""
    number = text.upper().removesuffix("IB").removesuffix("B")
    unit = number[-1] if number[-1:] in ("K", "M", "G") else ""
    try:
        value = int(number.removesuffix(unit)) * _UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a size like 4096, 4K or 64M") from None
    if value < 4:
        raise argparse.ArgumentTypeError(f"{text!r}: at least one float32 (4 bytes)")
    return value


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "bench", help="measure the toolkit against native engines and its plan"
    )
    commands = parser.add_subparsers(dest="bench_command", metavar="WHAT", required=True)

    step = commands.add_parser("step", help="toolkit step vs native step of the same engine")
    add_spec(step)
    step.add_argument("--all", action="store_true", help="every engine on the same model")
    step.add_argument("--reps", type=_positive, default=3, help="repetitions (default 3)")
    step.add_argument("--steps", type=_positive, default=60, help="timed steps per launch")
    step.add_argument("--warmup", type=_positive, default=5, help="untimed steps per launch")
    step.add_argument(
        "--vs-defaults",
        action="store_true",
        help="also run the native script with the engine's own defaults (toolkit / defaults)",
    )
    step.add_argument(
        "--floor",
        action="store_true",
        help="also run the physical floor: each rank's compute with no engine, then its "
        "gradient bytes moved once at memory speed (toolkit / floor; with --in-process, step "
        "by step in the same processes)",
    )
    step.add_argument(
        "--in-process",
        action="store_true",
        help="alternate native and toolkit step by step in the same processes (the adapter's "
        "cost alone, robust to other jobs); --steps counts cycles",
    )
    step.add_argument(
        "--resolve",
        type=_fraction,
        default=None,
        metavar="FRACTION",
        help="with --in-process: launch past --reps until toolkit / native is known to "
        "±FRACTION over launches (e.g. 0.01), at most --max-reps",
    )
    step.add_argument(
        "--max-reps", type=_positive, default=12, help="with --resolve: the most launches a case"
    )
    step.add_argument(
        "--cases", nargs="*", default=[], metavar="PATTERN", help="with --all: only these"
    )
    step.add_argument("--patch", action="append", default=[], help="add toolkit+PATCH")
    step.add_argument(
        "--candidate", action="append", default=[], help="add native+FLAG (e.g. --loss-allreduce)"
    )
    step.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="add native@PATH=VALUE: the native step under another spec setting",
    )
    step.add_argument(
        "--toolkit-setting",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="add toolkit@PATH=VALUE: the toolkit's step under another spec setting",
    )
    step.add_argument("--layers", type=_layers, default=None, help="MLP widths (default issue's)")
    step.add_argument("--micro", type=_positive, default=None, help="samples per rank per step")
    step.add_argument(
        "--ranks",
        type=_positive,
        default=None,
        help="processes (default 2, the issue's); the bench sets launch.np, not the spec",
    )
    step.add_argument("--out", default=DEFAULT_OUT, help="where NAME.json and NAME.png go")
    step.add_argument("--name", default="step", help="file name stem (default step)")
    step.set_defaults(func=_run("run_step"))

    sweep = commands.add_parser("allreduce", help="allreduce bus bandwidth by message size")
    sweep.add_argument(
        "--sizes",
        nargs="+",
        type=_size,
        default=None,
        metavar="SIZE",
        help="message sizes, e.g. 4K 1M 64M (default 4K..64M by 4x; --full: to 256M)",
    )
    sweep.add_argument("--full", action="store_true", help="4 KiB .. 256 MiB")
    sweep.add_argument(
        "--blocks",
        type=_positive,
        default=9,
        help="timed blocks per size and path, at least (rounded up to whole rounds, in each of "
        "which every path runs behind every other once, and to whole turns of the buffers' "
        "places in memory); toolkit / raw is the median of the blocks' ratios",
    )
    sweep.add_argument(
        "--launches",
        type=_positive,
        default=1,
        help="launches of each sweep, taken in turns and pooled (one launch resolves a 64 MiB "
        "ratio to about ±5%% here)",
    )
    sweep.add_argument(
        "--sweeps", nargs="*", default=[], metavar="PATTERN", help="only these launches"
    )
    sweep.add_argument("--out", default=DEFAULT_OUT, help="where NAME.json and NAME.png go")
    sweep.add_argument("--name", default="allreduce", help="file name stem (default allreduce)")
    sweep.set_defaults(func=_run("run_allreduce"))

    memory = commands.add_parser("memory", help="toolkit plan against real CPU runs")
    memory.add_argument(
        "--spec",
        default=None,
        metavar="FILE",
        help="optimizer, precision and the zero/ddp/horovod sections from here",
    )
    memory.add_argument("--layers", type=_layers, default=None, help="MLP widths")
    memory.add_argument("--micro", type=_positive, default=64, help="samples per rank")
    memory.add_argument("--cases", nargs="*", default=[], metavar="PATTERN", help="only these")
    memory.add_argument("--out", default=DEFAULT_OUT, help="where NAME.json goes")
    memory.add_argument("--name", default="memory", help="file name stem (default memory)")
    memory.set_defaults(func=_run("run_memory"))

    bubble = commands.add_parser("bubble", help="measured pipeline bubble against (p-1)/(m+p-1)")
    bubble.add_argument(
        "--micro-batches",
        nargs="+",
        type=_positive,
        default=None,
        metavar="M",
        help="micro-batches per step to measure (default 1 2 4 8)",
    )
    bubble.add_argument("--layers", type=_layers, default=None, help="MLP widths")
    bubble.add_argument("--micro", type=_positive, default=None, help="samples per micro-batch")
    bubble.add_argument("--steps", type=_positive, default=10, help="timed steps per launch")
    bubble.add_argument(
        "--send-recv",
        nargs="+",
        choices=("gloo", "shared_memory"),
        default=None,
        help="the pipeline's transports between stages (deepspeed.send_recv), each m measured "
        "under each in turn (default both)",
    )
    bubble.add_argument("--out", default=DEFAULT_OUT, help="where bubble.json and .png go")
    bubble.set_defaults(func=_run("run_bubble"))

    report = commands.add_parser("report", help="BENCHMARKS.md from the JSON in a directory")
    report.add_argument("--dir", default="docs/bench", help="where the JSON and PNG are")
    report.add_argument("--to", default="BENCHMARKS.md", help="the Markdown file to write")
    report.set_defaults(func=_run("run_report"))

    everything = commands.add_parser(
        "all",
        help=(
            "every benchmark BENCHMARKS.md shows, launching again on what the first runs left "
            "unresolved (the adapter's cases, the floor's best choices, the allreduce at 64 MiB), "
            "then the report (2-3 hours on 2 cores)"
        ),
    )
    add_spec(everything)
    everything.add_argument(
        "--smoke",
        action="store_true",
        help="every benchmark and every launch-again at tiny sizes, into reports/bench-smoke "
        "(a few minutes): shows the command runs through to its report, measures nothing",
    )
    everything.add_argument(
        "--dir", default=None, help="where results go (default docs/bench; --smoke: its own)"
    )
    everything.add_argument(
        "--to", default=None, help="the Markdown file to write (default BENCHMARKS.md)"
    )
    everything.add_argument(
        "--reps", type=_positive, default=None, help="step repetitions (default 3; --smoke: 1)"
    )
    everything.set_defaults(func=_run("run_all"))


def _run(name: str) -> Any:
    """The subcommand's function in toolkit.bench.runs, imported only when it runs."""

    def call(args: argparse.Namespace) -> int:
        from toolkit.bench import runs

        result: int = getattr(runs, name)(args)
        return result

    return call
