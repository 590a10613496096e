"""Each rank reports what run.allreduce, run.broadcast and run.barrier gave it (2 ranks)."""

from __future__ import annotations

import json
import sys

import toolkit
from toolkit.launch.environment import split_local_rank_arg


def main() -> int:
    argv, _ = split_local_rank_arg(sys.argv[1:])
    run = toolkit.init(toolkit.load_spec(argv[0]))
    mine = float(run.rank + 1)  # rank 0 has 1.0, rank 1 has 2.0
    total = run.allreduce([mine], op="sum")
    mean = run.allreduce([mine])
    from_rank_1 = run.broadcast([10.0 * run.rank + 7.0], root=1)
    run.barrier()
    report = {
        "rank": run.rank,
        "sum": float(total[0]),
        "mean": float(mean[0]),
        "broadcast": float(from_rank_1[0]),
    }
    print(json.dumps(report), flush=True)
    run.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
