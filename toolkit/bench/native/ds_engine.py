"""Native DeepSpeed, as DeepSpeed's getting-started guide writes it: `deepspeed.initialize` with a
config, `engine.backward(loss)` and `engine.step()`; with `--pipeline-stages` > 1, the pipeline
engine's `train_batch` over a `PipelineModule` of the same layers.

Without `--ds-config`, the config is the minimal one the guide shows (batch sizes and the ZeRO
stage; every other setting is DeepSpeed's default) and the optimizer is the client's
torch.optim.SGD: DeepSpeed has no SGD of its own, and ZeRO > 0 then needs
zero_allow_untested_optimizer. With `--ds-config FILE` it runs exactly that config.

    deepspeed --num_gpus 2 ds_engine.py --zero-stage 2 --out timings.json

(Named ds_engine.py: a script named deepspeed.py would shadow the package.)
"""

from __future__ import annotations

import argparse
import gc
import json
from typing import Any

import _bench
import deepspeed
import torch
from _torch_model import mlp
from deepspeed.pipe import PipelineModule

# On the CPU accelerator, init_distributed JIT-builds a shared-memory op that only inference uses;
# its build lock, left behind by a killed job, hangs every later start. Not a training setting.
deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def minimal_config(args: argparse.Namespace, world: int) -> dict[str, Any]:
    data_parallel = world // args.pipeline_stages
    return {
        "train_batch_size": args.micro * args.micro_batches * data_parallel,
        "train_micro_batch_size_per_gpu": args.micro,
        "zero_optimization": {"stage": args.zero_stage},
        "zero_allow_untested_optimizer": True,
    }


def run() -> None:
    p = _bench.parser(__doc__ or "")
    p.add_argument("--zero-stage", type=int, default=0)
    p.add_argument("--pipeline-stages", type=int, default=1)
    p.add_argument("--ds-config", default=None, help="a DeepSpeed config file to run as is")
    args = _bench.parse(p)
    if args.threads:
        torch.set_num_threads(args.threads)
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    torch.manual_seed(args.seed)
    model: torch.nn.Module = mlp(_bench.widths(args))
    loss_fn = torch.nn.CrossEntropyLoss()
    if args.pipeline_stages > 1:
        model = PipelineModule(
            layers=list(model.children()), num_stages=args.pipeline_stages, loss_fn=loss_fn
        )
    if args.ds_config:
        with open(args.ds_config) as file:
            config = json.load(file)
    else:
        config = minimal_config(args, world)
    optimizer = None
    if "optimizer" not in config:
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), optimizer=optimizer, config=config
    )

    def step(batch: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        if args.pipeline_stages > 1:
            loss = engine.train_batch(data_iter=iter(batch))
        else:
            ((inputs, labels),) = batch
            loss = loss_fn(engine(inputs), labels)
            engine.backward(loss)
            engine.step()
        if args.loss_allreduce:
            mean = loss.detach().double()
            torch.distributed.all_reduce(mean)
            return mean / world
        return loss.detach()

    def micro_batches(inputs: Any, labels: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
        x, y = torch.as_tensor(inputs), torch.as_tensor(labels)
        return list(zip(x.split(args.micro), y.split(args.micro), strict=True))

    steps = [micro_batches(*batch) for batch in _bench.batches(args, rank)]
    clock, loss = _bench.time_steps(step, steps, args)
    _bench.write(args, rank, world, clock, loss, engine="deepspeed", config=config)
    # Not in DeepSpeed's guide, and after the timed steps: the end that
    # toolkit.backends.torch_common.release_process_groups gives the toolkit's runs. Without it
    # runs sometimes aborted at exit ("terminate called without an active exception": 3 of 10
    # native launches in one bench run), and the bench lost them.
    torch.distributed.barrier()
    deepspeed.comm.destroy_process_group()


def main() -> None:
    run()
    gc.collect()  # DeepSpeed's engine and the groups it holds, gone with run()'s frame


if __name__ == "__main__":
    main()
