"""Train a small MLP with BatchNorm for a few steps and report its full weights and buffers.

    torchrun --nproc_per_node 2 batchnorm_torch.py --spec S --out W.npz

Every rank prints one JSON line: its rank, the digest of its full_state_dict and the held-out
loss run.evaluate gives; rank 0 writes the full weights and buffers to --out (.npz).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

import toolkit
from toolkit.report import print_json, weights_digest

SAMPLES, FEATURES, CLASSES, STEPS = 192, 8, 4, 6


def data(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(loc=1.5, scale=2.0, size=(SAMPLES, FEATURES)).astype(np.float32)
    return x, (x[:, :CLASSES].argmax(axis=1)).astype(np.int64)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", required=True)
    parser.add_argument("--out")
    args = parser.parse_args(toolkit.script_args())
    spec = toolkit.load_spec(args.spec)
    run = toolkit.init(spec)
    torch.manual_seed(spec.seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 16),
        torch.nn.BatchNorm1d(16),
        torch.nn.Tanh(),
        torch.nn.Linear(16, CLASSES),
    )
    run.prepare(model)
    for micro_batches in run.steps(run.loader(data(0)), epochs=10):
        if run.step >= STEPS:
            break
        run.train_step(micro_batches, torch.nn.functional.cross_entropy)

    def metric(outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        loss = torch.nn.functional.cross_entropy(outputs.float(), targets, reduction="sum")
        return {"loss_sum": loss, "count": torch.tensor(float(len(targets)))}

    metrics = run.evaluate(run.loader(data(1), shuffle=False), metric)
    weights = run.full_state_dict()
    if args.out and run.is_main:
        np.savez(args.out, **weights)
    print_json(
        rank=run.rank,
        weights_sha256=weights_digest(weights),
        eval_loss=metrics["loss_sum"] / metrics["count"],
    )
    run.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
