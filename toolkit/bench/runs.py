"""What each `toolkit bench` subcommand does once its arguments are parsed
(toolkit/commands/bench.py holds the parsers). Imports no engine: they run in launched ranks."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolkit.errors import ToolkitError

if TYPE_CHECKING:
    from toolkit.bench.targets import Row


def _step_command(args: argparse.Namespace) -> str:
    """The command line that reproduces this run, for the JSON and BENCHMARKS.md."""
    words = ["toolkit", "bench", "step", "--spec", args.spec]
    words += ["--all"] if args.all else []
    words += ["--vs-defaults"] if args.vs_defaults else []
    words += ["--floor"] if args.floor else []
    words += ["--in-process"] if args.in_process else []
    words += ["--reps", str(args.reps), "--steps", str(args.steps), "--warmup", str(args.warmup)]
    if args.resolve is not None:
        words += ["--resolve", str(args.resolve), "--max-reps", str(args.max_reps)]
    words += ["--cases", *args.cases] if args.cases else []
    words += ["--name", args.name] if args.name != "step" else []
    for name in args.patch:
        words += ["--patch", name]
    for flag in args.candidate:
        words += [f"--candidate={flag}"]
    for text in args.setting:
        words += ["--setting", text]
    for text in args.toolkit_setting:
        words += ["--toolkit-setting", text]
    if args.layers:
        words += ["--layers", ",".join(map(str, args.layers))]
    if args.micro:
        words += ["--micro", str(args.micro)]
    if args.ranks:
        words += ["--ranks", str(args.ranks)]
    return " ".join(words)


def _check_ranks_fill_stages(ranks: int, user: Any, cases: list[Any]) -> None:
    """--ranks must be a whole number of pipelines for every case that has one."""
    from toolkit.bench.step import pipeline_stages

    for case in cases:
        stages = pipeline_stages(case.spec) if "pipeline" in case.spec else user.pipeline.stages
        if ranks % stages:
            raise ToolkitError(
                f"--ranks {ranks}: case {case.name} has {stages} pipeline stages, and the "
                "ranks must be a multiple of them",
                f"give --ranks {stages * max(1, ranks // stages)}, or leave the case out "
                "with --cases",
            )


def run_step(args: argparse.Namespace) -> int:
    from toolkit.bench import cases as bench_cases
    from toolkit.bench import record
    from toolkit.bench.patches import PATCHES
    from toolkit.bench.step import StepBench, log_stderr, variants_for
    from toolkit.bench.step_report import plot, table
    from toolkit.spec import load_spec

    user = load_spec(args.spec)
    unknown = [n for names in args.patch for n in names.split("+") if n not in PATCHES]
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
        for key, value in (("layers", args.layers), ("micro", args.micro), ("ranks", args.ranks))
        if value is not None
    }
    if overrides:
        selected = [
            dataclasses.replace(c, workload=dataclasses.replace(c.workload, **overrides))
            for c in selected
        ]
    if args.ranks:
        _check_ranks_fill_stages(args.ranks, user, selected)
    patches = args.patch
    if args.in_process and not patches:
        from toolkit.bench.inprocess import DEFAULT_PATCHES

        patches = list(DEFAULT_PATCHES)
    variants = variants_for(
        vs_defaults=args.vs_defaults,
        patches=patches,
        candidates=args.candidate,
        settings=args.setting,
        toolkit_settings=args.toolkit_setting,
        floor=args.floor,
    )
    context = record.machine()
    out = Path(args.out)
    runner = StepBench
    if args.in_process:
        launch_only = (args.candidate, args.setting, args.toolkit_setting)
        if any(launch_only) or args.vs_defaults:
            raise ToolkitError(
                "--in-process compares native and toolkit steps (and --patch and --floor "
                "variants) in the same processes; --candidate, --setting, --toolkit-setting "
                "and --vs-defaults compare launches",
                "run those without --in-process",
            )
        from toolkit.bench.inprocess import InProcessBench

        runner = InProcessBench
    if args.resolve is not None and not args.in_process:
        raise ToolkitError(
            f"--resolve {args.resolve}: resolves toolkit / native over the launches of "
            "--in-process runs",
            "add --in-process, or leave --resolve out and raise --reps",
        )
    if args.resolve is not None and args.max_reps < args.reps:
        raise ToolkitError(
            f"--max-reps {args.max_reps}: fewer than --reps {args.reps}",
            "--max-reps bounds the launches --resolve adds after --reps",
        )
    extra: dict[str, Any] = {}
    if args.in_process:
        extra = {"resolve": args.resolve, "max_reps": args.max_reps}
    with tempfile.TemporaryDirectory(prefix="toolkit-bench-") as work:
        bench = runner(
            Path(work), user, steps=args.steps, warmup=args.warmup, log=log_stderr, **extra
        )
        results = bench.run(selected, variants, args.reps)
    name = args.name
    data = {
        "kind": "step-in-process" if args.in_process else "step",
        "command": _step_command(args),
        "machine": record.finish(context),
        "reps": args.reps,
        "resolve": args.resolve,
        "max_reps": args.max_reps if args.resolve is not None else None,
        "steps": args.steps,
        "warmup": args.warmup,
        "workloads": {c.name: dataclasses.asdict(c.workload) for c in selected},
        "cases": [result.to_json() for result in results],
    }
    print(table(data))
    measured = any(result.measured for result in results)
    if record.write_measured(out / f"{name}.json", data, measured=measured):
        png = plot(data, out / f"{name}.png")
        print(f"wrote {out / f'{name}.json'}, {png}")
    return 1 if any(result.errors for result in results) else 0


def run_allreduce(args: argparse.Namespace) -> int:
    from toolkit.bench import allreduce, record
    from toolkit.bench.allreduce_report import plot, table
    from toolkit.bench.step import log_stderr

    sizes = args.sizes or list(allreduce.FULL_SIZES if args.full else allreduce.DEFAULT_SIZES)
    sweeps = allreduce.matching_sweeps(args.sweeps)
    if not sweeps:
        names = ", ".join(s.name for s in allreduce.SWEEPS)
        raise ToolkitError(f"--sweeps {args.sweeps}: matches no sweep", f"sweeps: {names}")
    context = record.machine()
    with tempfile.TemporaryDirectory(prefix="toolkit-bench-") as work:
        measured = allreduce.run_sweeps(
            Path(work),
            sorted(set(sizes)),
            blocks=args.blocks,
            launches=args.launches,
            sweeps=sweeps,
            log=log_stderr,
        )
    words = ["toolkit", "bench", "allreduce", "--blocks", str(args.blocks)]
    words += ["--launches", str(args.launches)]
    words += ["--full"] if args.full else []
    words += ["--sizes", *map(str, args.sizes)] if args.sizes else []
    words += ["--sweeps", *args.sweeps] if args.sweeps else []
    words += ["--name", args.name] if args.name != "allreduce" else []
    data = {
        "kind": "allreduce",
        "command": " ".join(words),
        "machine": record.finish(context),
        **measured,
    }
    out = Path(args.out)
    print(table(data))
    if record.write_measured(out / f"{args.name}.json", data, measured=bool(data["series"])):
        png = plot(data, out / f"{args.name}.png")
        print(f"wrote {out / f'{args.name}.json'}, {png}")
    return 1 if data["errors"] else 0


def run_memory(args: argparse.Namespace) -> int:
    from toolkit.bench import memory, record
    from toolkit.bench.step import log_stderr
    from toolkit.spec import load_spec

    base: dict[str, Any] = {"optimizer": {"name": "adamw"}}
    if args.spec:
        spec = load_spec(args.spec).to_dict()
        base = memory.spec_changes(spec)
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
    words += ["--name", args.name] if args.name != "memory" else []
    data = {"kind": "memory", "command": " ".join(words), "machine": record.finish(context)}
    data.update(measured)
    path = Path(args.out) / f"{args.name}.json"
    print(memory.table(data))
    if record.write_measured(path, data, measured=bool(data["cases"])):
        print(f"wrote {path}")
    return 1 if data["errors"] else 0


def run_bubble(args: argparse.Namespace) -> int:
    from toolkit.bench import bubble, record
    from toolkit.bench.step import log_stderr

    counts = tuple(sorted(set(args.micro_batches or bubble.DEFAULT_MICRO_BATCHES)))
    layers = args.layers or bubble.DEFAULT_LAYERS
    if len(layers) - 1 < bubble.STAGES:
        raise ToolkitError(
            f"--layers {','.join(map(str, layers))}: {len(layers) - 1} layer cannot fill "
            f"{bubble.STAGES} pipeline stages",
            f"give at least {bubble.STAGES + 1} widths, e.g. 64,64,64",
        )
    micro = args.micro or bubble.DEFAULT_MICRO
    transports = tuple(dict.fromkeys(args.send_recv or bubble.DEFAULT_SEND_RECV))
    context = record.machine()
    with tempfile.TemporaryDirectory(prefix="toolkit-bench-") as work:
        measured = bubble.run_bubble(
            Path(work),
            micro_batch_counts=counts,
            layers=layers,
            micro=micro,
            steps=args.steps,
            transports=transports,
            log=log_stderr,
        )
    words = ["toolkit", "bench", "bubble", "--steps", str(args.steps)]
    words += ["--send-recv", *transports] if args.send_recv else []
    words += ["--micro-batches", *map(str, counts)] if args.micro_batches else []
    words += ["--layers", ",".join(map(str, layers))] if args.layers else []
    words += ["--micro", str(micro)] if args.micro else []
    data = {"kind": "bubble", "command": " ".join(words), "machine": record.finish(context)}
    data.update(measured)
    out = Path(args.out)
    print(bubble.table(data))
    if record.write_measured(out / "bubble.json", data, measured=bool(data["cases"])):
        png = bubble.plot(data, out / "bubble.png")
        print(f"wrote {out / 'bubble.json'}, {png}")
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


FLOOR_CASES = ("ddp", "horovod-torch-mpi", "tf-mwms", "horovod-tf-mpi")
"""The fastest torch and TF engines here (BENCHMARKS.md), measured against the physical floor."""


RESOLVE = ("--reps", "5", "--max-reps", "8", "--resolve", "0.01", "--steps", "150")
"""How `toolkit bench all` launches on the adapter's cases its in-process run left short of
met: launches of 150 cycles, 5 to 8 of them, until toolkit / native is known to ±1% (about a
thousand cycles resolve that on this machine, docs/bench/findings.md)."""

FLOOR_RESOLVE = ("--reps", "10", "--steps", "60", "--warmup", "5")
"""How `toolkit bench all` launches on the best choices its floor run left short of met: 10
repetitions, each a launch of the toolkit's step and one of the floor's. A launch's step time
moves with the machine's load (one of 5 read 64.5 ms where the others read 48.4-49.5), and the
ratio's interval is a bootstrap over repetitions."""

