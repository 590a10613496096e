"""Native PyTorch FSDP2, as the PyTorch FSDP2 tutorial writes it: torchrun's env:// rendezvous,
gloo on CPU, `fully_shard` on each block (here each Linear layer) and then the whole model,
SGD with momentum on the sharded parameters.

    torchrun --nproc-per-node 2 fsdp.py --out timings.json
"""

from __future__ import annotations

import gc

import _bench
import torch
import torch.distributed as dist
from _torch_model import mlp
from torch.distributed.fsdp import fully_shard


def run() -> None:
    parser = _bench.parser(__doc__ or "")
    parser.add_argument(
        "--no-reshard-after-forward", action="store_true", help="keep gathered parameters"
    )
    args = _bench.parse(parser)
    if args.threads:
        torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    model = mlp(_bench.widths(args))
    reshard = not args.no_reshard_after_forward
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, reshard_after_forward=reshard)
    fully_shard(model, reshard_after_forward=reshard)
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
    _bench.write(args, rank, world, clock, loss, engine="fsdp")
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    run()
    gc.collect()  # the sharded model and the groups it holds, gone with run()'s frame


if __name__ == "__main__":
    main()
