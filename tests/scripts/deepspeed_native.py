"""A training script written the way DeepSpeed's documentation writes one, with no toolkit in
it: `--local_rank` and `deepspeed.add_config_arguments` on the command line,
`deepspeed.initialize(args=...)` with the config file named by `--deepspeed_config` and the
script's own torch optimizer, and the engine's own backward and step. Like DeepSpeed's own
example tests, it refuses to run when the `--local_rank` it was given disagrees with
LOCAL_RANK. Prints one JSON line per rank: its rank, the first and last loss, and a digest of
its final weights.

    deepspeed --num_gpus 2 deepspeed_native.py --deepspeed --deepspeed_config ds_config.json
    toolkit launch --spec spec.yaml -- deepspeed_native.py --deepspeed --deepspeed_config ...
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os

import deepspeed
import torch

STEPS = 8


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    args = deepspeed.add_config_arguments(parser).parse_args()
    if args.local_rank != int(os.environ["LOCAL_RANK"]):
        raise SystemExit(
            f"Mismatch in local rank setting, args.local_rank={args.local_rank} but "
            f"env['LOCAL_RANK']={os.environ['LOCAL_RANK']}"
        )
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, optimizer=optimizer)
    rank = torch.distributed.get_rank()
    generator = torch.Generator().manual_seed(1 + rank)  # each rank its own shard of data
    losses = []
    for _ in range(STEPS):
        inputs = torch.randn(engine.train_micro_batch_size_per_gpu(), 16, generator=generator)
        labels = inputs[:, :4].argmax(dim=1)
        loss = torch.nn.functional.cross_entropy(engine(inputs), labels)
        engine.backward(loss)
        engine.step()
        losses.append(float(loss))
    digest = hashlib.sha256()
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
        for parameter in engine.module.parameters():
            digest.update(parameter.detach().float().numpy().tobytes())
    report = {"rank": rank, "first_loss": losses[0], "last_loss": losses[-1]}
    print(json.dumps({**report, "weights_sha256": digest.hexdigest()}), flush=True)
    torch.distributed.barrier()


if __name__ == "__main__":
    main()
