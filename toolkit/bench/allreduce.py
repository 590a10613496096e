"""`toolkit bench allreduce`: the bus bandwidth of `run.allreduce` by message size, for each
spec's engine and launcher.

Bus bandwidth is the ring all-reduce's convention (NCCL's tests use it too): the bytes each rank
must send and receive, 2 (n - 1) / n of the message, over the median time of a call. It is
comparable across world sizes and against a link's speed.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path

from toolkit.bench import report
from toolkit.bench.launching import RANKS, launch_rank_program
from toolkit.errors import ToolkitError
from toolkit.spec import TrainSpec

DEFAULT_SIZES = (4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20)
HEADER = ["spec", "bytes", "median ms", "bus GB/s"]


def bus_bandwidth(nbytes: int, world: int, seconds: float) -> float:
    """Bytes per second each rank moves in a ring all-reduce of `nbytes`."""
    return 2 * (world - 1) / world * nbytes / seconds if world > 1 else 0.0


def run(
    specs: Sequence[tuple[str, TrainSpec]], *, sizes: Sequence[int], repeats: int, out: Path
) -> int:
    rows: list[list[str]] = []
    results = []
    sizes_text = ",".join(str(size) for size in sizes)
    with tempfile.TemporaryDirectory(prefix="toolkit-allreduce-") as scratch:
        for index, (label, spec) in enumerate(specs):
            print(f"bench allreduce: {label}", flush=True)
            spec_file = Path(scratch) / f"{index}.spec.json"
            spec_file.write_text(json.dumps(spec.to_dict()))
            result_file = Path(scratch) / f"{index}.json"
            program = [str(RANKS / "allreduce.py"), "--spec", str(spec_file)]
            arguments = [
                "--sizes",
                sizes_text,
                "--repeats",
                str(repeats),
                "--out",
                str(result_file),
            ]
            launch_rank_program(spec, [*program, *arguments])
            if not result_file.is_file():
                raise ToolkitError(f"the allreduce launch of {label} wrote nothing", "see above")
            record = json.loads(result_file.read_text())
            for nbytes, seconds in record["seconds"].items():
                median = statistics.median(seconds)
                bandwidth = bus_bandwidth(int(nbytes), record["world"], median)
                rows.append([label, nbytes, f"{median * 1e3:.3f}", f"{bandwidth / 1e9:.2f}"])
            results.append({"spec": label, **record})
    report.write(out, "allreduce", {"repeats": repeats, "results": results}, HEADER, rows)
    return 0
