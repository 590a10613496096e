"""A real training rank for the stopped-rank tests: `toolkit.init` from the spec, a few steps
of a small model on the engine the spec names, then it writes its pid to PIDDIR/RANK and keeps
training until the job is stopped. The test SIGSTOPs one rank; the other then waits in the
engine's next collective.

    stall_train.py PIDDIR SPEC
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

import toolkit
from toolkit.launch.environment import split_local_rank_arg

WARM_STEPS = 3
SAMPLES = 256


def data() -> tuple[np.ndarray, np.ndarray]:
    generator = np.random.default_rng(0)
    inputs = generator.standard_normal((SAMPLES, 16)).astype(np.float32)
    return inputs, generator.integers(0, 4, SAMPLES).astype(np.int64)


def torch_job(run: Any) -> Any:
    import torch

    run.prepare(
        torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    )
    return torch.nn.functional.cross_entropy


def tf_job(run: Any) -> Any:
    import keras

    with run.scope():
        model = keras.Sequential(
            [keras.Input(shape=(16,)), keras.layers.Dense(32), keras.layers.Dense(4)]
        )
    run.prepare(model)
    return lambda logits, labels: keras.losses.sparse_categorical_crossentropy(
        labels, logits, from_logits=True
    )


def main(piddir: str, spec_file: str) -> int:
    spec = toolkit.load_spec(spec_file)
    run = toolkit.init(spec)
    loss_fn = torch_job(run) if spec.framework_name == "torch" else tf_job(run)
    for step, micro_batches in enumerate(run.steps(run.loader(data()), epochs=1_000_000)):
        run.train_step(micro_batches, loss_fn)
        if step == WARM_STEPS:
            written = Path(piddir) / f".{run.rank}"
            written.write_text(str(os.getpid()))
            written.rename(Path(piddir) / str(run.rank))  # the test never reads half a file
    return 0


if __name__ == "__main__":
    arguments, _ = split_local_rank_arg(sys.argv[1:])
    sys.exit(main(*arguments))
