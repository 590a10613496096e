"""The rank program of `toolkit bench allreduce`: for each message size, every path of this
launch (the toolkit's `run.allreduce` and the raw engine calls next to it, in the same
processes) and a single-core memcpy, interleaved.

    python toolkit/bench/ranks/toolkit_allreduce.py --spec S.json --paths torch-gloo,toolkit \
        --sizes 4096,65536 --out sweep.json

Per size and path: at least `--blocks` blocks, each a barrier then `iterations` back-to-back
operations (enough that a block moves ~`--block-bytes`), timed on rank 0, and every block's
seconds per operation are written: blocks of different paths with the same index ran in the
same round, so their ratios are the side-by-side repetitions (toolkit.bench.allreduce, which
also pools the blocks of every launch into each path's median). memcpy runs on every rank at
once (each on its own core), as the allreduce does.

The blocks run in rounds, each an order in which every path follows every other path once
(toolkit.bench.ordering): n paths give each path n-1 blocks a round, and `--blocks` is rounded
up to whole rounds, and those to whole turns of the buffers' rotation (below); each round opens
with an untimed block of its last path (`lead_in`). Until
2026-11-29 the order rotated (a b c d, b c d a, ...), which puts each path behind the same one
in all but one block of n: the in-place toolkit path behind the copying one, the raw path
behind memcpy.

Every round allocates the paths' buffers afresh, in an order that rotates from round to round
(`allocation_order`), and the rounds come in whole turns of the rotation, so that each path's
buffer sits at each place in memory as often as the others'. Where a 64 MiB buffer lies moves
its allreduce's time by up to a tenth: with the buffers allocated once, in the paths' order,
Horovod's raw call over MPI on the buffer allocated last (the A/A) read 0.99-1.16 of the same
call's bandwidth on the first over 5 launches, and with the allocation order reversed
0.90-0.91 over 3 (docs/bench/findings.md). Why one place is slower than another was not found;
rotating takes it out of the ratios whatever it is, in whole turns only: with 3 rounds of 4
buffers, where the raw path's buffer was allocated first once and its A/A's never, Horovod
MPI's A/A read 1.023 [1.010, 1.035] over 16 launches. memcpy, the physical limit and neither
side of a ratio, keeps its buffers for the whole size.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from typing import Any

from toolkit.bench.native import _bench
from toolkit.bench.ordering import carryover_balanced
from toolkit.bench.ranks import raw_paths
from toolkit.bench.ranks._toolkit_job import start_toolkit


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spec", required=True)
    parser.add_argument("--paths", required=True, help="comma-separated raw_paths.PATHS names")
    parser.add_argument("--sizes", required=True, help="comma-separated message sizes in bytes")
    parser.add_argument("--blocks", type=int, required=True)
    parser.add_argument("--block-bytes", type=int, default=64 << 20)
    parser.add_argument("--max-iterations", type=int, default=50)
    parser.add_argument("--out", required=True)
    args, _ = parser.parse_known_args(argv)
    return args


def iterations(size: int, args: argparse.Namespace) -> int:
    return max(2, min(args.max_iterations, math.ceil(args.block_bytes / size)))


def rounds(paths: list[str], blocks: int, places: int) -> list[list[str]]:
    """Whole carryover-balanced rounds, enough that every path runs at least `blocks` blocks,
    in whole turns of `places` rounds: the buffers' allocation order rotates once a round
    (`allocation_order`), so only whole turns put every buffer at every place equally often."""
    round_order = [paths[index] for index in carryover_balanced(len(paths))]
    per_round = round_order.count(paths[0])
    return [round_order] * (math.ceil(blocks / per_round / places) * places)


def lead_in(round_order: list[str]) -> str:
    """The path of the untimed block that opens a round: its last, so that the round's first
    timed block follows the path the design puts before it, read cyclically, as every other
    block does. Without it the first block, always the raw path's, followed the round's
    allocations and warm-up. Over 16 launches at 64 MiB the A/As (the raw call's copy / the
    raw call) of torch's Gloo and Horovod's Gloo read 1.024 and 1.056 without it, 0.994 and
    0.994 with it (docs/bench/findings.md)."""
    return round_order[-1]


def allocation_order(paths: list[str], round_index: int) -> list[str]:
    """The order round `round_index` allocates the paths' buffers in: rotated by one a round."""
    shift = round_index % len(paths)
    return paths[shift:] + paths[:shift]


def time_block(operation: Callable[[], Any], count: int, barrier: Callable[[], None]) -> float:
    barrier()
    start = time.perf_counter()
    for _ in range(count):
        operation()
    return (time.perf_counter() - start) / count


def main() -> int:
    args = parse(sys.argv[1:])
    _, run = start_toolkit(args.spec)
    names = args.paths.split(",")
    makers = {name: raw_paths.factory(name)(run) for name in names}
    sizes = [int(size) for size in args.sizes.split(",")]
    every_block: dict[str, dict[str, list[float]]] = {name: {} for name in [*names, "memcpy"]}
    for size in sizes:
        elements = max(1, size // 4)
        memcpy = raw_paths.memcpy(elements)
        count = iterations(size, args)
        blocks: dict[str, list[float]] = {name: [] for name in [*names, "memcpy"]}
        planned = rounds(list(blocks), args.blocks, places=len(names))
        for round_index, round_order in enumerate(planned):
            operations = {
                name: makers[name](elements) for name in allocation_order(names, round_index)
            }
            operations["memcpy"] = memcpy
            for operation in operations.values():
                operation()  # warm: first-touch pages, connections, Horovod's negotiation cache
            time_block(operations[lead_in(round_order)], count, run.barrier)
            for name in round_order:
                blocks[name].append(time_block(operations[name], count, run.barrier))
            del operations  # before the next round's buffers, which take the places it frees
        for name, measured in blocks.items():
            every_block[name][str(size)] = measured
    if run.is_main:
        record = {
            "world": run.world_size,
            "blocks": every_block,
            "paths": names,
        }
        _bench.write_record(args.out, record)
    run.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
