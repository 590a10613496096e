"""A real training rank for the non-finite gradient test: one epoch of three steps of a small
model on the engine the spec names, the second step's loss multiplied by inf (every gradient
inf or NaN), then one JSON line per rank saying whether every weight is still finite.

    nonfinite_step.py SPEC
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np
import torch

import toolkit
from toolkit.launch.environment import split_local_rank_arg
from toolkit.report import print_json

STEPS = 3
NONFINITE_STEP = 1


def data(samples: int) -> tuple[np.ndarray, np.ndarray]:
    generator = np.random.default_rng(0)
    inputs = generator.standard_normal((samples, 16)).astype(np.float32)
    return inputs, generator.integers(0, 4, samples).astype(np.int64)


def main(spec_file: str) -> int:
    spec = toolkit.load_spec(spec_file)
    run = toolkit.init(spec)
    run.prepare(
        torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    )
    scale = [1.0]

    def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> Any:
        return torch.nn.functional.cross_entropy(logits, labels) * scale[0]

    samples = STEPS * spec.batch_for(run.world_size).global_
    for step, micro_batches in enumerate(run.steps(run.loader(data(samples)), epochs=1)):
        scale[0] = math.inf if step == NONFINITE_STEP else 1.0
        run.train_step(micro_batches, loss_fn)
    weights = run.full_state_dict()
    print_json(rank=run.rank, finite=all(bool(np.isfinite(w).all()) for w in weights.values()))
    run.shutdown()
    return 0


if __name__ == "__main__":
    arguments, _ = split_local_rank_arg(sys.argv[1:])
    sys.exit(main(*arguments))
