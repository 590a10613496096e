"""A training script written the way DeepSpeed's own examples are, and nothing else.

argparse with `--local_rank` (the deepspeed launcher passes it), `deepspeed.add_config_arguments`
for `--deepspeed_config`, and `deepspeed.initialize(args=..., model=..., model_parameters=...)`.
Like DeepSpeed's tests/small_model_debugging/test_model.py it checks that --local_rank agrees
with LOCAL_RANK. Rank 0 prints one JSON line: the world size, the last loss and the weights' sum.
It must run unmodified under native `deepspeed` and under `toolkit launch` alike.
"""

import argparse
import json
import os

import deepspeed
import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser(description="tiny DeepSpeed example")
    parser.add_argument("--local_rank", type=int, default=-1, help="passed by the launcher")
    parser.add_argument("--steps", type=int, default=4)
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()
    if args.local_rank != int(os.environ["LOCAL_RANK"]):
        raise SystemExit(
            f"--local_rank={args.local_rank} but LOCAL_RANK={os.environ['LOCAL_RANK']}"
        )
    torch.set_num_threads(1)
    # On a machine without GPUs DeepSpeed's CPU accelerator picks oneCCL, absent here (the
    # ranks then wait forever): name gloo, as DeepSpeed's CPU examples do.
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    engine, _, _, _ = deepspeed.initialize(
        args=args, model=model, model_parameters=model.parameters()
    )
    rank = dist.get_rank()
    data = torch.Generator().manual_seed(100 + rank)
    loss = torch.zeros(())
    for _ in range(args.steps):
        x = torch.randn(engine.train_micro_batch_size_per_gpu(), 8, generator=data)
        loss = torch.nn.functional.mse_loss(engine(x), x.sum(dim=1, keepdim=True))
        engine.backward(loss)
        engine.step()
    total = sum(float(p.detach().double().sum()) for p in engine.module.parameters())
    if rank == 0:
        report = {"world": dist.get_world_size(), "loss": round(float(loss), 6)}
        print(json.dumps({**report, "weights_sum": round(total, 6)}), flush=True)


if __name__ == "__main__":
    main()
