"""The rank program of `toolkit bench allreduce`: `run.allreduce` over each message size.

    python toolkit/bench/ranks/allreduce.py --spec SPEC.json --sizes 4096,1048576 --out out.json

Per size: one untimed call, then `--repeats` timed calls, each after a barrier so that every
rank starts together; rank 0 writes the seconds of each call.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from toolkit.bench.native._bench import write_record
from toolkit.bench.ranks._toolkit_job import start_toolkit
from toolkit.launch import script_args


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spec", required=True)
    parser.add_argument("--sizes", required=True, help="message sizes in bytes, comma-separated")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(script_args())
    _, run = start_toolkit(args.spec)
    seconds: dict[str, list[float]] = {}
    for size in (int(text) for text in args.sizes.split(",")):
        buffer = np.ones(max(1, size // 4), dtype=np.float32)
        run.allreduce(buffer, op="sum")
        timed = []
        for _ in range(args.repeats):
            run.barrier()
            start = time.perf_counter()
            run.allreduce(buffer, op="sum")
            timed.append(time.perf_counter() - start)
        seconds[str(buffer.nbytes)] = timed
    if run.is_main:
        write_record(args.out, {"world": run.world_size, "seconds": seconds})
    run.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
