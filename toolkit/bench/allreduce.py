"""`toolkit bench allreduce`: allreduce bus bandwidth by message size, through the toolkit's
`run.allreduce` and through each raw path, with single-core memcpy as the physical limit.

Each sweep is one launch of 2 ranks through a real launcher: the toolkit starts its engine
(`toolkit.init`), and the same processes then time, size by size and interleaved, the
toolkit's `run.allreduce` and the engine's own call (and any other raw path that launcher
gives, e.g. mpi4py under mpirun). So toolkit/raw is a ratio taken side by side in the same
processes, and the raw paths of different sweeps are compared through their bandwidths.
Each size's toolkit/raw, in one launch, is the median of its blocks' ratios, block k of the
toolkit's path against block k of the raw one, which ran in the same round
(`toolkit_over_raw_spread`). The ratio of the two paths' median blocks, which this replaced,
read 0.88-1.31 at 64 MiB for paths that make the same call, with 3 blocks of 2 operations.
`--launches N` launches every sweep N times and pools them (`paired_ratios`), since one
launch of 25 blocks resolves a 64 MiB ratio to about ±5% here and the target is 2%.
Every launch also times its raw path a second time, as a path of its own with its own buffer
(`raw_again_over_raw_spread`, by the raw path's label): the A/A, how far two runs of the very
same call read apart in that launch. Each round of blocks allocates the paths' buffers anew, in
an order that rotates from round to round, since where a buffer lies moved its allreduce's time
by up to a tenth (toolkit/bench/ranks/toolkit_allreduce.py).

Bandwidth follows nccl-tests: algbw = bytes / time, busbw = algbw × 2(n-1)/n for allreduce
(the fraction of the buffer each rank sends and receives in a ring); for 2 ranks busbw = algbw.
memcpy's bandwidth is bytes / time of one core copying the buffer.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolkit.bench import stats
from toolkit.bench.launching import failure, launch_with_spec
from toolkit.bench.ranks.raw_paths import AGAIN
from toolkit.parity.cases import merge
from toolkit.ports import free_port, free_port_range
from toolkit.spec import TrainSpec
from toolkit.units import KIB

RANK_PROGRAM = str(Path(__file__).parent / "ranks" / "toolkit_allreduce.py")
DEFAULT_SIZES = tuple(4 * KIB * 4**k for k in range(8))  # 4 KiB .. 64 MiB
FULL_SIZES = tuple(4 * KIB * 4**k for k in range(9))  # 4 KiB .. 256 MiB
SWEEP_TIMEOUT_S = 900


TOOLKIT_PATHS = ("toolkit", "toolkit-inplace")
"""The toolkit's own paths: `run.allreduce` (a new tensor, its argument left as it was, at the
cost of a copy) and `run.allreduce_` (in place, as the raw torch and Horovod paths are)."""


@dataclass(frozen=True)
class Sweep:
    name: str
    spec: dict[str, Any]
    series: dict[str, str]
    """raw_paths name -> the label of its series (TOOLKIT_PATHS are the toolkit's own)."""
    reference: str
    """The raw path the toolkit's allreduce goes through here (its ratio's denominator)."""


SWEEPS: tuple[Sweep, ...] = (
    Sweep(
        "ddp/mpirun",
        {"backend": "ddp", "launch": {"launcher": "mpirun"}},
        {
            "torch-gloo": "torch.distributed gloo",
            "mpi4py": "mpi4py (Open MPI)",
            "toolkit": "toolkit ddp (gloo)",
            "toolkit-inplace": "toolkit ddp (gloo), in place",
        },
        reference="torch-gloo",
    ),
    Sweep(
        "horovod-mpi/horovodrun",
        {
            "backend": "horovod",
            "horovod": {"controller": "mpi"},
            "launch": {"launcher": "horovodrun"},
        },
        {
            "horovod-torch": "Horovod MPI",
            "toolkit": "toolkit horovod (MPI)",
            "toolkit-inplace": "toolkit horovod (MPI), in place",
        },
        reference="horovod-torch",
    ),
    Sweep(
        "horovod-gloo/horovodrun",
        {
            "backend": "horovod",
            "horovod": {"controller": "gloo"},
            "launch": {"launcher": "horovodrun"},
        },
        {
            "horovod-torch": "Horovod Gloo",
            "toolkit": "toolkit horovod (Gloo)",
            "toolkit-inplace": "toolkit horovod (Gloo), in place",
        },
        reference="horovod-torch",
    ),
    Sweep(
        "tf/local",
        {"backend": "tf", "launch": {"launcher": "local"}},
        {"tf-collective": "TF collective (ring)", "toolkit": "toolkit tf (ring)"},
        reference="tf-collective",
    ),
)


def matching_sweeps(patterns: list[str] | tuple[str, ...]) -> tuple[Sweep, ...]:
    """The SWEEPS whose name holds any of `patterns`; all of them when there are none."""
    return tuple(s for s in SWEEPS if not patterns or any(p in s.name for p in patterns))


def fitted(sizes: list[int]) -> bool:
    """Whether a sweep of these sizes has a latency-bandwidth fit: the two take two sizes at
    least to tell apart."""
    return len(sizes) > 1


def sweep_spec(sweep: Sweep, ranks: int) -> TrainSpec:
    data = merge(
        TrainSpec().to_dict(),
        sweep.spec,
        {
            "launch": {"np": ranks, "threads_per_rank": 1, "master_port": free_port()},
            "tf": {"port": free_port_range(ranks)},
        },
    )
    return TrainSpec.from_dict(data)


def bus_factor(ranks: int) -> float:
    return 2.0 * (ranks - 1) / ranks


def series_record(label: str, path: str, seconds: dict[str, float], ranks: int) -> dict[str, Any]:
    sizes = sorted(int(size) for size in seconds)
    times = [seconds[str(size)] for size in sizes]
    factor = 1.0 if path == "memcpy" else bus_factor(ranks)
    alpha, beta = stats.fit_alpha_beta(sizes, times) if fitted(sizes) else (math.nan, math.nan)
    return {
        "label": label,
        "path": path,
        "sizes": sizes,
        "seconds": times,
        "busbw_gbs": [size / t * factor / 1e9 for size, t in zip(sizes, times, strict=True)],
        "alpha_us": alpha * 1e6,
        "beta_busbw_gbs": beta * factor / 1e9,
    }


def run_sweeps(
    work: Path,
    sizes: list[int],
    *,
    blocks: int,
    launches: int = 1,
    ranks: int = 2,
    sweeps: tuple[Sweep, ...] = SWEEPS,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Every sweep launched `launches` times, in turns (each sweep once, then each again, so
    that a slow spell of the machine falls on all of them); the series by label, the
    toolkit/raw ratios with the launches pooled, errors."""
    written: dict[str, list[dict[str, Any]]] = {sweep.name: [] for sweep in sweeps}
    errors: list[str] = []
    for launch in range(launches):
        for index, sweep in enumerate(sweeps):
            turn = f" (launch {launch + 1} of {launches})" if launches > 1 else ""
            log(f"{sweep.name}{turn}: {', '.join(sweep.series.values())}")
            directory = work / f"launch{launch}" / f"sweep{index}"
            result = launch_sweep(sweep, directory, sizes, blocks=blocks, ranks=ranks)
            if isinstance(result, str):
                log(f"  FAILED: {result.splitlines()[0]}")
                errors.append(f"{sweep.name}{turn}: {result}")
                continue
            written[sweep.name].append(result["blocks"])
    series: list[dict[str, Any]] = []
    ratios: dict[str, dict[str, float]] = {}
    spreads: dict[str, dict[str, dict[str, Any]]] = {}
    again_spreads: dict[str, dict[str, dict[str, Any]]] = {}
    each_launch: dict[str, dict[str, list[float]]] = {}
    again_each_launch: dict[str, dict[str, list[float]]] = {}
    for sweep in sweeps:
        timed = written[sweep.name]
        if not timed:
            continue
        for path, label in sweep.series.items():
            series.append(series_record(label, path, pooled_seconds(timed, path), ranks))
        memcpy = f"memcpy, 1 core ({sweep.name})"
        series.append(series_record(memcpy, "memcpy", pooled_seconds(timed, "memcpy"), ranks))
        for path in (path for path in sweep.series if path in TOOLKIT_PATHS):
            label = sweep.series[path]
            spreads[label] = paired_ratios(timed, sweep.reference, path)
            each_launch[label] = launch_medians(timed, sweep.reference, path)
            ratios[label] = {size: spread["median"] for size, spread in spreads[label].items()}
        again, raw_label = sweep.reference + AGAIN, sweep.series[sweep.reference]
        again_spreads[raw_label] = paired_ratios(timed, sweep.reference, again)
        again_each_launch[raw_label] = launch_medians(timed, sweep.reference, again)
    return {
        "series": series,
        "toolkit_over_raw_busbw": ratios,
        "toolkit_over_raw_spread": spreads,
        "raw_again_over_raw_spread": again_spreads,
        "toolkit_over_raw_launches": each_launch,
        "raw_again_over_raw_launches": again_each_launch,
        "launches": {sweep.name: len(written[sweep.name]) for sweep in sweeps},
        "errors": errors,
        "ranks": ranks,
    }


def launch_sweep(
    sweep: Sweep, directory: Path, sizes: list[int], *, blocks: int, ranks: int
) -> dict[str, Any] | str:
    """One launch of `sweep`: what its rank program wrote, or why it wrote nothing."""
    spec = sweep_spec(sweep, ranks)
    directory.mkdir(parents=True)
    out = directory / "sweep.json"
    paths = [*sweep.series, sweep.reference + AGAIN]
    args = ["--paths", ",".join(paths), "--sizes", ",".join(map(str, sizes))]
    args += ["--blocks", str(blocks), "--out", str(out)]
    outcome = launch_with_spec(spec, directory, RANK_PROGRAM, args, timeout=SWEEP_TIMEOUT_S)
    reason = failure(outcome, wrote=out.exists(), missing="no results written")
    return reason or json.loads(out.read_text())


Blocks = dict[str, dict[str, list[float]]]
"""What one launch timed: path -> size -> its blocks' seconds per operation."""


def pooled_seconds(launches: list[Blocks], path: str) -> dict[str, float]:
    """Size -> the median block's seconds of `path` over every launch's blocks."""
    return {
        size: stats.median([s for launch in launches for s in launch[path][size]])
        for size in launches[0][path]
    }


def paired_ratios(launches: list[Blocks], raw: str, other: str) -> dict[str, dict[str, Any]]:
    """Size -> `other`'s busbw / `raw`'s busbw: within a launch, raw seconds / other seconds
    of the blocks of the same round; the launches pooled as the in-process step bench pools
    its (stats.combine_launches: each launch's median ratio, weighted by how well its blocks
    fix it, with the launches' disagreement added to the interval). One launch's interval says
    only how well its blocks fix its figure: where each buffer lies moves a launch's figure by
    a few percent (toolkit/bench/ranks/toolkit_allreduce.py), which only more launches see."""
    return {
        size: stats.combine_launches(
            [block_ratios(launch, raw, other, size) for launch in launches]
        ).to_json()
        for size in launches[0][other]
    }


def launch_medians(launches: list[Blocks], raw: str, other: str) -> dict[str, list[float]]:
    """Size -> each launch's own figure for `other` / `raw`, as `paired_ratios` pools it."""
    return {
        size: [stats.launch_figure(block_ratios(launch, raw, other, size)) for launch in launches]
        for size in launches[0][other]
    }


def block_ratios(launch: Blocks, raw: str, other: str, size: str) -> list[float]:
    """`other`'s busbw / `raw`'s in one launch, block by block of the same round."""
    return [r / o for r, o in zip(launch[raw][size], launch[other][size], strict=True)]
