"""`toolkit bench allreduce`: allreduce bus bandwidth by message size, through the toolkit's
`run.allreduce` and through each raw path, with single-core memcpy as the physical limit.

Each sweep is one launch of 2 ranks through a real launcher: the toolkit starts its engine
(`toolkit.init`), and the same processes then time, size by size and interleaved, the
toolkit's `run.allreduce` and the engine's own call (and any other raw path that launcher
gives, e.g. mpi4py under mpirun). So toolkit/raw is a ratio taken side by side in the same
processes, and the raw paths of different sweeps are compared through their bandwidths.
Each size's toolkit/raw is the median of its blocks' ratios, block k of the toolkit's path
against block k of the raw one, which ran in the same round, with a bootstrap 95% interval
(`toolkit_over_raw_spread`). The ratio of the two paths' median blocks, which this replaced,
read 0.88-1.31 at 64 MiB for paths that make the same call, with 3 blocks of 2 operations.
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
    alpha, beta = stats.fit_alpha_beta(sizes, times)
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
    ranks: int = 2,
    sweeps: tuple[Sweep, ...] = SWEEPS,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Every sweep's launch; the series by label, the toolkit/raw ratios, errors."""
    series: list[dict[str, Any]] = []
    ratios: dict[str, dict[str, float]] = {}
    spreads: dict[str, dict[str, dict[str, Any]]] = {}
    again_spreads: dict[str, dict[str, dict[str, Any]]] = {}
    errors: list[str] = []
    for index, sweep in enumerate(sweeps):
        spec = sweep_spec(sweep, ranks)
        directory = work / f"sweep{index}"
        directory.mkdir(parents=True)
        out = directory / "sweep.json"
        again = sweep.reference + AGAIN
        paths = [*sweep.series, again]
        args = ["--paths", ",".join(paths), "--sizes", ",".join(map(str, sizes))]
        args += ["--blocks", str(blocks), "--out", str(out)]
        log(f"{sweep.name}: {', '.join(sweep.series.values())}")
        outcome = launch_with_spec(spec, directory, RANK_PROGRAM, args, timeout=SWEEP_TIMEOUT_S)
        reason = failure(outcome, wrote=out.exists(), missing="no results written")
        if reason:
            log(f"  FAILED: {reason.splitlines()[0]}")
            errors.append(f"{sweep.name}: {reason}")
            continue
        written = json.loads(out.read_text())
        measured = written["seconds"]
        for path, label in sweep.series.items():
            series.append(series_record(label, path, measured[path], ranks))
        series.append(
            series_record(f"memcpy, 1 core ({sweep.name})", "memcpy", measured["memcpy"], ranks)
        )
        timed = written["blocks"]
        for path in (path for path in sweep.series if path in TOOLKIT_PATHS):
            label = sweep.series[path]
            spreads[label] = paired_ratios(timed[sweep.reference], timed[path])
            ratios[label] = {size: spread["median"] for size, spread in spreads[label].items()}
        again_spreads[sweep.series[sweep.reference]] = paired_ratios(
            timed[sweep.reference], timed[again]
        )
    return {
        "series": series,
        "toolkit_over_raw_busbw": ratios,
        "toolkit_over_raw_spread": spreads,
        "raw_again_over_raw_spread": again_spreads,
        "errors": errors,
        "ranks": ranks,
    }


def paired_ratios(
    raw: dict[str, list[float]], other: dict[str, list[float]]
) -> dict[str, dict[str, Any]]:
    """Size -> the spread of `other`'s busbw / raw busbw over the blocks of the same round:
    raw seconds / other seconds, block by block."""
    return {
        size: stats.spread(
            [raw_s / other_s for raw_s, other_s in zip(raw[size], other[size], strict=True)]
        ).to_json()
        for size in other
    }
