"""A plain DeepSpeed training script (DeepSpeed's idiom, no toolkit inside) that saves a native
checkpoint with `engine.save_checkpoint` part-way, for `toolkit checkpoint import`.

    deepspeed --num_gpus 2 deepspeed_native_checkpoint.py --deepspeed --deepspeed_config C \
        --steps 7 --save-at 5 --save DIR --out-at-save W5.npz --out W7.npz [--optimizer sgd]

It trains the model of tests/scripts/resume_torch.py on the same data, in the same order and
with the same hyper-parameters as that script under a spec of seed 3, batch {global: 64,
micro: 16} and a constant learning rate, so that a toolkit run resuming from the imported
checkpoint continues this run: the toolkit's sample order (toolkit.sharding, written out here
in three lines) is a permutation of (seed, epoch); each step's global batch is cut as
[accumulation, data-parallel rank, micro]. The optimizer is the script's torch optimizer (no
"optimizer" section in the config: DeepSpeed's own Adam would build a C++ op for minutes).
Rank 0 writes the consolidated fp32 weights after step --save-at and after the last step.
"""

from __future__ import annotations

import argparse
import os

import deepspeed
import numpy as np
import torch

SEED, SAMPLES, FEATURES, CLASSES = 3, 256, 8, 4
OPTIMIZERS = {
    "adam": lambda params: torch.optim.Adam(params, lr=0.01, foreach=False),
    "sgd": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9, foreach=False),
}


def build_model() -> torch.nn.Sequential:
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(), torch.nn.Linear(16, CLASSES)
    )


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(SAMPLES, FEATURES)).astype(np.float32)
    return x, (x[:, :CLASSES].argmax(axis=1)).astype(np.int64)


def micro_batches(step: int, engine: deepspeed.DeepSpeedEngine) -> list[np.ndarray]:
    """This rank's sample indices of each micro-batch of optimizer step `step`."""
    accumulation = engine.gradient_accumulation_steps()
    micro, ranks = engine.train_micro_batch_size_per_gpu(), engine.dp_world_size
    size = micro * accumulation * ranks
    epoch, within = divmod(step, SAMPLES // size)
    order = np.random.default_rng([SEED, epoch]).permutation(SAMPLES)
    grid = order[within * size : (within + 1) * size].reshape(accumulation, ranks, micro)
    return [grid[a, engine.global_rank] for a in range(accumulation)]


def save_weights(engine: deepspeed.DeepSpeedEngine, path: str) -> None:
    """The consolidated fp32 weights (gathered under ZeRO-3), by state_dict name, rank 0."""
    named = list(engine.module.named_parameters())
    with deepspeed.zero.GatheredParameters([p for _, p in named]):
        weights = {name: p.detach().float().numpy().copy() for name, p in named}
    if engine.global_rank == 0:
        np.savez(path, **weights)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--save-at", type=int, required=True)
    parser.add_argument("--save", required=True)
    parser.add_argument("--out-at-save", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="adam")
    args = deepspeed.add_config_arguments(parser).parse_args()
    assert args.local_rank == int(os.environ["LOCAL_RANK"])
    # DeepSpeed's CPU accelerator JIT-builds a shared-memory allreduce op that training never
    # uses (inference_all_reduce only): skipped, as toolkit.backends.deepspeed.backend does.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    torch.manual_seed(SEED)
    model = build_model()
    optimizer = OPTIMIZERS[args.optimizer](model.parameters())
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, optimizer=optimizer)
    x, y = (torch.from_numpy(array) for array in data())
    for step in range(args.steps):
        for indices in micro_batches(step, engine):
            loss = torch.nn.functional.cross_entropy(engine(x[indices]), y[indices])
            engine.backward(loss)
            engine.step()
        if step + 1 == args.save_at:
            engine.save_checkpoint(args.save)
            save_weights(engine, args.out_at_save)
    save_weights(engine, args.out)
    torch.distributed.barrier()


if __name__ == "__main__":
    main()