ALLREDUCE_RESOLVE = ("--blocks", "9", "--launches", "16")
"""How `toolkit bench all` launches on the allreduce sweeps its size sweep left short of met, at
the target's size alone: 16 launches, each of at least 9 blocks (17.4 minutes for all four
sweeps here). One launch's figure moves by about ±4% (where each buffer lies, toolkit/bench/
ranks/toolkit_allreduce.py); pooled, 16 fixed the in-place ratios to ±1.3-1.7% over MPI, DDP's
Gloo and TF's ring, ±4% over Horovod's Gloo (docs/bench/findings.md)."""


@dataclass(frozen=True)
class Scale:
    """How much `toolkit bench all` measures: what BENCHMARKS.md shows (FULL), or every bench
    and every launch-again at tiny sizes (SMOKE), which shows in minutes that the one command
    runs through to its report, and measures nothing worth reading."""

    dir: str
    to: str
    reps: int
    step: tuple[str, ...]
    """Flags of every step run, the launches-again included."""
    cases: tuple[str, ...]
    """The step runs' cases (all when empty)."""
    floor_cases: tuple[str, ...]
    allreduce: tuple[str, ...]
    sweeps: tuple[str, ...]
    """The allreduce sweeps, the launches-again included (all when empty)."""
    memory: tuple[str, ...]
    bubble: tuple[str, ...]
    resolve: tuple[str, ...]
    floor_resolve: tuple[str, ...]
    allreduce_resolve: tuple[str, ...]


