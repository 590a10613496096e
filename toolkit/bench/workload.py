"""The benchmark workload, framework-free: the MLP's widths, the batch per rank and the
optimizer, as spec fields and as the native scripts' arguments.

Default (issue 13): MLP 512-2048-2048-512-10 (6.3 M parameters, 25 MB of fp32 gradients), 2
ranks × 64 samples, fp32, SGD with momentum 0.9, one compute thread per rank. The pipeline
case keeps the global batch (128) and cuts it into 4 micro-batches of 32, as DeepSpeed's
pipeline engine needs several micro-batches in flight.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

DEFAULT_LAYERS = (512, 2048, 2048, 512, 10)


@dataclass(frozen=True, kw_only=True)
class Workload:
    layers: tuple[int, ...] = DEFAULT_LAYERS
    """MLP widths, input first, classes last."""
    micro: int = 64
    """Samples per micro-batch per data-parallel rank."""
    micro_batches: int = 1
    """Micro-batches per optimizer step."""
    ranks: int = 2
    lr: float = 0.01
    momentum: float = 0.9
    seed: int = 0

    @property
    def parameters(self) -> int:
        return sum(a * b + b for a, b in itertools.pairwise(self.layers))

    def spec_fields(self, data_parallel: int) -> dict[str, Any]:
        """What the bench pins in the spec so that toolkit and native run the same step."""
        return {
            "seed": self.seed,
            "batch": {
                "global": self.micro * self.micro_batches * data_parallel,
                "micro": self.micro,
                "accumulation": None,
            },
            "optimizer": {"name": "sgd", "lr": self.lr, "momentum": self.momentum},
            "lr_scaling": "none",
            "clip_grad_norm": 0.0,
            "precision": "fp32",
            "launch": {"np": self.ranks, "threads_per_rank": 1},
        }

    def arguments(self, *, steps: int, warmup: int) -> list[str]:
        """The arguments every rank program (native or toolkit) takes for this workload."""
        return [
            "--layers",
            ",".join(str(width) for width in self.layers),
            "--micro",
            str(self.micro),
            "--micro-batches",
            str(self.micro_batches),
            "--lr",
            str(self.lr),
            "--momentum",
            str(self.momentum),
            "--seed",
            str(self.seed),
            "--steps",
            str(steps),
            "--warmup",
            str(warmup),
        ]
