"""Probe: where the toolkit's DDP step spends its time beyond the physical floor, in the same 2
processes, step by step.

Four copies of the bench's MLP (toolkit/bench/native/_torch_model.py) train side by side, one
step of each per cycle, in an order that rotates every cycle:

- `plain`: no DDP at all, the floor's compute;
- `noop`: DDP with a comm hook that returns the bucket as it is (DDP's own cost);
- `shared_memory`: DDP with the toolkit's comm hook (toolkit/backends/ddp/comm_hook.py);
- `gloo`: DDP with its default allreduce over Gloo, as native DDP runs.

Rank 0 prints one JSON line: per variant the median step and the median time inside the comm
hook, in ms (the hook's includes waiting for the slower rank), and whether the shared-memory and
Gloo models ended with the same weights (they must, with 2 ranks).

    .venv/bin/torchrun --nproc-per-node 2 scripts/ddp_step_probe.py [--cycles 60]
"""

# No `from __future__ import annotations`: DDP's register_comm_hook compares a hook's annotations
# with dist.GradBucket and Future[Tensor] themselves and rejects strings.

import argparse
import copy
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from toolkit.backends.ddp.comm_hook import comm_hook
from toolkit.backends.shared_memory import SharedMemoryCollectives

sys.path.insert(0, str(Path(__file__).parents[1] / "toolkit" / "bench" / "native"))
from _torch_model import issue_mlp

WARMUP_CYCLES = 5
HookTimes = list[float]


def noop_hook(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    done.set_result(bucket.buffer())
    return done


def timed(hook: Callable, seconds: HookTimes) -> Callable:
    def wrapper(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        start = time.perf_counter()
        done = hook(state, bucket)
        seconds.append(time.perf_counter() - start)
        return done

    return wrapper


def models(base: torch.nn.Module, shared: SharedMemoryCollectives, hook_s: HookTimes) -> dict:
    found: dict[str, torch.nn.Module] = {"plain": copy.deepcopy(base)}
    for name, hook in (("noop", noop_hook), ("shared_memory", comm_hook), ("gloo", None)):
        model = DistributedDataParallel(
            copy.deepcopy(base), bucket_cap_mb=25, gradient_as_bucket_view=True
        )
        if hook is not None:
            model.register_comm_hook(shared, timed(hook, hook_s))
        found[name] = model
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cycles", type=int, default=60)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    hook_s: HookTimes = []
    shared = SharedMemoryCollectives(rank=rank, world_size=world, timeout_s=60, field="probe")
    variants = models(issue_mlp(), shared, hook_s)
    optimizers = {
        name: torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        for name, model in variants.items()
    }
    generator = torch.Generator().manual_seed(rank)
    inputs = torch.randn(64, 512, generator=generator)
    labels = torch.randint(0, 10, (64,), generator=generator)
    loss_fn = torch.nn.CrossEntropyLoss()
    step_ms: dict[str, list[float]] = {name: [] for name in variants}
    hook_ms: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for cycle in range(WARMUP_CYCLES + args.cycles):
        shift = cycle % len(names)
        for name in names[shift:] + names[:shift]:
            dist.barrier()
            hook_s.clear()
            start = time.perf_counter()
            optimizers[name].zero_grad()
            loss_fn(variants[name](inputs), labels).backward()
            optimizers[name].step()
            if cycle >= WARMUP_CYCLES:
                step_ms[name].append((time.perf_counter() - start) * 1e3)
                hook_ms[name].append(sum(hook_s) * 1e3)
    weights = {
        name: torch.cat([p.detach().flatten() for p in variants[name].parameters()])
        for name in ("shared_memory", "gloo")
    }
    if rank == 0:
        figures = {
            name: {
                "step_ms": round(statistics.median(step_ms[name]), 2),
                "hook_ms": round(statistics.median(hook_ms[name]), 2),
            }
            for name in names
        }
        same = bool(torch.equal(weights["shared_memory"], weights["gloo"]))
        print(json.dumps({**figures, "same_weights": same}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