FULL = Scale(
    dir="docs/bench",
    to="BENCHMARKS.md",
    reps=3,
    step=(),
    cases=(),
    floor_cases=FLOOR_CASES,
    allreduce=("--full",),
    sweeps=(),
    memory=(),
    bubble=(),
    resolve=RESOLVE,
    floor_resolve=FLOOR_RESOLVE,
    allreduce_resolve=ALLREDUCE_RESOLVE,
)

_TINY_STEP = ("--steps", "2", "--warmup", "1", "--layers", "16,8,4", "--micro", "4")

SMOKE = Scale(
    dir="reports/bench-smoke",
    to="reports/bench-smoke/BENCHMARKS.md",
    reps=1,
    step=_TINY_STEP,
    cases=("ddp",),
    floor_cases=("ddp",),
    allreduce=("--sizes", "4K", "--blocks", "1"),
    sweeps=("ddp",),
    memory=("--cases", "ddp", "--layers", "64,32,10", "--micro", "4"),
    bubble=(
        *("--micro-batches", "2", "--layers", "16,16,16", "--micro", "4", "--steps", "2"),
        *("--send-recv", "shared_memory"),
    ),
    # No 2 launches resolve a ratio to a millionth: the in-process run launches twice.
    resolve=("--reps", "1", "--max-reps", "2", "--resolve", "0.000001"),
    floor_resolve=("--reps", "2"),
    allreduce_resolve=("--blocks", "1", "--launches", "2"),
)


