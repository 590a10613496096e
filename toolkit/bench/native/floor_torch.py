"""The physical floor of a PyTorch data-parallel step: the bench's MLP, forward, backward and
SGD with momentum on this rank's samples, with no engine and no communication, then the
gradient bytes moved once at memory speed (see _floor_parts.py). Started by the same launcher
as the engines' runs, every rank at once; rank 0 writes the timings, with compute and move
apart.

    torchrun --nproc-per-node 2 floor_torch.py --threads 1 --out timings.json
"""

from __future__ import annotations

import _bench
import _floor
import torch

from toolkit.bench.native._floor_parts import FloorStep, torch_compute


def main() -> None:
    args = _bench.parse(_bench.parser(__doc__ or ""))
    if args.threads:
        torch.set_num_threads(args.threads)
    rank = _floor.launcher_rank()
    torch.manual_seed(args.seed)
    step = FloorStep(*torch_compute(_bench.widths(args), args.lr, args.momentum))
    data = [tuple(torch.from_numpy(a) for a in b) for b in _bench.batches(args, rank)]
    clock, loss = _bench.time_steps(step, data, args)
    _floor.write(args, rank, step, clock, loss, engine="floor-torch")


if __name__ == "__main__":
    main()
