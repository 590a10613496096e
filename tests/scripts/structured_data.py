"""The data both structured_* scripts train on: dict samples (integer tokens, float features)
and integer labels, the same for the torch and the TensorFlow runs. No engine imports."""

from __future__ import annotations

import numpy as np

VOCAB, WIDTH = 10, 8
TRAIN, HELD_OUT = 64, 32
EPOCHS = 2


def arrays(count: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, VOCAB, size=(count, 3)).astype(np.int64)
    features = rng.normal(size=(count, WIDTH)).astype(np.float32)
    labels = ((tokens.sum(axis=1) + (features[:, 0] > 0)) % VOCAB).astype(np.int64)
    return {"tokens": tokens, "features": features, "labels": labels}
