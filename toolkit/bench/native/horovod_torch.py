"""Native Horovod for PyTorch, as Horovod's PyTorch guide writes it: `hvd.init()`,
`hvd.DistributedOptimizer` over named parameters, parameters and optimizer state broadcast from
rank 0. Tuning (controller, fusion, cycle time) comes from the launcher, as Horovod intends.

    horovodrun -np 2 -H localhost:2 --gloo python horovod_torch.py --out timings.json
"""

from __future__ import annotations

import _bench
import horovod.torch as hvd
import torch
from _torch_model import mlp


def main() -> None:
    args = _bench.parse(_bench.parser(__doc__ or ""))
    hvd.init()
    if args.threads:
        torch.set_num_threads(args.threads)
    rank, world = hvd.rank(), hvd.size()
    torch.manual_seed(args.seed)
    model = mlp(_bench.widths(args))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(batch: tuple) -> torch.Tensor:
        inputs, labels = (torch.as_tensor(a) for a in batch) if args.host_copy else batch
        optimizer.zero_grad()
        loss = loss_fn(model(inputs), labels)
        loss.backward()
        optimizer.step()
        if args.loss_allreduce:
            return hvd.allreduce(loss.detach().double(), op=hvd.Average)
        return loss.detach()

    data = _bench.batches(args, rank)
    inputs = data if args.host_copy else [tuple(torch.from_numpy(a) for a in b) for b in data]
    clock, loss = _bench.time_steps(step, inputs, args)
    _bench.write(args, rank, world, clock, loss, engine="horovod-torch")
    hvd.shutdown()


if __name__ == "__main__":
    main()
