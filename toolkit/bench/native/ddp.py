"""Native PyTorch DDP, as the PyTorch DDP tutorial writes it: torchrun's env:// rendezvous, gloo
on CPU, `DistributedDataParallel(model)` with its default buckets unless told otherwise, SGD
with momentum.

    torchrun --nproc-per-node 2 ddp.py --out timings.json
"""

from __future__ import annotations

import gc

import _bench
import torch
import torch.distributed as dist
from _torch_model import mlp
from torch.nn.parallel import DistributedDataParallel


def run() -> None:
    parser = _bench.parser(__doc__ or "")
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0, help="torch's default 25")
    parser.add_argument("--gradient-as-bucket-view", action="store_true")
    args = _bench.parse(parser)
    if args.threads:
        torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    model = DistributedDataParallel(
        mlp(_bench.widths(args)),
        bucket_cap_mb=args.bucket_cap_mb,
        gradient_as_bucket_view=args.gradient_as_bucket_view,
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(batch: tuple) -> torch.Tensor:
        inputs, labels = (torch.as_tensor(a) for a in batch) if args.host_copy else batch
        optimizer.zero_grad()
        loss = loss_fn(model(inputs), labels)
        loss.backward()
        optimizer.step()
        if args.loss_allreduce:
            mean = loss.detach().double()
            dist.all_reduce(mean)
            return mean / world
        return loss.detach()

    data = _bench.batches(args, rank)
    inputs = data if args.host_copy else [tuple(torch.from_numpy(a) for a in b) for b in data]
    clock, loss = _bench.time_steps(step, inputs, args)
    _bench.write(args, rank, world, clock, loss, engine="ddp")
    # After the timed steps, the end toolkit.backends.torch_common.release_process_groups gives
    # the toolkit's runs: the DDP wrapper holds the group, whose gloo threads may otherwise
    # abort the interpreter's exit ("terminate called without an active exception").
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    run()
    gc.collect()  # the DDP wrapper and the groups it holds, gone with run()'s frame


if __name__ == "__main__":
    main()
