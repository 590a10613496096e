"""`toolkit bench step|allreduce|memory|report`: measurements on this machine, as JSON and PNG.

- `step --spec FILE [--all] [--reps N] [--steps N] [--vs-defaults]`: the toolkit's training step
  against the same engine's native script, started by the same launcher, interleaved.
- `allreduce [--sizes ...]`: allreduce bus bandwidth through the toolkit and each raw path, with
  memcpy measured in the same run as the physical limit.
- `memory --spec FILE`: `toolkit plan`'s per-rank memory against real CPU runs.
- `report`: BENCHMARKS.md from the JSON the others wrote; `all`: every figure, then the report.

Imports no engine: engines run only inside the launched ranks.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

from toolkit.commands._output import add_spec
from toolkit.errors import ToolkitError

DEFAULT_OUT = "reports/bench"


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
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
    parser = subparsers.add_parser("bench", help="measure the toolkit against native engines")
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
    step.add_argument("--layers", type=_layers, default=None, help="MLP widths (default issue's)")
    step.add_argument("--micro", type=_positive, default=None, help="samples per rank per step")
    step.add_argument("--out", default=DEFAULT_OUT, help="where NAME.json and NAME.png go")
    step.add_argument("--name", default="step", help="file name stem (default step)")
    step.set_defaults(func=run_step)

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
    sweep.add_argument("--blocks", type=_positive, default=3, help="timed blocks per size")
    sweep.add_argument(
        "--sweeps", nargs="*", default=[], metavar="PATTERN", help="only these launches"
    )
    sweep.add_argument("--out", default=DEFAULT_OUT, help="where allreduce.json and .png go")
    sweep.set_defaults(func=run_allreduce)

    memory = commands.add_parser("memory", help="toolkit plan against real CPU runs")
    memory.add_argument(
        "--spec", default=None, metavar="FILE", help="optimizer/precision from here"
    )
    memory.add_argument("--layers", type=_layers, default=None, help="MLP widths")
    memory.add_argument("--micro", type=_positive, default=64, help="samples per rank")
    memory.add_argument("--cases", nargs="*", default=[], metavar="PATTERN", help="only these")
    memory.add_argument("--out", default=DEFAULT_OUT, help="where memory.json goes")
    memory.set_defaults(func=run_memory)

    report = commands.add_parser("report", help="BENCHMARKS.md from the JSON in a directory")
    report.add_argument("--dir", default="docs/bench", help="where the JSON and PNG are")
    report.add_argument("--to", default="BENCHMARKS.md", help="the Markdown file to write")
    report.set_defaults(func=run_report)

    everything = commands.add_parser(
        "all", help="every benchmark BENCHMARKS.md shows, then the report (about an hour)"
    )
    add_spec(everything)
    everything.add_argument("--dir", default="docs/bench", help="where results go")
    everything.add_argument("--to", default="BENCHMARKS.md", help="the Markdown file to write")
    everything.add_argument("--reps", type=_positive, default=3, help="step repetitions")
    everything.set_defaults(func=run_all)


def _step_command(args: argparse.Namespace) -> str:
    """The command line that reproduces this run, for the JSON and BENCHMARKS.md."""
    words = ["toolkit", "bench", "step", "--spec", args.spec]
    words += ["--all"] if args.all else []
    words += ["--vs-defaults"] if args.vs_defaults else []
    words += ["--reps", str(args.reps), "--steps", str(args.steps), "--warmup", str(args.warmup)]
    words += ["--cases", *args.cases] if args.cases else []
    words += ["--name", args.name] if args.name != "step" else []
    for name in args.patch:
        words += ["--patch", name]
    for flag in args.candidate:
        words += [f"--candidate={flag}"]
    for text in args.setting:
        words += ["--setting", text]
    if args.layers:
        words += ["--layers", ",".join(map(str, args.layers))]
    if args.micro:
        words += ["--micro", str(args.micro)]
    return " ".join(words)


def run_step(args: argparse.Namespace) -> int:
    import dataclasses

    from toolkit.bench import cases as bench_cases
    from toolkit.bench import record
    from toolkit.bench.patches import PATCHES
    from toolkit.bench.step import StepBench, log_stderr, variants_for
    from toolkit.bench.step_report import plot, table
    from toolkit.spec import load_spec

    user = load_spec(args.spec)
    unknown = [name for name in args.patch if name not in PATCHES]
    if unknown:
        raise ToolkitError(
            f"--patch {unknown[0]!r}: no such patch; there are {', '.join(sorted(PATCHES))}",
            "see toolkit/bench/patches.py",
        )
    selected = list(bench_cases.CASES) if args.all else [bench_cases.case_for(user)]
    if args.cases:
        selected = [c for c in selected if any(p in c.name for p in args.cases)]
        if not selected:
            names = ", ".join(c.name for c in bench_cases.CASES)
            raise ToolkitError(f"--cases {args.cases}: matches no case", f"cases: {names}")
    overrides = {
        key: value
        for key, value in (("layers", args.layers), ("micro", args.micro))
        if value is not None
    }
    if overrides:
        selected = [
            dataclasses.replace(c, workload=dataclasses.replace(c.workload, **overrides))
            for c in selected
        ]
    variants = variants_for(
        vs_defaults=args.vs_defaults,
        patches=args.patch,
        candidates=args.candidate,
        settings=args.setting,
    )
    context = record.machine()
    out = Path(args.out)
    with tempfile.TemporaryDirectory(prefix="toolkit-bench-") as work:
        bench = StepBench(Path(work), user, steps=args.steps, warmup=args.warmup, log=log_stderr)
        results = bench.run(selected, variants, args.reps)
    name = args.name
    data = {
        "kind": "step",
        "command": _step_command(args),
        "machine": record.finish(context),
        "reps": args.reps,
        "steps": args.steps,
        "warmup": args.warmup,
        "workloads": {c.name: dataclasses.asdict(c.workload) for c in selected},
        "cases": [result.to_json() for result in results],
    }
    record.write_json(out / f"{name}.json", data)
    png = plot(data, out / f"{name}.png")
    print(table(data))
    print(f"wrote {out / f'{name}.json'}, {png}")
    return 1 if any(result.errors for result in results) else 0


def run_allreduce(args: argparse.Namespace) -> int:
    from toolkit.bench import allreduce, record
    from toolkit.bench.allreduce_report import plot, table
    from toolkit.bench.step import log_stderr

    sizes = args.sizes or list(allreduce.FULL_SIZES if args.full else allreduce.DEFAULT_SIZES)
    sweeps = tuple(
        s for s in allreduce.SWEEPS if not args.sweeps or any(p in s.name for p in args.sweeps)
    )
    if not sweeps:
        names = ", ".join(s.name for s in allreduce.SWEEPS)
        raise ToolkitError(f"--sweeps {args.sweeps}: matches no sweep", f"sweeps: {names}")
    context = record.machine()
    with tempfile.TemporaryDirectory(prefix="toolkit-bench-") as work:
        measured = allreduce.run_sweeps(
            Path(work), sorted(set(sizes)), blocks=args.blocks, sweeps=sweeps, log=log_stderr
        )
    words = ["toolkit", "bench", "allreduce", "--blocks", str(args.blocks)]
    words += ["--full"] if args.full else []
    words += ["--sizes", *map(str, args.sizes)] if args.sizes else []
    words += ["--sweeps", *args.sweeps] if args.sweeps else []
    data = {
        "kind": "allreduce",
        "command": " ".join(words),
        "machine": record.finish(context),
        **measured,
    }
    out = Path(args.out)
    record.write_json(out / "allreduce.json", data)
    png = plot(data, out / "allreduce.png")
    print(table(data))
    print(f"wrote {out / 'allreduce.json'}, {png}")
    return 1 if data["errors"] else 0


def run_memory(args: argparse.Namespace) -> int:
    from toolkit.bench import memory, record
    from toolkit.bench.step import log_stderr
    from toolkit.spec import load_spec

    base: dict[str, Any] = {"optimizer": {"name": "adamw"}}
    if args.spec:
        spec = load_spec(args.spec).to_dict()
        base = {"optimizer": spec["optimizer"], "precision": spec["precision"]}
    cases = tuple(
        c for c in memory.MEMORY_CASES if not args.cases or any(p in c.name for p in args.cases)
    )
    if not cases:
        names = ", ".join(c.name for c in memory.MEMORY_CASES)
        raise ToolkitError(f"--cases {args.cases}: matches no case", f"cases: {names}")
    layers = args.layers or memory.DEFAULT_LAYERS
    context = record.machine()
    with tempfile.TemporaryDirectory(prefix="toolkit-bench-") as work:
        measured = memory.run_memory(
            Path(work), layers=layers, micro=args.micro, base=base, cases=cases, log=log_stderr
        )
    words = ["toolkit", "bench", "memory", "--micro", str(args.micro)]
    words += ["--spec", args.spec] if args.spec else []
    words += ["--layers", ",".join(map(str, layers))] if args.layers else []
    words += ["--cases", *args.cases] if args.cases else []
    data = {"kind": "memory", "command": " ".join(words), "machine": record.finish(context)}
    data.update(measured)
    record.write_json(Path(args.out) / "memory.json", data)
    print(memory.table(data))
    print(f"wrote {Path(args.out) / 'memory.json'}")
    return 1 if data["errors"] else 0


def run_report(args: argparse.Namespace) -> int:
    from toolkit.bench.markdown import render

    directory, target = Path(args.dir), Path(args.to)
    if not directory.is_dir():
        raise ToolkitError(f"--dir {args.dir!r} is not a directory", "run `toolkit bench all`")
    prefix = os.path.relpath(str(directory), str(target.parent)).rstrip("/") + "/"
    target.write_text(render(directory, image_prefix=prefix))
    print(f"wrote {target}")
    return 0


def run_all(args: argparse.Namespace) -> int:
    """What BENCHMARKS.md shows, each through the CLI itself so the JSON records its command."""
    from toolkit.cli import main

    out = ["--out", args.dir]
    runs = [
        [
            "bench",
            "step",
            "--spec",
            args.spec,
            "--all",
            "--vs-defaults",
            "--reps",
            str(args.reps),
            *out,
        ],
        ["bench", "allreduce", "--full", *out],
        ["bench", "memory", *out],
    ]
    status = 0
    for argv in runs:
        status |= main(argv)
    memory_spec = Path(args.dir) / "memory-plan.yaml"
    memory_spec.write_text(
        "backend: ddp\noptimizer: {name: adamw}\nbatch: {global: 128, micro: 64}\nlaunch: {np: 2}\n"
    )
    model = "toolkit.bench.native._torch_model:memory_mlp"
    plan_out = str(Path(args.dir) / "plan.txt")
    status |= main(["plan", "--spec", str(memory_spec), "--model", model, "-o", plan_out])
    status |= main(["bench", "report", "--dir", args.dir, "--to", args.to])
    return status
