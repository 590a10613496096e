"""A training script written the way Horovod's own examples write one, with no toolkit in it:
`hvd.init()` first, one thread per rank, the data sharded by rank, the learning rate scaled by
the number of workers, `hvd.DistributedOptimizer` around a torch optimizer, and rank 0's
parameters and optimizer state broadcast before training (Horovod's pytorch_mnist.py idiom).
Prints one JSON line per rank: its rank, the first and last loss, and a digest of its final
weights.

    horovodrun -np 2 -H localhost:2 python horovod_native.py --lr 0.01
    toolkit launch --spec spec.yaml -- horovod_native.py --lr 0.01
"""

from __future__ import annotations

import argparse
import hashlib
import json

import horovod.torch as hvd
import torch

STEPS = 8
BATCH = 8


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr * hvd.size())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    generator = torch.Generator().manual_seed(1 + hvd.rank())  # each rank its own shard
    losses = []
    for _ in range(STEPS):
        inputs = torch.randn(BATCH, 16, generator=generator)
        labels = inputs[:, :4].argmax(dim=1)
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(inputs), labels)
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    digest = hashlib.sha256()
    for parameter in model.parameters():
        digest.update(parameter.detach().numpy().tobytes())
    report = {"rank": hvd.rank(), "first_loss": losses[0], "last_loss": losses[-1]}
    print(json.dumps({**report, "weights_sha256": digest.hexdigest()}), flush=True)


if __name__ == "__main__":
    main()
