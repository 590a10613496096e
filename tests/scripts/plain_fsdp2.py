"""A plain FSDP2 job, written as its torch docs show, with no toolkit: what a team brings.

    torchrun --nproc_per_node 2 plain_fsdp2.py save DCP_DIR --steps 3 --out FULL.npz
    torchrun --nproc_per_node 2 plain_fsdp2.py load DCP_DIR --out FULL.npz

`save` trains the MLP of resume_torch.py (same state_dict names) with Adam for --steps and
writes it with `torch.distributed.checkpoint.save` in get_state_dict's layout; `load` reads
a DCP checkpoint's weights into the sharded model with `torch.distributed.checkpoint.load`.
Rank 0 writes the full weights (and after `save` the Adam moments, as "exp_avg/<name>",
and the step) to --out, gathered with full state dicts, for the test to compare against.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

FEATURES, HIDDEN, CLASSES = 8, 16, 4
FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def sharded_model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, CLASSES)
    )
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def save(directory: str, steps: int, out: str) -> None:
    model = sharded_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(steps):
        x = torch.randn(16, FEATURES, generator=generator)
        loss = torch.nn.functional.cross_entropy(model(x), x[:, :CLASSES].argmax(dim=1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    weights, state = get_state_dict(model, optimizer)
    dcp.save({"model": weights, "optimizer": state}, checkpoint_id=directory)
    full_weights, full_state = get_state_dict(model, optimizer, options=FULL)
    if dist.get_rank() == 0:
        arrays = {name: tensor.numpy() for name, tensor in full_weights.items()}
        for name, slots in full_state["state"].items():
            arrays.update({f"{slot}/{name}": value.numpy() for slot, value in slots.items()})
        np.savez(out, **arrays)


def load(directory: str, out: str) -> None:
    model = sharded_model()
    state = {"model": get_model_state_dict(model)}
    dcp.load(state, checkpoint_id=directory)
    set_model_state_dict(model, state["model"])
    full = get_model_state_dict(model, options=FULL)
    if dist.get_rank() == 0:
        np.savez(out, **{name: tensor.numpy() for name, tensor in full.items()})


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("save", "load"))
    parser.add_argument("directory")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    if args.mode == "save":
        save(args.directory, args.steps, args.out)
    else:
        load(args.directory, args.out)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
