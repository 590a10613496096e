"""Train an MLP on the digits data with whichever torch engine the spec names.

The script never names an engine or a launcher; the spec and the launcher do:

    torchrun --nproc_per_node 2 hvd_examples/torch_digits.py --spec hvd_examples/specs/ddp.yaml
    horovodrun -np 2 -H localhost:2 --gloo python hvd_examples/torch_digits.py \
        --spec hvd_examples/specs/horovod.yaml
    mpirun -np 2 python hvd_examples/torch_digits.py --spec hvd_examples/specs/horovod.yaml
    deepspeed --num_gpus 2 hvd_examples/torch_digits.py --spec hvd_examples/specs/zero2.yaml
    toolkit launch --spec hvd_examples/specs/ddp.yaml -- hvd_examples/torch_digits.py \
        --spec hvd_examples/specs/ddp.yaml

Rank 0 shows a progress bar and prints one JSON line of metrics; the exit status is 1 when the
held-out accuracy is below --min-accuracy.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

import toolkit
from toolkit.datasets import digits
from toolkit.report import exit_on_user_error, print_json, weights_digest


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", help="the training spec; default: the one toolkit launch names")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--min-accuracy", type=float, default=0.9)
    parser.add_argument(
        "--save", help="save the final training state here (a checkpoint directory)"
    )
    return parser.parse_args(argv)


def build_model() -> torch.nn.Sequential:
    # Sequential, so the pipeline engine can split it into stages.
    return torch.nn.Sequential(
        torch.nn.Linear(64, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 10),
    )


def accuracy(weights: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
    model = build_model()
    model.load_state_dict({name: torch.from_numpy(value) for name, value in weights.items()})
    with torch.no_grad():
        predictions = model(torch.from_numpy(x)).argmax(dim=1).numpy()
    return float((predictions == y).mean())


def main() -> int:
    argv = toolkit.script_args()  # without the deepspeed launcher's --local_rank
    args = parse_args(argv)
    spec = toolkit.load_spec(args.spec)
    run = toolkit.init(spec)
    data = digits()
    torch.manual_seed(spec.seed)
    run.prepare(build_model())
    losses = []
    for micro_batches in run.steps(run.loader((data.x_train, data.y_train)), epochs=args.epochs):
        losses.append(run.train_step(micro_batches, torch.nn.functional.cross_entropy))
    weights = run.full_state_dict()
    if args.save:
        run.save(args.save)
    held_out = accuracy(weights, data.x_test, data.y_test)
    print_json(rank=run.rank, weights_sha256=weights_digest(weights))
    if run.is_main:
        print_json(
            backend=spec.backend,
            launcher=run.env.launcher,
            world_size=run.world_size,
            steps=len(losses),
            first_loss=losses[0],
            final_loss=losses[-1],
            accuracy=held_out,
            weights_checksum=float(sum(np.abs(w).sum() for w in weights.values())),
        )
    run.shutdown()
    return 0 if held_out >= args.min_accuracy else 1


if __name__ == "__main__":
    sys.exit(exit_on_user_error(main))