def all_runs(spec: str, reps: int, directory: str, scale: Scale = FULL) -> dict[str, list[str]]:
    """The benches `toolkit bench all` runs, as CLI arguments, by the JSON file each writes in
    `directory` (the files BENCHMARKS.md's targets are read from, toolkit.bench.targets)."""
    out = ["--out", directory]
    step = ["bench", "step", "--spec", spec, "--all", "--reps", str(reps), *scale.step]
    step_cases = [*step, "--cases", *scale.cases] if scale.cases else step
    floor = ["--floor", "--name", "step-floor", "--cases", *scale.floor_cases]
    sweeps = ["--sweeps", *scale.sweeps] if scale.sweeps else []
    return {
        "step-in-process.json": [*step_cases, "--in-process", "--name", "step-in-process", *out],
        "step-vs-defaults.json": [*step_cases, "--vs-defaults", "--name", "step-vs-defaults", *out],
        "step-floor.json": [*step, *floor, *out],
        "allreduce.json": ["bench", "allreduce", *scale.allreduce, *sweeps, *out],
        "memory.json": ["bench", "memory", *scale.memory, *out],
        "bubble.json": ["bench", "bubble", *scale.bubble, *out],
    }


Resolver = Callable[[dict[str, Any]], list[str] | None]
"""A headline file's data -> the command that launches again on what it left short of met."""


def resolvers(spec: str, directory: str, scale: Scale = FULL) -> dict[str, Resolver]:
    """Each of targets.RESOLVING_RUNS's launches-again, by the headline file it reads."""
    return {
        "step-in-process.json": partial(resolve_run, spec, directory, scale),
        "step-floor.json": partial(resolve_floor_run, spec, directory, scale),
        "allreduce.json": partial(resolve_allreduce_run, directory, scale),
    }


def resolve_run(
    spec: str, directory: str, scale: Scale, headline: dict[str, Any]
) -> list[str] | None:
    """The command that launches on the cases of `headline` (step-in-process.json) whose
    adapter figure is not met, into targets.RESOLVING_RUN; None when every case is met."""
    from toolkit.bench.targets import RESOLVING_RUN, adapter_rows

    flags = ["--in-process", *scale.step, *scale.resolve]
    return _resolve_step(spec, directory, adapter_rows(headline, ""), RESOLVING_RUN, flags)


def resolve_floor_run(
    spec: str, directory: str, scale: Scale, headline: dict[str, Any]
) -> list[str] | None:
    """The command that launches on the best choices of `headline` (step-floor.json) whose
    ratio to the floor is not met, into targets.FLOOR_RESOLVING_RUN; None when both are."""
    from toolkit.bench.targets import FLOOR_RESOLVING_RUN, floor_rows

    flags = ["--floor", *scale.step, *scale.floor_resolve]
    return _resolve_step(spec, directory, floor_rows(headline, ""), FLOOR_RESOLVING_RUN, flags)


def _resolve_step(
    spec: str, directory: str, rows: Iterable[Row], resolving: str, flags: list[str]
) -> list[str] | None:
    """`toolkit bench step` with `flags` on the cases of `rows` that are not met, into the file
    `resolving`; None when all are."""
    from toolkit.bench.targets import MET

    short = [row.subject for row in rows if row.verdict != MET]
    if not short:
        return None
    step = ["bench", "step", "--spec", spec, "--all", *flags, "--cases", *short]
    return [*step, "--name", resolving.removesuffix(".json"), "--out", directory]


def resolve_allreduce_run(
    directory: str, scale: Scale, headline: dict[str, Any]
) -> list[str] | None:
    """The command that launches on the sweeps of `headline` (allreduce.json) whose ratio at
    the target's size is not met, into targets.ALLREDUCE_RESOLVING_RUN; None when all are."""
    from toolkit.bench.allreduce import matching_sweeps
    from toolkit.bench.targets import (
        ALLREDUCE_RESOLVING_RUN,
        ALLREDUCE_SIZE,
        MET,
        allreduce_rows,
        allreduce_subject,
    )

    short = {row.subject for row in allreduce_rows(headline, "") if row.verdict != MET}
    sweeps = [
        sweep.name for sweep in matching_sweeps(scale.sweeps) if allreduce_subject(sweep) in short
    ]
    if not sweeps:
        return None
    name = ALLREDUCE_RESOLVING_RUN.removesuffix(".json")
    sweep = ["bench", "allreduce", "--sizes", str(ALLREDUCE_SIZE), *scale.allreduce_resolve]
    return [*sweep, "--sweeps", *sweeps, "--name", name, "--out", directory]


def run_all(args: argparse.Namespace) -> int:
    """What BENCHMARKS.md shows, each through the CLI itself so the JSON records its command."""
    from toolkit.cli import main

    scale = SMOKE if args.smoke else FULL
    directory, to = args.dir or scale.dir, args.to or scale.to
    Path(directory).mkdir(parents=True, exist_ok=True)
    status = 0
    for argv in all_runs(args.spec, args.reps or scale.reps, directory, scale).values():
        status |= main(argv)
    for name, resolver in resolvers(args.spec, directory, scale).items():
        headline = Path(directory) / name
        resolving = resolver(json.loads(headline.read_text())) if headline.exists() else None
        status |= main(resolving) if resolving else 0
    memory_spec = Path(directory) / "memory-plan.yaml"
    memory_spec.write_text(
        "backend: ddp\noptimizer: {name: adamw}\nbatch: {global: 128, micro: 64}\nlaunch: {np: 2}\n"
    )
    model = "toolkit.bench.native._torch_model:memory_mlp"
    plan_out = str(Path(directory) / "plan.txt")
    status |= main(["plan", "--spec", str(memory_spec), "--model", model, "-o", plan_out])
    status |= main(["bench", "report", "--dir", directory, "--to", to])
    return status
